// CPU ops: the optimizer step of a training Program, global_norm and adamw.
//
// global_norm: (g0, g1, ...) -> (norm[1] f32)
//   norm = sqrt(sum over every present input of the squares of its elements). Inputs have any
//   float dtype and any shape; absent inputs (None / id -1) are skipped; no input gives 0.
//   Every input is cut into blocks of kBlock elements, a fixed cut that depends on the shapes
//   alone. Each block's sum of squares is taken in double (the square of an f32, bf16 or f16 is
//   exact there) and the block sums are added in block order after the parallel part. The result
//   is a function of the inputs only, not of the thread count or timing: a resumed run clips
//   with the same norm, bit for bit. Inf or NaN elements give an inf or NaN norm.
//
// adamw: (hp[8], [norm[1]], then per group i: param, [master], grad, m, v) -> ()
//   No outputs: param, master, m and v are UPDATED IN PLACE (a Program that plans liveness must
//   count those inputs as written). hp is an f32 tensor, so that a schedule changes lr each step
//   without rebuilding the Program:
//     hp = [lr, beta1, beta2, eps, weight_decay, step (1-based), max_grad_norm (0: off), unused]
//   norm is global_norm's output; absent, or max_grad_norm == 0, means no clipping.
//   master (f32, optional) holds the weights when param is stored in bf16 / f16: the update runs
//   on master and param receives it rounded to nearest even. Without master, param (f32, bf16
//   or f16) is updated directly. grad is f32, bf16 or f16; m and v are f32. attr no_decay: the
//   group indices that get no weight decay (norm weights, biases).
//
//   The math is torch.optim.AdamW (foreach=False, _single_tensor_adam with decoupled weight
//   decay) after torch.nn.utils.clip_grad_norm_, in the same operation order. Scalars are
//   computed in double from hp, as Python floats are in torch, then rounded once to f32:
//     clip  = min(1, max_grad_norm / (norm + 1e-6))         clip_grad_norm_'s clip_coef
//     g     = grad * clip                                   (grads are scaled as they are read)
//     w     = master or param;  w *= 1 - lr*wd              (not for no_decay groups)
//     m     = m.lerp(g, 1 - beta1)                          torch's lerp: m + (1-b1)(g-m)
//     v     = v*beta2 + (1-beta2)*g*g
//     denom = sqrt(v) / sqrt(1 - beta2^step) + eps
//     w    += (-lr / (1 - beta1^step)) * m / denom
//   torch rounds bf16 grads back to bf16 after clipping; we do not (one rounding fewer).
//
//   Non-finite norm: like torch, the update is not skipped. A NaN norm makes clip NaN and every
//   parameter NaN; an inf norm makes clip 0 (finite grads contribute nothing, inf grads NaN).
//   A trainer that wants to skip such steps runs the program up to global_norm, reads the norm,
//   and runs the adamw instruction only when it is finite (Program.run(begin, end)).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cpu/common.h"

namespace surogate::cpu {

namespace {

// Work unit of both ops. Fixed, so that global_norm's summation order never changes.
constexpr int64_t kBlock = 1 << 15;

struct Block {
  int index;  // which input (global_norm) or group (adamw)
  int64_t lo, hi;
};

// Cut `n` elements of item `index` into blocks, appended to `out`.
void add_blocks(int index, int64_t n, std::vector<Block>* out) {
  for (int64_t lo = 0; lo < n; lo += kBlock) out->push_back(Block{index, lo, std::min(n, lo + kBlock)});
}

// ---- global_norm ------------------------------------------------------------------------

inline double to_double(double v) { return v; }
template <typename T> inline double to_double(T v) { return static_cast<double>(load(v)); }

// Sum of squares in double, in a fixed order: eight interleaved partial sums (which the
// compiler vectorizes), combined pairwise, then the tail.
template <typename T>
double sum_squares(const T* p, int64_t n) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) {
      const double x = to_double(p[i + j]);
      acc[j] += x * x;
    }
  }
  double tail = 0;
  for (; i < n; ++i) {
    const double x = to_double(p[i]);
    tail += x * x;
  }
  return (((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))) + tail;
}

