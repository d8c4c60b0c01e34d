// CPU attention over packed variable-length documents: attention_fwd and attention_bwd.
//
// Shapes: N tokens (all documents of a batch, packed), Hq query heads, Hkv key/value heads,
// D head dim, G = Hq / Hkv query heads per kv head (GQA: query head h reads kv head h / G).
// cu_seqlens[S+1] (int32, cu[0] = 0, cu[S] = N) delimits the documents; attention never
// crosses a document. Positions i (query) and j (key) below are counted from the document start.
//
//   s_ij = scale * q_i . k_j                      scale defaults to 1/sqrt(D) (attr <= 0: default)
//   s_ij = softcap * tanh(s_ij / softcap)         when softcap > 0 (Gemma 2)
//   out_i = sum_j softmax_j(s_ij) v_j,  lse_i = log sum_j exp(s_ij)   over the visible keys j
//
// Visible keys, matching transformers' masking_utils (the mask its sdpa path builds):
//   causal,  window = 0: j <= i
//   causal,  window = W: i - W < j <= i          (sliding_window_overlay: a token sees itself
//                                                  and the W-1 before it; Mistral, Qwen2, Gemma 2)
//   !causal, window = 0: every key of the document
//   !causal, window = W: |i - j| <= W            (sliding_window_bidirectional_overlay)
//   causal + kv_limit:   key_lo(i) <= j <= kv_limit[i]   (optional input kv_limit[N] i32: Gemma 3's
//                        bidirectional image spans, the span's last index for its tokens, i for
//                        the rest; the window keeps its lower bound, as transformers'
//                        AND(sliding_window_overlay, OR(causal, blockwise_overlay)))
// Every query sees at least itself, so no row of the softmax is empty. kv_limit is validated
// (i <= kv_limit[i] < L, nondecreasing in i), so both key bounds stay nondecreasing in i and
// the queries of a key stay one interval, [lowest i with kv_limit[i] >= j, ...).
//
// Attention sinks (GPT-OSS; optional input sinks[Hq]): a logit z_h per query head joins every
// row's softmax denominator and carries no value, as transformers' eager_attention_forward
// (cat the sink column, softmax, drop it):
//   out_i = sum_j exp(s_ij) v_j / (sum_j exp(s_ij) + exp(z_h)),  lse_i = log(sum_j exp(s_ij) + exp(z_h))
// With that lse, P = exp(s - lse) is the row's probability and the backward below is unchanged;
// the sink's own gradient is dz_h = -sum_i exp(z_h - lse_i) Delta_i (its dP is 0: no value).
//
// Backward (FlashAttention-2): with P = exp(s - lse) recomputed tile by tile and
// Delta_i = dout_i . out_i,
//   dV = P^T dO,  dP = dO V^T,  dS = P * (dP - Delta) [* (1 - tanh^2) under softcap],
//   dQ = scale * dS K,  dK = scale * dS^T Q.
//
// How it runs. Both directions work on tiles of up to kTileRows query rows (a row is one
// (token, query head) pair; the G heads that share a kv head sit in the same tile, so one K/V
// tile serves all of them) against kBlockK keys. Scores live only per tile: the forward keeps a
// running max and sum per row (online softmax), never an N x N matrix. Operands are first copied
// to f32 in layouts where every tile is one contiguous block (see "operands in f32"), and every
// product of two tiles goes through one register-blocked micro-kernel (gemm_tile) whose inner
// loop runs over contiguous output columns, so GCC vectorizes it without -ffast-math. The hot
// functions are compiled for x86-64-v4 (AVX-512), v3 (AVX2) and baseline and picked at load time.
//   forward:  parallel over (document, kv head, query block).
//   backward: parallel over (document, kv head, key chunk). An item owns dK and dV of its keys,
//             so those need no synchronization; dQ goes to an f32 accumulator per key chunk
//             (one chunk unless there are too few (document, kv head) pairs to fill the
//             threads), summed into dq at the end.
//
// The file is longer than most op groups (~700 lines) because the two directions share the
// micro-kernel, the mask arithmetic, the f32 staging and the vectorizable exp / tanh, and
// splitting them would put half of each derivation out of sight of the other.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <vector>

#include "cpu/common.h"
#include "cpu/vec_math.h"
#include "runtime/op_checks_attention.h"

