// CUDA attention over packed variable-length documents: attention_fwd and attention_bwd, the
// twins of cpu/attention.cpp. That file is the spec and documents the math: the scale default,
// softcap, the visible keys under causal / window, the lse convention and GQA (query head h reads
// kv head h / G). Shape letters as there: N packed tokens, Hq / Hkv heads, D head dim, S documents.
//
// How it runs (FlashAttention-2 in shape, WMMA tensor cores for bf16 / f16, plain f32 FMAs for
// f32, which only tests use):
//   forward:  one CTA per (query tile of BM rows of one document, query head). K / V tiles of BN
//             keys stream through shared memory; scores S = Q K^T and the output accumulator O
//             live in shared f32, the softmax is online (running max and sum per row). Key tiles
//             that no query of the tile sees (causal, window) are never visited.
//   backward: Delta = rowsum(dout * out) first; then one CTA per (key tile of one document, kv
//             head). It holds K, V and f32 dK, dV in shared memory and walks the query tiles that
//             see its keys, for each of the G query heads of its group: recompute P = exp(s - lse),
//             dP = dO V^T, dS = P (dP - Delta) [(1 - tanh^2) under softcap], add dV += P^T dO,
//             dK += dS^T Q, and atomically add dS K into an f32 [N, Hq, D] scratch, cast to dq
//             (times scale) at the end.
// A kv_limit (bidirectional spans) moves each query's last key: the forward's key tiles end at
// the last query's limit, the backward's query tiles start at the first query that sees the key
// tile (a binary search over the document's nondecreasing limits); both stay intervals.
//
// bf16 / f16 with D a multiple of 8 up to 128 and no softcap take the fast path instead
// (attention_flash.cu: register-resident FlashAttention-2 on mma.sync); these kernels serve
// everything else (f32, softcap, D > 128 or not a multiple of 8).
//
// Documents are found on the device: cu_seqlens is device memory and reading it on the host
// would synchronize. A one-block kernel turns it into tile offsets (document s owns tiles
// [off[s], off[s+1])); the grid is sized by the bound ceil(N / rows) + S and surplus CTAs exit.
// The kernels cannot validate cu_seqlens' values the way the CPU op does; they clamp every
// offset into [0, N] so a malformed one gives wrong numbers, never an out-of-bounds access.
//
// Head dims are padded up to a compiled width kD (64, 128, 256 or 512) with zeros in shared
// memory: 64, 128, 256 and 512 run at their own width, anything else (8, 80, 96, 320, ...) on the
// next one up. The tiles shrink as kD grows (FwdTile, BwdTile); where a small tile's score product
// has fewer output blocks than the CTA has warps, its reduction over D is split across the warps.
//
// The file is past ~400 lines because both directions share the tile matmul, the loaders, the
// mask and the document lookup, and each kernel reads best next to the other's derivation.
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/allocator.h"
#include "cuda/attention_docs.cuh"
#include "cuda/attention_flash.cuh"
#include "cuda/attention_sinks.cuh"
#include "cuda/backend.h"
#include "cuda/common.cuh"
#include "runtime/op_checks_attention.h"

