// Elementwise CPU ops: fill, cast, copy, add, scale, softcap_fwd, and argmax over rows. Outputs
// may alias inputs (y = x + y).
//
// softcap_fwd (the final logit soft-capping of Gemma 2 / 4 in inference graphs; training folds it
// into lm_head_ce): y = T(T(tanh(T(x / cap))) * cap), rounded at HF's three places
// (logits / cap, tanh, * cap are three tensors of the logits' dtype).
#include <cmath>
#include <limits>

#include "cpu/common.h"
#include "runtime/op_checks.h"
#include "runtime/op_checks_pointwise.h"

namespace surogate::cpu {

namespace {

constexpr int64_t kGrain = 1 << 14;

// fill: () -> (y); attrs: value (default 0)
Status fill(const OpArgs& a) {
  const Tensor& y = a.out(0);
  float v = 0.0f;
  SG_RETURN_IF_ERROR(check_fill(a, &v));
  if (v == 0.0f) {
    std::memset(y.data, 0, y.nbytes());
    return Status::OK();
  }
  SG_DISPATCH_FLOAT("fill", y.dtype, T, {
    T* p = y.ptr<T>();
    const T sv = store<T>(v);
    parallel_for(0, y.numel(), kGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) p[i] = sv;
    });
  });
  return Status::OK();
}

// cast: (x) -> (y); any float dtype to any float dtype, same numel.
Status cast(const OpArgs& a) {
  const Tensor& x = a.in(0);
  const Tensor& y = a.out(0);
  SG_RETURN_IF_ERROR(check_cast(a));
  const size_t xs = dtype_size(x.dtype), ys = dtype_size(y.dtype);
  parallel_for(0, x.numel(), kGrain, [&](int64_t lo, int64_t hi) {
    convert(static_cast<const char*>(x.data) + lo * xs, x.dtype, static_cast<char*>(y.data) + lo * ys, y.dtype,
            hi - lo);
  });
  return Status::OK();
}

// copy: (x) -> (y); same dtype and numel.
Status copy(const OpArgs& a) { return copy_tensor(a.in(0), a.out(0)); }

// add: (a, b) -> (y); y = alpha * a + beta * b, all the same shape and dtype.
Status add(const OpArgs& args) {
  const Tensor& x = args.in(0);
  const Tensor& z = args.in(1);
  const Tensor& y = args.out(0);
  AddArgs r;
  SG_RETURN_IF_ERROR(check_add(args, &r));
  const float alpha = r.alpha, beta = r.beta;
  SG_DISPATCH_FLOAT("add", x.dtype, T, {
    const T* pa = x.ptr<T>();
    const T* pb = z.ptr<T>();
    T* py = y.ptr<T>();
    parallel_for(0, x.numel(), kGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) py[i] = store<T>(alpha * load(pa[i]) + beta * load(pb[i]));
    });
  });
  return Status::OK();
}

// scale: (x) -> (y); y = alpha * x.
Status scale(const OpArgs& args) {
  const Tensor& x = args.in(0);
  const Tensor& y = args.out(0);
  AddArgs r;
  SG_RETURN_IF_ERROR(check_scale(args, &r));
  const float alpha = r.alpha;
  SG_DISPATCH_FLOAT("scale", x.dtype, T, {
    const T* px = x.ptr<T>();
    T* py = y.ptr<T>();
    parallel_for(0, x.numel(), kGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) py[i] = store<T>(alpha * load(px[i]));
    });
  });
  return Status::OK();
}

// softcap_fwd: (x) -> (y); attr cap.
Status softcap_fwd(const OpArgs& args) {
  float cap = 0.0f;
  SG_RETURN_IF_ERROR(check_softcap_fwd(args, &cap));
  SG_DISPATCH_FLOAT("softcap_fwd", args.in(0).dtype, T, {
    const T* px = args.in(0).ptr<T>();
    T* py = args.out(0).ptr<T>();
    parallel_for(0, args.in(0).numel(), kGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        const float t = load(store<T>(std::tanh(load(store<T>(load(px[i]) / cap)))));
        py[i] = store<T>(t * cap);
      }
    });
  });
  return Status::OK();
}

// argmax: (x [R, V]) -> (y int32 [R]); the lowest index of each row's largest value, -1 for a
// row holding a NaN or +inf (serving: the greedy token, and the sampler's non-finite check).
Status argmax(const OpArgs& args) {
  const Tensor& x = args.in(0);
  const Tensor& y = args.out(0);
  SG_RETURN_IF_ERROR(check_argmax(args));
  const int64_t V = x.shape[1];
  SG_DISPATCH_FLOAT("argmax", x.dtype, T, {
    parallel_for(0, x.shape[0], 1, [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const T* row = x.ptr<T>() + r * x.strides[0];
        int32_t best = -1;
        float bv = -std::numeric_limits<float>::infinity();
        for (int64_t i = 0; i < V; ++i) {
          const float v = load(row[i]);
          if (std::isnan(v) || v == std::numeric_limits<float>::infinity()) {
            best = -1;
            break;
          }
          if (best < 0 || v > bv) best = static_cast<int32_t>(i), bv = v;
        }
        y.ptr<int32_t>()[r] = V > 0 ? best : -1;
      }
    });
  });
  return Status::OK();
}

}  // namespace

void register_cpu_elementwise(OpRegistry& reg) {
  add_op(reg, "fill", fill);
  add_op(reg, "cast", cast);
  add_op(reg, "copy", copy);
  add_op(reg, "add", add);
  add_op(reg, "scale", scale);
  add_op(reg, "softcap_fwd", softcap_fwd);
  add_op(reg, "argmax", argmax);
}

}  // namespace surogate::cpu
