// Gated MLP activation CPU ops, forward and backward: swiglu_fwd / swiglu_bwd (Llama, Qwen,
// Mistral) and geglu_fwd / geglu_bwd (Gemma's gelu_pytorch_tanh); act_mul_fwd / act_mul_bwd are
// y = act(a) * b over two tensors (Gemma 4's per-layer input gate, gelu_tanh(gate) * input, with
// geglu's math and roundings per element), b also one value (act none: Gemma 4's layer scalar) or
// absent: y = act(a), the plain activation (SigLIP's gelu_pytorch_tanh), rounded once; act_mul's
// act may also be gelu, the exact erf form (nn.GELU(): Qwen3-VL's patch mergers).
//
// Shapes: N rows (tokens), F intermediate channels. gu, dgu: [N, 2F]; y, dy: [N, F]; one
// storage dtype T (f32, bf16 or f16), math in f32.
// gu is the output of the fused projection W = [W_gate; W_up] ([2F, C]): gate g = gu[:, :F],
// up u = gu[:, F:]. HF's MLP is down_proj(act(gate_proj(x)) * up_proj(x)).
//
//   silu(g)      = g * s(g),                s(v) = 1 / (1 + exp(-v))
//   gelu_tanh(g) = 0.5 g (1 + tanh(z)),     z = sqrt(2/pi) (g + 0.044715 g^3)
//                = g * s(2 z)               (the form computed: no cancellation in 1 + tanh)
//   forward:  y = T(a * u),  a = T(act(g))
// HF in bf16 rounds act(g) to bf16 (it is a tensor of the input dtype) and then multiplies by
// up in bf16 (f32 product, rounded); we round at the same two places. SwiGLU's y then equals
// HF's bit for bit except where our exp and torch's (Sleef) differ in the last f32 bit and
// that flips a rounding (none in 4M values tested). GeGLU's does too for g > -3 (> 99.9%);
// below, torch's 1 + tanh(z) cancels (to exactly 0 under about -7, even in f64) while g s(2z)
// stays accurate, so there we differ from HF by less than 4e-6 |u| and are the closer one.
// For T = f32 both roundings are no-ops.
//
//   backward, with p = s(g) (SwiGLU) or p = s(2z) (GeGLU), in f32 and rounded once:
//   d up   = dy * act(g)
//   d gate = dy * u * act'(g),   silu'(g)      = p + g p (1 - p)
//                                gelu_tanh'(g) = p + 2 g p (1 - p) sqrt(2/pi) (1 + 3 * 0.044715 g^2)
// (HF's bf16 autograd rounds act(g) and dy * u to bf16 on the way; we do not, so our
// gradients are the closer ones to the f32 math.) p (1 - p) is computed from e = exp(-v) as
// 1 / (2 + e + 1/e), accurate in both tails. dgu may alias gu: each element of gate and up is
// read before the same element of dgu is written.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "cpu/common.h"
#include "cpu/vec_math.h"
#include "runtime/op_checks_pointwise.h"

