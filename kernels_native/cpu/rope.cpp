// Rotary position embedding (RoPE) and the fused per-head RMSNorm + RoPE of Qwen3's q_norm /
// k_norm, forward and backward, matching HF transformers (modeling_rope_utils.py, LlamaRotaryEmbedding,
// apply_rotary_pos_emb, Qwen3RMSNorm).
//
// N tokens, H heads, D head dim, R = rotary_dim (even, <= D, default D), half = R / 2, p = pos[n].
// Layout is HF's non-interleaved "rotate_half": dims i and i + half form a pair (i < half) and
// dims [R, D) pass through unchanged (HF's partial rotary: q[..., :R] rotates, q[..., R:] does not).
//   y[i]        = x[i] cos(p f_i) - x[i + half] sin(p f_i)
//   y[i + half] = x[i + half] cos(p f_i) + x[i] sin(p f_i)
// rope_bwd applies the rotation by -angle (the transpose).
//
// inv_freq f_i, float32 like HF, in HF's order of float32 operations (rope_type attr):
//   default: f_i = 1 / theta^(f32(2i) / f32(R))
//   linear:  f_i / factor (HF scales inv_freq rather than positions; equal up to rounding, we follow HF)
//   proportional (Gemma 4's global layers): f_i as default for i < rope_angles (attr, default
//            R / 2), 0 beyond (those pairs pass through: cos 1, sin 0), each then / factor (default 1)
//   llama3:  _compute_llama3_parameters with factor, low_freq_factor, high_freq_factor and
//            original_max_position (= original_max_position_embeddings); all four are required.
// attention_factor (default 1, which is what HF uses for these three types) scales cos and sin.
//
// Rounding order (T = storage dtype; for f32 every "round to T" is a no-op):
//   1. theta^e is computed in f64 and rounded once to f32 (correctly rounded). torch on CPU uses
//      SLEEF's powf (1 ulp), which differs in ~1% of (theta, R, i) entries (e.g. theta 1e6, R 128,
//      i 37); at such an entry the angle differs by ~1 ulp, so large positions can differ from
//      HF-on-CPU by about |angle| * 2^-24 there. All entries for theta 1e4 / 5e5 and R 64, 80, 128 agree.
//   2. angle = f32(p) * f_i in f32 (exact HF); cos and sin of that f32 angle are evaluated in f64
//      and rounded to f32, times attention_factor in f32, then rounded to T (HF's cos.to(x.dtype)).
//   3. y = T(T(x * cos) + T(rotate_half(x) * sin)): each product rounded to T, then the sum, as
//      torch's elementwise bf16/f16 ops do. rope_bwd uses the same order, which is also the order of
//      torch autograd through apply_rotary_pos_emb, so bf16 forward and backward are HF's bit for
//      bit except where a cos/sin value differs by an ulp before its rounding to T.
//   qk_norm_rope_fwd (Qwen3RMSNorm, then RoPE): rstd = 1 / sqrt(sum(x^2) / D + eps) in f32,
//      n = T(w * T(x * rstd)), y = rope(n) as above. rstd [N, H] is saved in f32.
//      Attr weight_offset o (0; Gemma3RMSNorm's `1 + w` is o = 1): o != 0 gives
//      n = T(x * rstd * (w + o)), rounded once, as cpu/norm.cpp does for that case.
//   qk_norm_rope_bwd works in f32 and rounds once at the store: g = rope_bwd(dy) (unrounded, with
//      the T-rounded cos/sin of the forward), xhat = x rstd, w' = w + o (the forward's offset),
//      dx = rstd (g w' - xhat mean(g w' xhat)), dw = sum over tokens and heads of g xhat.
//
// cos/sin come from a per-call table: one row per position of [min pos, max pos] when that range
// is shorter than N (packed documents restarting at 0, batches of equal sequences), else one row
// per token. Positions are arbitrary int32 per token.
//
// The attributes and inv_freq are parsed in runtime/op_checks_rope.cpp (with the argument checks
// CUDA shares); the cos/sin table and rounding helpers live in cpu/rope.h (qkv_rope_cache uses them
// too); the rnd<bf16_t> / rnd<f16_t> bit tricks were checked equal to load(store<T>(x)) on all 2^32 floats.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/rope.h"