namespace surogate::cuda {

namespace {

constexpr int kThreads = 256;                   // 8 warps per CTA: the tiles hold one or two CTAs per SM
constexpr int kMaxSmem = 227 * 1024;            // per block on H100 / H200 (opt-in above 48 KB)
constexpr int kOffsetThreads = 1024;            // the one block that scans cu_seqlens
constexpr int kMaxHeadDim = 512;                // the widest compiled tile (Gemma 4's global layers)
constexpr float kNegInf = -INFINITY;

// ---- tile shapes ---------------------------------------------------------------------------
// Leading dims are padded (8 elements for operands, 4 floats for f32 tiles) so that rows do not
// all start on the same shared-memory bank; WMMA needs them to be multiples of 16 bytes.

// Warps that a score product (S = Q K^T, dP = dO V^T) leaves idle when the tile has fewer 16 x 16
// output blocks than the CTA has warps (the large head dims' small tiles): the reduction over D
// is then split kSplit ways, each warp summing a slice into f32 scratch that is added up after.
// f32 tiles use plain FMAs, one thread per output element, and need no split.
template <typename T, int M, int N>
constexpr int score_split() {
  if constexpr (std::is_same_v<T, float>) {
    return 1;
  } else {
    constexpr int blocks = (M / 16) * (N / 16);
    return blocks >= kThreads / 32 ? 1 : (kThreads / 32) / blocks;
  }
}
constexpr int align128(int bytes) { return (bytes + 127) / 128 * 128; }

// Rows of a tile shrink as D grows so that Q, K, V (or K, V, Q, dO) and the f32 accumulators fit
// one CTA: D = 512 keeps 32 query rows x 32 keys forward (16 x 32 in f32) and 16 x 16 backward
// (8 x 8 in f32).
template <typename T, int kD>
struct FwdTile {
  static constexpr bool kF32 = std::is_same_v<T, float>;
  static constexpr int BM = kF32 ? (kD > 256 ? 16 : kD > 128 ? 32 : 64) : (kD > 256 ? 32 : 64);  // query rows
  static constexpr int BN = kD > 128 ? 32 : 64;                                                    // keys
  static constexpr int kSplit = score_split<T, BM, BN>();
  static constexpr int LDT = kD + 8, LDO = kD + 4, LDS = BN + 4, LDP = BN + 8;
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + BM * LDT * int(sizeof(T));
  static constexpr int kV = kK + BN * LDT * int(sizeof(T));
  static constexpr int kO = kV + BN * LDT * int(sizeof(T));
  static constexpr int kS = kO + BM * LDO * 4;
  static constexpr int kP = kS + BM * LDS * 4;
  static constexpr int kM = kP + BM * LDP * int(sizeof(T));
  static constexpr int kL = kM + BM * 4;
  static constexpr int kSplitAt = align128(kL + BM * 4);  // kSplit slices of S when kSplit > 1
  static constexpr int kBytes = kSplitAt + (kSplit > 1 ? kSplit * BM * LDS * 4 : 0);
  static_assert(kBytes <= kMaxSmem, "forward tile does not fit in shared memory");
};

template <typename T, int kD>
struct BwdTile {
  static constexpr bool kF32 = std::is_same_v<T, float>;
  static constexpr int BM = kF32 ? (kD <= 64 ? 64 : kD <= 128 ? 32 : kD <= 256 ? 16 : 8)
                                 : (kD <= 128 ? 64 : kD <= 256 ? 32 : 16);  // query rows
  static constexpr int BN = BM;                                             // keys
  static constexpr int kSplit = score_split<T, BM, BN>();
  static constexpr int LDT = kD + 8, LDO = kD + 4, LDS = BN + 4, LDP = BN + 8;
  // dQ's f32 tile is needed only after S and dP have become P and dS: it shares their space.
  static constexpr int kUnion = std::max(2 * BM * LDS * 4, BM * LDO * 4);
  static constexpr int kK = 0;
  static constexpr int kV = kK + BN * LDT * int(sizeof(T));
  static constexpr int kQ = kV + BN * LDT * int(sizeof(T));
  static constexpr int kDO = kQ + BM * LDT * int(sizeof(T));
  static constexpr int kS = kDO + BM * LDT * int(sizeof(T));  // S, then dP at kS + BM * LDS * 4; dQ over both
  static constexpr int kP = kS + kUnion;
  static constexpr int kDS = kP + BM * LDP * int(sizeof(T));
  static constexpr int kDK = kDS + BM * LDP * int(sizeof(T));
  static constexpr int kDV = kDK + BN * LDO * 4;
  static constexpr int kLse = kDV + BN * LDO * 4;
  static constexpr int kDelta = kLse + BM * 4;
  static constexpr int kSplitAt = align128(kDelta + BM * 4);  // shared by S and dP, one after the other
  static constexpr int kBytes = kSplitAt + (kSplit > 1 ? kSplit * BM * LDS * 4 : 0);
  static_assert(kBytes <= kMaxSmem, "backward tile does not fit in shared memory");
};

// ---- masks and documents ---------------------------------------------------------------------

// min64 / max64 / clamp64, doc_bounds and find_doc: cuda/attention_docs.cuh.
using namespace attn;

// Keys [lo(i), hi(i)) of a document of length L are visible to its query i; both bounds are
// nondecreasing in i (cpu/attention.cpp, AttnConfig). int64: i + window must not overflow.
// kLimit (a kv_limit is given; causal only): hi(i) = lim[i] + 1 and the first query of a key tile
// the first whose limit reaches it (attention_docs.cuh), lim the document's slice of kv_limit. The
// kernels are compiled once without it: a call without a kv_limit runs the code it ran before.
struct Mask {
  bool causal;
  int64_t window;
  const int32_t* kv_limit;  // [N], or null
  __device__ int64_t lo(int64_t i) const {
    if (window <= 0) return 0;
    return max64(0, causal ? i - window + 1 : i - window);
  }
  template <bool kLimit>
  __device__ int64_t hi(int64_t i, int64_t L, const int32_t* lim) const {
    if constexpr (kLimit) return limit_hi(lim, i, L);
    if (causal) return i + 1;
    return window > 0 ? min64(L, i + window + 1) : L;
  }
  // The queries that see at least one key of [k0, k1).
  template <bool kLimit>
  __device__ void queries(int64_t k0, int64_t k1, int64_t L, const int32_t* lim, int64_t* q0, int64_t* q1) const {
    if (causal) {
      *q0 = kLimit ? limit_first_query(lim, k0, L) : k0;
      *q1 = window > 0 ? min64(L, k1 + window - 1) : L;
    } else if (window > 0) {
      *q0 = max64(0, k0 - window);
      *q1 = min64(L, k1 + window);
    } else {
      *q0 = 0;
      *q1 = L;
    }
  }
};

// off[s] = tiles of `rows` rows in the documents before s; off[S] = all of them. One block: each
// thread takes a run of documents, then a block-wide exclusive scan of the per-thread counts.
__global__ void tile_offsets_kernel(const int32_t* cu, int S, int64_t N, int rows, int* off) {
  __shared__ int warp_total[kOffsetThreads / 32];
  const int per = (S + kOffsetThreads - 1) / kOffsetThreads;
  const int s0 = static_cast<int>(min64(S, int64_t(threadIdx.x) * per));
  const int s1 = static_cast<int>(min64(S, int64_t(s0) + per));
  auto tiles = [&](int s) {
    int64_t start, len;
    doc_bounds(cu, s, N, &start, &len);
    return static_cast<int>((len + rows - 1) / rows);
  };
  int mine = 0;
  for (int s = s0; s < s1; ++s) mine += tiles(s);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int incl = mine;
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  if (lane == 31) warp_total[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int w = warp_total[lane];
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += y;
    }
    __syncwarp();
    warp_total[lane] = w;  // inclusive over warps
  }
  __syncthreads();
  int at = incl - mine + (warp > 0 ? warp_total[warp - 1] : 0);
  for (int s = s0; s < s1; ++s) {
    off[s] = at;
    at += tiles(s);
  }
  if (threadIdx.x == kOffsetThreads - 1) off[S] = at;
}

// ---- shared-memory tiles ---------------------------------------------------------------------

// dst[r][c] (r < nrows, c < kD) = src[r * stride + c] for r < nvalid and c < D, else 0: the zero
// rows and columns make padded products exact and keep stale data (NaN * 0) out of them.
template <typename T, int kD>
__device__ void load_rows(T* dst, int ldd, const T* src, int64_t stride, int nvalid, int nrows, int D) {
  constexpr int V = 16 / int(sizeof(T));
  const bool vec = D % V == 0 && stride % V == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0;
  if (vec) {
    constexpr int per_row = kD / V;
    for (int e = threadIdx.x; e < nrows * per_row; e += blockDim.x) {
      const int r = e / per_row, c = (e % per_row) * V;
      uint4 val = make_uint4(0, 0, 0, 0);
      if (r < nvalid && c < D) val = *reinterpret_cast<const uint4*>(src + r * stride + c);
      *reinterpret_cast<uint4*>(dst + r * ldd + c) = val;
    }
  } else {
    for (int e = threadIdx.x; e < nrows * kD; e += blockDim.x) {
      const int r = e / kD, c = e % kD;
      dst[r * ldd + c] = (r < nvalid && c < D) ? src[r * stride + c] : st<T>(0.0f);
    }
  }
}

__device__ __forceinline__ void zero_f32(float* p, int n) {
  for (int e = threadIdx.x; e < n; e += blockDim.x) p[e] = 0.0f;
}

// C[M][N] (f32, ldc) = (acc ? C : 0) + op(A)[M][K] op(B)[K][N], all in shared memory, the whole
// block cooperating. op(A)[m][k] = kTA ? A[k * lda + m] : A[m * lda + k]; op(B)[k][n] = kTB ?
// B[n * ldb + k] : B[k * ldb + n]; transposes are free (WMMA col_major loads). The caller
// synchronizes before (A, B, C written) and after (C read by other threads).
// kSplit > 1 (WMMA only): the K dimension is cut in kSplit slices, so that M x N / 256 output
// blocks keep kSplit times as many warps busy; each (block, slice) goes to f32 `scratch`
// ([kSplit][M][N + 4]) and the block sums the slices into C. That path synchronizes inside
// (every thread must call it) and once more at its end, so that two split products may follow
// each other on the same scratch.
template <int M, int N, int K, bool kTA, bool kTB, int kSplit = 1, typename T>
__device__ void block_mma(float* C, int ldc, const T* A, int lda, const T* B, int ldb, bool acc,
                          float* scratch = nullptr) {
  if constexpr (std::is_same_v<T, float>) {
    static_assert(kSplit == 1, "f32 products are one thread per output element");
    for (int e = threadIdx.x; e < M * N; e += blockDim.x) {
      const int m = e / N, n = e % N;
      float s = acc ? C[m * ldc + n] : 0.0f;
#pragma unroll 8
      for (int k = 0; k < K; ++k) s += (kTA ? A[k * lda + m] : A[m * lda + k]) * (kTB ? B[n * ldb + k] : B[k * ldb + n]);
      C[m * ldc + n] = s;
    }
  } else {
    namespace wmma = nvcuda::wmma;
    static_assert(M % 16 == 0 && N % 16 == 0 && K % (16 * kSplit) == 0, "tiles are multiples of 16");
    using LA = std::conditional_t<kTA, wmma::col_major, wmma::row_major>;
    using LB = std::conditional_t<kTB, wmma::col_major, wmma::row_major>;
    constexpr int TN = N / 16, KS = K / kSplit, LDW = N + 4;
    const int warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    for (int t = warp; t < (M / 16) * TN * kSplit; t += nwarps) {
      const int blk = t % ((M / 16) * TN), slice = t / ((M / 16) * TN);
      const int tm = blk / TN, tn = blk % TN;
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
      if (kSplit == 1 && acc) wmma::load_matrix_sync(c, C + tm * 16 * ldc + tn * 16, ldc, wmma::mem_row_major);
      else wmma::fill_fragment(c, 0.0f);
#pragma unroll 4
      for (int k = slice * KS; k < (slice + 1) * KS; k += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LA> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LB> b;
        wmma::load_matrix_sync(a, kTA ? A + k * lda + tm * 16 : A + tm * 16 * lda + k, lda);
        wmma::load_matrix_sync(b, kTB ? B + tn * 16 * ldb + k : B + k * ldb + tn * 16, ldb);
        wmma::mma_sync(c, a, b, c);
      }
      if constexpr (kSplit == 1) {
        wmma::store_matrix_sync(C + tm * 16 * ldc + tn * 16, c, ldc, wmma::mem_row_major);
      } else {
        wmma::store_matrix_sync(scratch + (slice * M + tm * 16) * LDW + tn * 16, c, LDW, wmma::mem_row_major);
      }
    }
    if constexpr (kSplit > 1) {
      __syncthreads();
      for (int e = threadIdx.x; e < M * N; e += blockDim.x) {
        const int m = e / N, n = e % N;
        float s = acc ? C[m * ldc + n] : 0.0f;
#pragma unroll
        for (int z = 0; z < kSplit; ++z) s += scratch[(z * M + m) * LDW + n];
        C[m * ldc + n] = s;
      }
      __syncthreads();
    }
  }
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

struct Params {
  const void *q, *k, *v, *dout, *out;
  const float *lse_in, *delta;
  const int32_t* cu;
  const int* off;
  void *o, *dk, *dv;
  float *lse, *dq_acc;
  int64_t N, Hq, Hkv, G, D;
  int S;
  Mask mask;
  float scale, softcap;
};

// ---- forward -------------------------------------------------------------------------------

template <typename T, int kD, bool kLimit>
__global__ void __launch_bounds__(kThreads) attention_fwd_kernel(Params p) {
  using C = FwdTile<T, kD>;
  constexpr int BM = C::BM, BN = C::BN;
  // Highest tile first: the last query tiles of a document see the most keys under a causal
  // mask and should not be the stragglers. Surplus CTAs (the grid is an upper bound) exit.
  const int b = static_cast<int>(gridDim.x - 1 - blockIdx.x);
  if (b >= p.off[p.S]) return;
  const int s = find_doc(p.off, p.S, b);
  int64_t base, L;
  doc_bounds(p.cu, s, p.N, &base, &L);
  const int64_t q0 = int64_t(b - p.off[s]) * BM;
  const int nq = static_cast<int>(min64(BM, L - q0));
  const int64_t h = blockIdx.y, hk = h / p.G;
  const int32_t* lim = kLimit ? p.mask.kv_limit + base : nullptr;  // the document's kv_limit

  extern __shared__ __align__(128) unsigned char smem[];
  T* Qs = reinterpret_cast<T*>(smem + C::kQ);
  T* Ks = reinterpret_cast<T*>(smem + C::kK);
  T* Vs = reinterpret_cast<T*>(smem + C::kV);
  float* Os = reinterpret_cast<float*>(smem + C::kO);
  float* Ss = reinterpret_cast<float*>(smem + C::kS);
  T* Ps = reinterpret_cast<T*>(smem + C::kP);
  float* m_s = reinterpret_cast<float*>(smem + C::kM);
  float* l_s = reinterpret_cast<float*>(smem + C::kL);
  float* split_s = reinterpret_cast<float*>(smem + C::kSplitAt);

  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  const int D = static_cast<int>(p.D);
  const int64_t q_stride = p.Hq * p.D, kv_stride = p.Hkv * p.D;
  load_rows<T, kD>(Qs, C::LDT, q + ((base + q0) * p.Hq + h) * p.D, q_stride, nq, BM, D);
  zero_f32(Os, BM * C::LDO);
  for (int r = threadIdx.x; r < BM; r += blockDim.x) m_s[r] = kNegInf, l_s[r] = 0.0f;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int64_t kb_begin = p.mask.lo(q0) / BN;
  const int64_t kb_end = (p.mask.hi<kLimit>(q0 + nq - 1, L, lim) + BN - 1) / BN;
  for (int64_t kb = kb_begin; kb < kb_end; ++kb) {
    const int64_t k0 = kb * BN;
    const int nk = static_cast<int>(min64(BN, L - k0));
    __syncthreads();  // the previous tile's O += P V is done with Ks, Vs, Ps
    load_rows<T, kD>(Ks, C::LDT, k + ((base + k0) * p.Hkv + hk) * p.D, kv_stride, nk, BN, D);
    load_rows<T, kD>(Vs, C::LDT, v + ((base + k0) * p.Hkv + hk) * p.D, kv_stride, nk, BN, D);
    __syncthreads();
    block_mma<BM, BN, kD, false, true, C::kSplit>(Ss, C::LDS, Qs, C::LDT, Ks, C::LDT, false, split_s);  // S = Q K^T
    __syncthreads();

    // Online softmax, one warp per row: masked scores become -inf, P = exp(s - m_new), and the
    // row's sum and output are rescaled by exp(m_old - m_new) when its max moves.
    for (int r = warp; r < BM; r += nwarps) {
      float* srow = Ss + r * C::LDS;
      T* prow = Ps + r * C::LDP;
      if (r >= nq) {  // past the document's end: P = 0 keeps those O rows at 0
        for (int c = lane; c < BN; c += 32) prow[c] = st<T>(0.0f);
        continue;
      }
      const int64_t i = q0 + r;
      const int64_t lo = clamp64(p.mask.lo(i) - k0, 0, nk);
      const int64_t hi = clamp64(p.mask.hi<kLimit>(i, L, lim) - k0, 0, nk);
      float mx = kNegInf;
      for (int c = lane; c < BN; c += 32) {
        float x = kNegInf;
        if (c >= lo && c < hi) {
          x = srow[c] * p.scale;
          if (p.softcap > 0.0f) x = p.softcap * tanhf(x / p.softcap);
        }
        srow[c] = x;
        mx = fmaxf(mx, x);
      }
      mx = warp_max(mx);
      const float m_old = m_s[r];
      const float m_new = fmaxf(m_old, mx);
      // m_new = -inf: this row has seen no key yet (a window that starts past this tile's
      // first rows); its P row is 0 and there is nothing to rescale.
      const bool none = m_new == kNegInf;
      const float corr = none ? 1.0f : __expf(m_old - m_new);
      float sum = 0.0f;
      for (int c = lane; c < BN; c += 32) {
        const float pv = none ? 0.0f : __expf(srow[c] - m_new);
        prow[c] = st<T>(pv);
        sum += pv;
      }
      sum = warp_sum(sum);
      if (corr != 1.0f) {
        float* orow = Os + r * C::LDO;
        for (int d = lane; d < kD; d += 32) orow[d] *= corr;
      }
      __syncwarp();  // every lane has read m_s[r] before lane 0 replaces it
      if (lane == 0) {
        m_s[r] = m_new;
        l_s[r] = l_s[r] * corr + sum;
      }
    }
    __syncthreads();
    block_mma<BM, kD, BN, false, false>(Os, C::LDO, Ps, C::LDP, Vs, C::LDT, true);  // O += P V
  }
  __syncthreads();

  T* o = static_cast<T*>(p.o);
  for (int e = threadIdx.x; e < nq * D; e += blockDim.x) {
    const int r = e / D, d = e % D;
    const float l = l_s[r];
    o[((base + q0 + r) * p.Hq + h) * p.D + d] = st<T>(l > 0.0f ? Os[r * C::LDO + d] / l : 0.0f);
  }
  for (int r = threadIdx.x; r < nq; r += blockDim.x) {
    p.lse[(base + q0 + r) * p.Hq + h] = m_s[r] + logf(l_s[r]);
  }
}

// ---- backward ------------------------------------------------------------------------------

// delta[row] = dout[row] . out[row] for every (token, query head) row: one warp per row.
template <typename T>
__global__ void attention_delta_kernel(const T* dout, const T* out, float* delta, int64_t rows, int64_t D) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  for (int64_t row = blockIdx.x * int64_t(blockDim.x >> 5) + (threadIdx.x >> 5); row < rows; row += warps) {
    float acc = 0.0f;
    for (int64_t d = lane; d < D; d += 32) acc += ld(dout[row * D + d]) * ld(out[row * D + d]);
    acc = warp_sum(acc);
    if (lane == 0) delta[row] = acc;
  }
}

template <typename T>
__global__ void attention_dq_kernel(const float* acc, T* dq, int64_t n, float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    dq[i] = st<T>(scale * acc[i]);
  }
}