namespace surogate::cpu {

namespace {

constexpr int kBlockK = 64;    // keys per tile
constexpr int kTileRows = 64;  // query rows (token x head) per tile, at least G

// ---- the micro-kernel: C[M][W] (+)= op(A)[M][K] B[K][W], f32, row-major with leading dims ---
// op(A) = A[M][K], or A^T for A stored [K][M] (kTransA: dV = P^T dO and dK = dS^T Q read P and
// dS as they are, no transposed copy).

// NR (4 or 1) rows of C times NW columns held in accumulators while k runs: each B row loaded
// once feeds NR FMAs. Four named arrays rather than c[4][NW]: GCC keeps those in registers.
template <bool kTransA, int NR, int NW>
inline __attribute__((always_inline)) void gemm_block(float* __restrict C, int64_t ldc, const float* __restrict A,
                                                      int64_t lda, const float* __restrict B, int64_t ldb, int K,
                                                      bool acc) {
  static_assert(NR == 4 || NR == 1);
  float a0[NW], a1[NW], a2[NW], a3[NW];
  for (int j = 0; j < NW; ++j) {
    a0[j] = acc ? C[j] : 0.0f;
    if constexpr (NR == 4) {
      a1[j] = acc ? C[ldc + j] : 0.0f;
      a2[j] = acc ? C[2 * ldc + j] : 0.0f;
      a3[j] = acc ? C[3 * ldc + j] : 0.0f;
    }
  }
  // Row i of op(A) at column k: A[k * lda + i] when transposed (4 adjacent floats), else A[i * lda + k].
  const int64_t step_k = kTransA ? lda : 1, step_i = kTransA ? 1 : lda;
  for (int k = 0; k < K; ++k) {
    const float* b = B + k * ldb;
    const float* a = A + k * step_k;
    const float x0 = a[0];
    if constexpr (NR == 4) {
      const float x1 = a[step_i], x2 = a[2 * step_i], x3 = a[3 * step_i];
      for (int j = 0; j < NW; ++j) {
        a0[j] += x0 * b[j];
        a1[j] += x1 * b[j];
        a2[j] += x2 * b[j];
        a3[j] += x3 * b[j];
      }
    } else {
      for (int j = 0; j < NW; ++j) a0[j] += x0 * b[j];
    }
  }
  for (int j = 0; j < NW; ++j) {
    C[j] = a0[j];
    if constexpr (NR == 4) {
      C[ldc + j] = a1[j];
      C[2 * ldc + j] = a2[j];
      C[3 * ldc + j] = a3[j];
    }
  }
}

template <bool kTransA, int NR, int NW>
inline __attribute__((always_inline)) void gemm_strip(float* C, int64_t ldc, const float* A, int64_t lda,
                                                      const float* B, int64_t ldb, int W, int K, bool acc) {
  int j = 0;
  for (; j + NW <= W; j += NW) gemm_block<kTransA, NR, NW>(C + j, ldc, A, lda, B + j, ldb, K, acc);
  if constexpr (NW > 16) {
    for (; j + 16 <= W; j += 16) gemm_block<kTransA, NR, 16>(C + j, ldc, A, lda, B + j, ldb, K, acc);
  }
  for (; j + 4 <= W; j += 4) gemm_block<kTransA, NR, 4>(C + j, ldc, A, lda, B + j, ldb, K, acc);
  for (; j < W; ++j) gemm_block<kTransA, NR, 1>(C + j, ldc, A, lda, B + j, ldb, K, acc);
}

template <bool kTransA, int NW>
inline __attribute__((always_inline)) void gemm_rows(float* C, int64_t ldc, const float* A, int64_t lda,
                                                     const float* B, int64_t ldb, int M, int W, int K, bool acc) {
  int r = 0;
  for (; r + 4 <= M; r += 4) {
    gemm_strip<kTransA, 4, NW>(C + r * ldc, ldc, kTransA ? A + r : A + r * lda, lda, B, ldb, W, K, acc);
  }
  for (; r < M; ++r) {
    gemm_strip<kTransA, 1, NW>(C + r * ldc, ldc, kTransA ? A + r : A + r * lda, lda, B, ldb, W, K, acc);
  }
}

// gemm_tile: C (+)= A B; gemm_tile_ta: C (+)= A^T B. One version per x86-64 level, dispatched at
// load time (GCC function multiversioning), because the best block differs: 4 x 16 for AVX-512
// and baseline SSE2, 4 x 32 for AVX2 (GCC's code for 4 x 16 keeps AVX2 accumulators on the
// stack). Measured on the micro-kernel alone: ~100 / 68 / 36 GFLOP/s per core (Zen 4).
#define SG_GEMM_VERSION(TARGET, NW)                                                                        \
  TARGET void gemm_tile(float* C, int64_t ldc, const float* A, int64_t lda, const float* B, int64_t ldb, int M, \
                        int W, int K, bool acc) {                                                          \
    gemm_rows<false, NW>(C, ldc, A, lda, B, ldb, M, W, K, acc);                                            \
  }                                                                                                        \
  TARGET void gemm_tile_ta(float* C, int64_t ldc, const float* A, int64_t lda, const float* B, int64_t ldb,   \
                           int M, int W, int K, bool acc) {                                                \
    gemm_rows<true, NW>(C, ldc, A, lda, B, ldb, M, W, K, acc);                                             \
  }
#if defined(__x86_64__) && !defined(__clang__)
SG_GEMM_VERSION(__attribute__((target("default"))), 16)
SG_GEMM_VERSION(__attribute__((target("arch=x86-64-v3"))), 32)
SG_GEMM_VERSION(__attribute__((target("arch=x86-64-v4"))), 16)
#else
SG_GEMM_VERSION(, 16)
#endif
#undef SG_GEMM_VERSION

// ---- masks -------------------------------------------------------------------------------

// The checked shapes and attrs (runtime/op_checks_attention.h) and the tile size.
struct AttnConfig : AttentionArgs {
  int64_t tile_tokens = 1;  // query tokens per tile: kTileRows / G, at least 1

