// GPT-OSS's expert pieces on the CPU, forward and backward (checks: runtime/op_checks_moe_oai.h).
//
// swiglu_oai: transformers' GptOssExperts._apply_gate on the interleaved gate_up output (gate at
// column 2j, up at 2j + 1), with alpha (1.702) and limit (7.0):
//   g = min(gate, limit), u = clamp(up, -limit, limit)
//   y = (u + 1) * g * sigmoid(alpha g)
// rounded to the storage dtype T where torch rounds each op of that expression: T(alpha g),
// T(sigmoid), T(g s), T(u + 1), T(product); for f32 these are no-ops. Backward in f32, rounded
// once, with torch's clamp gradient (1 inside [min, max], the bounds included; 0 outside):
//   d up   = dy g s [-limit <= up <= limit]
//   d gate = dy (u + 1) (s + alpha g s (1 - s)) [gate <= limit]
//
// moe_bias_add: y = x + b[e] on expert e's rows [offsets[e], offsets[e+1]) of moe_permute's
// order (GPT-OSS's gate_up_proj_bias and down_proj_bias, added before the routing weights);
// moe_bias_grad: db[e] = the sum of dy over expert e's rows, in row order (deterministic).
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/common.h"
#include "runtime/op_checks_moe_oai.h"

namespace surogate::cpu {

namespace {

template <typename T> inline float rnd(float x) { return load(store<T>(x)); }

inline float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

Status swiglu_oai_fwd(const OpArgs& a) {
  SwigluOaiArgs r;
  SG_RETURN_IF_ERROR(check_swiglu_oai_fwd(a, &r));
  const int64_t F = r.F;
  const float alpha = r.alpha, limit = r.limit;
  SG_DISPATCH_FLOAT("swiglu_oai_fwd", a.in(0).dtype, T, {
    const T* gu = a.in(0).ptr<T>();
    T* y = a.out(0).ptr<T>();
    parallel_for(0, r.M, std::max<int64_t>(1, 8192 / std::max<int64_t>(F, 1)), [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        const T* row = gu + i * 2 * F;
        for (int64_t j = 0; j < F; ++j) {
          const float g = std::min(load(row[2 * j]), limit);
          const float u = std::clamp(load(row[2 * j + 1]), -limit, limit);
          const float s = rnd<T>(sigmoid(rnd<T>(g * alpha)));
          const float glu = rnd<T>(g * s);
          y[i * F + j] = store<T>(rnd<T>(u + 1.0f) * glu);
        }
      }
    });
  });
  return Status::OK();
}

Status swiglu_oai_bwd(const OpArgs& a) {
  SwigluOaiArgs r;
  SG_RETURN_IF_ERROR(check_swiglu_oai_bwd(a, &r));
  const int64_t F = r.F;
  const float alpha = r.alpha, limit = r.limit;
  SG_DISPATCH_FLOAT("swiglu_oai_bwd", a.in(0).dtype, T, {
    const T* dy = a.in(0).ptr<T>();
    const T* gu = a.in(1).ptr<T>();
    T* dgu = a.out(0).ptr<T>();
    parallel_for(0, r.M, std::max<int64_t>(1, 8192 / std::max<int64_t>(F, 1)), [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        const T* row = gu + i * 2 * F;
        T* drow = dgu + i * 2 * F;
        for (int64_t j = 0; j < F; ++j) {
          const float gate = load(row[2 * j]), up = load(row[2 * j + 1]), d = load(dy[i * F + j]);
          const float g = std::min(gate, limit), u = std::clamp(up, -limit, limit);
          const float s = sigmoid(alpha * g);
          const float dup = up >= -limit && up <= limit ? d * g * s : 0.0f;
          const float dgate = gate <= limit ? d * (u + 1.0f) * (s + alpha * g * s * (1.0f - s)) : 0.0f;
          drow[2 * j] = store<T>(dgate);  // written after both reads: dgu may alias gu
          drow[2 * j + 1] = store<T>(dup);
        }
      }
    });
  });
  return Status::OK();
}

Status moe_bias_add(const OpArgs& a) {
  MoeBiasArgs r;
  SG_RETURN_IF_ERROR(check_moe_bias_add(a, &r));
  const int32_t* off = a.in(2).ptr<int32_t>();
  SG_RETURN_IF_ERROR(check_offset_values("moe_bias_add", off, r.E, r.M));
  const int64_t C = r.C;
  SG_DISPATCH_FLOAT("moe_bias_add", a.in(0).dtype, T, {
    const T* x = a.in(0).ptr<T>();
    const T* b = a.in(1).ptr<T>();
    T* y = a.out(0).ptr<T>();
    for (int64_t e = 0; e < r.E; ++e) {
      const T* be = b + e * C;
      parallel_for(off[e], off[e + 1], std::max<int64_t>(1, 8192 / std::max<int64_t>(C, 1)),
                   [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) {
          for (int64_t c = 0; c < C; ++c) y[i * C + c] = store<T>(load(x[i * C + c]) + load(be[c]));
        }
      });
    }
  });
  return Status::OK();
}

Status moe_bias_grad(const OpArgs& a) {
  MoeBiasArgs r;
  SG_RETURN_IF_ERROR(check_moe_bias_grad(a, &r));
  const int32_t* off = a.in(1).ptr<int32_t>();
  SG_RETURN_IF_ERROR(check_offset_values("moe_bias_grad", off, r.E, r.M));
  const int64_t C = r.C;
  const Tensor& db = a.out(0);
  SG_DISPATCH_FLOAT("moe_bias_grad", a.in(0).dtype, T, {
    const T* dy = a.in(0).ptr<T>();
    parallel_for(0, r.E, 1, [&](int64_t e0, int64_t e1) {
      std::vector<float> acc(static_cast<size_t>(C));
      for (int64_t e = e0; e < e1; ++e) {
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t i = off[e]; i < off[e + 1]; ++i) {
          for (int64_t c = 0; c < C; ++c) acc[c] += load(dy[i * C + c]);
        }
        if (db.dtype == DType::kF32) {
          float* out = db.ptr<float>() + e * C;
          for (int64_t c = 0; c < C; ++c) out[c] = (r.accumulate ? out[c] : 0.0f) + acc[c];
        } else {
          T* out = db.ptr<T>() + e * C;
          for (int64_t c = 0; c < C; ++c) out[c] = store<T>((r.accumulate ? load(out[c]) : 0.0f) + acc[c]);
        }
      }
    });
  });
  return Status::OK();
}

}  // namespace

void register_cpu_moe_oai(OpRegistry& reg) {
  add_op(reg, "swiglu_oai_fwd", swiglu_oai_fwd);
  add_op(reg, "swiglu_oai_bwd", swiglu_oai_bwd);
  add_op(reg, "moe_bias_add", moe_bias_add);
  add_op(reg, "moe_bias_grad", moe_bias_grad);
}

}  // namespace surogate::cpu