template <typename T, int kD, bool kLimit>
__global__ void __launch_bounds__(kThreads) attention_bwd_kernel(Params p) {
  using C = BwdTile<T, kD>;
  constexpr int BM = C::BM, BN = C::BN;
  const int b = static_cast<int>(blockIdx.x);
  if (b >= p.off[p.S]) return;
  const int s = find_doc(p.off, p.S, b);
  int64_t base, L;
  doc_bounds(p.cu, s, p.N, &base, &L);
  const int64_t k0 = int64_t(b - p.off[s]) * BN;
  const int nk = static_cast<int>(min64(BN, L - k0));
  const int64_t hk = blockIdx.y;
  const int32_t* lim = kLimit ? p.mask.kv_limit + base : nullptr;  // the document's kv_limit

  extern __shared__ __align__(128) unsigned char smem[];
  T* Ks = reinterpret_cast<T*>(smem + C::kK);
  T* Vs = reinterpret_cast<T*>(smem + C::kV);
  T* Qs = reinterpret_cast<T*>(smem + C::kQ);
  T* dOs = reinterpret_cast<T*>(smem + C::kDO);
  float* Ss = reinterpret_cast<float*>(smem + C::kS);
  float* dPs = Ss + BM * C::LDS;
  float* dQs = Ss;  // after S and dP are consumed
  T* Ps = reinterpret_cast<T*>(smem + C::kP);
  T* dSs = reinterpret_cast<T*>(smem + C::kDS);
  float* dKs = reinterpret_cast<float*>(smem + C::kDK);
  float* dVs = reinterpret_cast<float*>(smem + C::kDV);
  float* lse_s = reinterpret_cast<float*>(smem + C::kLse);
  float* delta_s = reinterpret_cast<float*>(smem + C::kDelta);
  float* split_s = reinterpret_cast<float*>(smem + C::kSplitAt);

  const T* q = static_cast<const T*>(p.q);
  const T* dout = static_cast<const T*>(p.dout);
  const int D = static_cast<int>(p.D);
  const int64_t q_stride = p.Hq * p.D, kv_stride = p.Hkv * p.D;
  load_rows<T, kD>(Ks, C::LDT, static_cast<const T*>(p.k) + ((base + k0) * p.Hkv + hk) * p.D, kv_stride, nk, BN, D);
  load_rows<T, kD>(Vs, C::LDT, static_cast<const T*>(p.v) + ((base + k0) * p.Hkv + hk) * p.D, kv_stride, nk, BN, D);
  zero_f32(dKs, BN * C::LDO);
  zero_f32(dVs, BN * C::LDO);

  int64_t q_lo, q_hi;
  p.mask.queries<kLimit>(k0, k0 + nk, L, lim, &q_lo, &q_hi);
  for (int64_t g = 0; g < p.G; ++g) {
    const int64_t h = hk * p.G + g;
    for (int64_t t0 = q_lo; t0 < q_hi; t0 += BM) {
      const int nq = static_cast<int>(min64(BM, q_hi - t0));
      const int64_t row0 = (base + t0) * p.Hq + h;  // (token, head) row of the tile's first query
      __syncthreads();  // the previous query tile is done with Qs, dOs, Ps, dSs and dQs
      load_rows<T, kD>(Qs, C::LDT, q + row0 * p.D, q_stride, nq, BM, D);
      load_rows<T, kD>(dOs, C::LDT, dout + row0 * p.D, q_stride, nq, BM, D);
      for (int r = threadIdx.x; r < BM; r += blockDim.x) {
        lse_s[r] = r < nq ? p.lse_in[row0 + r * p.Hq] : 0.0f;
        delta_s[r] = r < nq ? p.delta[row0 + r * p.Hq] : 0.0f;
      }
      __syncthreads();
      block_mma<BM, BN, kD, false, true, C::kSplit>(Ss, C::LDS, Qs, C::LDT, Ks, C::LDT, false, split_s);    // S = Q K^T
      block_mma<BM, BN, kD, false, true, C::kSplit>(dPs, C::LDS, dOs, C::LDT, Vs, C::LDT, false, split_s);  // dP = dO V^T
      __syncthreads();
      // P and dS (the gradient with respect to the scaled, uncapped score) for visible pairs; 0
      // elsewhere, including rows and columns past the document's end.
      for (int e = threadIdx.x; e < BM * BN; e += blockDim.x) {
        const int r = e / BN, c = e % BN;
        float pv = 0.0f, ds = 0.0f;
        const int64_t i = t0 + r, j = k0 + c;
        if (r < nq && c < nk && j >= p.mask.lo(i) && j < p.mask.hi<kLimit>(i, L, lim)) {
          float x = Ss[r * C::LDS + c] * p.scale, dcap = 1.0f;
          if (p.softcap > 0.0f) {
            const float th = tanhf(x / p.softcap);
            x = p.softcap * th;
            dcap = 1.0f - th * th;
          }
          pv = __expf(x - lse_s[r]);
          ds = pv * (dPs[r * C::LDS + c] - delta_s[r]) * dcap;
        }
        Ps[r * C::LDP + c] = st<T>(pv);
        dSs[r * C::LDP + c] = st<T>(ds);
      }
      __syncthreads();
      block_mma<BN, kD, BM, true, false>(dVs, C::LDO, Ps, C::LDP, dOs, C::LDT, true);   // dV += P^T dO
      block_mma<BN, kD, BM, true, false>(dKs, C::LDO, dSs, C::LDP, Qs, C::LDT, true);   // dK += dS^T Q
      block_mma<BM, kD, BN, false, false>(dQs, C::LDO, dSs, C::LDP, Ks, C::LDT, false);  // dQ part = dS K
      __syncthreads();
      for (int e = threadIdx.x; e < nq * D; e += blockDim.x) {
        const int r = e / D, d = e % D;
        atomicAdd(p.dq_acc + (row0 + r * p.Hq) * p.D + d, dQs[r * C::LDO + d]);
      }
    }
  }
  __syncthreads();

  T* dk = static_cast<T*>(p.dk);
  T* dv = static_cast<T*>(p.dv);
  for (int e = threadIdx.x; e < nk * D; e += blockDim.x) {
    const int j = e / D, d = e % D;
    const int64_t at = ((base + k0 + j) * p.Hkv + hk) * p.D + d;
    dk[at] = st<T>(p.scale * dKs[j * C::LDO + d]);
    dv[at] = st<T>(dVs[j * C::LDO + d]);
  }
}