namespace surogate::cpu {

namespace {

// Hot row loops are built for x86-64-v4 (AVX-512), v3 (AVX2, FMA, F16C) and the portable
// baseline, picked at load time; v3 / v4 also turn f16 conversions into F16C instructions.

inline int32_t as_int(float f) { int32_t i; std::memcpy(&i, &f, 4); return i; }
inline float as_float(int32_t i) { float f; std::memcpy(&f, &i, 4); return f; }

// clamp(x, lo, hi) in integer compares on an order-preserving key of the bits (the sign-
// magnitude bits of a negative float, magnitude flipped). A float compare-and-select would do
// it too, but GCC neither if-converts a float compare under -ftrapping-math nor vectorizes
// fmin / fmax inside target_clones; integer min / max vectorize on every ISA. NaN clamps to lo
// or hi by its sign bit.
inline int32_t order_key(int32_t b) { return b ^ ((b >> 31) & 0x7fffffff); }
inline float clamp_f32(float x, float lo, float hi) {
  int32_t k = order_key(as_int(x));
  const int32_t klo = order_key(as_int(lo)), khi = order_key(as_int(hi));
  k = k < klo ? klo : k;
  k = k > khi ? khi : k;
  return as_float(order_key(k));
}

// exp(x) in f32, within 2 ulp, in plain arithmetic that the compiler vectorizes (std::exp is a
// scalar call). Cephes' expf: x = n ln2 + r with |r| <= ln2 / 2, a degree-7 polynomial for
// exp(r), then 2^n applied as two halves so that n from -150 to 129 (results that underflow to
// subnormals or 0, or overflow to inf) needs no special case. NaN gives a finite value: the
// callers keep a NaN gate NaN by multiplying by the gate itself.
inline float exp_f32(float x) {
  constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  constexpr float kShift = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float xc = clamp_f32(x, -104.0f, 89.0f);
  const float t = xc * kLog2e + kShift;
  const float n = t - kShift;
  const int32_t ni = as_int(t) - as_int(kShift);
  float r = xc - n * kLn2Hi;
  r = r - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * (r * r) + r + 1.0f;
  const int32_t k = ni >> 1;
  return e * as_float((k + 127) << 23) * as_float((ni - k + 127) << 23);
}

template <typename T> float round_to(float v) { return load(store<T>(v)); }

// p (1 - p) for p = s(v), given e = exp(-v): 1 / (2 + e + 1/e). Exact in both tails, where
// 1 - p cancels (p near 1) or e * p is inf * 0 (e overflowed).
inline float sigmoid_slope(float e) { return 1.0f / (2.0f + e + 1.0f / e); }

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoeff = 0.044715f;

struct Silu {
  static float act(float g) { return g / (1.0f + exp_f32(-g)); }
  // d act / d g and act, from one exp.
  static float grad(float g, float* a) {
    const float e = exp_f32(-g);
    const float p = 1.0f / (1.0f + e);
    *a = g * p;
    return p + g * sigmoid_slope(e);
  }
};

struct GeluTanh {
  static float act(float g) {
    const float z = kSqrt2OverPi * (g + kGeluCoeff * g * g * g);
    return g / (1.0f + exp_f32(-2.0f * z));
  }
  static float grad(float g, float* a) {
    const float g2 = g * g;
    const float z = kSqrt2OverPi * (g + kGeluCoeff * g2 * g);
    const float e = exp_f32(-2.0f * z);
    const float p = 1.0f / (1.0f + e);
    *a = g * p;
    return p + 2.0f * g * sigmoid_slope(e) * kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * g2);
  }
};

// The exact GELU (act "gelu", torch's nn.GELU(): Qwen3-VL's patch mergers), erf in f32:
//   gelu(g) = g Phi(g),  Phi(g) = 0.5 (1 + erf(g / sqrt 2));  gelu'(g) = Phi(g) + g phi(g),
//   phi(g) = exp(-g^2 / 2) / sqrt(2 pi).
struct GeluErf {
  static float act(float g) { return 0.5f * g * (1.0f + std::erf(g * kInvSqrt2)); }
  static float grad(float g, float* a) {
    const float cdf = 0.5f * (1.0f + std::erf(g * kInvSqrt2));
    *a = g * cdf;
    return cdf + g * kInvSqrt2Pi * std::exp(-0.5f * g * g);
  }
  static constexpr float kInvSqrt2 = 0.70710678118654752f;
  static constexpr float kInvSqrt2Pi = 0.39894228040143268f;
};

template <typename Act, typename T>
SG_CPU_CLONES void gated_fwd_row(const T* gate, const T* up, T* y, int64_t F) {
  for (int64_t j = 0; j < F; ++j) y[j] = store<T>(round_to<T>(Act::act(load(gate[j]))) * load(up[j]));
}

template <typename Act, typename T>
SG_CPU_CLONES void gated_bwd_row(const T* dy, const T* gate, const T* up, T* dgate, T* dup, int64_t F) {
  for (int64_t j = 0; j < F; ++j) {
    const float d = load(dy[j]), u = load(up[j]);
    float a;
    const float da = Act::grad(load(gate[j]), &a);
    dgate[j] = store<T>(d * u * da);
    dup[j] = store<T>(d * a);
  }
}

int64_t row_grain(int64_t F) { return std::max<int64_t>(1, 8192 / std::max<int64_t>(F, 1)); }

template <typename Act>
Status gated_fwd(const char* op, const OpArgs& a) {
  const Tensor &gu = a.in(0), &y = a.out(0);
  int64_t N = 0, F = 0;
  SG_RETURN_IF_ERROR(check_gated_fwd(op, a, &N, &F));
  SG_DISPATCH_FLOAT(op, gu.dtype, T, {
    const T* g = gu.ptr<T>();
    T* out = y.ptr<T>();
    parallel_for(0, N, row_grain(F), [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) gated_fwd_row<Act, T>(g + i * 2 * F, g + i * 2 * F + F, out + i * F, F);
    });
  });
  return Status::OK();
}

template <typename Act>
Status gated_bwd(const char* op, const OpArgs& a) {
  const Tensor &dy = a.in(0), &gu = a.in(1), &dgu = a.out(0);
  int64_t N = 0, F = 0;
  SG_RETURN_IF_ERROR(check_gated_bwd(op, a, &N, &F));
  SG_DISPATCH_FLOAT(op, gu.dtype, T, {
    const T* d = dy.ptr<T>();
    const T* g = gu.ptr<T>();
    T* dg = dgu.ptr<T>();
    parallel_for(0, N, row_grain(F), [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        gated_bwd_row<Act, T>(d + i * F, g + i * 2 * F, g + i * 2 * F + F, dg + i * 2 * F, dg + i * 2 * F + F, F);
      }
    });
  });
  return Status::OK();
}

