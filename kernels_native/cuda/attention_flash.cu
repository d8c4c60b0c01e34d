// FlashAttention-2 for bf16 / f16 with head dim D a multiple of 8 up to 128 (no softcap): the
// fast path of attention_fwd / attention_bwd. cpu/attention.cpp is the spec (scale, visible keys,
// lse, the backward's math); cuda/attention.cu holds the general kernels, the checks and the
// dispatch.
//
// Everything hot lives in registers: tensor cores through mma.sync m16n8k16 (f32 accumulate),
// operands read from shared memory with ldmatrix, K / V (forward) and Q / dO (backward) tiles
// double-buffered in shared memory with cp.async. Rows of every shared tile are padded by 8
// elements (16 bytes): the 8 rows an ldmatrix reads then start on 8 different 16-byte bank groups.
//
//   forward:  one CTA per (tile of BM query rows of one document, query head); warp w owns rows
//             [16w, 16w + 16) with its Q fragment held for the whole key loop. Per key tile of 64:
//             S = Q K^T in registers, scale and mask (the mask only on tiles that need it), online
//             softmax in the exp2 domain, P packed to bf16 / f16 in registers as the A operand of
//             O += P V. At the end O / l and lse = m + log(l).
//   backward: one CTA per (tile of BN keys of one document, kv head); warp w owns key rows
//             [16w, 16w + 16) and their dK, dV accumulators. For each query head of the GQA group
//             and each 64-query tile that sees the keys: S^T = K Q^T, P^T = exp(scale S^T - lse),
//             dP^T = V dO^T, dS^T = P^T (dP^T - Delta), dV += P^T dO, dK += dS^T Q (all with key
//             rows as the M dimension, so the accumulators stay put), then dS^T goes to shared
//             memory and dQ += dS K is added atomically into the f32 scratch.
//
// Widths: the tiles are compiled for kD in {64, 80, 96, 112, 128}, D on the next one up. A D below
// its width (kPad: 72 for Gemma 3's SigLIP, 8..56, 88, ...) reads its D columns of q / k / v / dO
// into the kD-wide shared tiles and zero-fills the rest: zero columns add nothing to Q K^T, V dO^T
// or dS K and give zero output columns, which are not stored. D % 8 == 0 keeps every row 16-byte
// aligned and makes each 8-column fragment tile either all real or all padding. kPad = false
// (D == kD) is the code it was before, with no runtime D.
//
// mma.sync.m16n8k16 fragments (g = lane / 4, t = lane % 4), 16-bit operands packed two per
// 32-bit register, the lower index in the lower half:
//   A (16 x 16, row-major): a0 = A[g][2t, 2t+1], a1 = A[g+8][2t, 2t+1], a2 = A[g][2t+8, 2t+9],
//                           a3 = A[g+8][2t+8, 2t+9]
//   B (16 x 8, "col"):      b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g]
//   C (16 x 8, f32):        c0, c1 = C[g][2t, 2t+1], c2, c3 = C[g+8][2t, 2t+1]
// So the C fragments of two adjacent 8-column tiles, packed pairwise, are exactly the A fragment
// of the 16-wide k chunk they span: {c(2k)[0,1], c(2k)[2,3], c(2k+1)[0,1], c(2k+1)[2,3]}.
// ldmatrix.x4 loads four 8 x 8 matrices; lanes 8i..8i+7 give the row addresses of matrix i, and
// register i receives matrix i as M[g][2t, 2t+1] (or, with .trans, M[2t, 2t+1][g]).
//   A from a row-major [m][k] tile:           lane -> row m0 + lane % 16, col k0 + (lane / 16) * 8
//   B = X^T for X stored [n][k] (K in S = Q K^T): x4 -> b0, b1 of n-tile n0 and of n0 + 8;
//                                             lane -> row n0 + (lane / 16) * 8 + lane % 8,
//                                                     col k0 + (lane / 8 % 2) * 8
//   B = X for X stored [k][n] (V in P V), .trans: x4 -> b0, b1 of n-tile n0 and of n0 + 8;
//                                             lane -> row k0 + (lane / 8 % 2) * 8 + lane % 8,
//                                                     col n0 + (lane / 16) * 8
//   A = X^T for X stored [k][m] (dS^T in dS K), .trans: lane -> row k0 + (lane / 16) * 8 + lane % 8,
//                                                     col m0 + (lane / 8 % 2) * 8
//
// The file is past ~400 lines because both directions share the PTX wrappers, the loaders, the
// masks and the document lookup, and the fragment layouts above are read by both.
#include "cuda/attention_flash.cuh"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/attention_docs.cuh"
#include "cuda/common.cuh"

