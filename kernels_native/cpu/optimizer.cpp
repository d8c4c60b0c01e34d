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
//
// adamw8: (hp[8], [norm[1]], then per group i: param, [master], grad, m_q, m_scale, v_q, v_scale) -> ()
//   AdamW with 8-bit optimizer states (bitsandbytes-style blockwise quantization). Same hp, norm,
//   clipping, no_decay and master convention as adamw, same per-element math in the same order.
//   The moments are stored as uint8 codes [n] in blocks of kQBlock = 256 consecutive elements,
//   each block with one f32 scale (m_scale, v_scale: float32 [ceil(n/256)]):
//     m = kSigned[m_q] * m_scale              m_scale = max |m| over the block
//     v = (kUnsigned[v_q] * v_scale)^2        v_scale = max sqrt(v) over the block
//   kSigned / kUnsigned are cubic power-law codes (uniform in the cube root of x / absmax):
//     kSigned[s<<7 | k] = (-1)^s (k / 127)^3   sign-magnitude, k in [0, 127] (byte 128, -0, unused)
//     kUnsigned[k]      = (k / 255)^3          k in [0, 255]
//   so byte 0 is 0.0 in both: an all-zero block (codes and scale 0) is the canonical zero.
//   The cube gives fine steps near 0 and ~6 decades of range (smallest nonzero m: 4.9e-7 absmax;
//   sqrt(v): 6e-8 absmax, v: 3.6e-15 absmax^2), at a relative step of 3/k for code k: about 2.4%
//   near absmax for m, 1.2% for sqrt(v). On 20-step AdamW runs with per-element gradient scales
//   spread over 1-5 decades this tracks the f32 update as well as or better than bitsandbytes'
//   dynamic-tree code (tests/train/test_adamw8.py measures it). v is quantized as sqrt(v): half
//   the dynamic range of v, and sqrt(v)'s magnitudes track |m|'s inside a block, so an element
//   whose m survives quantization keeps a nonzero denominator. Quantization rounds to the
//   nearest code value (midpoints compared in f32, ties to the lower code, no libm calls, so
//   the codes are the same on every machine); a positive sqrt(v) never rounds to 0 (it takes
//   the smallest positive code instead), so m / (sqrt(v) + eps) never divides by a lost v.
//   A block whose scale is 0 is all zeros whatever its codes: zero-initialized state (codes and
//   scales all 0) is the zero state. Each step dequantizes a block to f32, runs adamw's update
//   on it, and requantizes it with the new per-block absmax. Blocks are independent and every
//   result depends on the inputs only: parallel over blocks and deterministic.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cmath>
#include <string>
#include <vector>

#include "cpu/common.h"
#include "runtime/op_checks_optimizer.h"