double sum_squares_any(const Tensor& t, int64_t lo, int64_t hi) {
  const char* base = static_cast<const char*>(t.data) + lo * static_cast<int64_t>(dtype_size(t.dtype));
  const int64_t n = hi - lo;
  switch (t.dtype) {
    case DType::kF32: return sum_squares(reinterpret_cast<const float*>(base), n);
    case DType::kBF16: return sum_squares(reinterpret_cast<const bf16_t*>(base), n);
    case DType::kF16: return sum_squares(reinterpret_cast<const f16_t*>(base), n);
    case DType::kF8E4M3: return sum_squares(reinterpret_cast<const f8e4m3_t*>(base), n);
    case DType::kF8E5M2: return sum_squares(reinterpret_cast<const f8e5m2_t*>(base), n);
    case DType::kF64: return sum_squares(reinterpret_cast<const double*>(base), n);
    default: return 0.0;  // rejected before
  }
}

Status global_norm(const OpArgs& a) {
  const Tensor& out = a.out(0);
  SG_CHECK(out.dtype == DType::kF32 && out.numel() == 1, StatusCode::kShapeMismatch,
           str_cat("global_norm: output norm must be float32[1], got ", out.describe()),
           "allocate the norm as a float32 tensor of shape [1]");
  std::vector<Block> blocks;
  for (int i = 0; i < a.num_inputs; ++i) {
    if (!a.has_in(i)) continue;
    const Tensor& g = a.in(i);
    SG_CHECK(dtype_is_float(g.dtype), StatusCode::kDTypeUnsupported,
             str_cat("global_norm: input ", i, " has dtype ", dtype_name(g.dtype), ", expected a float type"), "");
    SG_CHECK_ARG(g.is_contiguous(), str_cat("global_norm: input ", i, " ", g.describe(), " must be contiguous"));
    add_blocks(i, g.numel(), &blocks);
  }
  std::vector<double> partial(blocks.size(), 0.0);
  parallel_for(0, static_cast<int64_t>(blocks.size()), 1, [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b) partial[b] = sum_squares_any(a.in(blocks[b].index), blocks[b].lo, blocks[b].hi);
  });
  double total = 0.0;
  for (double s : partial) total += s;  // block order: deterministic
  *out.ptr<float>() = static_cast<float>(std::sqrt(total));
  return Status::OK();
}

// ---- adamw ------------------------------------------------------------------------------

constexpr int kGroup = 5;  // param, master, grad, m, v
enum Slot { kParam = 0, kMaster, kGrad, kM, kV };
const char* const kSlotName[kGroup] = {"param", "master", "grad", "m", "v"};

// The per-step scalars, each rounded once to f32 as torch does when it applies a Python float
// to an f32 tensor.
struct AdamScalars {
  float decay = 1.0f;   // 1 - lr*wd (1 for no_decay groups: x * 1.0f == x exactly)
  float w1 = 0.0f;      // lerp weight 1 - beta1
  float beta2 = 0.0f;
  float c2 = 0.0f;      // 1 - beta2
  float bc2_sqrt = 1.0f;  // sqrt(1 - beta2^step)
  float eps = 0.0f;
  float neg_step_size = 0.0f;  // -lr / (1 - beta1^step)
  float clip = 1.0f;
};

template <typename P, typename G, bool kHasMaster>
void adamw_block(P* param, float* master, const G* grad, float* m, float* v, int64_t lo, int64_t hi,
                 const AdamScalars& s, float decay) {
  // torch's lerp: with a small weight (< 0.5) m + w*(g - m), else g - (g - m)*(1 - w); both are
  // base + coeff*(g - m), which keeps the loop free of branches.
  const bool small = std::fabs(s.w1) < 0.5f;
  const float coeff = small ? s.w1 : s.w1 - 1.0f;
  // Locals, not s.*: the stores below could alias `s` as far as the compiler knows, and
  // reloading it every iteration keeps the loop from vectorizing.
  const float clip = s.clip, beta2 = s.beta2, c2 = s.c2, bc2_sqrt = s.bc2_sqrt, eps = s.eps;
  const float neg_step_size = s.neg_step_size;
  for (int64_t i = lo; i < hi; ++i) {
    const float g = load(grad[i]) * clip;
    float w = kHasMaster ? master[i] : load(param[i]);
    w = w * decay;
    const float mi = (small ? m[i] : g) + coeff * (g - m[i]);
    float vi = v[i] * beta2;
    vi = vi + c2 * g * g;
    const float denom = std::sqrt(vi) / bc2_sqrt + eps;
    w = w + neg_step_size * mi / denom;
    m[i] = mi;
    v[i] = vi;
    if constexpr (kHasMaster) master[i] = w;
    param[i] = store<P>(w);
  }
}