namespace surogate::cuda {

namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = -INFINITY;

// ---- PTX -------------------------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, bypassing L1; !valid writes 16 zero bytes and reads nothing (src
// must still be a mapped address: callers pass the tile's base).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// c += A B for one 16 x 8 x 16 tile (layouts in the header).
template <typename T>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats rounded to T, `lo` in the lower half.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

// The A fragment of k chunk kk from the C fragments of 8-column tiles 2kk and 2kk + 1.
template <typename T>
__device__ __forceinline__ void c_to_a(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  a[0] = pack2<T>(c0[0], c0[1]);
  a[1] = pack2<T>(c0[2], c0[3]);
  a[2] = pack2<T>(c1[0], c1[1]);
  a[3] = pack2<T>(c1[2], c1[3]);
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// ---- documents and masks (as in attention.cu) -------------------------------------------------

using namespace attn;  // min64 / max64, doc_bounds, find_doc: cuda/attention_docs.cuh

// Keys [lo(i), hi(i)) of a document of length L are visible to its query i (cpu/attention.cpp);
// both bounds are nondecreasing in i. Queries [qa(j), qb(j)) see key j; nondecreasing in j.
// int64: i + window must not overflow; every result lies in [0, L] (hi: for i < L).
// kLimit (a kv_limit is given; causal only): hi(i) = lim[i] + 1 and qa(j) the first query whose
// limit reaches j (attention_docs.cuh), lim the document's slice of kv_limit. The kernels are
// compiled once without it, so a call without a kv_limit runs exactly the code it ran before.
struct FlashMask {
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
    if (causal) return min64(L, i + 1);
    return window > 0 ? min64(L, i + window + 1) : L;
  }
  // causal: j <= i < j + W (from the first query whose limit reaches j with kLimit);
  // bidirectional: j - W <= i <= j + W.
  template <bool kLimit>
  __device__ int64_t qa(int64_t j, int64_t L, const int32_t* lim) const {
    if constexpr (kLimit) return limit_first_query(lim, j, L);
    if (causal) return j;
    return window > 0 ? max64(0, j - window) : 0;
  }
  __device__ int64_t qb(int64_t j, int64_t L) const {
    if (window <= 0) return L;
    return min64(L, causal ? j + window : j + window + 1);
  }
};

struct FlashParams {
  const void *q, *k, *v, *dout;
  const float *lse_in, *delta;
  const int32_t* cu;
  const int* off;
  void *o, *dk, *dv;
  float *lse, *dq_acc;
  int64_t N, Hq, Hkv;
  int G, S;
  FlashMask mask;
  float scale;
  int D;  // the real head dim, read by kPad kernels only (last: the other fields keep their offsets)
};

// ---- tile loads ------------------------------------------------------------------------------

// Rows [0, kRows) x kD of a row-major global tile (row stride `stride` elements) into shared
// memory with leading dim kD + 8; rows >= nvalid and (kPad) columns >= D become zeros (never read
// from global). kRolled keeps the rounds a loop: fewer live registers where the caller has none
// to spare (the padded backward at kD 112 and 128 spills with them unrolled).
template <typename T, int kRows, int kD, int kThreads, bool kPad = false, bool kRolled = false>
__device__ __forceinline__ void load_tile(T* dst, const T* src, int64_t stride, int nvalid, int D = kD) {
  constexpr int kChunks = kD / 8;  // 16-byte chunks per row
  constexpr int kTotal = kRows * kChunks;
  constexpr int kRounds = (kTotal + kThreads - 1) / kThreads;  // the last one partial for some widths
  auto copy = [&](int i) {
    const int e = i * kThreads + static_cast<int>(threadIdx.x);
    if (kTotal % kThreads != 0 && e >= kTotal) return;
    const int r = e / kChunks, c = (e % kChunks) * 8;
    const bool ok = r < nvalid && (!kPad || c < D);
    cp_async16(smem_u32(dst + r * (kD + 8) + c), ok ? src + r * stride + c : src, ok);
  };
  if constexpr (kRolled) {
#pragma unroll 1
    for (int i = 0; i < kRounds; ++i) copy(i);
  } else {
#pragma unroll
    for (int i = 0; i < kRounds; ++i) copy(i);
  }
}

// ---- forward ---------------------------------------------------------------------------------

template <int kD>
struct FwdShape {
  static constexpr int kWarps = kD <= 96 ? 8 : 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int BM = 16 * kWarps;  // query rows: 128 (kD 64, 80, 96) or 64 (kD 112, 128)
  static constexpr int BN = 64;           // keys per tile
  static constexpr int LD = kD + 8;
  static constexpr int kBytes = (BM + 4 * BN) * LD * 2;  // Q, K x2, V x2
};

template <typename T, int kD, bool kPad, bool kLimit>
__global__ void __launch_bounds__(FwdShape<kD>::kThreads) flash_fwd_kernel(FlashParams p) {
  using F = FwdShape<kD>;
  constexpr int BM = F::BM, BN = F::BN, LD = F::LD, kThreads = F::kThreads;
  // Highest tile first: under a causal mask the last tiles see the most keys.
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
  T* Qs = reinterpret_cast<T*>(smem);
  T* Ks = Qs + BM * LD;      // two buffers of BN * LD
  T* Vs = Ks + 2 * BN * LD;  // two buffers of BN * LD

  const int D = kPad ? p.D : kD;  // global row width; columns [D, kD) are zeros in shared memory
  const int64_t q_stride = p.Hq * D, kv_stride = p.Hkv * D;
  const T* q_tile = static_cast<const T*>(p.q) + ((base + q0) * p.Hq + h) * D;
  const T* k_head = static_cast<const T*>(p.k) + (base * p.Hkv + hk) * D;  // key j at j * kv_stride
  const T* v_head = static_cast<const T*>(p.v) + (base * p.Hkv + hk) * D;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  // This thread's two rows (g and g + 8 of its warp) and their visible keys.
  int lo[2], hi[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t i = q0 + warp * 16 + g + 8 * r;
    lo[r] = static_cast<int>(min64(p.mask.lo(i), L));
    hi[r] = static_cast<int>(p.mask.hi<kLimit>(i, L, lim));
  }
  const int64_t q_last = q0 + nq - 1;
  const int kb_begin = static_cast<int>(p.mask.lo(q0) / BN);
  const int kb_end = static_cast<int>((p.mask.hi<kLimit>(q_last, L, lim) + BN - 1) / BN);
  const int64_t lo_last = p.mask.lo(q_last), hi_first = p.mask.hi<kLimit>(q0, L, lim);

  auto load_kv = [&](int kb, int buf) {
    const int64_t k0 = int64_t(kb) * BN;
    const int nk = static_cast<int>(min64(BN, L - k0));
    load_tile<T, BN, kD, kThreads, kPad>(Ks + buf * BN * LD, k_head + k0 * kv_stride, kv_stride, nk, D);
    load_tile<T, BN, kD, kThreads, kPad>(Vs + buf * BN * LD, v_head + k0 * kv_stride, kv_stride, nk, D);
  };
  load_tile<T, BM, kD, kThreads, kPad>(Qs, q_tile, q_stride, nq, D);
  load_kv(kb_begin, 0);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  uint32_t qf[kD / 16][4];  // this warp's 16 x kD slice of Q as A fragments
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    ldsm_x4(qf[kk], smem_u32(Qs + (warp * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8));
  }

  float o[kD / 8][4];
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {kNegInf, kNegInf};  // running max of scale * log2(e) * s, per row
  float l[2] = {0.0f, 0.0f};        // this thread's part of the running sum (the quad's total at the end)
  const float sl2 = p.scale * kLog2e;

  const int n_kb = kb_end - kb_begin;  // >= 1: every query sees itself
  for (int it = 0; it < n_kb; ++it) {
    const int buf = it & 1;
    if (it + 1 < n_kb) {
      load_kv(kb_begin + it + 1, buf ^ 1);  // that buffer was released by the barrier ending it - 1
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // tile `it` is in shared memory for every thread
    const T* Kb = Ks + buf * BN * LD;
    const T* Vb = Vs + buf * BN * LD;

    float sc[BN / 8][4];  // S = Q K^T: rows g, g + 8 of the warp, keys 8n + 2t + {0, 1}
#pragma unroll
    for (int n = 0; n < BN / 8; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
#pragma unroll
      for (int np = 0; np < BN / 16; ++np) {
        uint32_t bk[4];
        ldsm_x4(bk, smem_u32(Kb + (np * 16 + (lane >> 4) * 8 + (lane & 7)) * LD + kk * 16 + ((lane >> 3) & 1) * 8));
        mma<T>(sc[2 * np], qf[kk], bk[0], bk[1]);
        mma<T>(sc[2 * np + 1], qf[kk], bk[2], bk[3]);
      }
    }

    // Scale into the exp2 domain; mask only tiles that some row of the CTA does not fully see
    // (lo and hi are nondecreasing, so the first and last rows decide; hi <= L covers the
    // document's end). Rows past nq are never stored and need no mask.
    const int64_t k0 = int64_t(kb_begin + it) * BN;
    const bool full = lo_last <= k0 && hi_first >= k0 + BN;
#pragma unroll
    for (int n = 0; n < BN / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = sc[n][e] * sl2;
        if (!full) {
          const int j = static_cast<int>(k0) + n * 8 + 2 * t + (e & 1);
          if (j < lo[e >> 1] || j >= hi[e >> 1]) x = kNegInf;
        }
        sc[n][e] = x;
      }
    }

    // Online softmax per row: the quad (4 lanes) holds a row's 64 scores.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = m[r];
#pragma unroll
      for (int n = 0; n < BN / 8; ++n) mx = fmaxf(mx, fmaxf(sc[n][2 * r], sc[n][2 * r + 1]));
      mx = quad_max(mx);
      // A row that has seen no visible key yet (a window starting past this tile) keeps
      // m = -inf; exp2 against 0 then gives P = 0 and corr = 0 (O and l are 0 anyway).
      const float mu = mx == kNegInf ? 0.0f : mx;
      const float corr = exp2f(m[r] - mu);
      m[r] = mx;
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < BN / 8; ++n) {
        sc[n][2 * r] = exp2f(sc[n][2 * r] - mu);
        sc[n][2 * r + 1] = exp2f(sc[n][2 * r + 1] - mu);
        sum += sc[n][2 * r] + sc[n][2 * r + 1];
      }
      l[r] = l[r] * corr + sum;
#pragma unroll
      for (int n = 0; n < kD / 8; ++n) {
        o[n][2 * r] *= corr;
        o[n][2 * r + 1] *= corr;
      }
    }