  const int32_t* limits = nullptr;  // the kv_limit input's values (validated), or null

  // The document's slice of kv_limit (null without one): `lim` below.
  const int32_t* doc_limit(int64_t base) const { return limits ? limits + base : nullptr; }

  // Keys [key_lo(i), key_hi(i)) are visible to query i of a document of length L; both bounds
  // are nondecreasing in i, which the tile loops below rely on (a kv_limit is validated to be).
  int64_t key_lo(int64_t i) const {
    if (window <= 0) return 0;
    return std::max<int64_t>(0, causal ? i - window + 1 : i - window);
  }
  int64_t key_hi(int64_t i, int64_t L, const int32_t* lim) const {
    if (causal) return lim ? lim[i] + 1 : i + 1;
    return window > 0 ? std::min(L, i + window + 1) : L;
  }
  // The queries that see at least one key of [k0, k1): the inverse of the two bounds above. With
  // a kv_limit the first is the lowest i with lim[i] >= k0 (at most k0: lim[k0] >= k0).
  void query_range(int64_t k0, int64_t k1, int64_t L, const int32_t* lim, int64_t* q0, int64_t* q1) const {
    if (causal) {
      *q0 = lim ? std::lower_bound(lim, lim + k0, static_cast<int32_t>(k0)) - lim : k0;
      *q1 = window > 0 ? std::min(L, k1 + window - 1) : L;
    } else if (window > 0) {
      *q0 = std::max<int64_t>(0, k0 - window);
      *q1 = std::min(L, k1 + window);
    } else {
      *q0 = 0;
      *q1 = L;
    }
  }
};

// Per token of a query tile, the visible columns [lo, hi) of the key tile [k0, k0 + nk).
void tile_columns(const AttnConfig& c, int64_t L, const int32_t* lim, int64_t t0, int64_t nt, int64_t k0, int64_t nk,
                  int* lo, int* hi) {
  for (int64_t ti = 0; ti < nt; ++ti) {
    lo[ti] = static_cast<int>(std::clamp<int64_t>(c.key_lo(t0 + ti) - k0, 0, nk));
    hi[ti] = static_cast<int>(std::clamp<int64_t>(c.key_hi(t0 + ti, L, lim) - k0, 0, nk));
  }
}

// ---- validation --------------------------------------------------------------------------

// The shared checks, then those that read cu_seqlens' values (host memory).
Status read_config(const char* op, const OpArgs& a, bool backward, const Tensor& cu, AttnConfig* c) {
  SG_RETURN_IF_ERROR(backward ? check_attention_bwd(a, c) : check_attention_fwd(a, c));
  c->tile_tokens = std::max<int64_t>(1, kTileRows / c->G);
  const int32_t* cs = cu.ptr<int32_t>();
  SG_CHECK(cs[0] == 0, StatusCode::kInvalidArgument, str_cat(op, ": cu_seqlens[0] is ", cs[0], ", must be 0"),
           "cu_seqlens holds document start offsets: [0, len0, len0 + len1, ..., N]");
  for (int64_t s = 0; s < c->S; ++s) {
    SG_CHECK(cs[s + 1] >= cs[s], StatusCode::kInvalidArgument,
             str_cat(op, ": cu_seqlens is not nondecreasing (cu_seqlens[", s, "] = ", cs[s], ", cu_seqlens[", s + 1,
                     "] = ", cs[s + 1], ")"),
             "cu_seqlens holds cumulative document lengths");
  }
  SG_CHECK(cs[c->S] == c->N, StatusCode::kInvalidArgument,
           str_cat(op, ": cu_seqlens ends at ", cs[c->S], " but q has N = ", c->N, " tokens"),
           "the last offset of cu_seqlens is the total token count");
  if (c->kv_limit == nullptr) return Status::OK();
  const int32_t* lim = c->kv_limit->ptr<int32_t>();
  for (int64_t s = 0; s < c->S; ++s) {
    const int64_t L = cs[s + 1] - cs[s];
    for (int64_t i = 0; i < L; ++i) {
      const int64_t v = lim[cs[s] + i], prev = i > 0 ? lim[cs[s] + i - 1] : 0;
      SG_CHECK(v >= i && v < L && v >= prev, StatusCode::kInvalidArgument,
               str_cat(op, ": kv_limit[", cs[s] + i, "] = ", v, " for token ", i, " of document ", s, " (length ", L,
                       "); each must lie in [its own index, L - 1] and not fall below the one before"),
               "kv_limit counts from the document's start: i for a causal token, the span's last index for a "
               "token of a bidirectional span");
    }
  }
  c->limits = lim;
  return Status::OK();
}

// ---- operands in f32 ----------------------------------------------------------------------
// Each direction first copies the operands its inner loop re-reads into f32, in layouts where a
// tile is one contiguous block the micro-kernel reads in place: bf16 / f16 are converted once,
// not once per tile pair, and no tile is gathered from rows Hq * D apart.
//   forward:  K and V [Hkv][N][D]; K is stored by key tile (kBlockK keys of one document, fewer
//             at its end) as that tile's K^T [D][nk], so the tiles pack into N rows exactly
//   backward: scale * Q and dO [Hkv][N][G][D] (the G query heads of a kv head, token after token),
//             lse and Delta [Hkv][N][G], dQ accumulators [chunk][Hkv][N][G][D]
// The price is scratch the size of k and v (forward) or a few times q (backward).

// 64-byte aligned f32 scratch owned by one worker.
struct Scratch {
  float* p = nullptr;
  explicit Scratch(size_t n) : p(static_cast<float*>(std::aligned_alloc(64, ((n * 4 + 63) / 64) * 64))) {}
  ~Scratch() { std::free(p); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
};

// The key tiles of all documents: (document, tile within it).
std::vector<std::pair<int64_t, int64_t>> key_tiles(const AttnConfig& c, const int32_t* cu) {
  std::vector<std::pair<int64_t, int64_t>> tiles;
  for (int64_t s = 0; s < c.S; ++s) {
    for (int64_t b = 0; b * kBlockK < cu[s + 1] - cu[s]; ++b) tiles.emplace_back(s, b);
  }
  return tiles;
}

// Tokens [tok, tok + n) of kv head h as rows [n][D] and/or columns [D][ld] (K^T, V^T: the B
// operand of Q K^T and dO V^T).
template <typename T>
void load_kv(const T* x, int64_t H, int64_t D, int64_t tok, int64_t n, int64_t h, float* rows, float* cols,
             int64_t ld) {
  for (int64_t j = 0; j < n; ++j) {
    const T* src = x + ((tok + j) * H + h) * D;
    if (rows) {
      for (int64_t d = 0; d < D; ++d) rows[j * D + d] = load(src[d]);
    }
    if (cols) {
      for (int64_t d = 0; d < D; ++d) cols[d * ld + j] = load(src[d]);
    }
  }
}

// x[N][Hq][D] -> mul * x as y[Hkv][N][G][D]. The G heads of a token are adjacent on both sides.
template <typename T>
void to_group_major(const AttnConfig& c, const T* x, float mul, float* y) {
  const int64_t N = c.N, GD = c.G * c.D;
  parallel_for(0, N, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t tok = lo; tok < hi; ++tok) {
      for (int64_t kvh = 0; kvh < c.Hkv; ++kvh) {
        const T* src = x + tok * c.Hq * c.D + kvh * GD;
        float* dst = y + (kvh * N + tok) * GD;
        for (int64_t e = 0; e < GD; ++e) dst[e] = load(src[e]) * mul;
      }
    }
  });
}

// ---- forward -----------------------------------------------------------------------------

// max and sum of x[0, n) with 16 independent lanes: a plain float reduction is a serial chain
// the compiler may not reorder (no -ffast-math), so it would neither vectorize nor pipeline.
inline float row_max(const float* x, int n) {
  float lane[16];
  for (int j = 0; j < 16; ++j) lane[j] = -std::numeric_limits<float>::infinity();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) lane[j] = select_lt(lane[j], x[i + j], x[i + j], lane[j]);
  }
  for (; i < n; ++i) lane[0] = std::max(lane[0], x[i]);
  float mx = lane[0];
  for (int j = 1; j < 16; ++j) mx = std::max(mx, lane[j]);
  return mx;
}