// ---- host side -----------------------------------------------------------------------------

using Config = AttentionArgs;

// The shared checks (runtime/op_checks_attention.h; cu_seqlens' values live on the device), then
// the limits of the CUDA kernels.
Status read_config(const char* op, const OpArgs& a, bool backward, Config* c) {
  SG_RETURN_IF_ERROR(backward ? check_attention_bwd(a, c) : check_attention_fwd(a, c));
  SG_CHECK(c->D <= kMaxHeadDim, StatusCode::kUnsupported,
           str_cat(op, ": head dim D = ", c->D, " has no CUDA kernel (at most ", kMaxHeadDim, ")"),
           "run this attention on the CPU backend");
  SG_CHECK(c->Hq <= 65535, StatusCode::kUnsupported, str_cat(op, ": Hq = ", c->Hq, " query heads is over 65535"),
           "the CUDA kernels put heads on the grid's y dimension");
  SG_CHECK(c->N <= INT32_MAX && c->S < INT32_MAX, StatusCode::kInvalidArgument,
           str_cat(op, ": N = ", c->N, " tokens in S = ", c->S, " documents do not fit int32 offsets"),
           "split the batch");
  return Status::OK();
}

Params make_params(const Config& c, const Tensor& cu) {
  Params p{};
  p.cu = cu.ptr<int32_t>();
  p.N = c.N;
  p.Hq = c.Hq;
  p.Hkv = c.Hkv;
  p.G = c.G;
  p.D = c.D;
  p.S = static_cast<int>(c.S);
  // A window past N tokens is no window; capping it keeps i + window far from overflow.
  p.mask = Mask{c.causal, std::min(c.window, c.N + 1), c.kv_limit ? c.kv_limit->ptr<int32_t>() : nullptr};
  p.scale = c.scale;
  p.softcap = c.softcap;
  return p;
}