    // O += P V: P's C fragments become A fragments in registers.
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t a[4];
      c_to_a<T>(a, sc[2 * kk], sc[2 * kk + 1]);
#pragma unroll
      for (int np = 0; np < kD / 16; ++np) {
        uint32_t bv[4];
        ldsm_x4_t(bv, smem_u32(Vb + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LD + np * 16 + (lane >> 4) * 8));
        mma<T>(o[2 * np], a, bv[0], bv[1]);
        mma<T>(o[2 * np + 1], a, bv[2], bv[3]);
      }
    }
    __syncthreads();  // every warp is done with buffer `buf` before it is refilled at it + 1
  }

  T* out = static_cast<T*>(p.o);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float lsum = quad_sum(l[r]);
    const int row = warp * 16 + g + 8 * r;
    if (row >= nq) continue;
    const int64_t at = (base + q0 + row) * p.Hq + h;
    const float inv = lsum > 0.0f ? 1.0f / lsum : 0.0f;
    T* orow = out + at * D + 2 * t;
#pragma unroll
    for (int n = 0; n < kD / 8; ++n) {
      if (kPad && n * 8 >= D) break;  // padding columns (all zero) are not stored
      *reinterpret_cast<uint32_t*>(orow + n * 8) = pack2<T>(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
    }
    if (t == 0) p.lse[at] = m[r] * kLn2 + logf(lsum);
  }
}