inline float row_sum(const float* x, int n) {
  float lane[16] = {};
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) lane[j] += x[i + j];
  }
  for (; i < n; ++i) lane[0] += x[i];
  float sum = 0.0f;
  for (int j = 0; j < 16; ++j) sum += lane[j];
  return sum;
}

// One key tile of the online softmax for R rows: scores S[R][ldS] (visible columns
// [lo, hi) per token, row r = token r / G) become probabilities relative to the running max m;
// the running sum l and the output accumulator O[R][D] are rescaled when the max moves.
SG_CPU_CLONES
void softmax_tile(float* S, int64_t ldS, int nk, int R, int G, const int* lo, const int* hi, float softcap, float* m,
                  float* l, float* O, int64_t D) {
  for (int r = 0; r < R; ++r) {
    float* s = S + r * ldS;
    const int c0 = lo[r / G], c1 = hi[r / G];
    if (c0 >= c1) {
      for (int c = 0; c < nk; ++c) s[c] = 0.0f;
      continue;
    }
    if (softcap > 0.0f) {
      const float inv = 1.0f / softcap;
      for (int c = c0; c < c1; ++c) s[c] = softcap * tanh_approx(s[c] * inv);
    }
    const float m_new = std::max(m[r], row_max(s + c0, c1 - c0));
    const float corr = std::exp(m[r] - m_new);  // 0 on the first tile (m = -inf)
    for (int c = 0; c < c0; ++c) s[c] = 0.0f;
    for (int c = c0; c < c1; ++c) s[c] = exp_approx(s[c] - m_new);
    for (int c = c1; c < nk; ++c) s[c] = 0.0f;
    const float sum = row_sum(s + c0, c1 - c0);
    l[r] = l[r] * corr + sum;
    m[r] = m_new;
    if (corr != 1.0f) {
      float* o = O + r * D;
      for (int64_t d = 0; d < D; ++d) o[d] *= corr;
    }
  }
}

