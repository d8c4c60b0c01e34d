// CPU fused LM head + softmax cross-entropy: per-token loss from hidden states and the head
// weight without ever holding the [N, V] logits (at most row_block x chunk of them).
//
// Shape letters: N tokens, C channels (hidden size), V vocabulary.
//
// lm_head_ce_fwd: (h[N,C], W[V,C], targets[N] i32) -> (loss[N] f32, lse[N] f32). For a row with
// target t != ignore_index, z = h[n] @ W^T (z -> cap * tanh(z / cap) when softcap = cap > 0):
//   lse[n]  = log sum_v exp(z_v)                   (online over vocab chunks)
//   loss[n] = lse - (1 - eps) z_t - eps mean_v z_v  = (1 - eps) nll + eps mean_v(-log p_v),
// torch's label_smoothing = eps. Ignored rows get loss = lse = 0 and cost nothing: they are
// dropped before the GEMMs (SFT masks the prompt, often half the tokens).
//
// lm_head_ce_bwd: (h, W, targets, lse, dloss[N] f32) -> (dh[N,C], [dW[V,C]]). With
// dz = dloss[n] (softmax(z) - (1 - eps) onehot(t) - eps / V), times 1 - (z / cap)^2 under a
// softcap: dh = dz @ W (overwritten; 0 on ignored rows), dW = dz^T @ h (accumulate: added).
// An absent dW (frozen head, LoRA) skips its GEMM.
//
// Loop order: vocab chunks outside, row blocks inside. Each W chunk is widened to f32 once,
// the online-logsumexp state is O(N) and h blocks are re-widened per chunk, which costs
// C element copies per row against 2 * chunk * C GEMM flops.
//
// Just over 400 lines: forward and backward stay together, as they share the row kernels
// (exp, tanh, online logsumexp), the argument checks and the operand widening.
#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/common.h"
#include "runtime/op_checks_matmul.h"
#include "cpu/vec_math.h"
#include "cpu/gemm.h"

namespace surogate::cpu {

namespace {

constexpr int64_t kLogitsElems = int64_t{1} << 21;  // logits per row block: 8 MiB of f32, 512 rows at chunk 4096
constexpr int64_t kMinRows = 16;
constexpr int64_t kGrainElems = 1 << 16;  // elements per parallel_for task: >= ~10 us, well above a wake-up
constexpr int kLanes = 16;  // independent accumulators: reductions vectorize without reassociation

int64_t row_grain(int64_t row_len) { return std::max<int64_t>(1, kGrainElems / std::max<int64_t>(row_len, 1)); }

// Row kernels. Compares go through order_key, the integer image of IEEE order: under GCC's
// default -ftrapping-math a float compare-and-select is left scalar on AVX2 / SSE2 targets
// while an integer one vectorizes. A NaN has the largest key, so a row max keeps it.
constexpr int32_t order_key(float x) {
  const int32_t b = std::bit_cast<int32_t>(x);
  return b ^ ((b >> 31) & 0x7fffffff);
}
constexpr float from_order_key(int32_t k) { return std::bit_cast<float>(k ^ ((k >> 31) & 0x7fffffff)); }
inline int32_t max_i(int32_t a, int32_t b) { return a > b ? a : b; }
inline int32_t min_i(int32_t a, int32_t b) { return a < b ? a : b; }


SG_CPU_CLONES void softcap_row(float* z, int64_t n, float cap) {
  const float inv = 1.0f / cap;
  for (int64_t i = 0; i < n; ++i) z[i] = cap * tanh_approx(z[i] * inv);
}

// One chunk of a row into the online logsumexp (*m: running max, *s: sum of exp(z - *m)) and,
// when zsum is given, into the running sum of z (label smoothing's mean).
SG_CPU_CLONES void lse_update(const float* z, int64_t n, float* m, float* s, float* zsum) {
  int32_t key = order_key(-std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < n; ++i) key = max_i(key, order_key(z[i]));
  const float cmax = from_order_key(key);
  const float m_new = *m > cmax ? *m : cmax;

  float es[kLanes] = {}, zs[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      es[j] += exp_approx(z[i + j] - m_new);
      zs[j] += z[i + j];
    }
  }
  for (; i < n; ++i) {
    es[0] += exp_approx(z[i] - m_new);
    zs[0] += z[i];
  }
  float esum = 0.0f, ztot = 0.0f;
  for (int j = 0; j < kLanes; ++j) {
    esum += es[j];
    ztot += zs[j];
  }
  *s = *s * std::exp(*m - m_new) + esum;  // exp(-inf) = 0 on the first chunk
  *m = m_new;
  if (zsum) *zsum += ztot;
}

// Chunk logits z of one row -> dz = dl * (exp(z - lse) - eps_v), in place; the target's extra
// -dl * (1 - eps) is the caller's. Under a softcap z is the raw logit, capped here.
SG_CPU_CLONES void grad_row(float* z, int64_t n, float lse, float dl, float eps_v, float cap) {
  if (cap > 0.0f) {
    const float inv = 1.0f / cap;
    for (int64_t i = 0; i < n; ++i) {
      const float t = tanh_approx(z[i] * inv);
      z[i] = dl * (exp_approx(cap * t - lse) - eps_v) * (1.0f - t * t);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) z[i] = dl * (exp_approx(z[i] - lse) - eps_v);
  }
}

// Rows whose target is not ignore_index, ascending; a target outside [0, V) fails naming its row.
Status valid_rows(const char* op, const Tensor& targets, int64_t V, int64_t ignore, std::vector<int64_t>* rows) {
  const int32_t* t = targets.ptr<int32_t>();
  rows->clear();
  for (int64_t n = 0; n < targets.shape[0]; ++n) {
    if (t[n] == ignore) continue;
    SG_CHECK(t[n] >= 0 && t[n] < V, StatusCode::kInvalidArgument,
             str_cat(op, ": targets[", n, "] = ", t[n], " is outside the vocabulary [0, ", V, ")"),
             str_cat("mask padding and prompt tokens with ignore_index (", ignore, ")"));
    rows->push_back(n);
  }
  return Status::OK();
}

// The f32 operands of one GEMM step: W's vocab rows [v0, v0+vc) and the valid rows
// rows[b0 : b0+rb) of h, widened into scratch unless already f32 and contiguous in memory.
struct Operands {
  const Tensor& h;
  const Tensor& W;
  const std::vector<int64_t>& rows;
  float* h_buf;  // [rb, C] scratch, or null when h is f32 and every row is valid
  float* w_buf;  // [chunk, C] scratch, or null when W is f32

