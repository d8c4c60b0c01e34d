// LFM2's gated short convolution on CUDA, the twin of cpu/short_conv.cpp (the contract and the
// formulas are written down there): short_conv_fwd, short_conv_bwd (dbcx, and dw / dbias as
// per-channel sums over the tokens) and short_conv_cache (a serving step: each sequence's span
// continued from its conv state, which is rewritten in place).
//
// Kernels. fwd and the dbcx part of bwd: one thread per (token, channel), grid-stride; each finds
// its token's document by a binary search over cu_seqlens (S + 1 entries, cached) and sums its
// L taps in the CPU's order (k ascending, from the bias), u = T(B x) recomputed per tap. dw /
// dbias: a CTA of 32 channels x 8 token lanes; each thread sums its tokens into registers (taps
// indexed statically, L <= kShortConvMaxTaps), then the 8 lanes are summed in shared memory in a
// fixed order (deterministic), and lane 0 writes (accumulate: adds). cache: one thread per
// (sequence, channel) walks the span's tokens in order with the window of the last L-1 u values
// in registers. The host reads no device memory (a decode step is captured in a CUDA graph):
// cu_seqlens / cu_q / slots are clamped on the device, never checked; a slot outside the state
// runs from zeros and keeps nothing, as slot -1.
#include <algorithm>

#include "cuda/backend.h"
#include "cuda/common.cuh"
#include "runtime/op_checks_short_conv.h"

namespace surogate::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxL = static_cast<int>(kShortConvMaxTaps);
constexpr int kChannels = 32;  // dw / dbias: channels per CTA
constexpr int kLanes = 8;      // dw / dbias: token lanes per CTA

unsigned grid_for(int64_t items) { return grid_stride_blocks(items, kThreads); }

__device__ __forceinline__ int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); }

// The document [start, end) of token t: the last s with cu[s] <= t, clamped to [0, t] / [t + 1, N].
__device__ __forceinline__ void doc_of(const int32_t* cu, int S, int64_t t, int64_t N, int64_t* start, int64_t* end) {
  int lo = 0, hi = S;
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (cu[mid] <= t) lo = mid;
    else hi = mid;
  }
  *start = clamp64(cu[lo], 0, t);
  *end = clamp64(cu[lo + 1], t + 1, N);
}

template <typename T>
__device__ __forceinline__ float u_at(const T* bcx, int64_t t, int64_t C, int64_t c) {
  const T* r = bcx + t * 3 * C;
  return rnd<T>(ld(r[c]) * ld(r[2 * C + c]));
}

// conv[t] for channel c, rounded to T (the forward's conv, with its bias).
template <typename T>
__device__ __forceinline__ float conv_at(const T* bcx, const T* w, const T* bias, int64_t t, int64_t start, int64_t C,
                                         int64_t c, int L) {
  float acc = bias ? ld(bias[c]) : 0.0f;
  for (int k = 0; k < L; ++k) {
    const int64_t tt = t - (L - 1) + k;
    if (tt < start) continue;
    acc += ld(w[c * L + k]) * u_at<T>(bcx, tt, C, c);
  }
  return rnd<T>(acc);
}

template <typename T>
__global__ void fwd_kernel(const T* bcx, const T* w, const T* bias, const int32_t* cu, int S, T* y, int64_t N,
                           int64_t C, int L) {
  const int64_t total = N * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / C, c = i - t * C;
    int64_t start, end;
    doc_of(cu, S, t, N, &start, &end);
    const float conv = conv_at<T>(bcx, w, bias, t, start, C, c, L);
    y[i] = st<T>(ld(bcx[t * 3 * C + C + c]) * conv);
  }
}

template <typename T>
__global__ void dbcx_kernel(const T* dy, const T* bcx, const T* w, const T* bias, const int32_t* cu, int S, T* d,
                            int64_t N, int64_t C, int L) {
  const int64_t total = N * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / C, c = i - t * C;
    int64_t start, end;
    doc_of(cu, S, t, N, &start, &end);
    float du = 0.0f;
    for (int k = 0; k < L; ++k) {
      const int64_t tt = t + (L - 1) - k;
      if (tt >= end) continue;
      du += ld(w[c * L + k]) * (ld(dy[tt * C + c]) * ld(bcx[tt * 3 * C + C + c]));
    }
    const float conv = conv_at<T>(bcx, w, bias, t, start, C, c, L);
    const T* r = bcx + t * 3 * C;
    T* o = d + t * 3 * C;
    o[c] = st<T>(du * ld(r[2 * C + c]));
    o[C + c] = st<T>(ld(dy[i]) * conv);
    o[2 * C + c] = st<T>(du * ld(r[c]));
  }
}

