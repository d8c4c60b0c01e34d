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

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Launches the fast forward kernel and returns true where it applies (T = TW = bf16 / f16, Kin and
// Nout multiples of 8, 16-byte aligned bases); false leaves the call to grouped_gemm_kernel.
template <typename T, typename TW>
bool launch_fast_gemm(const MoeGroupedArgs& d, const T* x, const TW* W, const int32_t* off, T* y) {
  if constexpr (std::is_same_v<T, TW> && !std::is_same_v<T, float>) {
    if (d.Kin % 8 != 0 || d.Nout % 8 != 0 || !aligned16(x) || !aligned16(W) || !aligned16(y)) return false;
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
