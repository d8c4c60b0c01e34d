// The grouped GEMM over experts on CUDA: moe_grouped_matmul and moe_grouped_matmul_wgrad, the
// twins of cpu/moe.cpp (which states the math). One launch covers every expert: the rows are
// already expert-contiguous (moe_permute), so a CTA takes a BM-row tile of them, finds on the
// device which experts own those rows (binary search in offsets: reading offsets on the host
// would synchronize) and multiplies each expert's part of the tile with that expert's matrix;
// rows of other experts are zeros in shared memory and are not stored. Tiles inside one expert
// (the common case at training batch sizes) take one pass; a tile that straddles experts takes
// one pass per expert it holds. bf16 / f16 run on tensor cores (WMMA 16x16x16, f32 accumulate),
// f32 (tests) on plain FMAs, as attention.cu's block_mma.
//
// Two kernels each: the fast one (grouped_*_fast_kernel: bf16 / f16, forward weights in the same
// dtype, Kin and Nout multiples of 8, 16-byte aligned bases) keeps the accumulators in registers
// over the whole reduction and loads 16-byte vectors; the generic one (below, accumulators in
// shared memory, element loads) takes f32, mixed dtypes and misaligned shapes.
//
//   forward (trans_b): y[r] = x[r] @ W[e]^T for r in [off[e], off[e+1]); !trans_b: x[r] @ W[e]
//   wgrad:   grid (Kin tiles, Nout tiles, E): dW[e] tile = sum over e's rows of dy^T x, in
//            BK-row chunks, f32 in shared memory, stored once (+ dW[e] with accumulate)
//
// offsets are device memory and cannot be validated as the CPU does: every offset is clamped
// into [0, M] and kept monotone, so bad offsets give wrong numbers, never an out-of-bounds access.
#include <mma.h>

#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "cuda/backend.h"
#include "cuda/common.cuh"
#include "runtime/op_checks_moe.h"