  int64_t C() const { return h.shape[1]; }

  const float* w_chunk(int64_t v0, int64_t vc) const {
    const int64_t c = C();
    if (!w_buf) return W.ptr<float>() + v0 * c;
    const char* src = static_cast<const char*>(W.data);
    const size_t es = dtype_size(W.dtype);
    parallel_for(0, vc, row_grain(c), [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) to_f32(src + (v0 + i) * c * es, W.dtype, w_buf + i * c, c);
    });
    return w_buf;
  }

  const float* h_block(int64_t b0, int64_t rb) const {
    const int64_t c = C();
    if (h.dtype == DType::kF32 && rows[b0 + rb - 1] - rows[b0] == rb - 1) return h.ptr<float>() + rows[b0] * c;
    const char* src = static_cast<const char*>(h.data);
    const size_t es = dtype_size(h.dtype);
    parallel_for(0, rb, row_grain(c), [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) to_f32(src + rows[b0 + i] * c * es, h.dtype, h_buf + i * c, c);
    });
    return h_buf;
  }
};

// Scratch of n f32 values from the caching allocator; `buf` keeps it alive.
Status scratch(int64_t n, Tensor* buf, float** out) {
  SG_RETURN_IF_ERROR(empty({n}, DType::kF32, Device{}, buf));
  *out = buf->ptr<float>();
  return Status::OK();
}

