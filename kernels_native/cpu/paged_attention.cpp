// Paged KV cache CPU ops for inference: kv_cache_write and paged_attention.
//
// Layout (vLLM-like). The cache of one layer is two tensors k_cache, v_cache of shape
// [num_blocks, block_size, Hkv, D], in the dtype of k / v / q (f32, bf16 or f16). A slot is one
// token's [Hkv, D] row: slot = block * block_size + offset. A sequence owns the blocks its block
// table lists: its token t lives in block block_tables[s][t / block_size] at offset
// t % block_size. Block tables are int32 [S, max_blocks], padded with -1.
//
// kv_cache_write: (k[T,Hkv,D], v[T,Hkv,D], slot_mapping[T] int32) -> (k_cache, v_cache)
//   k_cache[slot] = k[i], v_cache[slot] = v[i] for slot = slot_mapping[i]; slot -1 skips the
//   token (padding). The caches are outputs written in place (only the mapped slots change).
//   Slots must lie in [0, num_blocks * block_size) and be distinct; both are checked before
//   anything is written, and the error names the token.
//
// paged_attention: (q[T,Hq,D], k_cache, v_cache, block_tables[S,max_blocks], cu_q[S+1],
//                   context_lens[S]) -> (out[T,Hq,D], [lse[T,Hq] f32])
//   q holds the new tokens of S sequences, flattened: sequence s owns rows cu_q[s]..cu_q[s+1]
//   (n_q of them; n_q = 0 is allowed). context_lens[s] counts the tokens of s in the cache after
//   this step's kv_cache_write, the new ones included, so n_q <= context_lens[s]. The query rows
//   are the LAST n_q positions of the context: row i of s sits at absolute position
//   p = context_lens[s] - n_q + i and attends to the cache positions j with
//       j <= p   and   (window == 0  or  j > p - window)           (HF sliding window)
//   One op serves decode (n_q = 1), prefill (n_q = context), chunked prefill (the chunk's rows
//   against the earlier chunks plus itself) and mixed batches of those.
//   GQA: query head h reads kv head h / (Hq / Hkv).
//   score_j = scale * q . k_j, then softcap * tanh(score_j / softcap) when softcap > 0;
//   out = sum_j softmax(score)_j v_j, lse = log(sum_j exp(score_j)) (natural log, f32).
//   attrs: scale (1 / sqrt(D)), window (0: none), softcap (0: none).
//   kv_limit[T] (optional input 7, int32): row i sees keys j <= kv_limit[i] instead of j <= p
//   (the window still counts from p): a row inside a bidirectional span (Gemma 3's image tokens)
//   also sees the span's later keys, which this step wrote. p <= kv_limit[i] < context_lens[s]
//   is checked before anything is computed.
//   sinks[Hq] (optional input 6, GPT-OSS): exp(sinks[h]) joins each row's denominator (no value),
//   as cpu/attention.cpp's sinks: out = sum_j exp(score_j) v_j / (sum_j exp(score_j) + exp(z_h)).
//   Only the blocks a query reads must be valid: with a window, entries of blocks that lie
//   wholly before every query's window may be -1 (freed).
//
// Kernel. Work items are (sequence, query block, kv heads, key split). Decode has one query row
// per sequence, prefill up to 64 / group rows per block. An item walks its keys in tiles of 64
// positions (whatever the block size), with an online softmax per query (running max, sum and
// f32 accumulator). Every K / V row of a tile is loaded once for the Hq / Hkv query heads of its
// kv head (GQA) and the item's rows:
//   - few queries per kv head (decode): the products read the contiguous [D] rows straight
//     from the cache, widening bf16 / f16 in registers; scores are W-key x D tiles reduced
//     across lanes by a shuffle transpose;
//   - many (prefill): the tile is converted to f32 once (K transposed) and the products are
//     register-blocked 4-query x W-key and 4-query x W-dim tiles.
// Items cover all kv heads of their rows (a token's [Hkv, D] slice is contiguous, so a tile's
// rows stream in memory order); when there are fewer than twice as many items as threads
// (decode of few sequences), their key ranges are split in chunks of at least kMinSplitKeys
// keys (flash-decoding: each split leaves (max, sum, accumulator) per query, a second pass
// combines them), then, below four per thread, their kv heads. The result depends on the
// thread count only in the last bits of f32 (summation order).
// The item kernel is compiled for x86-64-v4 (W = 16), v3 (W = 8) and the baseline (W = 4), with
// GNU vector extensions for the lane shuffles, and picked at run time; never -march=native.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpu/common.h"
#include "cpu/paged_attention.h"
#include "runtime/op_checks_paged_attention.h"