// Tile offsets of `rows`-row tiles per document, in scratch that lives as long as *holder.
Status tile_offsets(const Tensor& cu, const Config& c, int rows, std::shared_ptr<void>* holder, const int** off) {
  SG_RETURN_IF_ERROR(allocate(cu.device, static_cast<size_t>(c.S + 1) * sizeof(int), holder));
  int* o = static_cast<int*>(holder->get());
  tile_offsets_kernel<<<1, kOffsetThreads, 0, current_stream()>>>(cu.ptr<int32_t>(), static_cast<int>(c.S), c.N, rows, o);
  SG_CUDA_CHECK_LAUNCH();
  *off = o;
  return Status::OK();
}

// Calls f(std::integral_constant<int, kD>) for the compiled width that holds head dim D.
template <typename F>
Status with_head_dim(int64_t D, F&& f) {
  if (D <= 64) return f(std::integral_constant<int, 64>{});
  if (D <= 128) return f(std::integral_constant<int, 128>{});
  if (D <= 256) return f(std::integral_constant<int, 256>{});
  return f(std::integral_constant<int, 512>{});
}

int tile_grid(const Config& c, int rows) { return static_cast<int>((c.N + rows - 1) / rows + c.S); }

// The fast path's arguments (attention_flash.cuh), with tile offsets of `rows` rows in *holder.
Status flash_args(const Config& c, const Params& p, const Tensor& cu, DType dtype, int rows,
                  std::shared_ptr<void>* holder, FlashAttnArgs* f) {
  f->dtype = dtype;
  f->N = c.N;
  f->Hq = c.Hq;
  f->Hkv = c.Hkv;
  f->D = c.D;
  f->S = static_cast<int>(c.S);
  f->cu = p.cu;
  f->causal = p.mask.causal;
  f->window = p.mask.window;
  f->kv_limit = p.mask.kv_limit;
  f->scale = p.scale;
  f->q = p.q;
  f->k = p.k;
  f->v = p.v;
  return tile_offsets(cu, c, rows, holder, &f->off);
}