// dw[c, k] = sum_t g[t] u[t - (L-1) + k], dbias[c] = sum_t g[t], g = dy Cg. dw / dbias are
// float32 or T (dt_w / dt_b); nullptr: not wanted.
template <typename T>
__global__ void __launch_bounds__(kChannels * kLanes)
dw_kernel(const T* dy, const T* bcx, const int32_t* cu, int S, void* dw, DType dt_w, void* db, DType dt_b,
          bool accumulate, int64_t N, int64_t C, int L) {
  __shared__ float red[kLanes][kMaxL + 1][kChannels];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = int64_t(blockIdx.x) * kChannels + tx;
  float acc[kMaxL + 1];
#pragma unroll
  for (int k = 0; k <= kMaxL; ++k) acc[k] = 0.0f;
  if (c < C) {
    for (int64_t t = ty; t < N; t += kLanes) {
      int64_t start, end;
      doc_of(cu, S, t, N, &start, &end);
      const float g = ld(dy[t * C + c]) * ld(bcx[t * 3 * C + C + c]);
#pragma unroll
      for (int k = 0; k < kMaxL; ++k) {
        if (k >= L) break;
        const int64_t tt = t - (L - 1) + k;
        if (tt >= start) acc[k] += g * u_at<T>(bcx, tt, C, c);
      }
      acc[kMaxL] += g;
    }
  }
#pragma unroll
  for (int k = 0; k <= kMaxL; ++k) red[ty][k][tx] = acc[k];
  __syncthreads();
  if (ty != 0 || c >= C) return;
  for (int k = 0; k <= kMaxL; ++k) {
    if (k < L || k == kMaxL) {
      float s = 0.0f;
      for (int j = 0; j < kLanes; ++j) s += red[j][k][tx];
      if (k == kMaxL) {
        if (db) store_as(db, dt_b, c, accumulate ? load_as(db, dt_b, c) + s : s);
      } else if (dw) {
        const int64_t at = c * L + k;
        store_as(dw, dt_w, at, accumulate ? load_as(dw, dt_w, at) + s : s);
      }
    }
  }
}

template <typename T>
__global__ void cache_kernel(const T* bcx, const T* w, const T* bias, const int32_t* slots, const int32_t* cu,
                             const int32_t* ctx, T* y, T* state, int S, int64_t P, int64_t N, int64_t C, int L) {
  const int W = L - 1;
  const int64_t total = int64_t(S) * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int s = static_cast<int>(i / C);
    const int64_t c = i - int64_t(s) * C;
    const int64_t base = cu[s], n = int64_t(cu[s + 1]) - base;
    if (n <= 0 || base < 0 || base + n > N) continue;
    const int32_t slot = slots[s];
    T* st_row = (slot >= 0 && slot < P) ? state + int64_t(slot) * W * C + c : nullptr;
    const bool resume = st_row != nullptr && ctx[s] > n;
    float wv[kMaxL], hist[kMaxL];
#pragma unroll
    for (int j = 0; j < kMaxL; ++j) {
      wv[j] = j < L ? ld(w[c * L + j]) : 0.0f;
      hist[j] = (j < W && resume) ? ld(st_row[int64_t(j) * C]) : 0.0f;
    }
    const float b = bias ? ld(bias[c]) : 0.0f;
    for (int64_t k = 0; k < n; ++k) {
      const int64_t t = base + k;
      const float u = u_at<T>(bcx, t, C, c);
      float acc = b;
#pragma unroll
      for (int j = 0; j < kMaxL - 1; ++j) {
        if (j < W) acc += wv[j] * hist[j];
      }
#pragma unroll
      for (int j = 0; j < kMaxL; ++j) {
        if (j == W) acc += wv[j] * u;
      }
      y[t * C + c] = st<T>(ld(bcx[t * 3 * C + C + c]) * rnd<T>(acc));
#pragma unroll
      for (int j = 0; j < kMaxL - 1; ++j) {
        if (j + 1 < W) hist[j] = hist[j + 1];
        else if (j + 1 == W) hist[j] = u;
      }
    }
    if (st_row != nullptr) {
#pragma unroll
      for (int j = 0; j < kMaxL - 1; ++j) {
        if (j < W) st_row[int64_t(j) * C] = st<T>(hist[j]);
      }
    }
  }
}