template <typename T>
Status attention_fwd_impl(const AttnConfig& c, const T* q, const T* k, const T* v, const int32_t* cu, T* out,
                          float* lse, const std::vector<float>& sinks) {
  const int64_t N = c.N, D = c.D, G = c.G, Bt = c.tile_tokens, R_max = Bt * G;
  const auto tiles = key_tiles(c, cu);
  const int64_t n_tiles = static_cast<int64_t>(tiles.size());
  Tensor kt_t, v_t;
  SG_RETURN_IF_ERROR(empty({c.Hkv, std::max<int64_t>(N, 1), D}, DType::kF32, Device{}, &kt_t));
  SG_RETURN_IF_ERROR(empty({c.Hkv, std::max<int64_t>(N, 1), D}, DType::kF32, Device{}, &v_t));
  float* kt_all = kt_t.ptr<float>();
  float* v_all = v_t.ptr<float>();
  parallel_for(0, c.Hkv * n_tiles, 4, [&](int64_t lo, int64_t hi) {
    for (int64_t it = lo; it < hi; ++it) {
      const int64_t kvh = it / n_tiles;
      const auto [s, b] = tiles[it % n_tiles];
      const int64_t k0 = cu[s] + b * kBlockK, nk = std::min<int64_t>(kBlockK, cu[s + 1] - k0);
      const int64_t at = (kvh * N + k0) * D;
      load_kv(k, c.Hkv, D, k0, nk, kvh, nullptr, kt_all + at, nk);
      load_kv(v, c.Hkv, D, k0, nk, kvh, v_all + at, nullptr, 0);
    }
  });

  // Work items (document, query block), the last blocks of a document first (under a causal
  // mask they see the most keys, and should not end up alone at the tail); times Hkv.
  std::vector<std::pair<int64_t, int64_t>> items;
  for (int64_t s = 0; s < c.S; ++s) {
    const int64_t L = cu[s + 1] - cu[s];
    for (int64_t t0 = ((L - 1) / Bt) * Bt; L > 0 && t0 >= 0; t0 -= Bt) items.emplace_back(s, t0);
  }
  const int64_t n_items = static_cast<int64_t>(items.size()) * c.Hkv;
  parallel_for(0, n_items, 1, [&](int64_t lo_item, int64_t hi_item) {
    Scratch qf(R_max * D), o(R_max * D), sc(R_max * kBlockK), m(R_max), l(R_max);
    std::vector<int> col_lo(Bt), col_hi(Bt);
    for (int64_t it = lo_item; it < hi_item; ++it) {
      const auto [s, t0] = items[it / c.Hkv];
      const int64_t kvh = it % c.Hkv, base = cu[s], L = cu[s + 1] - cu[s];
      const int64_t nt = std::min(Bt, L - t0), R = nt * G;
      // The scale is folded into Q once: scores come out of the product already scaled.
      for (int64_t ti = 0; ti < nt; ++ti) {
        const T* src = q + ((base + t0 + ti) * c.Hq + kvh * G) * D;
        for (int64_t e = 0; e < G * D; ++e) qf.p[ti * G * D + e] = load(src[e]) * c.scale;
      }
      std::fill(o.p, o.p + R * D, 0.0f);
      std::fill(m.p, m.p + R, -std::numeric_limits<float>::infinity());
      std::fill(l.p, l.p + R, 0.0f);
      const int32_t* lim = c.doc_limit(base);
      const int64_t b_end = (c.key_hi(t0 + nt - 1, L, lim) + kBlockK - 1) / kBlockK;
      for (int64_t b = c.key_lo(t0) / kBlockK; b < b_end; ++b) {
        const int64_t k0 = b * kBlockK, nk = std::min<int64_t>(kBlockK, L - k0);
        const float* kt = kt_all + (kvh * N + base + k0) * D;  // [D][nk]
        const float* vr = v_all + (kvh * N + base + k0) * D;
        tile_columns(c, L, lim, t0, nt, k0, nk, col_lo.data(), col_hi.data());
        gemm_tile(sc.p, kBlockK, qf.p, D, kt, nk, R, nk, D, false);  // S = scale Q K^T
        softmax_tile(sc.p, kBlockK, nk, R, G, col_lo.data(), col_hi.data(), c.softcap, m.p, l.p, o.p, D);
        gemm_tile(o.p, D, sc.p, kBlockK, vr, D, R, D, nk, true);  // O += P V
      }
      for (int64_t r = 0; r < R; ++r) {
        const int64_t tok = base + t0 + r / G, h = kvh * G + r % G;
        T* dst = out + (tok * c.Hq + h) * D;
        if (!sinks.empty()) {  // the sink joins the denominator: out = o exp(m - lse)
          const float z = sinks[h], mx = std::max(m.p[r], z);
          const float row_lse = mx + std::log(l.p[r] * std::exp(m.p[r] - mx) + std::exp(z - mx));
          const float mul = std::exp(m.p[r] - row_lse);
          for (int64_t d = 0; d < D; ++d) dst[d] = store<T>(o.p[r * D + d] * mul);
          lse[tok * c.Hq + h] = row_lse;
          continue;
        }
        const float inv = l.p[r] > 0.0f ? 1.0f / l.p[r] : 0.0f;
        for (int64_t d = 0; d < D; ++d) dst[d] = store<T>(o.p[r * D + d] * inv);
        lse[tok * c.Hq + h] = m.p[r] + std::log(l.p[r]);
      }
    }
  });
  return Status::OK();
}