template <typename T>
Status launch_fwd(const Config& c, Params p, const Tensor& cu, DType dtype) {
  if (flash_supports(dtype, c.D, c.softcap, {p.q, p.k, p.v, p.o})) {
    FlashAttnArgs f;
    std::shared_ptr<void> off_holder;
    SG_RETURN_IF_ERROR(flash_args(c, p, cu, dtype, flash_fwd_rows(c.D), &off_holder, &f));
    return flash_attention_fwd(f, p.o, p.lse);
  }
  return with_head_dim(c.D, [&](auto kd) -> Status {
    constexpr int kD = decltype(kd)::value;
    using Tile = FwdTile<T, kD>;
    std::shared_ptr<void> off_holder;
    SG_RETURN_IF_ERROR(tile_offsets(cu, c, Tile::BM, &off_holder, &p.off));
    auto kernel = p.mask.kv_limit ? attention_fwd_kernel<T, kD, true> : attention_fwd_kernel<T, kD, false>;
    SG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kBytes));
    const dim3 grid(tile_grid(c, Tile::BM), static_cast<unsigned>(c.Hq));
    kernel<<<grid, kThreads, Tile::kBytes, current_stream()>>>(p);
    SG_CUDA_CHECK_LAUNCH();
    return Status::OK();
  });
}