// Rows past cu_q[S] (bucket padding) are written as 0.
template <typename T>
__global__ void zero_tail_kernel(T* y, const int32_t* cu, int S, int64_t N, int64_t C) {
  const int64_t from = clamp64(cu[S], 0, N) * C, total = N * C;
  for (int64_t i = from + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    y[i] = st<T>(0.0f);
  }
}

Status short_conv_fwd(const OpArgs& a) {
  constexpr const char* op = "short_conv_fwd";
  ShortConvArgs r;
  SG_RETURN_IF_ERROR(check_short_conv_fwd(a, &r));
  if (r.N * r.C == 0) return Status::OK();
  SG_CUDA_DISPATCH_FLOAT(op, a.in(0).dtype, T, {
    fwd_kernel<T><<<grid_for(r.N * r.C), kThreads, 0, current_stream()>>>(
        a.in(0).ptr<T>(), a.in(1).ptr<T>(), r.bias ? a.in(3).ptr<T>() : nullptr, a.in(2).ptr<int32_t>(),
        static_cast<int>(r.S), a.out(0).ptr<T>(), r.N, r.C, static_cast<int>(r.L));
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

Status short_conv_bwd(const OpArgs& a) {
  constexpr const char* op = "short_conv_bwd";
  ShortConvArgs r;
  SG_RETURN_IF_ERROR(check_short_conv_bwd(a, &r));
  if (r.N * r.C == 0) return Status::OK();
  const int L = static_cast<int>(r.L), S = static_cast<int>(r.S);
  SG_CUDA_DISPATCH_FLOAT(op, a.in(1).dtype, T, {
    const T* bias = r.bias ? a.in(4).ptr<T>() : nullptr;
    dbcx_kernel<T><<<grid_for(r.N * r.C), kThreads, 0, current_stream()>>>(
        a.in(0).ptr<T>(), a.in(1).ptr<T>(), a.in(2).ptr<T>(), bias, a.in(3).ptr<int32_t>(), S, a.out(0).ptr<T>(),
        r.N, r.C, L);
    SG_CUDA_CHECK_LAUNCH();
    if (r.dw || r.dbias) {
      const dim3 block(kChannels, kLanes);
      const unsigned grid = static_cast<unsigned>((r.C + kChannels - 1) / kChannels);
      dw_kernel<T><<<grid, block, 0, current_stream()>>>(
          a.in(0).ptr<T>(), a.in(1).ptr<T>(), a.in(3).ptr<int32_t>(), S, r.dw ? r.dw->data : nullptr,
          r.dw ? r.dw->dtype : DType::kF32, r.dbias ? r.dbias->data : nullptr,
          r.dbias ? r.dbias->dtype : DType::kF32, r.accumulate, r.N, r.C, L);
    }
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

Status short_conv_cache(const OpArgs& a) {
  constexpr const char* op = "short_conv_cache";
  ShortConvArgs r;
  SG_RETURN_IF_ERROR(check_short_conv_cache(a, &r));
  if (r.N * r.C == 0) return Status::OK();
  const int S = static_cast<int>(r.S);
  SG_CUDA_DISPATCH_FLOAT(op, a.in(0).dtype, T, {
    zero_tail_kernel<T><<<grid_for(r.N * r.C), kThreads, 0, current_stream()>>>(
        a.out(0).ptr<T>(), a.in(3).ptr<int32_t>(), S, r.N, r.C);
    SG_CUDA_CHECK_LAUNCH();
    if (S > 0) {
      cache_kernel<T><<<grid_for(int64_t(S) * r.C), kThreads, 0, current_stream()>>>(
          a.in(0).ptr<T>(), a.in(1).ptr<T>(), r.bias ? a.in(5).ptr<T>() : nullptr, a.in(2).ptr<int32_t>(),
          a.in(3).ptr<int32_t>(), a.in(4).ptr<int32_t>(), a.out(0).ptr<T>(), a.out(1).ptr<T>(), S, r.P, r.N, r.C,
          static_cast<int>(r.L));
    }
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

}  // namespace

void register_cuda_short_conv(OpRegistry& reg) {
  add_op(reg, "short_conv_fwd", short_conv_fwd);
  add_op(reg, "short_conv_bwd", short_conv_bwd);
  add_op(reg, "short_conv_cache", short_conv_cache);
}

}  // namespace surogate::cuda