namespace surogate::cpu {

namespace {

constexpr int64_t kDwBlock = 32;  // tokens per dw partial sum (fixed: results do not depend on threads)

inline float dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
  }
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// rope_fwd / rope_bwd: (x[N,H,D], pos[N]) -> (y[N,H,D]); y may alias x.
Status rope_apply(const OpArgs& a, const char* op, float sign) {
  const Tensor& x = a.in(0);
  const Tensor& y = a.out(0);
  RopeArgs ra;
  SG_RETURN_IF_ERROR(check_rope(op, a, &ra));
  const int64_t N = ra.N, H = ra.H, D = ra.D;
  const RopeConfig& cfg = ra.rope;
  const int64_t R = cfg.rotary_dim, half = R / 2;
  const int32_t* pos = a.in(1).ptr<int32_t>();
  SG_DISPATCH_FLOAT(op, x.dtype, T, {
    CosSinTable table;
    SG_RETURN_IF_ERROR(build_table<T>(cfg, pos, N, &table));
    const float* cs_base = table.buf.ptr<float>();
    const T* px = x.ptr<T>();
    T* py = y.ptr<T>();
    const bool copy_pass = R < D && px != py;
    parallel_for(0, N, std::max<int64_t>(1, kRopeGrainElems / (H * D)), [&](int64_t n0, int64_t n1) {
      std::vector<float> buf(R);
      for (int64_t n = n0; n < n1; ++n) {
        const float* c = table.row(cs_base, n, pos[n], R);
        for (int64_t h = 0; h < H; ++h) {
          const T* xr = px + (n * H + h) * D;
          T* yr = py + (n * H + h) * D;
          load_row(xr, buf.data(), R);
          rotate_pairs(buf.data(), buf.data() + half, c, c + half, sign, yr, yr + half, half);
          if (copy_pass) std::memcpy(yr + R, xr + R, (D - R) * sizeof(T));
        }
      }
    });
  });
  return Status::OK();
}

Status rope_fwd(const OpArgs& a) { return rope_apply(a, "rope_fwd", 1.0f); }
Status rope_bwd(const OpArgs& a) { return rope_apply(a, "rope_bwd", -1.0f); }

// qk_norm_rope_fwd: (x[N,H,D], w[D], pos[N]) -> (y[N,H,D], rstd[N,H] f32); y may alias x.
Status qk_norm_rope_fwd(const OpArgs& a) {
  const char* op = "qk_norm_rope_fwd";
  const Tensor& x = a.in(0);
  const Tensor& w = a.in(1);
  const Tensor& y = a.out(0);
  const Tensor& rstd = a.out(1);
  RopeArgs ra;
  SG_RETURN_IF_ERROR(check_qk_norm_rope_fwd(a, &ra));
  const int64_t N = ra.N, H = ra.H, D = ra.D;
  const RopeConfig& cfg = ra.rope;
  const float eps = ra.eps;
  const float offset = static_cast<float>(a.attr().get_float("weight_offset", 0.0));
  const int64_t R = cfg.rotary_dim;
  const int32_t* pos = a.in(2).ptr<int32_t>();
  SG_DISPATCH_FLOAT(op, x.dtype, T, {
    CosSinTable table;
    SG_RETURN_IF_ERROR(build_table<T>(cfg, pos, N, &table));
    const float* cs_base = table.buf.ptr<float>();
    std::vector<float> wf(D);
    load_row(w.ptr<T>(), wf.data(), D);
    const T* px = x.ptr<T>();
    T* py = y.ptr<T>();
    float* pr = rstd.ptr<float>();
    parallel_for(0, N, std::max<int64_t>(1, kRopeGrainElems / (H * D)), [&](int64_t n0, int64_t n1) {
      std::vector<float> xs(D), nb(D);
      for (int64_t n = n0; n < n1; ++n) {
        const float* c = table.row(cs_base, n, pos[n], R);
        for (int64_t h = 0; h < H; ++h) {
          const T* xr = px + (n * H + h) * D;
          T* yr = py + (n * H + h) * D;
          load_row(xr, xs.data(), D);
          pr[n * H + h] = norm_rope_head(xs.data(), wf.data(), eps, c, D, R, nb.data(), yr, offset);
        }
      }
    });
  });
  return Status::OK();
}

// qk_norm_rope_bwd: (dy, x, w, rstd, pos) -> (dx, [dw]); attrs: accumulate (dw += instead of =).
Status qk_norm_rope_bwd(const OpArgs& a) {
  const char* op = "qk_norm_rope_bwd";
  const Tensor& dy = a.in(0);
  const Tensor& x = a.in(1);
  const Tensor& w = a.in(2);
  const Tensor& rstd = a.in(3);
  const Tensor& dx = a.out(0);
  RopeArgs ra;
  SG_RETURN_IF_ERROR(check_qk_norm_rope_bwd(a, &ra));
  const int64_t N = ra.N, H = ra.H, D = ra.D;
  const bool want_dw = ra.dw != nullptr;
  const bool accumulate = ra.accumulate;
  const RopeConfig& cfg = ra.rope;
  const float offset = static_cast<float>(a.attr().get_float("weight_offset", 0.0));
  const int64_t R = cfg.rotary_dim, half = R / 2;
  const int32_t* pos = a.in(4).ptr<int32_t>();
  const int64_t blocks = (N + kDwBlock - 1) / kDwBlock;
  SG_DISPATCH_FLOAT(op, x.dtype, T, {
    CosSinTable table;
    SG_RETURN_IF_ERROR(build_table<T>(cfg, pos, N, &table));
    const float* cs_base = table.buf.ptr<float>();
    Tensor partial;  // [blocks, D]: dw summed over the tokens of each block
    if (want_dw) SG_RETURN_IF_ERROR(empty({std::max<int64_t>(blocks, 1), D}, DType::kF32, Device{}, &partial));
    float* part = want_dw ? partial.ptr<float>() : nullptr;
    std::vector<float> wf(D);
    load_row(w.ptr<T>(), wf.data(), D);
    for (float& v : wf) v += offset;  // dx sees w + o; dw does not depend on it
    const T* pdy = dy.ptr<T>();
    const T* px = x.ptr<T>();
    T* pdx = dx.ptr<T>();
    const float* pr = rstd.ptr<float>();
    const float inv_d = 1.0f / static_cast<float>(D);
    parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
      std::vector<float> gv(D), xs(D), gw(D);
      for (int64_t b = b0; b < b1; ++b) {
        float* __restrict acc = part ? part + b * D : nullptr;
        if (acc) std::fill(acc, acc + D, 0.0f);
        for (int64_t n = b * kDwBlock; n < std::min(N, (b + 1) * kDwBlock); ++n) {
          const float* __restrict c = table.row(cs_base, n, pos[n], R);
          const float* __restrict s = c + half;
          for (int64_t h = 0; h < H; ++h) {
            const int64_t off = (n * H + h) * D;
            float* __restrict g = gv.data();
            float* __restrict xh = xs.data();
            float* __restrict q = gw.data();
            load_row(pdy + off, g, D);
            load_row(px + off, xh, D);
            for (int64_t i = 0; i < half; ++i) {  // g = rotation of dy by -angle
              const float g1 = g[i], g2 = g[i + half];
              g[i] = g1 * c[i] + g2 * s[i];
              g[i + half] = g2 * c[i] - g1 * s[i];
            }
            const float r = pr[n * H + h];
            for (int64_t j = 0; j < D; ++j) {
              xh[j] *= r;
              q[j] = g[j] * wf[j];
            }
            const float m = dot(q, xh, D) * inv_d;
            T* dxr = pdx + off;
            for (int64_t j = 0; j < D; ++j) dxr[j] = store<T>(r * (q[j] - xh[j] * m));
            if (acc) {
              for (int64_t j = 0; j < D; ++j) acc[j] += g[j] * xh[j];
            }
          }
        }
      }
    });
    if (want_dw) {
      std::vector<float> sum(D, 0.0f);
      for (int64_t b = 0; b < blocks; ++b) {
        const float* p = part + b * D;
        for (int64_t j = 0; j < D; ++j) sum[j] += p[j];
      }
      if (a.out(1).dtype == DType::kF32) {  // an f32 gradient accumulator (training a bf16 model)
        float* pdw = a.out(1).ptr<float>();
        for (int64_t j = 0; j < D; ++j) pdw[j] = accumulate ? pdw[j] + sum[j] : sum[j];
      } else {
        T* pdw = a.out(1).ptr<T>();
        for (int64_t j = 0; j < D; ++j) pdw[j] = store<T>(accumulate ? load(pdw[j]) + sum[j] : sum[j]);
      }
    }
  });
  return Status::OK();
}

}  // namespace

void register_cpu_rope(OpRegistry& reg) {
  add_op(reg, "rope_fwd", rope_fwd);
  add_op(reg, "rope_bwd", rope_bwd);
  add_op(reg, "qk_norm_rope_fwd", qk_norm_rope_fwd);
  add_op(reg, "qk_norm_rope_bwd", qk_norm_rope_bwd);
}

}  // namespace surogate::cpu