template <typename T>
Status launch_bwd(const Config& c, Params p, const Tensor& cu, const Tensor& dq) {
  const int64_t rows = c.N * c.Hq;
  std::shared_ptr<void> delta_holder, acc_holder;
  SG_RETURN_IF_ERROR(allocate(cu.device, static_cast<size_t>(rows) * sizeof(float), &delta_holder));
  SG_RETURN_IF_ERROR(allocate(cu.device, static_cast<size_t>(rows * c.D) * sizeof(float), &acc_holder));
  p.delta = static_cast<const float*>(delta_holder.get());
  p.dq_acc = static_cast<float*>(acc_holder.get());
  constexpr int kRowsPerBlock = kThreads / 32;
  const int delta_blocks = static_cast<int>(std::min<int64_t>((rows + kRowsPerBlock - 1) / kRowsPerBlock, 1 << 20));
  attention_delta_kernel<T><<<delta_blocks, kThreads, 0, current_stream()>>>(static_cast<const T*>(p.dout), static_cast<const T*>(p.out),
                                                        static_cast<float*>(delta_holder.get()), rows, c.D);
  SG_CUDA_CHECK_LAUNCH();
  SG_CUDA_CHECK(cudaMemsetAsync(p.dq_acc, 0, static_cast<size_t>(rows * c.D) * sizeof(float), current_stream()));

  if (flash_supports(dq.dtype, c.D, c.softcap, {p.q, p.k, p.v, p.dout, p.dk, p.dv})) {
    FlashAttnArgs f;
    std::shared_ptr<void> off_holder;
    SG_RETURN_IF_ERROR(flash_args(c, p, cu, dq.dtype, flash_bwd_keys(c.D), &off_holder, &f));
    SG_RETURN_IF_ERROR(flash_attention_bwd(f, p.dout, p.lse_in, p.delta, p.dq_acc, p.dk, p.dv));
  } else {
    SG_RETURN_IF_ERROR(with_head_dim(c.D, [&](auto kd) -> Status {
      constexpr int kD = decltype(kd)::value;
      using Tile = BwdTile<T, kD>;
      std::shared_ptr<void> off_holder;
      SG_RETURN_IF_ERROR(tile_offsets(cu, c, Tile::BN, &off_holder, &p.off));
      auto kernel = p.mask.kv_limit ? attention_bwd_kernel<T, kD, true> : attention_bwd_kernel<T, kD, false>;
      SG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kBytes));
      const dim3 grid(tile_grid(c, Tile::BN), static_cast<unsigned>(c.Hkv));
      kernel<<<grid, kThreads, Tile::kBytes, current_stream()>>>(p);
      SG_CUDA_CHECK_LAUNCH();
      return Status::OK();
    }));
  }

  const int64_t n = rows * c.D;
  const int blocks = static_cast<int>(std::min<int64_t>((n + 255) / 256, 65535));
  attention_dq_kernel<T><<<blocks, 256, 0, current_stream()>>>(p.dq_acc, dq.ptr<T>(), n, c.scale);
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