// Element i of a small f32 / bf16 / f16 tensor (the checks allow only those), read or written.
float float_at(const Tensor& t, int64_t i) {
  if (t.dtype == DType::kBF16) return load(t.ptr<bf16_t>()[i]);
  if (t.dtype == DType::kF16) return load(t.ptr<f16_t>()[i]);
  return t.ptr<float>()[i];
}
void set_float_at(const Tensor& t, int64_t i, float v) {
  if (t.dtype == DType::kBF16) t.ptr<bf16_t>()[i] = store<bf16_t>(v);
  else if (t.dtype == DType::kF16) t.ptr<f16_t>()[i] = store<f16_t>(v);
  else t.ptr<float>()[i] = v;
}

// sinks[Hq] in f32 (empty without the input).
std::vector<float> read_sinks(const OpArgs& a, int i, const AttnConfig& c) {
  std::vector<float> z;
  if (!c.sinks) return z;
  z.resize(c.Hq);
  for (int64_t h = 0; h < c.Hq; ++h) z[h] = float_at(a.in(i), h);
  return z;
}

// attention_fwd: (q, k, v, cu_seqlens, [sinks]) -> (out, lse); attrs: causal, scale, window, softcap.
Status attention_fwd(const OpArgs& a) {
  const char* op = "attention_fwd";
  const Tensor &q = a.in(0), &k = a.in(1), &v = a.in(2), &cu = a.in(3);
  const Tensor &out = a.out(0), &lse = a.out(1);
  AttnConfig c;
  SG_RETURN_IF_ERROR(read_config(op, a, /*backward=*/false, cu, &c));
  const std::vector<float> sinks = read_sinks(a, 4, c);
  SG_DISPATCH_FLOAT(op, q.dtype, T, {
    SG_RETURN_IF_ERROR(attention_fwd_impl<T>(c, q.ptr<T>(), k.ptr<T>(), v.ptr<T>(), cu.ptr<int32_t>(), out.ptr<T>(),
                                             lse.ptr<float>(), sinks));
  });
  return Status::OK();
}

// ---- backward ----------------------------------------------------------------------------

// One (query tile, key tile) pair: from the scores S (scaled, not capped) recompute
// P = exp(s - lse) and turn dP (= dO V^T) into dS = P (dP - Delta) [(1 - tanh^2)], the
// gradient with respect to the scaled score.
SG_CPU_CLONES
void softmax_grad_tile(const float* S, float* P, float* dP, int64_t ld, int nk, int R, int G, const int* lo,
                       const int* hi, const float* lse, const float* delta, float softcap) {
  const float inv = softcap > 0.0f ? 1.0f / softcap : 0.0f;
  for (int r = 0; r < R; ++r) {
    const float* s = S + r * ld;
    float* p = P + r * ld;
    float* ds = dP + r * ld;
    const int c0 = lo[r / G], c1 = hi[r / G];
    const float lr = lse[r], dr = delta[r];
    for (int c = 0; c < c0; ++c) p[c] = ds[c] = 0.0f;
    if (softcap > 0.0f) {
      for (int c = c0; c < c1; ++c) {
        const float t = tanh_approx(s[c] * inv);
        p[c] = exp_approx(softcap * t - lr);
        ds[c] = p[c] * (ds[c] - dr) * (1.0f - t * t);
      }
    } else {
      for (int c = c0; c < c1; ++c) {
        p[c] = exp_approx(s[c] - lr);
        ds[c] = p[c] * (ds[c] - dr);
      }
    }
    for (int c = std::max(c0, c1); c < nk; ++c) p[c] = ds[c] = 0.0f;
  }
}