namespace surogate::cuda {

namespace {

constexpr int kBM = 64, kBN = 64, kBK = 32, kThreads = 128;
constexpr int kPad = 8;  // shared rows padded: 16-byte-multiple strides, fewer bank conflicts

// C[BM][BN] (f32, ldc) += op(A)[BM][BK] op(B)[BK][BN] in shared memory, the whole block
// cooperating; op(A)[m][k] = kTA ? A[k * lda + m] : A[m * lda + k], op(B)[k][n] = kTB ?
// B[n * ldb + k] : B[k * ldb + n]. The caller synchronizes before and after.
template <bool kTA, bool kTB, typename T>
__device__ void tile_mma(float* C, int ldc, const T* A, int lda, const T* B, int ldb) {
  if constexpr (std::is_same_v<T, float>) {
    for (int e = threadIdx.x; e < kBM * kBN; e += blockDim.x) {
      const int m = e / kBN, n = e % kBN;
      float s = C[m * ldc + n];
#pragma unroll 8
      for (int k = 0; k < kBK; ++k) s += (kTA ? A[k * lda + m] : A[m * lda + k]) * (kTB ? B[n * ldb + k] : B[k * ldb + n]);
      C[m * ldc + n] = s;
    }
  } else {
    namespace wmma = nvcuda::wmma;
    using LA = std::conditional_t<kTA, wmma::col_major, wmma::row_major>;
    using LB = std::conditional_t<kTB, wmma::col_major, wmma::row_major>;
    constexpr int TN = kBN / 16;
    const int warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    for (int t = warp; t < (kBM / 16) * TN; t += nwarps) {
      const int tm = t / TN, tn = t % TN;
      float* c_at = C + tm * 16 * ldc + tn * 16;
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
      wmma::load_matrix_sync(c, c_at, ldc, wmma::mem_row_major);
#pragma unroll
      for (int k = 0; k < kBK; k += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LA> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LB> b;
        wmma::load_matrix_sync(a, kTA ? A + k * lda + tm * 16 : A + tm * 16 * lda + k, lda);
        wmma::load_matrix_sync(b, kTB ? B + tn * 16 * ldb + k : B + k * ldb + tn * 16, ldb);
        wmma::mma_sync(c, a, b, c);
      }
      wmma::store_matrix_sync(c_at, c, ldc, wmma::mem_row_major);
    }
  }
}

__device__ __forceinline__ int64_t clamped_offset(const int32_t* off, int e, int64_t M) {
  const int64_t v = off[e];
  return v < 0 ? 0 : (v > M ? M : v);
}

// The expert owning row r: the last e with off[e] <= r (clamped offsets, monotone by max).
__device__ int expert_of(const int32_t* off, int E, int64_t M, int64_t r) {
  int lo = 0, hi = E - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (clamped_offset(off, mid, M) <= r) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

template <typename T, typename TW, bool kTransB>
__global__ void __launch_bounds__(kThreads) grouped_gemm_kernel(const T* x, const TW* W, const int32_t* off, T* y,
                                                                int64_t M, int E, int64_t Kin, int64_t Nout) {
  __shared__ __align__(32) T As[kBM][kBK + kPad];
  __shared__ __align__(32) T Bs[kBN][kBK + kPad];
  __shared__ __align__(32) float Cs[kBM][kBN + 4];
  const int64_t m0 = int64_t{blockIdx.y} * kBM, n0 = int64_t{blockIdx.x} * kBN;
  if (m0 >= M) return;
  const int64_t m_end = min(m0 + kBM, M);
  for (int e = expert_of(off, E, M, m0); e < E; ++e) {
    const int64_t lo = max(m0, clamped_offset(off, e, M));
    const int64_t hi = min(m_end, max(lo, clamped_offset(off, e + 1, M)));
    if (lo >= m_end) break;
    if (lo >= hi) continue;
    const TW* We = W + int64_t{e} * Nout * Kin;
    for (int i = threadIdx.x; i < kBM * kBN; i += blockDim.x) Cs[i / kBN][i % kBN] = 0.0f;
    for (int64_t k0 = 0; k0 < Kin; k0 += kBK) {
      for (int i = threadIdx.x; i < kBM * kBK; i += blockDim.x) {
        const int m = i / kBK, k = i % kBK;
        const int64_t r = m0 + m, kk = k0 + k;
        As[m][k] = st<T>(r >= lo && r < hi && kk < Kin ? ld(x[r * Kin + kk]) : 0.0f);
      }
      for (int i = threadIdx.x; i < kBN * kBK; i += blockDim.x) {
        const int n = i / kBK, k = i % kBK;
        const int64_t nn = n0 + n, kk = k0 + k;
        float v = 0.0f;
        if (nn < Nout && kk < Kin) v = ld(kTransB ? We[nn * Kin + kk] : We[kk * Nout + nn]);
        Bs[n][k] = st<T>(v);
      }
      __syncthreads();
      tile_mma<false, true, T>(&Cs[0][0], kBN + 4, &As[0][0], kBK + kPad, &Bs[0][0], kBK + kPad);
      __syncthreads();
    }
    for (int i = threadIdx.x; i < kBM * kBN; i += blockDim.x) {
      const int m = i / kBN, n = i % kBN;
      const int64_t r = m0 + m, nn = n0 + n;
      if (r >= lo && r < hi && nn < Nout) y[r * Nout + nn] = st<T>(Cs[m][n]);
    }
    __syncthreads();
  }
}

// dW[e][n0 + m][k0 + n] over e's rows r: sum_r dy[r][n0 + m] x[r][k0 + n].
template <typename T, typename TW>
__global__ void __launch_bounds__(kThreads) grouped_wgrad_kernel(const T* dy, const T* x, const int32_t* off, TW* dW,
                                                                 int64_t M, int64_t Kin, int64_t Nout, bool accumulate) {
  __shared__ __align__(32) T As[kBK][kBM + kPad];  // [r][m] = dy[r][n0 + m]
  __shared__ __align__(32) T Bs[kBK][kBN + kPad];  // [r][n] = x[r][k0 + n]
  __shared__ __align__(32) float Cs[kBM][kBN + 4];
  const int e = blockIdx.z;
  const int64_t k0 = int64_t{blockIdx.x} * kBN, n0 = int64_t{blockIdx.y} * kBM;
  const int64_t lo = clamped_offset(off, e, M);
  const int64_t hi = max(lo, clamped_offset(off, e + 1, M));
  for (int i = threadIdx.x; i < kBM * kBN; i += blockDim.x) Cs[i / kBN][i % kBN] = 0.0f;
  for (int64_t r0 = lo; r0 < hi; r0 += kBK) {
    for (int i = threadIdx.x; i < kBK * kBM; i += blockDim.x) {
      const int rr = i / kBM, m = i % kBM;
      const int64_t r = r0 + rr, nn = n0 + m;
      As[rr][m] = st<T>(r < hi && nn < Nout ? ld(dy[r * Nout + nn]) : 0.0f);
    }
    for (int i = threadIdx.x; i < kBK * kBN; i += blockDim.x) {
      const int rr = i / kBN, n = i % kBN;
      const int64_t r = r0 + rr, kk = k0 + n;
      Bs[rr][n] = st<T>(r < hi && kk < Kin ? ld(x[r * Kin + kk]) : 0.0f);
    }
    __syncthreads();
    tile_mma<true, false, T>(&Cs[0][0], kBN + 4, &As[0][0], kBM + kPad, &Bs[0][0], kBN + kPad);
    __syncthreads();
  }
  TW* out = dW + int64_t{e} * Nout * Kin;
  for (int i = threadIdx.x; i < kBM * kBN; i += blockDim.x) {
    const int m = i / kBN, n = i % kBN;
    const int64_t nn = n0 + m, kk = k0 + n;
    if (nn < Nout && kk < Kin) {
      const float v = Cs[m][n] + (accumulate ? ld(out[nn * Kin + kk]) : 0.0f);
      out[nn * Kin + kk] = st<TW>(v);
    }
  }
}


// ---- The fast path: T = bf16 / f16, weights (forward) in T, Kin % 8 == 0, Nout % 8 == 0, 16-byte
// aligned bases. A 128x128 CTA tile, 8 warps in a 2 (m) x 4 (n) grid, each warp holding its 64x32
// of the tile as 4x2 WMMA accumulator fragments in registers across the whole reduction. Every
// BK step the block loads the next A and B tiles as 16-byte vectors into registers while the
// tensor cores work on the current ones in shared memory (one shared buffer, register prefetch).
// Fragments whose 16 rows hold none of the current expert's rows skip their MMAs and stores.
constexpr int kFM = 128, kFN = 128, kFK = 32, kFThreads = 256;
constexpr int kFWarpM = 64, kFWarpN = 32;                   // 2 x 4 warps
constexpr int kFragM = kFWarpM / 16, kFragN = kFWarpN / 16;  // 4 x 2 fragments a warp
constexpr int kFLdK = kFK + 8;                               // [128][BK] tiles: 80-byte rows
constexpr int kFLdN = kFN + 8;                               // [BK][128] tiles: 272-byte rows
constexpr int kFVecs = kFM * kFK / 8 / kFThreads;            // uint4 a thread per tile
constexpr int kVK = kFK / 8, kVN = kFN / 8;                  // uint4 along a BK row / a 128 row
static_assert(kFM == kFN && kFVecs * kFThreads * 8 == kFM * kFK, "tile / thread layout");

// One 16-byte vector (vector c of a [rows][BK] tile: row = c / kVK, k = c % kVK * 8; of a [BK][cols]
// tile: k = c / kVN, col = c % kVN * 8); invalid vectors are zeros and read nothing.
__device__ __forceinline__ uint4 ld16(const void* p, bool ok) {
  return ok ? __ldg(static_cast<const uint4*>(p)) : make_uint4(0u, 0u, 0u, 0u);
}

// The 16x16 f32 fragment c (through the warp's scratch) to out rows [row0, row0 + 16) x cols
// [col0, col0 + 16): row r kept when lo <= r < hi, 8-column groups kept when col < ncols.
// kAdd adds what out holds (wgrad accumulate); TO may differ from T (f32 dW).
template <typename TO, typename Frag>
__device__ __forceinline__ void store_fragment(const Frag& c, float* scratch, TO* out, int64_t ldo, int64_t row0,
                                               int64_t lo, int64_t hi, int64_t col0, int64_t ncols, bool add) {
  namespace wmma = nvcuda::wmma;
  wmma::store_matrix_sync(scratch, c, 16, wmma::mem_row_major);
  __syncwarp();
  const int lane = threadIdx.x % 32, rr = lane / 2, cc = lane % 2 * 8;
  const int64_t r = row0 + rr, col = col0 + cc;
  if (r >= lo && r < hi && col < ncols) {
    TO* o = out + r * ldo + col;
    if constexpr (std::is_same_v<TO, float>) {
#pragma unroll
      for (int q = 0; q < 8; ++q) o[q] = scratch[rr * 16 + cc + q] + (add ? o[q] : 0.0f);
    } else {
      alignas(16) TO v[8];
      alignas(16) TO old[8];
      if (add) *reinterpret_cast<uint4*>(old) = *reinterpret_cast<const uint4*>(o);
#pragma unroll
      for (int q = 0; q < 8; ++q) v[q] = st<TO>(scratch[rr * 16 + cc + q] + (add ? ld(old[q]) : 0.0f));
      *reinterpret_cast<uint4*>(o) = *reinterpret_cast<const uint4*>(v);
    }
  }
  __syncwarp();
}

template <typename T, bool kTransB>
__global__ void __launch_bounds__(kFThreads) grouped_gemm_fast_kernel(const T* x, const T* W, const int32_t* off, T* y,
                                                                      int64_t M, int E, int64_t Kin, int64_t Nout) {
  namespace wmma = nvcuda::wmma;
  constexpr int kBRows = kTransB ? kFN : kFK, kBLd = kTransB ? kFLdK : kFLdN;
  __shared__ __align__(128) T As[kFM * kFLdK];      // [m][k]
  __shared__ __align__(128) T Bs[kBRows * kBLd];    // trans_b: [n][k]; else [k][n]
  __shared__ __align__(128) float Cs[kFThreads / 32][16 * 16];
  using LB = std::conditional_t<kTransB, wmma::col_major, wmma::row_major>;
  const int64_t m0 = int64_t{blockIdx.y} * kFM, n0 = int64_t{blockIdx.x} * kFN;
  if (m0 >= M) return;
  const int64_t m_end = min(m0 + kFM, M);
  const int warp = threadIdx.x / 32, wm = warp / (kFN / kFWarpN), wn = warp % (kFN / kFWarpN);
  for (int e = expert_of(off, E, M, m0); e < E; ++e) {
    const int64_t lo = max(m0, clamped_offset(off, e, M));
    const int64_t hi = min(m_end, max(lo, clamped_offset(off, e + 1, M)));
    if (lo >= m_end) break;
    if (lo >= hi) continue;
    const T* We = W + int64_t{e} * Nout * Kin;
    bool live[kFragM];  // fragment rows meet [lo, hi): warp-uniform
#pragma unroll
    for (int i = 0; i < kFragM; ++i) {
      const int64_t f0 = m0 + wm * kFWarpM + i * 16;
      live[i] = f0 < hi && f0 + 16 > lo;
    }
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kFragM][kFragN];
#pragma unroll
    for (int i = 0; i < kFragM; ++i)
#pragma unroll
      for (int j = 0; j < kFragN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
    uint4 ra[kFVecs], rb[kFVecs];
    auto load = [&](int64_t k0) {
#pragma unroll
      for (int v = 0; v < kFVecs; ++v) {
        const int c = threadIdx.x + v * kFThreads;
        const int64_t r = m0 + c / kVK, kk = k0 + c % kVK * 8;
        ra[v] = ld16(x + r * Kin + kk, r >= lo && r < hi && kk < Kin);
        if constexpr (kTransB) {
          const int64_t nn = n0 + c / kVK;
          rb[v] = ld16(We + nn * Kin + kk, nn < Nout && kk < Kin);
        } else {
          const int64_t kb = k0 + c / kVN, nn = n0 + c % kVN * 8;
          rb[v] = ld16(We + kb * Nout + nn, kb < Kin && nn < Nout);
        }
      }
    };
    load(0);
    for (int64_t k0 = 0; k0 < Kin; k0 += kFK) {
      __syncthreads();  // the previous step's (or expert's) MMAs are done with the tiles
#pragma unroll
      for (int v = 0; v < kFVecs; ++v) {
        const int c = threadIdx.x + v * kFThreads;
        *reinterpret_cast<uint4*>(&As[(c / kVK) * kFLdK + c % kVK * 8]) = ra[v];
        if constexpr (kTransB) *reinterpret_cast<uint4*>(&Bs[(c / kVK) * kFLdK + c % kVK * 8]) = rb[v];
        else *reinterpret_cast<uint4*>(&Bs[(c / kVN) * kFLdN + c % kVN * 8]) = rb[v];
      }
      __syncthreads();
      if (k0 + kFK < Kin) load(k0 + kFK);  // in flight during the MMAs below
#pragma unroll
      for (int kk = 0; kk < kFK; kk += 16) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LB> b[kFragN];
#pragma unroll
        for (int j = 0; j < kFragN; ++j) {
          const int n = wn * kFWarpN + j * 16;
          wmma::load_matrix_sync(b[j], kTransB ? &Bs[n * kFLdK + kk] : &Bs[kk * kFLdN + n], kBLd);
        }
#pragma unroll
        for (int i = 0; i < kFragM; ++i) {
          if (!live[i]) continue;
          wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
          wmma::load_matrix_sync(a, &As[(wm * kFWarpM + i * 16) * kFLdK + kk], kFLdK);
#pragma unroll
          for (int j = 0; j < kFragN; ++j) wmma::mma_sync(acc[i][j], a, b[j], acc[i][j]);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kFragM; ++i) {
      if (!live[i]) continue;
#pragma unroll
      for (int j = 0; j < kFragN; ++j)
        store_fragment<T>(acc[i][j], Cs[warp], y, Nout, m0 + wm * kFWarpM + i * 16, lo, hi,
                          n0 + wn * kFWarpN + j * 16, Nout, false);
    }
  }
}

// dW[e][n0 + m][k0 + n] = sum over e's rows r of dy[r][n0 + m] x[r][k0 + n], the same tiling with
// the reduction over rows: A = dy^T staged [r][m] (col_major A), B = x staged [r][n] (row_major).
template <typename T, typename TW>
__global__ void __launch_bounds__(kFThreads, 2) grouped_wgrad_fast_kernel(const T* dy, const T* x, const int32_t* off,
                                                                       TW* dW, int64_t M, int64_t Kin, int64_t Nout,
                                                                       bool accumulate) {
  namespace wmma = nvcuda::wmma;
  __shared__ __align__(128) T As[kFK * kFLdN];  // [r][m] = dy[r][n0 + m]
  __shared__ __align__(128) T Bs[kFK * kFLdN];  // [r][n] = x[r][k0 + n]
  __shared__ __align__(128) float Cs[kFThreads / 32][16 * 16];
  const int e = blockIdx.z;
  const int64_t k0 = int64_t{blockIdx.x} * kFN, n0 = int64_t{blockIdx.y} * kFM;
  const int64_t lo = clamped_offset(off, e, M);
  const int64_t hi = max(lo, clamped_offset(off, e + 1, M));
  const int warp = threadIdx.x / 32, wm = warp / (kFN / kFWarpN), wn = warp % (kFN / kFWarpN);
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kFragM][kFragN];
#pragma unroll
  for (int i = 0; i < kFragM; ++i)
#pragma unroll
    for (int j = 0; j < kFragN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
  uint4 ra[kFVecs], rb[kFVecs];
  auto load = [&](int64_t r0) {
#pragma unroll
    for (int v = 0; v < kFVecs; ++v) {
      const int c = threadIdx.x + v * kFThreads;
      const int64_t r = r0 + c / kVN, col = c % kVN * 8;
      ra[v] = ld16(dy + r * Nout + n0 + col, r < hi && n0 + col < Nout);
      rb[v] = ld16(x + r * Kin + k0 + col, r < hi && k0 + col < Kin);
    }
  };
  if (lo < hi) load(lo);
  for (int64_t r0 = lo; r0 < hi; r0 += kFK) {
    __syncthreads();
#pragma unroll
    for (int v = 0; v < kFVecs; ++v) {
      const int c = threadIdx.x + v * kFThreads;
      *reinterpret_cast<uint4*>(&As[(c / kVN) * kFLdN + c % kVN * 8]) = ra[v];
      *reinterpret_cast<uint4*>(&Bs[(c / kVN) * kFLdN + c % kVN * 8]) = rb[v];
    }
    __syncthreads();
    if (r0 + kFK < hi) load(r0 + kFK);
#pragma unroll
    for (int kk = 0; kk < kFK; kk += 16) {
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> b[kFragN];
#pragma unroll
      for (int j = 0; j < kFragN; ++j) wmma::load_matrix_sync(b[j], &Bs[kk * kFLdN + wn * kFWarpN + j * 16], kFLdN);
#pragma unroll
      for (int i = 0; i < kFragM; ++i) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::col_major> a;
        wmma::load_matrix_sync(a, &As[kk * kFLdN + wm * kFWarpM + i * 16], kFLdN);
#pragma unroll
        for (int j = 0; j < kFragN; ++j) wmma::mma_sync(acc[i][j], a, b[j], acc[i][j]);
      }
    }
  }
  TW* out = dW + int64_t{e} * Nout * Kin;
#pragma unroll
  for (int i = 0; i < kFragM; ++i)
#pragma unroll
    for (int j = 0; j < kFragN; ++j)
      store_fragment<TW>(acc[i][j], Cs[warp], out, Kin, n0 + wm * kFWarpM + i * 16, 0, Nout,
                         k0 + wn * kFWarpN + j * 16, Kin, accumulate);
}

// ---- The small-rows path (decode): T = bf16 / f16, weights in T, Kin and Nout multiples of 8,
// 16-byte aligned bases, few rows per expert (small_rows() decides from M and E on the host). At
// decode the tiled kernels above launch Nout / 128 CTAs over M = tokens * top_k rows and each CTA
// streams every expert its tile holds, one after another: a handful of CTAs on 132 SMs. Here the
// grid is (Nout chunks, E): CTA (c, e) reads e's row range from the device offsets, exits at once
// when e has no rows (most CTAs at decode), and otherwise streams W[e]'s chunk c with 16-byte
// L1-bypassing loads along W's contiguous dim, multiplying it with up to kSRows of e's rows held in
// registers (f32 FMAs; more rows take further passes over the chunk, which L2 then serves). Each
// weight byte feeds R FMAs, so the pass is templated on R = 1, 2, 4, 8 (the rows it holds, rounded
// up; the missing rows repeat the last one and are not stored) and a single stream pays for one.
//   trans_b (W[e] = [Nout][Kin], y = x W^T): a warp takes kSU rows of W (output columns), its lanes
//     across Kin (32 vectors = 512 contiguous bytes a row per step, two steps in flight); each
//     lane's kSU x R partial dot products are summed over the warp with shuffles. A CTA is
//     kSWarps x kSU = 32 columns, so gate_up's Nout 1536 is 48 CTAs an expert.
//   !trans_b (W[e] = [Kin][Nout], y = x W): a thread takes one 16-byte vector of 8 columns and a
//     block of 8 rows of W (8 loads in flight), 8 threads cover the CTA's kSBN = 64 columns and the
//     32 groups of 8 lanes stride over Kin; the groups' 8 x R sums meet through shuffles (within a
//     warp) and shared memory (across warps, summed in warp order).
constexpr int kSThreads = 256, kSWarps = kSThreads / 32;
constexpr int kSRows = 8;                          // rows of x a pass holds
constexpr int kSU = 4;                             // trans_b: W rows a warp streams together
constexpr int kSSteps = 2;                         // trans_b: 16-byte vectors in flight per W row
constexpr int kSBNT = kSWarps * kSU;               // trans_b: output columns per CTA
constexpr int kSBN = 64, kSVN = kSBN / 8;          // !trans_b: output columns per CTA, vectors across them
constexpr int kSGroups = kSThreads / kSVN;         // !trans_b: k groups (8 rows of W each step)
constexpr int kSRowsN = 4;                         // !trans_b: rows a pass holds (8 x R accumulators)
static_assert(kSU * kSRows <= 32 && 8 % kSU == 0 && kSVN * 4 == 32, "lane layouts");

// Element j of a 16-byte vector of T (8 values) as f32.
template <typename T>
__device__ __forceinline__ float elem16(const uint4& u, int j) {
  const uint32_t w = j < 2 ? u.x : j < 4 ? u.y : j < 6 ? u.z : u.w;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __uint_as_float(j % 2 ? w & 0xffff0000u : w << 16);
  else return __half2float(__ushort_as_half(static_cast<unsigned short>(j % 2 ? w >> 16 : w & 0xffffu)));
}

// trans_b: y[r0 + i][nw + u] for i < rows, u < kSU (this warp's W rows nw.., all inside Nout).
template <typename T, int R>
__device__ __forceinline__ void rows_pass_tb(const T* x, const T* We, T* y, int64_t r0, int rows, int64_t Kin,
                                             int64_t Nout, int64_t nw) {
  const int lane = threadIdx.x % 32;
  const int64_t kv = Kin / 8;
  const uint4* wr = reinterpret_cast<const uint4*>(We + nw * Kin);  // nw + kSU <= Nout: both multiples of 4
  const uint4* xr = reinterpret_cast<const uint4*>(x + r0 * Kin);
  float acc[kSU][R];
#pragma unroll
  for (int u = 0; u < kSU; ++u)
#pragma unroll
    for (int i = 0; i < R; ++i) acc[u][i] = 0.0f;
  constexpr int kSteps = R < kSRows ? kSSteps : 1;  // at 8 rows the x vectors take the registers
  for (int64_t v0 = lane; v0 < kv; v0 += 32 * kSteps) {
    uint4 w[kSteps][kSU];
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const int64_t v = v0 + 32 * s;
#pragma unroll
      for (int u = 0; u < kSU; ++u) w[s][u] = v < kv ? ld_stream(wr + u * kv + v) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const int64_t v = min(v0 + 32 * s, kv - 1);  // past Kin W is zeros; x re-reads a valid vector
      uint4 xv[R];
#pragma unroll
      for (int i = 0; i < R; ++i) xv[i] = __ldg(xr + min(i, rows - 1) * kv + v);
      // Element j of every W vector once, then of every x vector: 4 unpacked W values live, not 32.
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        float wf[kSU];
#pragma unroll
        for (int u = 0; u < kSU; ++u) wf[u] = elem16<T>(w[s][u], j);
#pragma unroll
        for (int i = 0; i < R; ++i) {
          const float xf = elem16<T>(xv[i], j);
#pragma unroll
          for (int u = 0; u < kSU; ++u) acc[u][i] = fmaf(wf[u], xf, acc[u][i]);
        }
      }
    }
  }
#pragma unroll
  for (int u = 0; u < kSU; ++u)
#pragma unroll
    for (int i = 0; i < R; ++i) {
      float s = acc[u][i];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (lane == u * R + i && i < rows) y[(r0 + i) * Nout + nw + u] = st<T>(s);
    }
}

// !trans_b: y[r0 + i][n0, n0 + kSBN) for i < rows; red is [kSWarps][kSRowsN][kSBN] f32.
template <typename T, int R>
__device__ __forceinline__ void rows_pass_n(const T* x, const T* We, T* y, int64_t r0, int rows, int64_t Kin,
                                            int64_t Nout, int64_t n0, float* red) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int nv = lane % kSVN, g = warp * (32 / kSVN) + lane / kSVN;
  const int64_t col = n0 + nv * 8;
  const bool col_ok = col < Nout;
  const int64_t kb = Kin / 8;  // blocks of 8 rows of W
  const uint4* xr = reinterpret_cast<const uint4*>(x + r0 * Kin);
  float acc[R][8];
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int c = 0; c < 8; ++c) acc[i][c] = 0.0f;
  for (int64_t b = g; b < kb; b += kSGroups) {
    uint4 w[8];
#pragma unroll
    for (int j = 0; j < 8; ++j)
      w[j] = col_ok ? ld_stream(We + (b * 8 + j) * Nout + col) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const uint4 xv = __ldg(xr + min(i, rows - 1) * kb + b);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float xf = elem16<T>(xv, j);
#pragma unroll
        for (int c = 0; c < 8; ++c) acc[i][c] = fmaf(elem16<T>(w[j], c), xf, acc[i][c]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      float s = acc[i][c];
#pragma unroll
      for (int o = kSVN; o < 32; o <<= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (lane < kSVN) red[(warp * kSRowsN + i) * kSBN + nv * 8 + c] = s;
    }
  __syncthreads();
  for (int t = threadIdx.x; t < R * kSBN; t += kSThreads) {
    const int i = t / kSBN, n = t % kSBN;
    float s = 0.0f;
#pragma unroll
    for (int q = 0; q < kSWarps; ++q) s += red[(q * kSRowsN + i) * kSBN + n];
    if (i < rows && n0 + n < Nout) y[(r0 + i) * Nout + n0 + n] = st<T>(s);
  }
  __syncthreads();  // red is free for the next pass
}

template <typename T, bool kTransB>
__global__ void __launch_bounds__(kSThreads, 2) grouped_gemm_rows_kernel(const T* x, const T* W, const int32_t* off, T* y,
                                                                      int64_t M, int64_t Kin, int64_t Nout) {
  __shared__ float red[kTransB ? 1 : kSWarps * kSRowsN * kSBN];
  constexpr int kPass = kTransB ? kSRows : kSRowsN;
  const int e = blockIdx.y;
  const int64_t lo = clamped_offset(off, e, M);
  const int64_t hi = max(lo, clamped_offset(off, e + 1, M));
  if (lo >= hi) return;  // CTA-uniform: no barrier below is skipped by part of the block
  const T* We = W + int64_t{e} * Nout * Kin;
  for (int64_t r0 = lo; r0 < hi; r0 += kPass) {
    const int rows = static_cast<int>(min(int64_t{kPass}, hi - r0));
    if constexpr (kTransB) {
      const int64_t nw = int64_t{blockIdx.x} * kSBNT + threadIdx.x / 32 * kSU;
      if (nw >= Nout) return;  // no barriers on this path
      if (rows == 1) rows_pass_tb<T, 1>(x, We, y, r0, rows, Kin, Nout, nw);
      else if (rows == 2) rows_pass_tb<T, 2>(x, We, y, r0, rows, Kin, Nout, nw);
      else if (rows <= 4) rows_pass_tb<T, 4>(x, We, y, r0, rows, Kin, Nout, nw);
      else rows_pass_tb<T, 8>(x, We, y, r0, rows, Kin, Nout, nw);
    } else {
      const int64_t n0 = int64_t{blockIdx.x} * kSBN;
      if (rows == 1) rows_pass_n<T, 1>(x, We, y, r0, rows, Kin, Nout, n0, red);
      else if (rows == 2) rows_pass_n<T, 2>(x, We, y, r0, rows, Kin, Nout, n0, red);
      else rows_pass_n<T, 4>(x, We, y, r0, rows, Kin, Nout, n0, red);
    }
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The small-rows kernel where the mean rows per expert are at most kSRows (M <= kSRows E: decode,
// tokens * top_k rows over E experts, up to ~E / top_k * 8 tokens a step), decided from M and E
// alone (the counts are device memory). One expert may still hold many rows (passes of kSRows over
// its chunk, from L2); the tiled kernel is the one for training's hundreds of rows an expert.
// SUROGATE_MOE_ROWS=0 turns the path off, =1 takes it for every shape it supports (benches, debug).
bool small_rows(int64_t M, int64_t E) {
  static const int mode = [] {
    const char* v = std::getenv("SUROGATE_MOE_ROWS");
    return v && *v ? (*v == '0' ? 0 : 1) : -1;
  }();
  if (mode == 0 || E >= 65536) return false;
  return mode == 1 || M <= kSRows * E;
}

// Launches a fast forward kernel and returns true where one applies (T = TW = bf16 / f16, Kin and
// Nout multiples of 8, 16-byte aligned bases): the small-rows one or the tiled one; false leaves the
// call to grouped_gemm_kernel.
template <typename T, typename TW>
bool launch_fast_gemm(const MoeGroupedArgs& d, const T* x, const TW* W, const int32_t* off, T* y) {
  if constexpr (std::is_same_v<T, TW> && !std::is_same_v<T, float>) {
    if (d.Kin % 8 != 0 || d.Nout % 8 != 0 || !aligned16(x) || !aligned16(W) || !aligned16(y)) return false;
    if (small_rows(d.M, d.E)) {
      const int64_t bn = d.trans_b ? kSBNT : kSBN;
      const dim3 g(static_cast<unsigned>((d.Nout + bn - 1) / bn), static_cast<unsigned>(d.E));
      if (d.trans_b) {
        grouped_gemm_rows_kernel<T, true><<<g, kSThreads, 0, current_stream()>>>(x, W, off, y, d.M, d.Kin, d.Nout);
      } else {
        grouped_gemm_rows_kernel<T, false><<<g, kSThreads, 0, current_stream()>>>(x, W, off, y, d.M, d.Kin, d.Nout);
      }
      return true;
    }
    const dim3 grid(static_cast<unsigned>((d.Nout + kFN - 1) / kFN), static_cast<unsigned>((d.M + kFM - 1) / kFM));
    const int E = static_cast<int>(d.E);
    if (d.trans_b) {
      grouped_gemm_fast_kernel<T, true><<<grid, kFThreads, 0, current_stream()>>>(x, W, off, y, d.M, E, d.Kin, d.Nout);
    } else {
      grouped_gemm_fast_kernel<T, false><<<grid, kFThreads, 0, current_stream()>>>(x, W, off, y, d.M, E, d.Kin, d.Nout);
    }
    return true;
  } else {
    return false;
  }
}

// The same for the weight gradient: T = bf16 / f16 (dy and x), dW in any float type.
template <typename T, typename TW>
bool launch_fast_wgrad(const MoeGroupedArgs& d, const T* dy, const T* x, const int32_t* off, TW* dW) {
  if constexpr (!std::is_same_v<T, float>) {
    if (d.Kin % 8 != 0 || d.Nout % 8 != 0 || !aligned16(dy) || !aligned16(x) || !aligned16(dW)) return false;
    const dim3 grid(static_cast<unsigned>((d.Kin + kFN - 1) / kFN), static_cast<unsigned>((d.Nout + kFM - 1) / kFM),
                    static_cast<unsigned>(d.E));
    grouped_wgrad_fast_kernel<T, TW><<<grid, kFThreads, 0, current_stream()>>>(dy, x, off, dW, d.M, d.Kin, d.Nout,
                                                                              d.accumulate);
    return true;
  } else {
    return false;
  }
}

Status moe_grouped_matmul(const OpArgs& a) {
  const char* op = "moe_grouped_matmul";
  MoeGroupedArgs d;
  SG_RETURN_IF_ERROR(check_moe_grouped_matmul(a, &d));
  if (d.M == 0 || d.Nout == 0) return Status::OK();
  SG_CHECK_ARG((d.M + kBM - 1) / kBM < 65536, str_cat(op, ": ", d.M, " rows are more than one launch covers"));
  const Tensor &x = a.in(0), &W = a.in(1), &y = a.out(0);
  const dim3 grid(static_cast<unsigned>((d.Nout + kBN - 1) / kBN), static_cast<unsigned>((d.M + kBM - 1) / kBM));
  const int E = static_cast<int>(d.E);
  SG_CUDA_DISPATCH_FLOAT(op, x.dtype, T, {
    SG_CUDA_DISPATCH_FLOAT(op, W.dtype, TW, {
      if (launch_fast_gemm<T, TW>(d, x.ptr<T>(), W.ptr<TW>(), a.in(2).ptr<int32_t>(), y.ptr<T>())) break;  // leaves the W switch
      if (d.trans_b) {
        grouped_gemm_kernel<T, TW, true><<<grid, kThreads, 0, current_stream()>>>(
            x.ptr<T>(), W.ptr<TW>(), a.in(2).ptr<int32_t>(), y.ptr<T>(), d.M, E, d.Kin, d.Nout);
      } else {
        grouped_gemm_kernel<T, TW, false><<<grid, kThreads, 0, current_stream()>>>(
            x.ptr<T>(), W.ptr<TW>(), a.in(2).ptr<int32_t>(), y.ptr<T>(), d.M, E, d.Kin, d.Nout);
      }
    });
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

Status moe_grouped_matmul_wgrad(const OpArgs& a) {
  const char* op = "moe_grouped_matmul_wgrad";
  MoeGroupedArgs d;
  SG_RETURN_IF_ERROR(check_moe_grouped_matmul_wgrad(a, &d));
  if (d.Nout == 0 || d.Kin == 0) return Status::OK();
  SG_CHECK_ARG((d.Nout + kBM - 1) / kBM < 65536 && d.E < 65536,
               str_cat(op, ": dW ", a.out(0).shape_str(), " is more than one launch covers"));
  const Tensor &dy = a.in(0), &x = a.in(1), &dW = a.out(0);
  const dim3 grid(static_cast<unsigned>((d.Kin + kBN - 1) / kBN), static_cast<unsigned>((d.Nout + kBM - 1) / kBM),
                  static_cast<unsigned>(d.E));
  SG_CUDA_DISPATCH_FLOAT(op, dy.dtype, T, {
    SG_CUDA_DISPATCH_FLOAT(op, dW.dtype, TW, {
      if (launch_fast_wgrad<T, TW>(d, dy.ptr<T>(), x.ptr<T>(), a.in(2).ptr<int32_t>(), dW.ptr<TW>())) break;  // leaves the dW switch
      grouped_wgrad_kernel<T, TW><<<grid, kThreads, 0, current_stream()>>>(
          dy.ptr<T>(), x.ptr<T>(), a.in(2).ptr<int32_t>(), dW.ptr<TW>(), d.M, d.Kin, d.Nout, d.accumulate);
    });
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

}  // namespace

void register_cuda_moe_gemm(OpRegistry& reg) {
  add_op(reg, "moe_grouped_matmul", moe_grouped_matmul);
  add_op(reg, "moe_grouped_matmul_wgrad", moe_grouped_matmul_wgrad);
}

}  // namespace surogate::cuda