// attention_fwd: (q, k, v, cu_seqlens, [sinks], [kv_limit]) -> (out, lse); attrs: causal, scale, window,
// softcap.
Status attention_fwd(const OpArgs& a) {
  const char* op = "attention_fwd";
  const Tensor &q = a.in(0), &k = a.in(1), &v = a.in(2), &cu = a.in(3);
  const Tensor &out = a.out(0), &lse = a.out(1);
  Config c;
  SG_RETURN_IF_ERROR(read_config(op, a, /*backward=*/false, &c));
  if (c.N == 0) return Status::OK();
  Params p = make_params(c, cu);
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.o = out.data;
  p.lse = lse.ptr<float>();
  SG_CUDA_DISPATCH_FLOAT(op, q.dtype, T, { SG_RETURN_IF_ERROR(launch_fwd<T>(c, p, cu, q.dtype)); });
  if (c.sinks) {
    SG_RETURN_IF_ERROR(attention_sinks_fwd(a.in(4).data, a.in(4).dtype, out.data, out.dtype, p.lse, c.N, c.Hq, c.D));
  }
  return Status::OK();
}

// attention_bwd: (dout, q, k, v, out, lse, cu_seqlens, [kv_limit]) -> (dq, dk, dv); attrs as attention_fwd.
Status attention_bwd(const OpArgs& a) {
  const char* op = "attention_bwd";
  const Tensor &dout = a.in(0), &q = a.in(1), &k = a.in(2), &v = a.in(3), &out = a.in(4), &lse = a.in(5),
               &cu = a.in(6);
  const Tensor &dq = a.out(0), &dk = a.out(1), &dv = a.out(2);
  Config c;
  SG_RETURN_IF_ERROR(read_config(op, a, /*backward=*/true, &c));
  if (c.N == 0) return Status::OK();
  Params p = make_params(c, cu);
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.dout = dout.data;
  p.out = out.data;
  p.lse_in = lse.ptr<float>();
  p.dk = dk.data;
  p.dv = dv.data;
  SG_CUDA_DISPATCH_FLOAT(op, q.dtype, T, { SG_RETURN_IF_ERROR(launch_bwd<T>(c, p, cu, dq)); });
  return Status::OK();
}

}  // namespace

void register_cuda_attention(OpRegistry& reg) {
  add_op(reg, "attention_fwd", attention_fwd);
  add_op(reg, "attention_bwd", attention_bwd);
  add_op(reg, "attention_sinks_bwd", attention_sinks_bwd);
}

}  // namespace surogate::cuda