Status lm_head_ce_fwd(const OpArgs& a) {
  const char* op = "lm_head_ce_fwd";
  const Tensor& h = a.in(0);
  const Tensor& W = a.in(1);
  const Tensor& targets = a.in(2);
  const Tensor& loss = a.out(0);
  const Tensor& lse = a.out(1);
  LmHeadCeArgs at;
  SG_RETURN_IF_ERROR(check_lm_head_ce_fwd(a, &at));
  const int64_t N = at.N, C = at.C, V = at.V;
  std::vector<int64_t> rows;
  SG_RETURN_IF_ERROR(valid_rows(op, targets, V, at.ignore_index, &rows));
  std::fill_n(loss.ptr<float>(), N, 0.0f);
  std::fill_n(lse.ptr<float>(), N, 0.0f);
  const int64_t nv = static_cast<int64_t>(rows.size());
  if (nv == 0) return Status::OK();  // also covers V == 0: every target would be out of range

  const int64_t Vc = std::min(at.chunk, V);
  const int64_t RB = std::min(nv, std::max(kMinRows, kLogitsElems / Vc));
  Tensor l_t, h_t, w_t;
  float *logits = nullptr, *h_buf = nullptr, *w_buf = nullptr;
  SG_RETURN_IF_ERROR(scratch(RB * Vc, &l_t, &logits));
  if (h.dtype != DType::kF32 || nv != N) SG_RETURN_IF_ERROR(scratch(RB * C, &h_t, &h_buf));
  if (W.dtype != DType::kF32) SG_RETURN_IF_ERROR(scratch(Vc * C, &w_t, &w_buf));
  const Operands ops{h, W, rows, h_buf, w_buf};

  // Online state per valid row: running max, sum of exp, target logit, sum of logits.
  std::vector<float> m(nv, -std::numeric_limits<float>::infinity()), s(nv, 0.0f), zt(nv, 0.0f), zsum(nv, 0.0f);
  const int32_t* tgt = targets.ptr<int32_t>();
  for (int64_t v0 = 0; v0 < V; v0 += Vc) {
    const int64_t vc = std::min(Vc, V - v0);
    const float* wp = ops.w_chunk(v0, vc);
    for (int64_t b0 = 0; b0 < nv; b0 += RB) {
      const int64_t rb = std::min(RB, nv - b0);
      SG_RETURN_IF_ERROR(gemm_f32(op, false, true, rb, vc, C, 1.0f, ops.h_block(b0, rb), C, wp, C, 0.0f, logits, vc));
      parallel_for(0, rb, row_grain(vc), [&](int64_t lo, int64_t hi) {
        for (int64_t r = lo; r < hi; ++r) {
          const int64_t j = b0 + r;
          float* z = logits + r * vc;
          if (at.cap > 0.0f) softcap_row(z, vc, at.cap);
          const int64_t t = tgt[rows[j]] - v0;
          if (t >= 0 && t < vc) zt[j] = z[t];
          lse_update(z, vc, &m[j], &s[j], at.eps > 0.0f ? &zsum[j] : nullptr);
        }
      });
    }
  }
  float* lo = loss.ptr<float>();
  float* ls = lse.ptr<float>();
  for (int64_t j = 0; j < nv; ++j) {
    const float l = m[j] + std::log(s[j]);
    ls[rows[j]] = l;
    lo[rows[j]] = l - (1.0f - at.eps) * zt[j] - at.eps * zsum[j] / static_cast<float>(V);
  }
  return Status::OK();
}