// ---- backward --------------------------------------------------------------------------------

template <int kD>
struct BwdShape {
  // kD 80..112 as 128: with 8 warps the dQ columns would split into widths that are not whole
  // 16-column ldmatrix tiles (40, 56).
  static constexpr int kWarps = kD == 64 ? 8 : 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int BN = 16 * kWarps;  // keys: 128 (kD 64) or 64 (kD 80..128)
  static constexpr int BM = 64;           // queries per tile
  static constexpr int kSub = kD <= 80 ? 64 : 32;  // queries per register score tile
  static constexpr int LD = kD + 8;
  static constexpr int LDS = BM + 8;      // dS^T rows (keys) in shared memory
  static constexpr int kK = 0;                          // K: BN x LD
  static constexpr int kV = kK + BN * LD * 2;           // V: BN x LD
  static constexpr int kQ = kV + BN * LD * 2;           // Q: 2 buffers of BM x LD
  static constexpr int kDO = kQ + 2 * BM * LD * 2;      // dO: 2 buffers of BM x LD
  static constexpr int kDS = kDO + 2 * BM * LD * 2;     // dS^T: BN x LDS
  static constexpr int kLse = kDS + BN * LDS * 2;       // lse: 2 x BM f32
  static constexpr int kDelta = kLse + 2 * BM * 4;      // Delta: 2 x BM f32
  static constexpr int kBytes = kDelta + 2 * BM * 4;
  // dQ = dS K: warps split BM rows into 16-row groups and kD columns among the rest.
  static constexpr int kRowGroups = BM / 16;
  static constexpr int kColGroups = kWarps / kRowGroups;
  static constexpr int kCols = kD / kColGroups;
  static_assert(kColGroups * kRowGroups == kWarps && kCols % 16 == 0, "dQ work split");
  static_assert(kThreads >= BM, "one thread per query row loads lse and Delta");
};