struct NoAct {
  static float act(float g) { return g; }
  static float grad(float g, float* a) {
    *a = g;
    return 1.0f;
  }
};

// act_mul over [lo, hi): b[i], or b[0] for a broadcast b, or 1 without b (b null).
template <typename T> float broadcast_value(const T* b) { return b ? load(b[0]) : 1.0f; }

template <typename Act, typename T>
void act_mul_fwd_range(const T* x, const T* b, T* y, int64_t lo, int64_t hi, bool broadcast) {
  if (!broadcast) return gated_fwd_row<Act, T>(x + lo, b + lo, y + lo, hi - lo);
  const float bv = broadcast_value(b);
  for (int64_t i = lo; i < hi; ++i) y[i] = store<T>(round_to<T>(Act::act(load(x[i]))) * bv);
}

template <typename Act, typename T>
void act_mul_bwd_range(const T* dy, const T* x, const T* b, T* dx, T* db, int64_t lo, int64_t hi, bool broadcast) {
  if (!broadcast && db != nullptr) return gated_bwd_row<Act, T>(dy + lo, x + lo, b + lo, dx + lo, db + lo, hi - lo);
  const float bv = broadcast ? broadcast_value(b) : 0.0f;
  for (int64_t i = lo; i < hi; ++i) {
    float a;
    dx[i] = store<T>(load(dy[i]) * (broadcast ? bv : load(b[i])) * Act::grad(load(x[i]), &a));
  }
}

template <typename Act>
Status act_mul_fwd_as(const OpArgs& a, const ActMulArgs& r) {
  SG_DISPATCH_FLOAT("act_mul_fwd", a.in(0).dtype, T, {
    const T* x = a.in(0).ptr<T>();
    const T* b = r.has_b ? a.in(1).ptr<T>() : nullptr;
    T* y = a.out(0).ptr<T>();
    parallel_for(0, r.n, 8192, [&](int64_t lo, int64_t hi) { act_mul_fwd_range<Act, T>(x, b, y, lo, hi, r.broadcast); });
  });
  return Status::OK();
}

template <typename Act>
Status act_mul_bwd_as(const OpArgs& a, const ActMulArgs& r) {
  SG_DISPATCH_FLOAT("act_mul_bwd", a.in(0).dtype, T, {
    const T* d = a.in(0).ptr<T>();
    const T* x = a.in(1).ptr<T>();
    const T* b = r.has_b ? a.in(2).ptr<T>() : nullptr;
    T* dx = a.out(0).ptr<T>();
    T* db = a.has_out(1) ? a.out(1).ptr<T>() : nullptr;
    parallel_for(0, r.n, 8192, [&](int64_t lo, int64_t hi) {
      act_mul_bwd_range<Act, T>(d, x, b, dx, db, lo, hi, r.broadcast);
    });
  });
  return Status::OK();
}

Status act_mul_fwd(const OpArgs& a) {
  ActMulArgs r;
  SG_RETURN_IF_ERROR(check_act_mul_fwd(a, &r));
  if (r.gelu_erf) return act_mul_fwd_as<GeluErf>(a, r);
  return r.gelu ? act_mul_fwd_as<GeluTanh>(a, r) : act_mul_fwd_as<NoAct>(a, r);
}

Status act_mul_bwd(const OpArgs& a) {
  ActMulArgs r;
  SG_RETURN_IF_ERROR(check_act_mul_bwd(a, &r));
  if (r.gelu_erf) return act_mul_bwd_as<GeluErf>(a, r);
  return r.gelu ? act_mul_bwd_as<GeluTanh>(a, r) : act_mul_bwd_as<NoAct>(a, r);
}

Status swiglu_fwd(const OpArgs& a) { return gated_fwd<Silu>("swiglu_fwd", a); }
Status swiglu_bwd(const OpArgs& a) { return gated_bwd<Silu>("swiglu_bwd", a); }
Status geglu_fwd(const OpArgs& a) { return gated_fwd<GeluTanh>("geglu_fwd", a); }
Status geglu_bwd(const OpArgs& a) { return gated_bwd<GeluTanh>("geglu_bwd", a); }

}  // namespace

void register_cpu_activation(OpRegistry& reg) {
  add_op(reg, "swiglu_fwd", swiglu_fwd);
  add_op(reg, "swiglu_bwd", swiglu_bwd);
  add_op(reg, "geglu_fwd", geglu_fwd);
  add_op(reg, "geglu_bwd", geglu_bwd);
  add_op(reg, "act_mul_fwd", act_mul_fwd);
  add_op(reg, "act_mul_bwd", act_mul_bwd);
}

}  // namespace surogate::cpu