Status lm_head_ce_bwd(const OpArgs& a) {
  const char* op = "lm_head_ce_bwd";
  const Tensor& h = a.in(0);
  const Tensor& W = a.in(1);
  const Tensor& targets = a.in(2);
  const Tensor& lse = a.in(3);
  const Tensor& dloss = a.in(4);
  const Tensor& dh = a.out(0);
  LmHeadCeArgs at;
  SG_RETURN_IF_ERROR(check_lm_head_ce_bwd(a, &at));
  const bool has_dw = at.dW != nullptr;
  const int64_t N = at.N, C = at.C, V = at.V;
  const bool accumulate = at.accumulate;
  std::vector<int64_t> rows;
  SG_RETURN_IF_ERROR(valid_rows(op, targets, V, at.ignore_index, &rows));
  const int64_t nv = static_cast<int64_t>(rows.size());
  if (nv == 0) {
    SG_RETURN_IF_ERROR(fill_zero(dh));
    if (has_dw && !accumulate) SG_RETURN_IF_ERROR(fill_zero(a.out(1)));
    return Status::OK();
  }

  const int64_t Vc = std::min(at.chunk, V);
  const int64_t RB = std::min(nv, std::max(kMinRows, kLogitsElems / Vc));
  Tensor l_t, h_t, w_t, dh_t, dw_t;
  float *logits = nullptr, *h_buf = nullptr, *w_buf = nullptr;
  SG_RETURN_IF_ERROR(scratch(RB * Vc, &l_t, &logits));
  if (h.dtype != DType::kF32 || nv != N) SG_RETURN_IF_ERROR(scratch(RB * C, &h_t, &h_buf));
  if (W.dtype != DType::kF32) SG_RETURN_IF_ERROR(scratch(Vc * C, &w_t, &w_buf));
  const Operands ops{h, W, rows, h_buf, w_buf};

  // dh accumulates over vocab chunks in f32: in dh itself when it is f32 and every row is
  // valid, else in a compact [valid rows, C] buffer scattered into dh at the end.
  const bool dh_direct = dh.dtype == DType::kF32 && nv == N;
  float* dh_acc = dh_direct ? dh.ptr<float>() : nullptr;
  if (!dh_direct) SG_RETURN_IF_ERROR(scratch(nv * C, &dh_t, &dh_acc));
  // dW chunk: sgemm accumulates straight into an f32 dW, else into a chunk buffer rounded once.
  const bool dw_direct = has_dw && a.out(1).dtype == DType::kF32;
  float* dw_buf = nullptr;
  if (has_dw && !dw_direct) SG_RETURN_IF_ERROR(scratch(Vc * C, &dw_t, &dw_buf));

  const int32_t* tgt = targets.ptr<int32_t>();
  const float* lse_p = lse.ptr<float>();
  const float* dl_p = dloss.ptr<float>();
  const float eps_v = at.eps / static_cast<float>(V);
  for (int64_t v0 = 0; v0 < V; v0 += Vc) {
    const int64_t vc = std::min(Vc, V - v0);
    const float* wp = ops.w_chunk(v0, vc);
    float* dwp = dw_direct ? a.out(1).ptr<float>() + v0 * C : dw_buf;
    for (int64_t b0 = 0; b0 < nv; b0 += RB) {
      const int64_t rb = std::min(RB, nv - b0);
      const float* hp = ops.h_block(b0, rb);
      SG_RETURN_IF_ERROR(gemm_f32(op, false, true, rb, vc, C, 1.0f, hp, C, wp, C, 0.0f, logits, vc));
      parallel_for(0, rb, row_grain(vc), [&](int64_t lo, int64_t hi) {
        for (int64_t r = lo; r < hi; ++r) {
          const int64_t n = rows[b0 + r];
          float* z = logits + r * vc;
          const int64_t t = tgt[n] - v0;
          const float zt_raw = (t >= 0 && t < vc) ? z[t] : 0.0f;
          grad_row(z, vc, lse_p[n], dl_p[n], eps_v, at.cap);
          if (t >= 0 && t < vc) {
            const float th = at.cap > 0.0f ? std::tanh(zt_raw / at.cap) : 0.0f;
            z[t] -= dl_p[n] * (1.0f - at.eps) * (1.0f - th * th);
          }
        }
      });
      SG_RETURN_IF_ERROR(gemm_f32(op, false, false, rb, C, vc, 1.0f, logits, vc, wp, C, v0 == 0 ? 0.0f : 1.0f,
                                  dh_acc + b0 * C, C));
      if (has_dw) {
        const bool fresh = b0 == 0 && !(accumulate && dw_direct);
        SG_RETURN_IF_ERROR(
            gemm_f32(op, true, false, vc, C, rb, 1.0f, logits, vc, hp, C, fresh ? 0.0f : 1.0f, dwp, C));
      }
    }
    if (has_dw && !dw_direct) {
      const Tensor& dW = a.out(1);
      char* dst = static_cast<char*>(dW.data) + v0 * C * dtype_size(dW.dtype);
      const size_t row_bytes = C * dtype_size(dW.dtype);
      parallel_for(0, vc, row_grain(C), [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) {
          if (accumulate) add_from_f32(dw_buf + i * C, dst + i * row_bytes, dW.dtype, C);
          else from_f32(dw_buf + i * C, dst + i * row_bytes, dW.dtype, C);
        }
      });
    }
  }

  if (!dh_direct) {
    std::vector<int64_t> slot(N, -1);
    for (int64_t j = 0; j < nv; ++j) slot[rows[j]] = j;
    char* dst = static_cast<char*>(dh.data);
    const size_t row_bytes = C * dtype_size(dh.dtype);
    parallel_for(0, N, row_grain(C), [&](int64_t lo, int64_t hi) {
      for (int64_t n = lo; n < hi; ++n) {
        if (slot[n] < 0) std::memset(dst + n * row_bytes, 0, row_bytes);
        else from_f32(dh_acc + slot[n] * C, dst + n * row_bytes, dh.dtype, C);
      }
    });
  }
  return Status::OK();
}

}  // namespace

void register_cpu_cross_entropy(OpRegistry& reg) {
  add_op(reg, "lm_head_ce_fwd", lm_head_ce_fwd);
  add_op(reg, "lm_head_ce_bwd", lm_head_ce_bwd);
}

}  // namespace surogate::cpu