template <typename T>
Status attention_bwd_impl(const AttnConfig& c, const T* dout, const T* q, const T* k, const T* v, const T* out,
                          const float* lse, const int32_t* cu, T* dq, T* dk, T* dv) {
  const int64_t N = c.N, Hq = c.Hq, D = c.D, G = c.G, Bt = c.tile_tokens;
  if (N == 0) return Status::OK();

  // Key chunks per (document, kv head): enough items for about 4 per thread, but at most one
  // chunk per key block and a bounded dQ accumulator (chunks copies of [N, Hq, D] f32).
  int64_t pairs = 0, max_blocks = 1;
  for (int64_t s = 0; s < c.S; ++s) {
    const int64_t L = cu[s + 1] - cu[s];
    if (L > 0) pairs += c.Hkv, max_blocks = std::max(max_blocks, (L + kBlockK - 1) / kBlockK);
  }
  const int64_t want = 4 * static_cast<int64_t>(num_threads());
  const int64_t acc_bytes = N * Hq * D * 4;
  int64_t chunks = pairs >= want ? 1 : (want + pairs - 1) / pairs;
  chunks = std::clamp<int64_t>(std::min(chunks, max_blocks), 1, std::max<int64_t>(1, (int64_t{1} << 29) / acc_bytes));

  Tensor qs_t, do_t, lse_t, delta_t, dq_acc_t;
  SG_RETURN_IF_ERROR(empty({c.Hkv, N, G, D}, DType::kF32, Device{}, &qs_t));
  SG_RETURN_IF_ERROR(empty({c.Hkv, N, G, D}, DType::kF32, Device{}, &do_t));
  SG_RETURN_IF_ERROR(empty({c.Hkv, N, G}, DType::kF32, Device{}, &lse_t));
  SG_RETURN_IF_ERROR(empty({c.Hkv, N, G}, DType::kF32, Device{}, &delta_t));
  SG_RETURN_IF_ERROR(empty({chunks, c.Hkv, N, G, D}, DType::kF32, Device{}, &dq_acc_t));
  float *qs_all = qs_t.ptr<float>(), *do_all = do_t.ptr<float>(), *lse_all = lse_t.ptr<float>(),
        *delta_all = delta_t.ptr<float>(), *dq_acc = dq_acc_t.ptr<float>();
  to_group_major(c, q, c.scale, qs_all);
  to_group_major(c, dout, 1.0f, do_all);
  // lse regrouped; Delta_i = dout_i . out_i, once per (token, head).
  parallel_for(0, N, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t tok = lo; tok < hi; ++tok) {
      for (int64_t h = 0; h < Hq; ++h) {
        const int64_t i = tok * Hq + h, j = ((h / G) * N + tok) * G + h % G;
        float acc = 0.0f;
        for (int64_t d = 0; d < D; ++d) acc += load(dout[i * D + d]) * load(out[i * D + d]);
        delta_all[j] = acc;
        lse_all[j] = lse[i];
      }
    }
  });
  parallel_for(0, chunks * c.Hkv * N, 64, [&](int64_t lo, int64_t hi) {
    std::fill(dq_acc + lo * G * D, dq_acc + hi * G * D, 0.0f);
  });

  struct Item { int64_t s, kb0, kb1, chunk; };  // document, key blocks [kb0, kb1), accumulator
  std::vector<Item> items;
  for (int64_t s = 0; s < c.S; ++s) {
    const int64_t nb = (cu[s + 1] - cu[s] + kBlockK - 1) / kBlockK;
    const int64_t nc = std::min(chunks, nb);
    for (int64_t ch = 0; ch < nc; ++ch) items.push_back({s, ch * nb / nc, (ch + 1) * nb / nc, ch});
  }
  const int64_t n_items = static_cast<int64_t>(items.size()) * c.Hkv;
  parallel_for(0, n_items, 1, [&](int64_t lo_item, int64_t hi_item) {
    const int64_t R_max = Bt * G;
    Scratch kf(kBlockK * D), kt(D * kBlockK), vt(D * kBlockK), dk_acc(kBlockK * D), dv_acc(kBlockK * D);
    Scratch sc(R_max * kBlockK), p(R_max * kBlockK), ds(R_max * kBlockK);
    std::vector<int> col_lo(Bt), col_hi(Bt);
    for (int64_t it = lo_item; it < hi_item; ++it) {
      const Item& w = items[it / c.Hkv];
      const int64_t kvh = it % c.Hkv, base = cu[w.s], L = cu[w.s + 1] - cu[w.s];
      const int32_t* lim = c.doc_limit(base);
      // Rows of this (document, kv head) in the group-major operands: row (t, g) at (t * G + g).
      const int64_t row0 = (kvh * N + base) * G;
      const float *qs_d = qs_all + row0 * D, *do_d = do_all + row0 * D;
      const float *lse_d = lse_all + row0, *delta_d = delta_all + row0;
      float* dq_d = dq_acc + (w.chunk * c.Hkv * N * G + row0) * D;
      for (int64_t b = w.kb0; b < w.kb1; ++b) {
        const int64_t k0 = b * kBlockK, nk = std::min<int64_t>(kBlockK, L - k0);
        load_kv(k, c.Hkv, D, base + k0, nk, kvh, kf.p, kt.p, kBlockK);
        load_kv(v, c.Hkv, D, base + k0, nk, kvh, nullptr, vt.p, kBlockK);
        std::fill(dk_acc.p, dk_acc.p + nk * D, 0.0f);
        std::fill(dv_acc.p, dv_acc.p + nk * D, 0.0f);
        int64_t q0, q1;
        c.query_range(k0, k0 + nk, L, lim, &q0, &q1);
        for (int64_t t0 = q0; t0 < q1; t0 += Bt) {
          const int64_t nt = std::min(Bt, q1 - t0);
          const int R = static_cast<int>(nt * G);
          const float *qs = qs_d + t0 * G * D, *dO = do_d + t0 * G * D;
          tile_columns(c, L, lim, t0, nt, k0, nk, col_lo.data(), col_hi.data());
          gemm_tile(sc.p, kBlockK, qs, D, kt.p, kBlockK, R, nk, D, false);  // S = scale Q K^T
          gemm_tile(ds.p, kBlockK, dO, D, vt.p, kBlockK, R, nk, D, false);  // dP = dO V^T
          softmax_grad_tile(sc.p, p.p, ds.p, kBlockK, nk, R, G, col_lo.data(), col_hi.data(), lse_d + t0 * G,
                            delta_d + t0 * G, c.softcap);
          gemm_tile_ta(dv_acc.p, D, p.p, kBlockK, dO, D, nk, D, R, true);   // dV += P^T dO
          gemm_tile_ta(dk_acc.p, D, ds.p, kBlockK, qs, D, nk, D, R, true);  // dK += dS^T (scale Q)
          gemm_tile(dq_d + t0 * G * D, D, ds.p, kBlockK, kf.p, D, R, D, nk, true);  // dQ / scale += dS K
        }
        for (int64_t j = 0; j < nk; ++j) {
          const int64_t row = ((base + k0 + j) * c.Hkv + kvh) * D;
          for (int64_t d = 0; d < D; ++d) {
            dk[row + d] = store<T>(dk_acc.p[j * D + d]);
            dv[row + d] = store<T>(dv_acc.p[j * D + d]);
          }
        }
      }
    }
  });

  // dq = scale * (sum of the chunks' accumulators), back in [N][Hq][D].
  const int64_t chunk_stride = c.Hkv * N * G * D;
  parallel_for(0, N, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t tok = lo; tok < hi; ++tok) {
      for (int64_t kvh = 0; kvh < c.Hkv; ++kvh) {
        const float* src = dq_acc + (kvh * N + tok) * G * D;
        T* dst = dq + (tok * Hq + kvh * G) * D;
        for (int64_t e = 0; e < G * D; ++e) {
          float acc = src[e];
          for (int64_t ch = 1; ch < chunks; ++ch) acc += src[ch * chunk_stride + e];
          dst[e] = store<T>(c.scale * acc);
        }
      }
    }
  });
  return Status::OK();
}