namespace surogate::cpu {

namespace {

using namespace ::surogate::adam;  // the input layout (runtime/op_checks_optimizer.h)

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
  SG_RETURN_IF_ERROR(check_global_norm(a));
  std::vector<Block> blocks;
  for (int i = 0; i < a.num_inputs; ++i) {
    if (a.has_in(i)) add_blocks(i, a.in(i).numel(), &blocks);
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

// hp and norm (inputs 0 and 1) -> the step's scalars and the weight-decay factor 1 - lr*wd.
Status adam_scalars(const OpArgs& a, const char* op, AdamScalars* out, float* decay_out) {
  const float* hp = a.in(0).ptr<const float>();  // shapes checked by check_adamw / check_adamw8
  const double lr = hp[0], beta1 = hp[1], beta2 = hp[2], eps = hp[3], wd = hp[4], step = hp[5];
  const float max_norm = hp[6];
  SG_CHECK_ARG(beta1 >= 0.0 && beta1 < 1.0 && beta2 >= 0.0 && beta2 < 1.0,
               str_cat(op, ": betas (", beta1, ", ", beta2, ") must lie in [0, 1)"));
  SG_CHECK_ARG(step >= 1.0, str_cat(op, ": step ", step, " must be >= 1 (hp[5] is 1-based)"));
  SG_CHECK_ARG(max_norm >= 0.0f, str_cat(op, ": max_grad_norm ", max_norm, " must be >= 0 (0: no clipping)"));

  AdamScalars s;
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
  *decay_out = static_cast<float>(1.0 - lr * wd);
  *out = s;
  return Status::OK();
}

Status adamw(const OpArgs& a) {
  AdamwArgs r;
  SG_RETURN_IF_ERROR(check_adamw(a, &r));
  AdamScalars s;
  float decay = 1.0f;
  SG_RETURN_IF_ERROR(adam_scalars(a, "adamw", &s, &decay));
  const std::vector<char>& decays = r.decay;
  std::vector<Block> blocks;
  for (int g = 0; g < r.n_groups; ++g) add_blocks(g, a.in(2 + kGroup * g).numel(), &blocks);
  parallel_for(0, static_cast<int64_t>(blocks.size()), 1, [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b) {
      const Block& blk = blocks[b];
      adamw_dispatch(&a.in(2 + kGroup * blk.index), blk.lo, blk.hi, s, decays[blk.index] ? decay : 1.0f);
    }
  });
  return Status::OK();
}


// ---- adamw8 -----------------------------------------------------------------------------

static_assert(kBlock % kQBlock == 0, "work blocks must hold whole quantization blocks");

// A code: the value of each of the 256 byte codes, plus the sorted magnitudes that encoding
// searches (the midpoints between neighbours). Signed codes are sign-magnitude: bit 7 the sign,
// bits 0-6 the magnitude index, so that byte 0 is 0.0 for both codes.
struct Code {
  std::array<float, 256> value;
  std::array<float, 255> mid;  // mid[k] between magnitude k and k + 1
  int levels = 0;              // magnitudes: 128 (signed) or 256 (unsigned)
};

// The cubic power-law codes: signed, byte s<<7 | k is (-1)^s (k / 127)^3 (byte 128, -0, is
// never written); unsigned, byte k is (k / 255)^3.
Code make_power_code(bool is_signed) {
  Code c;
  c.levels = is_signed ? 128 : 256;
  const double top = c.levels - 1;
  const auto mag = [&](int k) { return (k / top) * (k / top) * (k / top); };
  for (int b = 0; b < 256; ++b) {
    const int k = is_signed ? (b & 127) : b;
    const double v = mag(k);
    c.value[b] = static_cast<float>(is_signed && (b & 128) ? -v : v);
  }
  c.mid.fill(0.0f);
  for (int k = 0; k + 1 < c.levels; ++k) c.mid[k] = static_cast<float>((mag(k) + mag(k + 1)) / 2.0);
  return c;
}

const Code& signed_code() {
  static const Code c = make_power_code(true);
  return c;
}
const Code& unsigned_code() {
  static const Code c = make_power_code(false);
  return c;
}

// The nearest magnitude index to a >= 0 (already divided by the block scale): the number of
// midpoints below a (ties go to the lower index).
inline int nearest_level(const Code& c, float a) {
  int lo = 0, hi = c.levels - 1;  // answer in [lo, hi]
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (c.mid[mid] < a) lo = mid + 1; else hi = mid;
  }
  return lo;
}

inline uint8_t encode_signed(const Code& c, float x) {
  const int k = nearest_level(c, std::fabs(x));
  return static_cast<uint8_t>(k == 0 ? 0 : (x < 0.0f ? 128 | k : k));
}

// Elements [lo, hi) (lo a multiple of kQBlock) of one group: whole quantization blocks.
template <typename P, typename G, bool kHasMaster>
void adamw8_range(P* param, float* master, const G* grad, uint8_t* mq, float* ms, uint8_t* vq, float* vs,
                  int64_t lo, int64_t hi, const AdamScalars& s, float decay) {
  const Code& cm = signed_code();
  const Code& cv = unsigned_code();
  const bool small = std::fabs(s.w1) < 0.5f;
  const float coeff = small ? s.w1 : s.w1 - 1.0f;
  const float clip = s.clip, beta2 = s.beta2, c2 = s.c2, bc2_sqrt = s.bc2_sqrt, eps = s.eps;
  const float neg_step_size = s.neg_step_size;
  float m[kQBlock], r[kQBlock];  // r: sqrt(v) after the update
  for (int64_t b0 = lo; b0 < hi; b0 += kQBlock) {
    const int64_t qb = b0 / kQBlock;
    const int64_t n = std::min<int64_t>(kQBlock, hi - b0);
    const float m_scale = ms[qb], v_scale = vs[qb];
    float m_max = 0.0f, r_max = 0.0f;
    for (int64_t j = 0; j < n; ++j) {
      const int64_t i = b0 + j;
      const float m_old = cm.value[mq[i]] * m_scale;
      const float r_old = cv.value[vq[i]] * v_scale;
      const float v_old = r_old * r_old;
      const float g = load(grad[i]) * clip;
      float w = kHasMaster ? master[i] : load(param[i]);
      w = w * decay;
      const float mi = (small ? m_old : g) + coeff * (g - m_old);
      float vi = v_old * beta2;
      vi = vi + c2 * g * g;
      const float ri = std::sqrt(vi);
      const float denom = ri / bc2_sqrt + eps;
      w = w + neg_step_size * mi / denom;
      m[j] = mi;
      r[j] = ri;
      m_max = std::max(m_max, std::fabs(mi));
      r_max = std::max(r_max, ri);
      if constexpr (kHasMaster) master[i] = w;
      param[i] = store<P>(w);
    }
    // Requantize. A NaN absmax (NaN updates) is stored as is: the block dequantizes to NaN.
    ms[qb] = m_max;
    vs[qb] = r_max;
    const float m_inv = m_max > 0.0f ? 1.0f / m_max : 0.0f;
    const float r_inv = r_max > 0.0f ? 1.0f / r_max : 0.0f;
    for (int64_t j = 0; j < n; ++j) {
      const int64_t i = b0 + j;
      mq[i] = m_max > 0.0f ? encode_signed(cm, m[j] * m_inv) : 0;
      int k = r_max > 0.0f ? nearest_level(cv, r[j] * r_inv) : 0;
      if (k == 0 && r[j] > 0.0f) k = 1;
      vq[i] = static_cast<uint8_t>(k);
    }
  }
}

template <typename P, typename G>
void adamw8_any(const Tensor* grp, int64_t lo, int64_t hi, const AdamScalars& s, float decay) {
  P* p = grp[kP8].ptr<P>();
  const G* g = grp[kGrad8].ptr<const G>();
  uint8_t* mq = grp[kMQ].ptr<uint8_t>();
  uint8_t* vq = grp[kVQ].ptr<uint8_t>();
  float* ms = grp[kMScale].ptr<float>();
  float* vs = grp[kVScale].ptr<float>();
  if (grp[kMaster8].data) {
    adamw8_range<P, G, true>(p, grp[kMaster8].ptr<float>(), g, mq, ms, vq, vs, lo, hi, s, decay);
  } else {
    adamw8_range<P, G, false>(p, nullptr, g, mq, ms, vq, vs, lo, hi, s, decay);
  }
}

template <typename P>
void adamw8_dispatch_grad(const Tensor* grp, int64_t lo, int64_t hi, const AdamScalars& s, float decay) {
  switch (grp[kGrad8].dtype) {
    case DType::kF32: adamw8_any<P, float>(grp, lo, hi, s, decay); break;
    case DType::kBF16: adamw8_any<P, bf16_t>(grp, lo, hi, s, decay); break;
    case DType::kF16: adamw8_any<P, f16_t>(grp, lo, hi, s, decay); break;
    default: break;  // rejected before
  }
}

void adamw8_dispatch(const Tensor* grp, int64_t lo, int64_t hi, const AdamScalars& s, float decay) {
  switch (grp[kP8].dtype) {
    case DType::kF32: adamw8_dispatch_grad<float>(grp, lo, hi, s, decay); break;
    case DType::kBF16: adamw8_dispatch_grad<bf16_t>(grp, lo, hi, s, decay); break;
    case DType::kF16: adamw8_dispatch_grad<f16_t>(grp, lo, hi, s, decay); break;
    default: break;  // rejected before
  }
}

Status adamw8(const OpArgs& a) {
  AdamwArgs r;
  SG_RETURN_IF_ERROR(check_adamw8(a, &r));
  AdamScalars s;
  float decay = 1.0f;
  SG_RETURN_IF_ERROR(adam_scalars(a, "adamw8", &s, &decay));
  const std::vector<char>& decays = r.decay;
  std::vector<Block> blocks;
  for (int g = 0; g < r.n_groups; ++g) add_blocks(g, a.in(2 + kGroup8 * g).numel(), &blocks);
  parallel_for(0, static_cast<int64_t>(blocks.size()), 1, [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b) {
      const Block& blk = blocks[b];
      adamw8_dispatch(&a.in(2 + kGroup8 * blk.index), blk.lo, blk.hi, s, decays[blk.index] ? decay : 1.0f);
    }
  });
  return Status::OK();
}

}  // namespace

void register_cpu_optimizer(OpRegistry& reg) {
  add_op(reg, "global_norm", global_norm);
  add_op(reg, "adamw", adamw);
  add_op(reg, "adamw8", adamw8);
}

}  // namespace surogate::cpu