template <typename P, typename G>
void adamw_block_any(const Tensor* grp, int64_t lo, int64_t hi, const AdamScalars& s, float decay) {
  P* p = grp[kParam].ptr<P>();
  const G* g = grp[kGrad].ptr<const G>();
  float* m = grp[kM].ptr<float>();
  float* v = grp[kV].ptr<float>();
  if (grp[kMaster].data) {
    adamw_block<P, G, true>(p, grp[kMaster].ptr<float>(), g, m, v, lo, hi, s, decay);
  } else {
    adamw_block<P, G, false>(p, nullptr, g, m, v, lo, hi, s, decay);
  }
}

template <typename P>
void adamw_dispatch_grad(const Tensor* grp, int64_t lo, int64_t hi, const AdamScalars& s, float decay) {
  switch (grp[kGrad].dtype) {
    case DType::kF32: adamw_block_any<P, float>(grp, lo, hi, s, decay); break;
    case DType::kBF16: adamw_block_any<P, bf16_t>(grp, lo, hi, s, decay); break;
    case DType::kF16: adamw_block_any<P, f16_t>(grp, lo, hi, s, decay); break;
    default: break;  // rejected before
  }
}

void adamw_dispatch(const Tensor* grp, int64_t lo, int64_t hi, const AdamScalars& s, float decay) {
  switch (grp[kParam].dtype) {
    case DType::kF32: adamw_dispatch_grad<float>(grp, lo, hi, s, decay); break;
    case DType::kBF16: adamw_dispatch_grad<bf16_t>(grp, lo, hi, s, decay); break;
    case DType::kF16: adamw_dispatch_grad<f16_t>(grp, lo, hi, s, decay); break;
    default: break;  // rejected before
  }
}

// One group's tensors: present where required, of the right dtypes and sizes, writeable.
Status check_group(const OpArgs& a, int group) {
  const int base = 2 + kGroup * group;
  const auto where = [&](int slot) {
    return str_cat("adamw: group ", group, " (input ", base + slot, ", ", kSlotName[slot], ")");
  };
  for (int slot = 0; slot < kGroup; ++slot) {
    if (!a.has_in(base + slot)) {
      SG_CHECK_ARG(slot == kMaster, str_cat(where(slot), " is missing; only master is optional"));
      continue;
    }
    const Tensor& t = a.in(base + slot);
    SG_CHECK_ARG(t.is_contiguous(), str_cat(where(slot), " ", t.describe(), " must be contiguous"));
    SG_CHECK_SHAPE(t.numel() == a.in(base + kParam).numel(),
                   str_cat(where(slot), " ", t.describe(), " has ", t.numel(), " elements but param has ",
                           a.in(base + kParam).numel()));
    const bool f32_only = slot == kMaster || slot == kM || slot == kV;
    SG_CHECK(f32_only ? t.dtype == DType::kF32
                      : (t.dtype == DType::kF32 || t.dtype == DType::kBF16 || t.dtype == DType::kF16),
             StatusCode::kDTypeUnsupported,
             str_cat(where(slot), " has dtype ", dtype_name(t.dtype), ", expected ",
                     f32_only ? "float32" : "float32, bfloat16 or float16"),
             slot == kMaster ? "master weights are float32" : "");
    SG_CHECK_ARG(slot == kGrad || !t.readonly,
                 str_cat(where(slot), " is read-only, but adamw updates it in place"));
  }
  return Status::OK();
}