template <typename T, int kD, bool kPad, bool kLimit>
__global__ void __launch_bounds__(BwdShape<kD>::kThreads) flash_bwd_kernel(FlashParams p) {
  using B = BwdShape<kD>;
  constexpr int BM = B::BM, BN = B::BN, LD = B::LD, LDS = B::LDS, kThreads = B::kThreads, kSub = B::kSub;
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
  T* Ks = reinterpret_cast<T*>(smem + B::kK);
  T* Vs = reinterpret_cast<T*>(smem + B::kV);
  T* Qs = reinterpret_cast<T*>(smem + B::kQ);
  T* dOs = reinterpret_cast<T*>(smem + B::kDO);
  T* dSs = reinterpret_cast<T*>(smem + B::kDS);
  float* lse_s = reinterpret_cast<float*>(smem + B::kLse);
  float* delta_s = reinterpret_cast<float*>(smem + B::kDelta);

  const T* q = static_cast<const T*>(p.q);
  const T* dout = static_cast<const T*>(p.dout);
  const int D = kPad ? p.D : kD;  // global row width; columns [D, kD) are zeros in shared memory
  constexpr bool kRolled = kPad && kD >= 112;  // see load_tile
  const int64_t q_stride = p.Hq * D, kv_stride = p.Hkv * D;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;

  // This thread's two key rows (g and g + 8 of its warp) and the queries that see them.
  int qa[2], qb[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t j = k0 + warp * 16 + g + 8 * r;
    const bool ok = j < L;
    qa[r] = ok ? static_cast<int>(p.mask.qa<kLimit>(j, L, lim)) : 0;
    qb[r] = ok ? static_cast<int>(p.mask.qb(j, L)) : 0;
  }
  // Queries [q_lo, q_hi) see some key of the tile; qa and qb are nondecreasing in j.
  const int64_t q_lo = p.mask.qa<kLimit>(k0, L, lim), q_hi = p.mask.qb(k0 + nk - 1, L);
  const int64_t qa_last = p.mask.qa<kLimit>(k0 + BN - 1, L, lim), qb_first = p.mask.qb(k0, L);
  const int n_qt = static_cast<int>((q_hi - q_lo + BM - 1) / BM);
  const int total = p.G * n_qt;  // (query head of the group, query tile) pairs

  // Q, dO, lse and Delta of pair `it` into buffer `buf`.
  auto load_q = [&](int it, int buf) {
    const int64_t t0 = q_lo + int64_t(it % n_qt) * BM;
    const int nq = static_cast<int>(min64(BM, q_hi - t0));
    const int64_t row0 = (base + t0) * p.Hq + hk * p.G + it / n_qt;  // (token, head) of the first query
    load_tile<T, BM, kD, kThreads, kPad, kRolled>(Qs + buf * BM * LD, q + row0 * D, q_stride, nq, D);
    load_tile<T, BM, kD, kThreads, kPad, kRolled>(dOs + buf * BM * LD, dout + row0 * D, q_stride, nq, D);
    const int r = threadIdx.x;
    if (r < BM) {
      const bool ok = r < nq;
      cp_async4(smem_u32(lse_s + buf * BM + r), p.lse_in + (ok ? row0 + r * p.Hq : 0), ok);
      cp_async4(smem_u32(delta_s + buf * BM + r), p.delta + (ok ? row0 + r * p.Hq : 0), ok);
    }
  };
  load_tile<T, BN, kD, kThreads, kPad>(Ks, static_cast<const T*>(p.k) + ((base + k0) * p.Hkv + hk) * D, kv_stride, nk,
                                       D);
  load_tile<T, BN, kD, kThreads, kPad>(Vs, static_cast<const T*>(p.v) + ((base + k0) * p.Hkv + hk) * D, kv_stride, nk,
                                       D);
  if (total > 0) load_q(0, 0);
  cp_async_commit();

  float dk[kD / 8][4], dv[kD / 8][4];  // key rows g, g + 8 of the warp, columns 8n + 2t + {0, 1}
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) {
    dk[n][0] = dk[n][1] = dk[n][2] = dk[n][3] = 0.0f;
    dv[n][0] = dv[n][1] = dv[n][2] = dv[n][3] = 0.0f;
  }
  const float sl2 = p.scale * kLog2e;
  const uint32_t k_rows = smem_u32(Ks + (warp * 16 + (lane & 15)) * LD + (lane >> 4) * 8);  // A = K
  const uint32_t v_rows = smem_u32(Vs + (warp * 16 + (lane & 15)) * LD + (lane >> 4) * 8);  // A = V

  for (int it = 0; it < total; ++it) {
    const int buf = it & 1;
    if (it + 1 < total) {
      // That buffer was last read before the second barrier of it - 1.
      load_q(it + 1, buf ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // (1) pair `it` (and at it = 0, K and V) visible to every thread
    const int64_t t0 = q_lo + int64_t(it % n_qt) * BM;
    const int nq = static_cast<int>(min64(BM, q_hi - t0));
    const int64_t h = hk * p.G + it / n_qt;
    const T* Qb = Qs + buf * BM * LD;
    const T* dOb = dOs + buf * BM * LD;
    const float* lse_b = lse_s + buf * BM;
    const float* delta_b = delta_s + buf * BM;

    // Tiles that every key row fully sees (qa, qb nondecreasing: the last key's qa and the first
    // key's qb decide) skip the mask test.
    const bool full = nk == BN && qa_last <= t0 && qb_first >= t0 + BM;
    // The query tile in sub-tiles of kSub: the f32 score tiles of 64 queries next to dK and dV
    // would spill at D = 128.
#pragma unroll 1
    for (int qs = 0; qs < BM; qs += kSub) {
      // S^T = K Q^T, then P^T, then dP^T = V dO^T (one product at a time keeps the live fragments
      // few): key rows g, g + 8 of the warp, queries 8n + 2t + {0, 1}.
      float pt[kSub / 8][4];
#pragma unroll
      for (int n = 0; n < kSub / 8; ++n) pt[n][0] = pt[n][1] = pt[n][2] = pt[n][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        uint32_t ak[4];
        ldsm_x4(ak, k_rows + kk * 32);  // 16 elements = 32 bytes per k chunk
#pragma unroll
        for (int np = 0; np < kSub / 16; ++np) {
          uint32_t bq[4];
          ldsm_x4(bq, smem_u32(Qb + (qs + np * 16 + (lane >> 4) * 8 + (lane & 7)) * LD + kk * 16 + ((lane >> 3) & 1) * 8));
          mma<T>(pt[2 * np], ak, bq[0], bq[1]);
          mma<T>(pt[2 * np + 1], ak, bq[2], bq[3]);
        }
      }

      // P^T = exp(scale s - lse), 0 where the query does not see the key (which covers queries past
      // nq and keys past nk).
#pragma unroll
      for (int n = 0; n < kSub / 8; ++n) {
        const float2 ls = *reinterpret_cast<const float2*>(lse_b + qs + n * 8 + 2 * t);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float pv = exp2f(fmaf(pt[n][e], sl2, -((e & 1) ? ls.y : ls.x) * kLog2e));
          if (!full) {
            const int i = static_cast<int>(t0) + qs + n * 8 + 2 * t + (e & 1);
            if (i < qa[e >> 1] || i >= qb[e >> 1]) pv = 0.0f;
          }
          pt[n][e] = pv;
        }
      }

      float dpt[kSub / 8][4];
#pragma unroll
      for (int n = 0; n < kSub / 8; ++n) dpt[n][0] = dpt[n][1] = dpt[n][2] = dpt[n][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        uint32_t av[4];
        ldsm_x4(av, v_rows + kk * 32);
#pragma unroll
        for (int np = 0; np < kSub / 16; ++np) {
          uint32_t bo[4];
          ldsm_x4(bo, smem_u32(dOb + (qs + np * 16 + (lane >> 4) * 8 + (lane & 7)) * LD + kk * 16 + ((lane >> 3) & 1) * 8));
          mma<T>(dpt[2 * np], av, bo[0], bo[1]);
          mma<T>(dpt[2 * np + 1], av, bo[2], bo[3]);
        }
      }
      // dS^T = P^T (dP^T - Delta): 0 wherever P^T is.
#pragma unroll
      for (int n = 0; n < kSub / 8; ++n) {
        const float2 dl = *reinterpret_cast<const float2*>(delta_b + qs + n * 8 + 2 * t);
#pragma unroll
        for (int e = 0; e < 4; ++e) dpt[n][e] = pt[n][e] * (dpt[n][e] - ((e & 1) ? dl.y : dl.x));
      }
      // P^T and dS^T as A fragments (k = queries). pa[kk][x] and dsa[kk][x] hold row g + 8 (x % 2),
      // queries 16 kk + 8 (x / 2) + 2t + {0, 1}.
      uint32_t pa[kSub / 16][4], dsa[kSub / 16][4];
#pragma unroll
      for (int kk = 0; kk < kSub / 16; ++kk) {
        c_to_a<T>(pa[kk], pt[2 * kk], pt[2 * kk + 1]);
        c_to_a<T>(dsa[kk], dpt[2 * kk], dpt[2 * kk + 1]);
      }

      // dS^T to shared memory for dQ (4-byte stores, conflict-free with the LDS = BM + 8 padding).
#pragma unroll
      for (int kk = 0; kk < kSub / 16; ++kk) {
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          *reinterpret_cast<uint32_t*>(dSs + (warp * 16 + g + 8 * (x & 1)) * LDS + qs + kk * 16 + (x >> 1) * 8 + 2 * t) =
              dsa[kk][x];
        }
      }

      // dV += P^T dO and dK += dS^T Q: A from registers, B = dO / Q stored [query][d] (.trans).
#pragma unroll
      for (int kk = 0; kk < kSub / 16; ++kk) {
#pragma unroll
        for (int np = 0; np < kD / 16; ++np) {
          const int at = (qs + kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LD + np * 16 + (lane >> 4) * 8;
          uint32_t bo[4], bq[4];
          ldsm_x4_t(bo, smem_u32(dOb + at));
          ldsm_x4_t(bq, smem_u32(Qb + at));
          mma<T>(dv[2 * np], pa[kk], bo[0], bo[1]);
          mma<T>(dv[2 * np + 1], pa[kk], bo[2], bo[3]);
          mma<T>(dk[2 * np], dsa[kk], bq[0], bq[1]);
          mma<T>(dk[2 * np + 1], dsa[kk], bq[2], bq[3]);
        }
      }
    }
    __syncthreads();  // (2) dS^T complete; the next writer of dSs first passes (1) of it + 1

    // dQ[query][d] += sum over the tile's keys of dS[query][key] K[key][d]: A = (dS^T)^T (.trans),
    // B = K stored [key][d] (.trans). This warp: rows qr + [0, 16), columns dc + [0, kCols), in
    // chunks of 32 columns and (kCols % 32 == 16: kD 80, 112) a last one of 16.
    const int qr = (warp % B::kRowGroups) * 16, dc = (warp / B::kRowGroups) * B::kCols;
    uint32_t af[BN / 16][4];
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      ldsm_x4_t(af[kk], smem_u32(dSs + (kk * 16 + (lane >> 4) * 8 + (lane & 7)) * LDS + qr + ((lane >> 3) & 1) * 8));
    }
#pragma unroll
    for (int c0 = 0; c0 < B::kCols; c0 += 32) {
      const int nw = min(32, B::kCols - c0);  // a constant once unrolled
      float acc[4][4];
#pragma unroll
      for (int n = 0; n < 4; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
#pragma unroll
        for (int np = 0; np < 2; ++np) {
          if (np * 16 >= nw) break;
          uint32_t bk[4];
          ldsm_x4_t(bk, smem_u32(Ks + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LD + dc + c0 + np * 16 +
                                 (lane >> 4) * 8));
          mma<T>(acc[2 * np], af[kk], bk[0], bk[1]);
          mma<T>(acc[2 * np + 1], af[kk], bk[2], bk[3]);
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = qr + g + 8 * r;
        if (row >= nq) continue;
        float* dst = p.dq_acc + ((base + t0 + row) * p.Hq + h) * D + dc + c0 + 2 * t;
#pragma unroll
        for (int n = 0; n < 4; ++n) {
          if (n * 8 >= nw || (kPad && dc + c0 + n * 8 >= D)) break;  // past the chunk, or padding
          atomicAdd(dst + n * 8, acc[n][2 * r]);
          atomicAdd(dst + n * 8 + 1, acc[n][2 * r + 1]);
        }
      }
    }
  }
  cp_async_wait<0>();  // total == 0 leaves K and V in flight

  T* dkp = static_cast<T*>(p.dk);
  T* dvp = static_cast<T*>(p.dv);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = warp * 16 + g + 8 * r;
    if (row >= nk) continue;
    const int64_t at = ((base + k0 + row) * p.Hkv + hk) * D + 2 * t;
#pragma unroll
    for (int n = 0; n < kD / 8; ++n) {
      if (kPad && n * 8 >= D) break;  // padding columns (all zero) are not stored
      *reinterpret_cast<uint32_t*>(dkp + at + n * 8) = pack2<T>(p.scale * dk[n][2 * r], p.scale * dk[n][2 * r + 1]);
      *reinterpret_cast<uint32_t*>(dvp + at + n * 8) = pack2<T>(dv[n][2 * r], dv[n][2 * r + 1]);
    }
  }
}