#if defined(__GNUC__) && !defined(__clang__)
// GNU vectors pass between always-inline helpers only; no ABI is involved.
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace surogate::cpu {

namespace {

#if defined(__GNUC__)
#define SG_INLINE inline __attribute__((always_inline))
#else
#define SG_INLINE inline
#endif

constexpr int64_t kLanes = 16;              // the head dim is padded to a multiple of this (and of W)
constexpr int64_t kTargetQueries = 64;      // queries (rows x group heads) per prefill item
constexpr int64_t kTransposeMinQueries = 16;  // from this many queries per item: transposed K path
constexpr int64_t kMinSplitKeys = 256;      // a key split reads at least this many keys
constexpr int64_t kKeyTile = 64;            // keys per step of the online softmax (multiple of 16)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// ---- inline math, compiled into each target clone of the callers ----------------------------

SG_INLINE int32_t as_int(float f) { int32_t i; std::memcpy(&i, &f, 4); return i; }
SG_INLINE float as_float(int32_t i) { float f; std::memcpy(&f, &i, 4); return f; }

// exp(x) in f32 within 2 ulp, vectorizable (Cephes expf as in cpu/activation.cpp): x clamped to
// [-104, 89] in integer compares on an order-preserving key, x = n ln2 + r, degree-7 polynomial,
// 2^n applied in two halves. exp(-inf) gives 0 (through the clamp and the underflow).
SG_INLINE int32_t order_key(int32_t b) { return b ^ ((b >> 31) & 0x7fffffff); }
SG_INLINE float exp_f32(float x) {
  constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  constexpr float kShift = 12582912.0f;
  int32_t k0 = order_key(as_int(x));
  const int32_t klo = order_key(as_int(-104.0f)), khi = order_key(as_int(89.0f));
  k0 = k0 < klo ? klo : k0;
  k0 = k0 > khi ? khi : k0;
  const float xc = as_float(order_key(k0));
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

// n contiguous elements of storage type T to f32, times `mul` (vectorizes; f16 in integer and
// float arithmetic as in cpu/gemm.cpp, since GCC does not vectorize _Float16 casts).
template <typename T>
SG_INLINE void row_to_f32(const T* src, float* dst, int64_t n, float mul) {
  if constexpr (std::is_same_v<T, f16_t>) {
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t em = src[i].bits & 0x7fffu;
      const uint32_t sign = static_cast<uint32_t>(src[i].bits & 0x8000u) << 16;
      const float mag = as_float(static_cast<int32_t>(em << 13)) * 0x1p112f;
      const uint32_t bits = em >= 0x7c00u ? ((em << 13) | 0x7f800000u) : static_cast<uint32_t>(as_int(mag));
      dst[i] = as_float(static_cast<int32_t>(bits | sign)) * mul;
    }
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = load(src[i]) * mul;
  }
}

// ---- score tile of the decode path: W keys x one query, W = the vector width ----------------
// GNU vector extensions (GCC, Clang): the reduction across lanes needs shuffles that plain loops
// do not vectorize into. Compiled per ISA level with W = 16 (AVX-512), 8 (AVX2), 4 (SSE2).
template <int W> struct Vec {
  typedef float f __attribute__((vector_size(W * 4)));
  typedef int32_t i __attribute__((vector_size(W * 4)));
};
template <typename V> SG_INLINE V splat(float x) { return V{} + x; }
template <typename To, typename From>
SG_INLINE To bitcast(const From& f) {
  static_assert(sizeof(To) == sizeof(From));
  To t;
  std::memcpy(&t, &f, sizeof(To));
  return t;
}
// Lanes I... of the concatenation (a, b): __builtin_shufflevector (GCC 12, Clang) or
// __builtin_shuffle (older GCC), with compile-time lane indices either way.
template <typename V, typename VI, int... I>
SG_INLINE V shuffle2(const V& a, const V& b) {
#if defined(__clang__) || __GNUC__ >= 12
  return __builtin_shufflevector(a, b, I...);
#else
  return __builtin_shuffle(a, b, VI{I...});
#endif
}

// Lane i of the concatenation (a, b) taken by one level of the transposed reduction: output
// lanes i < W/2 come from a, the others from b; within each, runs of `run` lanes, low run of
// each pair (hi = 0) or high run (hi = 1).
constexpr int run_lane(int W, int run, int hi, int i) {
  const int half = i / (W / 2), j = i % (W / 2);
  return half * W + (j / run) * 2 * run + (j % run) + hi * run;
}
template <int W, int RUN, int HI, typename V, size_t... I>
SG_INLINE V shuffle_runs(const V& a, const V& b, std::index_sequence<I...>) {
  return shuffle2<V, typename Vec<W>::i, run_lane(W, RUN, HI, static_cast<int>(I))...>(a, b);
}
// 2 RUN vectors in, RUN out; after the level with RUN = 1, acc[0][t] = sum of the lanes of the
// original acc[t].
template <int W, int RUN, typename V>
SG_INLINE void reduce_level(V* acc) {
  if constexpr (RUN >= 1) {
    constexpr auto idx = std::make_index_sequence<W>();
    for (int i = 0; i < RUN; ++i)
      acc[i] = shuffle_runs<W, RUN, 0>(acc[2 * i], acc[2 * i + 1], idx) +
               shuffle_runs<W, RUN, 1>(acc[2 * i], acc[2 * i + 1], idx);
    reduce_level<W, RUN / 2>(acc);
  }
}

// s[t] = q . K[t] for the W rows K[t] (row stride ks), Dp a multiple of W.
template <int W>
SG_INLINE void score_tile(const float* q, const float* K, int64_t ks, int64_t Dp, float* s) {
  using V = typename Vec<W>::f;
  V acc[W];
  for (int t = 0; t < W; ++t) acc[t] = V{};
  for (int64_t j = 0; j < Dp; j += W) {
    V qv;
    std::memcpy(&qv, q + j, sizeof(V));
    for (int t = 0; t < W; ++t) {
      V k;
      std::memcpy(&k, K + t * ks + j, sizeof(V));
      acc[t] += qv * k;
    }
  }
  reduce_level<W, W / 2>(acc);
  std::memcpy(s, &acc[0], sizeof(V));
}

// Lane i of v, rotated by `step` lanes (for reductions across lanes).
template <int W, int STEP, typename V, size_t... I>
SG_INLINE V rotate(const V& v, std::index_sequence<I...>) {
  return shuffle2<V, typename Vec<W>::i, static_cast<int>((I + STEP) % W)...>(v, v);
}
template <int W, int STEP = W / 2, typename V>
SG_INLINE float hmax(const V& v) {
  if constexpr (STEP >= 1) {
    const V r = rotate<W, STEP>(v, std::make_index_sequence<W>());
    return hmax<W, STEP / 2>(r > v ? r : v);
  } else {
    return v[0];
  }
}
template <int W, int STEP = W / 2, typename V>
SG_INLINE float hsum(const V& v) {
  if constexpr (STEP >= 1) {
    return hsum<W, STEP / 2>(v + rotate<W, STEP>(v, std::make_index_sequence<W>()));
  } else {
    return v[0];
  }
}

// exp_f32 on W lanes. The clamp is a float compare here (a NaN stays NaN); exp(-inf) is tiny,
// not 0, so callers mask the lanes that must be 0.
template <int W>
SG_INLINE typename Vec<W>::f exp_vec(const typename Vec<W>::f& x0) {
  using V = typename Vec<W>::f;
  using VI = typename Vec<W>::i;
  V x = x0;
  constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  constexpr float kShift = 12582912.0f;
  const V lo = splat<V>(-104.0f), hi = splat<V>(89.0f);
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  const V t = x * kLog2e + kShift;
  const V n = t - kShift;
  const VI ni = bitcast<VI>(t) - as_int(kShift);
  V r = x - n * kLn2Hi;
  r = r - n * kLn2Lo;
  V p = splat<V>(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const V e = p * (r * r) + r + 1.0f;
  const VI k = ni >> 1;
  const VI b1 = (k + 127) << 23, b2 = (ni - k + 127) << 23;
  return e * bitcast<V>(b1) * bitcast<V>(b2);
}

// One query's online softmax step over its scores s[t], t in [a, e), of a block, in tiles of W
// lanes from a - a % W to e: sets the other lanes of the tiles to -inf, writes p[t] =
// exp(s[t] - m_new) (0 off [a, e)) over the tiles, and returns m_new = max(m_old, max s) and
// the sum of p.
template <int W>
SG_INLINE void softmax_tiles(float* s, float* p, int64_t a, int64_t e, float m_old, float* m_new, float* sum) {
  using V = typename Vec<W>::f;
  using VI = typename Vec<W>::i;
  VI iota;
  for (int l = 0; l < W; ++l) iota[l] = l;
  const V ninf = splat<V>(kNegInf);
  const int64_t t0 = a - a % W;
  V vmax = ninf;
  for (int64_t t = t0; t < e; t += W) {
    V v;
    std::memcpy(&v, s + t, sizeof(V));
    const VI idx = iota + static_cast<int32_t>(t);
    v = (idx >= static_cast<int32_t>(a)) & (idx < static_cast<int32_t>(e)) ? v : ninf;
    std::memcpy(s + t, &v, sizeof(V));
    vmax = v > vmax ? v : vmax;
  }
  const float mx = hmax<W>(vmax);
  const float mn = mx > m_old ? mx : m_old;
  V vsum = V{};
  for (int64_t t = t0; t < e; t += W) {
    V v;
    std::memcpy(&v, s + t, sizeof(V));
    V pv = exp_vec<W>(v - mn);
    pv = v == ninf ? V{} : pv;
    std::memcpy(p + t, &pv, sizeof(V));
    vsum += pv;
  }
  *m_new = mn;
  *sum = hsum<W>(vsum);
}

// S[i][tt + l] = Q[i] . KT[:, tt + l] for NQ queries and W keys (l < W). KT is [D, ld], S rows ld.
template <int NQ, int W>
SG_INLINE void qk_tile(const float* Q, int64_t Dp, const float* KT, int64_t ld, int64_t D, float* S, int64_t tt) {
  using V = typename Vec<W>::f;
  V acc[NQ];
  for (int i = 0; i < NQ; ++i) acc[i] = V{};
  for (int64_t d = 0; d < D; ++d) {
    V k;
    std::memcpy(&k, KT + d * ld + tt, sizeof(V));
    for (int i = 0; i < NQ; ++i) acc[i] += Q[i * Dp + d] * k;
  }
  for (int i = 0; i < NQ; ++i) std::memcpy(S + i * ld + tt, &acc[i], sizeof(V));
}

// O[i] += sum_{t in [tl, th)} P[i][t] * V[t] for NQ queries; P rows ld, rows V[t] at stride vs,
// O rows Dp.
template <int NQ, int W>
SG_INLINE void pv_tile(const float* P, int64_t ld, const float* Vr, int64_t vs, int64_t Dp, float* O, int64_t tl,
                       int64_t th) {
  using V = typename Vec<W>::f;
  for (int64_t dc = 0; dc < Dp; dc += W) {
    V acc[NQ];
    for (int i = 0; i < NQ; ++i) std::memcpy(&acc[i], O + i * Dp + dc, sizeof(V));
    for (int64_t t = tl; t < th; ++t) {
      V v;
      std::memcpy(&v, Vr + t * vs + dc, sizeof(V));
      for (int i = 0; i < NQ; ++i) acc[i] += P[i * ld + t] * v;
    }
    for (int i = 0; i < NQ; ++i) std::memcpy(O + i * Dp + dc, &acc[i], sizeof(V));
  }
}

// W elements of storage type T at p, widened to f32 lanes (bf16: shift into the high half;
// f16: the exact integer and float arithmetic of row_to_f32).
template <typename T, int W>
SG_INLINE typename Vec<W>::f load_vec(const T* p) {
  using V = typename Vec<W>::f;
  using VI = typename Vec<W>::i;
  if constexpr (std::is_same_v<T, float>) {
    V v;
    std::memcpy(&v, p, sizeof(V));
    return v;
  } else {
    typedef uint16_t VH __attribute__((vector_size(W * 2)));
    VH h;
    std::memcpy(&h, p, sizeof(VH));
    const VI u = __builtin_convertvector(h, VI);
    if constexpr (std::is_same_v<T, bf16_t>) {
      return bitcast<V>(VI(u << 16));
    } else {
      const VI em = u & 0x7fff, sign = (u & 0x8000) << 16;
      const V mag = bitcast<V>(VI(em << 13)) * 0x1p112f;
      const VI bits = em >= 0x7c00 ? ((em << 13) | 0x7f800000) : bitcast<VI>(mag);
      return bitcast<V>(VI(bits | sign));
    }
  }
}

// score_tile reading the W keys straight from the cache: row t at rows[t] + off, D a multiple
// of W (q is f32, rows [D]).
template <typename T, int W>
SG_INLINE void score_tile_cache(const float* q, const T* const* rows, int64_t off, int64_t D, float* s) {
  using V = typename Vec<W>::f;
  V acc[W];
  for (int t = 0; t < W; ++t) acc[t] = V{};
  for (int64_t j = 0; j < D; j += W) {
    V qv;
    std::memcpy(&qv, q + j, sizeof(V));
    for (int t = 0; t < W; ++t) acc[t] += qv * load_vec<T, W>(rows[t] + off + j);
  }
  reduce_level<W, W / 2>(acc);
  std::memcpy(s, &acc[0], sizeof(V));
}

// pv_tile reading V straight from the cache: row t at rows[t] + off, D a multiple of W.
template <int NQ, int W, typename T>
SG_INLINE void pv_tile_cache(const float* P, int64_t ld, const T* const* rows, int64_t off, int64_t D, float* O,
                             int64_t Dp, int64_t tl, int64_t th) {
  using V = typename Vec<W>::f;
  for (int64_t dc = 0; dc < D; dc += W) {
    V acc[NQ];
    for (int i = 0; i < NQ; ++i) std::memcpy(&acc[i], O + i * Dp + dc, sizeof(V));
    for (int64_t t = tl; t < th; ++t) {
      const V v = load_vec<T, W>(rows[t] + off + dc);
      for (int i = 0; i < NQ; ++i) acc[i] += P[i * ld + t] * v;
    }
    for (int i = 0; i < NQ; ++i) std::memcpy(O + i * Dp + dc, &acc[i], sizeof(V));
  }
}

// ---- paged_attention work ----------------------------------------------------------------

struct Geometry {
  const void* q = nullptr;
  const void* kc = nullptr;
  const void* vc = nullptr;
  void* out = nullptr;
  float* lse = nullptr;  // may be null
  const int32_t* bt = nullptr;
  const int32_t* cu_q = nullptr;
  const int32_t* ctx = nullptr;
  int64_t max_blocks = 0, Hq = 0, Hkv = 0, G = 0, D = 0, Dp = 0, BS = 0, window = 0;
  float scale = 1.0f, softcap = 0.0f;
  float* part = nullptr;  // split partials
  const float* sinks = nullptr;  // [Hq] f32, or null
  const int32_t* kv_limit = nullptr;  // [T] last visible key per row, or null (causal)
};

// A finished row (running max m, sum l, accumulator o relative to m) written out: out = o / l and
// lse = m + log l, or with a sink z in the denominator lse = log(exp(m) l + exp(z)), out = o exp(m - lse).
template <typename T>
inline void finish_row(const Geometry& geo, int64_t row, int64_t h, float m, float l, const float* o, T* dst) {
  float lse, mul;
  if (geo.sinks) {
    const float z = geo.sinks[h], mx = std::max(m, z);
    lse = mx + std::log(l * std::exp(m - mx) + std::exp(z - mx));
    mul = std::exp(m - lse);
  } else {
    lse = m + std::log(l);
    mul = 1.0f / l;
  }
  for (int64_t d = 0; d < geo.D; ++d) dst[d] = store<T>(o[d] * mul);
  if (geo.lse) geo.lse[row * geo.Hq + h] = lse;
}

// One work item: query rows [r0, r1) of sequence s (relative to its first query row), kv heads
// [g0, g1) with their query heads, keys [k0, k1) (absolute positions). part >= 0: write
// (max, sum, acc) per query at part (floats) instead of the output.
struct Item {
  int32_t s = 0, r0 = 0, r1 = 0, g0 = 0, g1 = 0;
  int64_t k0 = 0, k1 = 0;
  int64_t part = -1;
  double cost = 0;
};

// A (sequence, query block, kv heads) whose keys were split: nsplit partials of M queries each,
// (Dp + 2) floats per query, starting at part.
struct SplitGroup {
  int32_t s = 0, r0 = 0, r1 = 0, g0 = 0, g1 = 0, nsplit = 0;
  int64_t part = 0;
};

// Queries of an item are ordered (kv head, row, head of the group): m = (gi * rows + ri) * G + hh.
// Workspace floats for M queries over nh kv heads, Mh = M / nh queries per kv head; the f32
// copy of the K / V tile (the last 2 nh KT Dp) is only used when the kernel does not read them
// straight from the cache (many queries, or a head dim that is not a multiple of 16).
int64_t workspace_floats(int64_t M, int64_t Mh, int64_t nh, int64_t D, int64_t Dp) {
  const bool staged = Mh >= kTransposeMinQueries || D % kLanes != 0;
  return 2 * M * Dp + 2 * M + 2 * round_up(Mh, 4) * kKeyTile + (staged ? 2 * nh * kKeyTile * Dp : 0);
}

template <typename T, int W>
SG_INLINE void attend_item_impl(const Geometry& geo, const Item& it, float* ws) {
  constexpr int64_t KT = kKeyTile;
  const int64_t G = geo.G, D = geo.D, Dp = geo.Dp, BS = geo.BS, Hq = geo.Hq, Hkv = geo.Hkv;
  const int64_t s = it.s, g0 = it.g0, nh = it.g1 - it.g0;
  const int64_t q_first = geo.cu_q[s];
  const int64_t nq = geo.cu_q[s + 1] - q_first;
  const int64_t ctx = geo.ctx[s];
  const int64_t pos0 = ctx - nq + it.r0;  // absolute position of the item's first query row
  const int64_t rows = it.r1 - it.r0;
  const int64_t Mh = rows * G, M = Mh * nh;
  const int64_t Mhp = round_up(Mh, 4);
  const bool transposed = Mh >= kTransposeMinQueries;
  // Few queries per kv head (decode): read K and V straight from the cache inside the products,
  // no f32 copy of the tile (each K row is used by the G query heads while in L1).
  const bool direct = !transposed && D % W == 0;
  const int64_t window = geo.window;
  const float softcap = geo.softcap;

  float* Qf = ws;                 // [M, Dp] scaled queries
  float* O = Qf + M * Dp;         // [M, Dp] accumulators
  float* mrun = O + M * Dp;       // [M] running max
  float* lsum = mrun + M;         // [M] running sum
  float* Sc = lsum + M;           // [Mhp, KT] scores of one kv head's queries for the tile
  float* P = Sc + Mhp * KT;       // [Mhp, KT] their probabilities
  float* Kb = P + Mhp * KT;       // [KT][nh, Dp] K rows, or [nh][Dp, KT] transposed
  float* Vb = Kb + nh * KT * Dp;  // [KT][nh, Dp] V rows
  const int64_t rs = nh * Dp;     // row stride of Kb (not transposed) and Vb

  // The workspace is reused across items and holds stale values. Qf's pad columns [D, Dp) are
  // zeroed, and so are those of the staged K rows, so scores are exact; V's pad columns only
  // reach O's pad columns, which are never read; lanes of a W-tile outside [tl, th) get masked
  // scores (a select, so stale values never propagate) and P = 0.
  const T* q = static_cast<const T*>(geo.q);
  for (int64_t m = 0; m < M; ++m) {
    const int64_t gi = m / Mh, ri = (m % Mh) / G, hh = m % G;
    const int64_t row = q_first + it.r0 + ri, h = (g0 + gi) * G + hh;
    row_to_f32(q + (row * Hq + h) * D, Qf + m * Dp, D, geo.scale);
    std::fill(Qf + m * Dp + D, Qf + (m + 1) * Dp, 0.0f);
  }
  std::fill(O, O + M * Dp, 0.0f);
  for (int64_t m = 0; m < M; ++m) { mrun[m] = kNegInf; lsum[m] = 0.0f; }

  const T* kc = static_cast<const T*>(geo.kc);
  const T* vc = static_cast<const T*>(geo.vc);
  const int32_t* table = geo.bt + s * geo.max_blocks;
  const int64_t row_stride = Hkv * D;  // elements between the rows of a block
  const T* krow[KT];
  const T* vrow[KT];

  // Key tiles of KT positions, aligned to multiples of KT, whatever the block size.
  for (int64_t kb = it.k0 - it.k0 % KT; kb < it.k1; kb += KT) {
    const int64_t tl = std::max(it.k0, kb) - kb, th = std::min(it.k1, kb + KT) - kb;
    if (direct) {
      // Row addresses of the tile's keys (kv head g0); lanes of the W-tiles outside [tl, th)
      // point at a valid row, their scores are masked.
      for (int64_t t = 0; t < KT; ++t) {
        const int64_t pos = kb + std::min(std::max(t, tl), th - 1);
        const int64_t r = (static_cast<int64_t>(table[pos / BS]) * BS + pos % BS) * Hkv + g0;
        krow[t] = kc + r * D;
        vrow[t] = vc + r * D;
      }
    } else {
      // The tile's K / V rows of our kv heads, block by block, to f32 once.
      for (int64_t t = tl; t < th;) {
        const int64_t pos = kb + t;
        const int64_t blk = table[pos / BS];
        const int64_t n = std::min(th - t, BS - pos % BS);  // rows of this block in the tile
        const T* krows = kc + ((blk * BS + pos % BS) * Hkv + g0) * D;
        const T* vrows = vc + ((blk * BS + pos % BS) * Hkv + g0) * D;
        for (int64_t j = 0; j < n; ++j, ++t) {
          const T* kr = krows + j * row_stride;
          const T* vr = vrows + j * row_stride;
          if (transposed) {
            for (int64_t gi = 0; gi < nh; ++gi) {
              float* kd = Kb + gi * Dp * KT + t;
              for (int64_t d = 0; d < D; ++d) kd[d * KT] = load(kr[gi * D + d]);
            }
          } else if (D == Dp) {
            row_to_f32(kr, Kb + t * rs, nh * D, 1.0f);
          } else {
            for (int64_t gi = 0; gi < nh; ++gi) {
              float* kd = Kb + t * rs + gi * Dp;
              row_to_f32(kr + gi * D, kd, D, 1.0f);
              std::fill(kd + D, kd + Dp, 0.0f);  // may hold a transposed tile of an earlier item
            }
          }
          if (D == Dp) {
            row_to_f32(vr, Vb + t * rs, nh * D, 1.0f);
          } else {
            for (int64_t gi = 0; gi < nh; ++gi) row_to_f32(vr + gi * D, Vb + t * rs + gi * Dp, D, 1.0f);
          }
        }
      }
    }

    for (int64_t gi = 0; gi < nh; ++gi) {
      const float* Kh = transposed ? Kb + gi * Dp * KT : Kb + gi * Dp;
      const float* Vh = Vb + gi * Dp;
      float* Qh = Qf + gi * Mh * Dp;
      float* Oh = O + gi * Mh * Dp;
      if (transposed) {
        for (int64_t tt = tl - tl % W; tt < th; tt += W) {
          int64_t m = 0;
          for (; m + 4 <= Mh; m += 4) qk_tile<4, W>(Qh + m * Dp, Dp, Kh, KT, D, Sc + m * KT, tt);
          for (; m < Mh; ++m) qk_tile<1, W>(Qh + m * Dp, Dp, Kh, KT, D, Sc + m * KT, tt);
        }
      }
      // Online softmax update of every query over its keys [a, e) of this tile.
      for (int64_t mi = 0; mi < Mh; ++mi) {
        const int64_t m = gi * Mh + mi;
        const int64_t p = pos0 + mi / G;
        const int64_t lim = geo.kv_limit ? geo.kv_limit[q_first + it.r0 + mi / G] : p;
        const int64_t lo = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
        const int64_t a = std::max(tl, lo - kb), e = std::min(th, lim + 1 - kb);
        float* pm = P + mi * KT;
        if (a >= e) {
          for (int64_t t = tl; t < th; ++t) pm[t] = 0.0f;
          continue;
        }
        float* sm = Sc + mi * KT;
        if (direct) {
          for (int64_t t = a - a % W; t < e; t += W) score_tile_cache<T, W>(Qh + mi * Dp, krow + t, gi * D, D, sm + t);
        } else if (!transposed) {
          for (int64_t t = a - a % W; t < e; t += W) score_tile<W>(Qh + mi * Dp, Kh + t * rs, rs, Dp, sm + t);
        }
        if (softcap > 0.0f) {
          const float inv = 1.0f / softcap;
          for (int64_t t = a; t < e; ++t) sm[t] = softcap * std::tanh(sm[t] * inv);
        }
        // Tiles of W lanes from a - a % W to e: zero the rest of [tl, th) for the PV product.
        const int64_t t0 = a - a % W, t1 = round_up(e, W);
        for (int64_t t = tl; t < t0; ++t) pm[t] = 0.0f;
        for (int64_t t = t1; t < th; ++t) pm[t] = 0.0f;
        const float m_old = mrun[m];
        float m_new, sum;
        softmax_tiles<W>(sm, pm, a, e, m_old, &m_new, &sum);
        if (m_old != m_new) {
          const float alpha = m_old == kNegInf ? 0.0f : exp_f32(m_old - m_new);
          float* om = O + m * Dp;
          for (int64_t d = 0; d < Dp; ++d) om[d] *= alpha;
          lsum[m] = lsum[m] * alpha + sum;
          mrun[m] = m_new;
        } else {
          lsum[m] += sum;
        }
      }
      // O += P V, four queries at a time.
      int64_t m = 0;
      if (direct) {
        const int64_t off = gi * D;
        for (; m + 4 <= Mh; m += 4) pv_tile_cache<4, W>(P + m * KT, KT, vrow, off, D, Oh + m * Dp, Dp, tl, th);
        for (; m + 2 <= Mh; m += 2) pv_tile_cache<2, W>(P + m * KT, KT, vrow, off, D, Oh + m * Dp, Dp, tl, th);
        for (; m < Mh; ++m) pv_tile_cache<1, W>(P + m * KT, KT, vrow, off, D, Oh + m * Dp, Dp, tl, th);
      } else {
        for (; m + 4 <= Mh; m += 4) pv_tile<4, W>(P + m * KT, KT, Vh, rs, Dp, Oh + m * Dp, tl, th);
        for (; m + 2 <= Mh; m += 2) pv_tile<2, W>(P + m * KT, KT, Vh, rs, Dp, Oh + m * Dp, tl, th);
        for (; m < Mh; ++m) pv_tile<1, W>(P + m * KT, KT, Vh, rs, Dp, Oh + m * Dp, tl, th);
      }
    }
  }

  if (it.part >= 0) {
    float* pp = geo.part + it.part;
    for (int64_t m = 0; m < M; ++m) {
      float* dst = pp + m * (Dp + 2);
      dst[0] = mrun[m];
      dst[1] = lsum[m];
      std::memcpy(dst + 2, O + m * Dp, static_cast<size_t>(D) * sizeof(float));
    }
    return;
  }
  T* out = static_cast<T*>(geo.out);
  for (int64_t m = 0; m < M; ++m) {
    const int64_t gi = m / Mh, ri = (m % Mh) / G, hh = m % G;
    const int64_t row = q_first + it.r0 + ri, h = (g0 + gi) * G + hh;
    finish_row<T>(geo, row, h, mrun[m], lsum[m], O + m * Dp, out + (row * Hq + h) * D);
  }
}

// The item kernel compiled per x86-64 level, with the vector width of its score tile, and
// picked once at run time (the same levels as SG_CPU_CLONES; never -march=native).
using ItemFn = void (*)(const Geometry&, const Item&, float*);
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
template <typename T>
__attribute__((target("arch=x86-64-v4"))) void attend_item_v4(const Geometry& g, const Item& it, float* ws) {
  attend_item_impl<T, 16>(g, it, ws);
}
template <typename T>
__attribute__((target("arch=x86-64-v3"))) void attend_item_v3(const Geometry& g, const Item& it, float* ws) {
  attend_item_impl<T, 8>(g, it, ws);
}
#endif
template <typename T>
void attend_item_base(const Geometry& g, const Item& it, float* ws) {
  attend_item_impl<T, 4>(g, it, ws);
}
// SUROGATE_PAGED_ATTENTION_ISA=x86-64-v3 or =default (a debug switch, read once; the tests use
// it) caps the level, so that the narrower builds can be checked on a wider CPU.
template <typename T>
ItemFn pick_item_fn() {
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
  const char* cap = std::getenv("SUROGATE_PAGED_ATTENTION_ISA");
  const int max_level = !cap ? 4 : std::strcmp(cap, "x86-64-v3") == 0 ? 3 : std::strcmp(cap, "default") == 0 ? 0 : 4;
  __builtin_cpu_init();
  if (max_level >= 4 && __builtin_cpu_supports("x86-64-v4")) return attend_item_v4<T>;
  if (max_level >= 3 && __builtin_cpu_supports("x86-64-v3")) return attend_item_v3<T>;
#endif
  return attend_item_base<T>;
}

// Combine the key splits of one group into the output rows.
template <typename T>
void combine_group(const Geometry& geo, const SplitGroup& sg, float* acc) {
  const int64_t G = geo.G, D = geo.D, Dp = geo.Dp, Hq = geo.Hq;
  const int64_t Mh = (sg.r1 - sg.r0) * G, M = Mh * (sg.g1 - sg.g0);
  const int64_t stride = M * (Dp + 2);  // floats per split
  const int64_t q_first = geo.cu_q[sg.s];
  T* out = static_cast<T*>(geo.out);
  for (int64_t m = 0; m < M; ++m) {
    const float* base = geo.part + sg.part + m * (Dp + 2);
    float mx = kNegInf;
    for (int64_t i = 0; i < sg.nsplit; ++i) mx = std::max(mx, base[i * stride]);
    float l = 0.0f;
    std::fill(acc, acc + D, 0.0f);
    for (int64_t i = 0; i < sg.nsplit; ++i) {
      const float* p = base + i * stride;
      if (p[0] == kNegInf) continue;  // no key of this query in that split
      const float w = std::exp(p[0] - mx);
      l += w * p[1];
      for (int64_t d = 0; d < D; ++d) acc[d] += w * p[2 + d];
    }
    const int64_t gi = m / Mh, ri = (m % Mh) / G, hh = m % G;
    const int64_t row = q_first + sg.r0 + ri, h = (sg.g0 + gi) * G + hh;
    finish_row<T>(geo, row, h, mx, l, acc, out + (row * Hq + h) * D);
  }
}

Status paged_attention(const OpArgs& a) {
  const char* op = "paged_attention";
  const Tensor& q = a.in(0);
  const Tensor& kc = a.in(1);
  const Tensor& vc = a.in(2);
  const Tensor& bt = a.in(3);
  const Tensor& cu = a.in(4);
  const Tensor& cl = a.in(5);
  const Tensor& out = a.out(0);
  PagedAttentionArgs pa;
  SG_RETURN_IF_ERROR(check_paged_attention(a, &pa));
  const bool want_lse = pa.lse != nullptr;
  const int64_t T = pa.T, Hq = pa.Hq, D = pa.D, NB = pa.NB, BS = pa.BS, Hkv = pa.Hkv, S = pa.S;
  const int64_t max_blocks = pa.max_blocks, window = pa.window;
  const double scale = pa.scale, softcap = pa.softcap;

  const int32_t* cu_q = cu.ptr<int32_t>();
  const int32_t* ctx = cl.ptr<int32_t>();
  const int32_t* table = bt.ptr<int32_t>();
  SG_CHECK_ARG(cu_q[0] == 0 && cu_q[S] == T,
               str_cat(op, ": cu_q must start at 0 and end at the ", T, " rows of q, got cu_q[0] = ", cu_q[0],
                       ", cu_q[", S, "] = ", cu_q[S]));
  for (int64_t s = 0; s < S; ++s) {
    const int64_t nq = static_cast<int64_t>(cu_q[s + 1]) - cu_q[s];
    SG_CHECK_ARG(nq >= 0, str_cat(op, ": cu_q decreases at sequence ", s, " (", cu_q[s], " -> ", cu_q[s + 1], ")"));
    SG_CHECK_ARG(nq <= ctx[s], str_cat(op, ": sequence ", s, " has ", nq, " query rows but context_lens[", s,
                                       "] = ", ctx[s], "; the context must include the new tokens"));
    SG_CHECK_ARG(ctx[s] <= max_blocks * BS,
                 str_cat(op, ": context_lens[", s, "] = ", ctx[s], " exceeds the ", max_blocks, " blocks of ", BS,
                         " tokens a row of block_tables holds"));
    if (nq == 0) continue;
    if (pa.kv_limit) {
      const int32_t* kl = pa.kv_limit->ptr<int32_t>();
      for (int64_t i = 0; i < nq; ++i) {
        const int64_t row = cu_q[s] + i, p = ctx[s] - nq + i;
        SG_CHECK_ARG(kl[row] >= p && kl[row] < ctx[s],
                     str_cat(op, ": kv_limit[", row, "] = ", kl[row], " but that row of sequence ", s,
                             " sits at position ", p, " of ", ctx[s], "; it must lie in [", p, ", ", ctx[s] - 1, "]"));
      }
    }
    const int64_t first_pos = ctx[s] - nq;
    const int64_t first_key = window > 0 ? std::max<int64_t>(0, first_pos - window + 1) : 0;
    for (int64_t b = first_key / BS; b * BS < ctx[s]; ++b) {
      const int32_t blk = table[s * max_blocks + b];
      SG_CHECK_ARG(blk >= 0 && blk < NB, str_cat(op, ": block_tables[", s, "][", b, "] = ", blk,
                                                 " is not a block of the cache (0..", NB - 1, ") but sequence ", s,
                                                 " reads it"));
    }
  }
  if (T == 0) return Status::OK();

  Geometry geo;
  geo.q = q.data;
  geo.kc = kc.data;
  geo.vc = vc.data;
  geo.out = out.data;
  geo.lse = want_lse ? a.out(1).ptr<float>() : nullptr;
  geo.bt = table;
  geo.cu_q = cu_q;
  geo.ctx = ctx;
  geo.max_blocks = max_blocks;
  geo.Hq = Hq;
  geo.Hkv = Hkv;
  geo.G = Hq / Hkv;
  geo.D = D;
  geo.Dp = round_up(D, kLanes);
  geo.BS = BS;
  geo.window = window;
  geo.scale = static_cast<float>(scale);
  geo.softcap = static_cast<float>(softcap);
  geo.kv_limit = pa.kv_limit ? pa.kv_limit->ptr<int32_t>() : nullptr;
  std::vector<float> sinks;
  if (pa.sinks) {
    sinks.resize(Hq);
    for (int64_t h = 0; h < Hq; ++h) {
      const Tensor& z = *pa.sinks;
      sinks[h] = z.dtype == DType::kBF16 ? load(z.ptr<bf16_t>()[h])
                 : z.dtype == DType::kF16 ? load(z.ptr<f16_t>()[h]) : z.ptr<float>()[h];
    }
    geo.sinks = sinks.data();
  }
  const int64_t G = geo.G;

  // Work items: (sequence, query block), then key splits while they are fewer than twice the
  // threads, then kv head ranges while fewer than four times.
  struct Base { int32_t s, r0, r1; int64_t k0, k1; };
  std::vector<Base> bases;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t nq = cu_q[s + 1] - cu_q[s];
    if (nq == 0) continue;
    const int64_t qb = nq == 1 ? 1 : std::max<int64_t>(1, kTargetQueries / G);
    for (int64_t r0 = 0; r0 < nq; r0 += qb) {
      const int64_t r1 = std::min(nq, r0 + qb);
      const int64_t p0 = ctx[s] - nq + r0, p1 = ctx[s] - nq + r1 - 1;
      const int64_t k0 = window > 0 ? std::max<int64_t>(0, p0 - window + 1) : 0;
      int64_t last = p1;  // the last key any of the rows sees
      for (int64_t r = r0; geo.kv_limit && r < r1; ++r) last = std::max<int64_t>(last, geo.kv_limit[cu_q[s] + r]);
      bases.push_back({static_cast<int32_t>(s), static_cast<int32_t>(r0), static_cast<int32_t>(r1), k0, last + 1});
    }
  }
  const int64_t threads = num_threads();
  const int64_t n_base = static_cast<int64_t>(bases.size());
  const int64_t want_splits = n_base < 2 * threads ? (2 * threads + n_base - 1) / n_base : 1;
  struct Split { int64_t kb0, chunk, ns; };
  const int64_t split_unit = std::lcm(BS, kKeyTile);  // splits cut at block and key tile boundaries
  std::vector<Split> splits(bases.size());
  int64_t n_split_items = 0;
  for (size_t i = 0; i < bases.size(); ++i) {
    const Base& b = bases[i];
    int64_t ns = std::max<int64_t>(1, std::min(want_splits, (b.k1 - b.k0) / kMinSplitKeys));
    const int64_t kb0 = b.k0 - b.k0 % split_unit;
    const int64_t chunk = round_up((b.k1 - kb0 + ns - 1) / ns, split_unit);
    ns = (b.k1 - kb0 + chunk - 1) / chunk;
    splits[i] = {kb0, chunk, ns};
    n_split_items += ns;
  }
  const int64_t head_chunks =
      n_split_items < 4 * threads ? std::min(Hkv, (4 * threads + n_split_items - 1) / n_split_items) : 1;
  const int64_t heads_per = (Hkv + head_chunks - 1) / head_chunks;

  std::vector<Item> items;
  std::vector<SplitGroup> groups;
  int64_t part_floats = 0, ws_floats = 0;
  for (size_t i = 0; i < bases.size(); ++i) {
    const Base& b = bases[i];
    const Split& sp = splits[i];
    for (int64_t g0 = 0; g0 < Hkv; g0 += heads_per) {
      const int64_t g1 = std::min(Hkv, g0 + heads_per);
      const int64_t Mh = (b.r1 - b.r0) * G, M = Mh * (g1 - g0);
      ws_floats = std::max(ws_floats, workspace_floats(M, Mh, g1 - g0, D, geo.Dp));
      int64_t part = -1;
      if (sp.ns > 1) {
        groups.push_back({b.s, b.r0, b.r1, static_cast<int32_t>(g0), static_cast<int32_t>(g1),
                          static_cast<int32_t>(sp.ns), part_floats});
        part = part_floats;
        part_floats += sp.ns * M * (geo.Dp + 2);
      }
      for (int64_t j = 0; j < sp.ns; ++j) {
        Item it;
        it.s = b.s;
        it.r0 = b.r0;
        it.r1 = b.r1;
        it.g0 = static_cast<int32_t>(g0);
        it.g1 = static_cast<int32_t>(g1);
        it.k0 = std::max(b.k0, sp.kb0 + j * sp.chunk);
        it.k1 = std::min(b.k1, sp.kb0 + (j + 1) * sp.chunk);
        it.part = sp.ns > 1 ? part + j * M * (geo.Dp + 2) : -1;
        it.cost = static_cast<double>(it.k1 - it.k0) * static_cast<double>(M + 8 * (g1 - g0));
        items.push_back(it);
      }
    }
  }
  // Largest first, so that the pool's dynamic chunks even out a mixed batch.
  std::stable_sort(items.begin(), items.end(), [](const Item& x, const Item& y) { return x.cost > y.cost; });

  Tensor part_t;
  if (part_floats > 0) {
    SG_RETURN_IF_ERROR(empty({part_floats}, DType::kF32, Device{}, &part_t));
    geo.part = part_t.ptr<float>();
  }

  SG_DISPATCH_FLOAT(op, q.dtype, Ty, {
    static const ItemFn attend_item = pick_item_fn<Ty>();
    parallel_for(0, static_cast<int64_t>(items.size()), 1, [&](int64_t lo, int64_t hi) {
      std::vector<float> ws(static_cast<size_t>(ws_floats), 0.0f);
      for (int64_t i = lo; i < hi; ++i) attend_item(geo, items[i], ws.data());
    });
    if (!groups.empty()) {
      parallel_for(0, static_cast<int64_t>(groups.size()), 1, [&](int64_t lo, int64_t hi) {
        std::vector<float> acc(static_cast<size_t>(D));
        for (int64_t i = lo; i < hi; ++i) combine_group<Ty>(geo, groups[i], acc.data());
      });
    }
  });
  return Status::OK();
}

}  // namespace

// ---- kv_cache_write --------------------------------------------------------------------------

Status check_slot_mapping(const char* op, const int32_t* slots, int64_t T, int64_t num_blocks, int64_t block_size) {
  const int64_t n_slots = num_blocks * block_size;
  std::vector<std::pair<int32_t, int64_t>> used;
  used.reserve(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) {
    const int32_t slot = slots[i];
    if (slot == -1) continue;
    SG_CHECK_ARG(slot >= 0 && slot < n_slots,
                 str_cat(op, ": slot_mapping[", i, "] = ", slot, " (token ", i, ") is outside the cache's ", n_slots,
                         " slots (", num_blocks, " blocks of ", block_size, "); -1 skips a token"));
    used.emplace_back(slot, i);
  }
  std::sort(used.begin(), used.end());
  for (size_t j = 1; j < used.size(); ++j) {
    SG_CHECK_ARG(used[j].first != used[j - 1].first,
                 str_cat(op, ": tokens ", used[j - 1].second, " and ", used[j].second, " both map to slot ",
                         used[j].first));
  }
  return Status::OK();
}

namespace {

Status kv_cache_write(const OpArgs& a) {
  const char* op = "kv_cache_write";
  const Tensor& k = a.in(0);
  const Tensor& v = a.in(1);
  const Tensor& sm = a.in(2);
  const Tensor& kc = a.out(0);
  const Tensor& vc = a.out(1);
  KvCacheWriteArgs kw;
  SG_RETURN_IF_ERROR(check_kv_cache_write(a, &kw));
  const int64_t T = kw.T, Hkv = kw.Hkv, D = kw.D;
  const int32_t* slots = sm.ptr<int32_t>();
  SG_RETURN_IF_ERROR(check_slot_mapping(op, slots, T, kc.shape[0], kc.shape[1]));

  const size_t row_bytes = static_cast<size_t>(Hkv * D) * dtype_size(k.dtype);
  const char* ks = static_cast<const char*>(k.data);
  const char* vs = static_cast<const char*>(v.data);
  char* kd = static_cast<char*>(kc.data);
  char* vd = static_cast<char*>(vc.data);
  const int64_t grain = std::max<int64_t>(1, static_cast<int64_t>((64 << 10) / std::max<size_t>(row_bytes, 1)));
  parallel_for(0, T, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t slot = slots[i];
      if (slot < 0) continue;
      std::memcpy(kd + slot * row_bytes, ks + i * row_bytes, row_bytes);
      std::memcpy(vd + slot * row_bytes, vs + i * row_bytes, row_bytes);
    }
  });
  return Status::OK();
}

}  // namespace

void register_cpu_paged_attention(OpRegistry& reg) {
  add_op(reg, "kv_cache_write", kv_cache_write);
  add_op(reg, "paged_attention", paged_attention);
}

}  // namespace surogate::cpu