// dsinks[h] (+)= -sum_i exp(z_h - lse_i) Delta_i, Delta_i = dout_i . out_i: the sink column's
// dS = P_sink (0 - Delta). Summed over tokens in order per head (deterministic).
template <typename T>
void sinks_grad(const AttnConfig& c, const T* dout, const T* out, const float* lse, const std::vector<float>& z,
                const Tensor& dsinks, bool accumulate) {
  std::vector<double> acc(c.Hq, 0.0);
  for (int64_t tok = 0; tok < c.N; ++tok) {
    for (int64_t h = 0; h < c.Hq; ++h) {
      const int64_t i = tok * c.Hq + h;
      float delta = 0.0f;
      for (int64_t d = 0; d < c.D; ++d) delta += load(dout[i * c.D + d]) * load(out[i * c.D + d]);
      acc[h] -= static_cast<double>(std::exp(z[h] - lse[i]) * delta);
    }
  }
  for (int64_t h = 0; h < c.Hq; ++h) {
    const float prev = accumulate ? float_at(dsinks, h) : 0.0f;
    set_float_at(dsinks, h, prev + static_cast<float>(acc[h]));
  }
}

// attention_sinks_bwd: (dout, out, lse, sinks) -> (dsinks); attr accumulate.
Status attention_sinks_bwd(const OpArgs& a) {
  AttentionSinksArgs r;
  SG_RETURN_IF_ERROR(check_attention_sinks_bwd(a, &r));
  AttnConfig c;
  c.N = r.N;
  c.Hq = r.Hq;
  c.D = r.D;
  c.sinks = true;
  const std::vector<float> z = read_sinks(a, 3, c);
  SG_DISPATCH_FLOAT("attention_sinks_bwd", a.in(0).dtype, T, {
    sinks_grad<T>(c, a.in(0).ptr<T>(), a.in(1).ptr<T>(), a.in(2).ptr<float>(), z, a.out(0), r.accumulate);
  });
  return Status::OK();
}

// attention_bwd: (dout, q, k, v, out, lse, cu_seqlens) -> (dq, dk, dv); attrs as attention_fwd.
Status attention_bwd(const OpArgs& a) {
  const char* op = "attention_bwd";
  const Tensor &dout = a.in(0), &q = a.in(1), &k = a.in(2), &v = a.in(3), &out = a.in(4), &lse = a.in(5),
               &cu = a.in(6);
  const Tensor &dq = a.out(0), &dk = a.out(1), &dv = a.out(2);
  AttnConfig c;
  SG_RETURN_IF_ERROR(read_config(op, a, /*backward=*/true, cu, &c));
  SG_DISPATCH_FLOAT(op, q.dtype, T, {
    SG_RETURN_IF_ERROR(attention_bwd_impl<T>(c, dout.ptr<T>(), q.ptr<T>(), k.ptr<T>(), v.ptr<T>(), out.ptr<T>(),
                                             lse.ptr<float>(), cu.ptr<int32_t>(), dq.ptr<T>(), dk.ptr<T>(),
                                             dv.ptr<T>()));
  });
  return Status::OK();
}

}  // namespace

void register_cpu_attention(OpRegistry& reg) {
  add_op(reg, "attention_fwd", attention_fwd);
  add_op(reg, "attention_bwd", attention_bwd);
  add_op(reg, "attention_sinks_bwd", attention_sinks_bwd);
}

}  // namespace surogate::cpu