Status adamw(const OpArgs& a) {
  SG_CHECK_ARG(a.num_inputs >= 2 && (a.num_inputs - 2) % kGroup == 0,
               str_cat("adamw: got ", a.num_inputs, " inputs, expected 2 + 5*k: hp, norm (or None), then "
                       "(param, master or None, grad, m, v) per parameter"));
  const int n_groups = (a.num_inputs - 2) / kGroup;
  const Tensor& hp_t = a.in(0);
  SG_CHECK(hp_t.dtype == DType::kF32 && hp_t.numel() == 8 && hp_t.is_contiguous(), StatusCode::kShapeMismatch,
           str_cat("adamw: hp must be a contiguous float32[8], got ", hp_t.describe()),
           "hp = [lr, beta1, beta2, eps, weight_decay, step, max_grad_norm, 0]");
  const float* hp = hp_t.ptr<const float>();
  const double lr = hp[0], beta1 = hp[1], beta2 = hp[2], eps = hp[3], wd = hp[4], step = hp[5];
  const float max_norm = hp[6];
  SG_CHECK_ARG(beta1 >= 0.0 && beta1 < 1.0 && beta2 >= 0.0 && beta2 < 1.0,
               str_cat("adamw: betas (", beta1, ", ", beta2, ") must lie in [0, 1)"));
  SG_CHECK_ARG(step >= 1.0, str_cat("adamw: step ", step, " must be >= 1 (hp[5] is 1-based)"));
  SG_CHECK_ARG(max_norm >= 0.0f, str_cat("adamw: max_grad_norm ", max_norm, " must be >= 0 (0: no clipping)"));

  AdamScalars s;
  if (a.has_in(1)) {
    const Tensor& n = a.in(1);
    SG_CHECK(n.dtype == DType::kF32 && n.numel() == 1, StatusCode::kShapeMismatch,
             str_cat("adamw: norm must be float32[1], got ", n.describe()), "pass global_norm's output");
  }
  if (a.has_in(1) && max_norm > 0.0f) {
    const Tensor& n = a.in(1);
    // clip_grad_norm_: clip_coef = max_norm / (total_norm + 1e-6), clamped to 1. A NaN stays NaN.
    const float coef = max_norm / (*n.ptr<const float>() + 1e-6f);
    s.clip = coef > 1.0f ? 1.0f : coef;
  }
  s.w1 = static_cast<float>(1.0 - beta1);
  s.beta2 = static_cast<float>(beta2);
  s.c2 = static_cast<float>(1.0 - beta2);
  s.bc2_sqrt = static_cast<float>(std::pow(1.0 - std::pow(beta2, step), 0.5));  // Python's bc2**0.5
  s.eps = static_cast<float>(eps);
  s.neg_step_size = static_cast<float>(-(lr / (1.0 - std::pow(beta1, step))));
  const float decay = static_cast<float>(1.0 - lr * wd);

  std::vector<char> decays(n_groups, wd != 0.0 ? 1 : 0);
  for (int64_t g : a.attr().get_ints("no_decay")) {
    SG_CHECK_ARG(g >= 0 && g < n_groups,
                 str_cat("adamw: no_decay names group ", g, ", but there are ", n_groups, " groups"));
    decays[g] = 0;
  }

  std::vector<Block> blocks;
  for (int g = 0; g < n_groups; ++g) {
    SG_RETURN_IF_ERROR(check_group(a, g));
    add_blocks(g, a.in(2 + kGroup * g).numel(), &blocks);
  }
  parallel_for(0, static_cast<int64_t>(blocks.size()), 1, [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b) {
      const Block& blk = blocks[b];
      adamw_dispatch(&a.in(2 + kGroup * blk.index), blk.lo, blk.hi, s, decays[blk.index] ? decay : 1.0f);
    }
  });
  return Status::OK();
}

}  // namespace

void register_cpu_optimizer(OpRegistry& reg) {
  add_op(reg, "global_norm", 0, kVariadic, 1, global_norm,
         "(g0, g1, ...) -> (norm[1] float32) = sqrt(sum of squares), absent inputs skipped");
  add_op(reg, "adamw", 1, kVariadic, 0, adamw,
         "(hp[8], [norm[1]], then (param, [master], grad, m, v) per group) -> () updates in place; "
         "attrs: no_decay");
}

}  // namespace surogate::cpu