// ---- host side -------------------------------------------------------------------------------

FlashParams make_params(const FlashAttnArgs& a) {
  FlashParams p{};
  p.q = a.q;
  p.k = a.k;
  p.v = a.v;
  p.cu = a.cu;
  p.off = a.off;
  p.N = a.N;
  p.Hq = a.Hq;
  p.Hkv = a.Hkv;
  p.G = static_cast<int>(a.Hq / a.Hkv);
  p.S = a.S;
  p.mask = FlashMask{a.causal, a.window, a.kv_limit};
  p.scale = a.scale;
  p.D = static_cast<int>(a.D);
  return p;
}

// Opts a kernel into more than 48 KB of dynamic shared memory, once per device.
template <typename Kernel>
Status allow_smem(Kernel kernel, int bytes, std::atomic<uint64_t>* done) {
  int dev = 0;
  SG_CUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = dev < 64 ? uint64_t(1) << dev : 0;
  if (bit != 0 && (done->load(std::memory_order_relaxed) & bit) != 0) return Status::OK();
  SG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  done->fetch_or(bit, std::memory_order_relaxed);
  return Status::OK();
}

int tile_grid(const FlashAttnArgs& a, int rows) { return static_cast<int>((a.N + rows - 1) / rows + a.S); }

template <typename T, int kD, bool kPad, bool kLimit>
Status launch_fwd(const FlashParams& p, const FlashAttnArgs& a) {
  using F = FwdShape<kD>;
  static std::atomic<uint64_t> smem_set{0};
  SG_RETURN_IF_ERROR(allow_smem(flash_fwd_kernel<T, kD, kPad, kLimit>, F::kBytes, &smem_set));
  const dim3 grid(tile_grid(a, F::BM), static_cast<unsigned>(a.Hq));
  flash_fwd_kernel<T, kD, kPad, kLimit><<<grid, F::kThreads, F::kBytes, current_stream()>>>(p);
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

template <typename T, int kD, bool kPad, bool kLimit>
Status launch_bwd(const FlashParams& p, const FlashAttnArgs& a) {
  using B = BwdShape<kD>;
  static std::atomic<uint64_t> smem_set{0};
  SG_RETURN_IF_ERROR(allow_smem(flash_bwd_kernel<T, kD, kPad, kLimit>, B::kBytes, &smem_set));
  const dim3 grid(tile_grid(a, B::BN), static_cast<unsigned>(a.Hkv));
  flash_bwd_kernel<T, kD, kPad, kLimit><<<grid, B::kThreads, B::kBytes, current_stream()>>>(p);
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

// The compiled width that holds head dim D (flash_supports holds): D rounded up to 16, at least 64.
int flash_width(int64_t D) { return D <= 64 ? 64 : static_cast<int>((D + 15) / 16 * 16); }

// Calls f(std::integral_constant<int, kD>) for D's width.
template <typename F>
auto with_width(int64_t D, F&& f) {
  switch (flash_width(D)) {
    case 64: return f(std::integral_constant<int, 64>{});
    case 80: return f(std::integral_constant<int, 80>{});
    case 96: return f(std::integral_constant<int, 96>{});
    case 112: return f(std::integral_constant<int, 112>{});
    default: return f(std::integral_constant<int, 128>{});
  }
}

// Launch<T, kD, kPad>::run for the dtype and head dim (flash_supports holds).
template <template <typename, int, bool> class Launch>
Status dispatch(const FlashParams& p, const FlashAttnArgs& a) {
  const bool bf16 = a.dtype == DType::kBF16;
  return with_width(a.D, [&](auto kd) -> Status {
    constexpr int kD = decltype(kd)::value;
    if (a.D == kD) return bf16 ? Launch<__nv_bfloat16, kD, false>::run(p, a) : Launch<__half, kD, false>::run(p, a);
    return bf16 ? Launch<__nv_bfloat16, kD, true>::run(p, a) : Launch<__half, kD, true>::run(p, a);
  });
}
template <typename T, int kD, bool kPad>
struct FwdLaunch {
  static Status run(const FlashParams& p, const FlashAttnArgs& a) {
    return p.mask.kv_limit ? launch_fwd<T, kD, kPad, true>(p, a) : launch_fwd<T, kD, kPad, false>(p, a);
  }
};
template <typename T, int kD, bool kPad>
struct BwdLaunch {
  static Status run(const FlashParams& p, const FlashAttnArgs& a) {
    return p.mask.kv_limit ? launch_bwd<T, kD, kPad, true>(p, a) : launch_bwd<T, kD, kPad, false>(p, a);
  }
};

}  // namespace

bool flash_supports(DType dtype, int64_t D, float softcap, std::initializer_list<const void*> ptrs) {
  if (dtype != DType::kBF16 && dtype != DType::kF16) return false;
  if (D < 8 || D > 128 || D % 8 != 0) return false;  // whole 16-byte row chunks, the widest tile
  if (softcap != 0.0f) return false;
  for (const void* ptr : ptrs) {
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0) return false;
  }
  return true;
}

int flash_fwd_rows(int64_t D) {
  return with_width(D, [](auto kd) { return FwdShape<decltype(kd)::value>::BM; });
}
int flash_bwd_keys(int64_t D) {
  return with_width(D, [](auto kd) { return BwdShape<decltype(kd)::value>::BN; });
}

Status flash_attention_fwd(const FlashAttnArgs& a, void* out, float* lse) {
  FlashParams p = make_params(a);
  p.o = out;
  p.lse = lse;
  return dispatch<FwdLaunch>(p, a);
}

Status flash_attention_bwd(const FlashAttnArgs& a, const void* dout, const float* lse, const float* delta,
                           float* dq_acc, void* dk, void* dv) {
  FlashParams p = make_params(a);
  p.dout = dout;
  p.lse_in = lse;
  p.delta = delta;
  p.dq_acc = dq_acc;
  p.dk = dk;
  p.dv = dv;
  return dispatch<BwdLaunch>(p, a);
}

}  // namespace surogate::cuda
