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
