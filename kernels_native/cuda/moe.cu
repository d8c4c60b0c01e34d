// Mixture-of-experts CUDA ops other than the grouped GEMM (moe_gemm.cu): the router and its
// backward, the permutation and the weighted un-permutation, the load-balancing loss — the twins
// of cpu/moe.cpp, which states the math and the roundings (the same here: f32 math, one rounding).
//
//   router:     one warp per token row (E <= 256, K <= 32: lanes over experts), else one thread.
//   permute:    one block sorts: per-expert counts in shared memory, their prefix sum (a warp scan),
//               then each expert's (n, k) pairs placed in token order (stable, as the CPU's counting sort),
//               idx staged through shared memory in chunks; a second kernel copies the rows.
//   unpermute:  forward: a thread per (token, channel), blocks of 256 channels; backward: one block
//               per token, threads over channels.
//   aux loss:   per layer, one block per expert sums probs[:, e] and counts idx == e into an
//               [L, E] scratch; one block then adds the layers in order (deterministic).
//   z-loss:     per layer, one block sums logsumexp(row)^2 over its rows into an [L] scratch (a
//               fixed tree order); one thread adds the layers in order. Backward: one thread per row.
// Device memory is not validated as the CPU does: expert indices and rows are clamped.
#include <cstdint>
#include <vector>

#include "core/allocator.h"
#include "cuda/backend.h"
#include "cuda/common.cuh"
#include "runtime/op_checks_moe.h"

namespace surogate::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxTopK = 64;

__device__ __forceinline__ int clamp_index(int v, int64_t bound) {
  return v < 0 ? 0 : (v >= bound ? static_cast<int>(bound - 1) : v);
}

// ---- router -----------------------------------------------------------------------------------

template <typename T>
__global__ void router_fwd_kernel(const T* logits, T* weights, int32_t* idx, float* probs, int64_t N, int E, int K,
                                  bool norm) {
  const int64_t n = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (n >= N) return;
  const T* l = logits + n * E;
  float* p = probs + n * E;
  float mx = -INFINITY;
  for (int e = 0; e < E; ++e) mx = fmaxf(mx, ld(l[e]));
  float sum = 0.0f;
  for (int e = 0; e < E; ++e) {
    const float v = expf(ld(l[e]) - mx);
    p[e] = v;
    sum += v;
  }
  const float inv = 1.0f / sum;
  for (int e = 0; e < E; ++e) p[e] *= inv;
  // K passes, each the largest p not taken (ties to the lower expert): taken = chosen before.
  int chosen[kMaxTopK];
  float s = 0.0f;
  for (int k = 0; k < K; ++k) {
    int best = -1;
    for (int e = 0; e < E; ++e) {
      bool taken = false;
      for (int j = 0; j < k; ++j) taken |= chosen[j] == e;
      if (!taken && (best < 0 || p[e] > p[best])) best = e;
    }
    chosen[k] = best;
    idx[n * K + k] = best;
    s += p[best];
  }
  for (int k = 0; k < K; ++k) {
    const float v = p[chosen[k]];
    weights[n * K + k] = st<T>(norm ? v / s : v);
  }
}

// The same, one warp per token for E <= 32 kRouterJ and K <= 32 (every model we serve): lanes over
// the experts, the softmax's max and sum as warp reductions, each of the K passes a warp argmax
// (ties to the lower expert, as above). One thread a token spent ~E K serial steps at decode, where
// N is 1..64 and a step's few threads are the whole router.
constexpr int kRouterJ = 8;  // experts per lane

template <typename T>
__global__ void router_fwd_warp_kernel(const T* logits, T* weights, int32_t* idx, float* probs, int64_t N, int E, int K,
                                       bool norm) {
  const int64_t n = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (n >= N) return;  // warp-uniform
  const T* l = logits + n * E;
  float* p = probs + n * E;
  float v[kRouterJ];
  float mx = -INFINITY;
#pragma unroll
  for (int j = 0; j < kRouterJ; ++j) {
    const int e = lane + 32 * j;
    v[j] = e < E ? ld(l[e]) : -INFINITY;
    mx = fmaxf(mx, v[j]);
  }
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < kRouterJ; ++j) {
    v[j] = lane + 32 * j < E ? expf(v[j] - mx) : 0.0f;
    sum += v[j];
  }
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const float inv = 1.0f / sum;
#pragma unroll
  for (int j = 0; j < kRouterJ; ++j) {
    const int e = lane + 32 * j;
    v[j] *= inv;
    if (e < E) p[e] = v[j];
  }
  float s = 0.0f, mine = 0.0f;  // lane k keeps choice k's probability
  for (int k = 0; k < K; ++k) {
    float bv = -1.0f;  // taken experts hold -1, below every probability
    int bi = E;
#pragma unroll
    for (int j = 0; j < kRouterJ; ++j) {
      const int e = lane + 32 * j;
      if (e < E && v[j] > bv) bv = v[j], bi = e;
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
    }
    if (lane == 0) idx[n * K + k] = bi;
    if (lane == k) mine = bv;
    s += bv;
#pragma unroll
    for (int j = 0; j < kRouterJ; ++j) {
      if (lane + 32 * j == bi) v[j] = -1.0f;
    }
  }
  if (lane < K) weights[n * K + lane] = st<T>(norm ? mine / s : mine);
}

template <typename T, typename D>
__global__ void router_bwd_kernel(const T* dw, const float* probs, const int32_t* idx, const float* dprobs, D* dlogits,
                                  int64_t N, int E, int K, bool norm) {
  const int64_t n = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (n >= N) return;
  const float* p = probs + n * E;
  const int32_t* ix = idx + n * K;
  float c[kMaxTopK];  // the chain through the weights, per choice
  float s = 0.0f, dot = 0.0f;
  for (int k = 0; k < K; ++k) s += p[clamp_index(ix[k], E)];
  for (int k = 0; k < K; ++k) dot += ld(dw[n * K + k]) * (p[clamp_index(ix[k], E)] / s);
  for (int k = 0; k < K; ++k) c[k] = norm ? (ld(dw[n * K + k]) - dot) / s : ld(dw[n * K + k]);
  float gp = 0.0f;
  for (int e = 0; e < E; ++e) {
    float g = dprobs ? dprobs[n * E + e] : 0.0f;
    for (int k = 0; k < K; ++k) g += clamp_index(ix[k], E) == e ? c[k] : 0.0f;
    gp += g * p[e];
  }
  for (int e = 0; e < E; ++e) {
    float g = dprobs ? dprobs[n * E + e] : 0.0f;
    for (int k = 0; k < K; ++k) g += clamp_index(ix[k], E) == e ? c[k] : 0.0f;
    dlogits[n * E + e] = st<D>(p[e] * (g - gp));
  }
}

Status moe_router_fwd(const OpArgs& a) {
  const char* op = "moe_router_fwd";
  MoeRouterArgs d;
  SG_RETURN_IF_ERROR(check_moe_router_fwd(a, &d));
  SG_CHECK_ARG(d.K <= kMaxTopK, str_cat(op, ": top_k ", d.K, " is above the CUDA kernel's ", kMaxTopK));
  if (d.N == 0) return Status::OK();
  const bool warp = d.E <= 32 * kRouterJ && d.K <= 32;
  SG_CUDA_DISPATCH_FLOAT(op, a.in(0).dtype, T, {
    if (warp) {
      router_fwd_warp_kernel<T><<<blocks_for(d.N * 32, kThreads), kThreads, 0, current_stream()>>>(
          a.in(0).ptr<T>(), a.out(0).ptr<T>(), a.out(1).ptr<int32_t>(), a.out(2).ptr<float>(), d.N,
          static_cast<int>(d.E), static_cast<int>(d.K), d.norm_topk_prob);
      break;
    }
    router_fwd_kernel<T><<<blocks_for(d.N, kThreads), kThreads, 0, current_stream()>>>(
        a.in(0).ptr<T>(), a.out(0).ptr<T>(), a.out(1).ptr<int32_t>(), a.out(2).ptr<float>(), d.N,
        static_cast<int>(d.E), static_cast<int>(d.K), d.norm_topk_prob);
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

Status moe_router_bwd(const OpArgs& a) {
  const char* op = "moe_router_bwd";
  MoeRouterArgs d;
  SG_RETURN_IF_ERROR(check_moe_router_bwd(a, &d));
  SG_CHECK_ARG(d.K <= kMaxTopK, str_cat(op, ": top_k ", d.K, " is above the CUDA kernel's ", kMaxTopK));
  if (d.N == 0) return Status::OK();
  const float* dprobs = d.dprobs ? a.in(3).ptr<float>() : nullptr;
  const Tensor& dl = a.out(0);
  SG_CUDA_DISPATCH_FLOAT(op, a.in(0).dtype, T, {
    SG_CUDA_DISPATCH_FLOAT(op, dl.dtype, D, {
      router_bwd_kernel<T, D><<<blocks_for(d.N, kThreads), kThreads, 0, current_stream()>>>(
          a.in(0).ptr<T>(), a.in(1).ptr<float>(), a.in(2).ptr<int32_t>(), dprobs, dl.ptr<D>(), d.N,
          static_cast<int>(d.E), static_cast<int>(d.K), d.norm_topk_prob);
    });
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

// ---- permutation ------------------------------------------------------------------------------

constexpr int kSortThreads = 1024, kChunk = 4096;

// One block: offsets[E + 1] and rows[M] (the stable counting sort of the (n, k) pairs by expert).
// Shared: counts then running positions, E + 1 ints, and a chunk of idx.
__global__ void __launch_bounds__(kSortThreads) permute_sort_kernel(const int32_t* idx, int32_t* rows, int32_t* offsets,
                                                                    int64_t M, int E) {
  extern __shared__ int32_t sh[];
  int32_t* next = sh;              // [E + 1]
  int32_t* chunk = sh + E + 1;     // [kChunk]
  for (int e = threadIdx.x; e <= E; e += blockDim.x) next[e] = 0;
  __syncthreads();
  for (int64_t j = threadIdx.x; j < M; j += blockDim.x) atomicAdd(&next[clamp_index(idx[j], E) + 1], 1);
  __syncthreads();
  if (threadIdx.x < 32) {  // next[1..E] to its inclusive prefix: lane l a contiguous run, then a warp scan
    const int lane = threadIdx.x, per = (E + 31) / 32, b = 1 + lane * per, end = min(E + 1, b + per);
    int run = 0;
    for (int e = b; e < end; ++e) run += next[e];
    int incl = run;
    for (int o = 1; o < 32; o <<= 1) {
      const int up = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += up;
    }
    int acc = incl - run;
    for (int e = b; e < end; ++e) next[e] = acc += next[e];
  }
  __syncthreads();
  for (int e = threadIdx.x; e <= E; e += blockDim.x) offsets[e] = next[e];
  __syncthreads();
  // Thread e places expert e's pairs in token order, chunk by chunk.
  for (int64_t c0 = 0; c0 < M; c0 += kChunk) {
    const int len = static_cast<int>(min(int64_t{kChunk}, M - c0));
    for (int i = threadIdx.x; i < len; i += blockDim.x) chunk[i] = clamp_index(idx[c0 + i], E);
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
      int pos = next[e];
      for (int i = 0; i < len; ++i) {
        if (chunk[i] == e) rows[c0 + i] = pos++;
      }
      next[e] = pos;
    }
    __syncthreads();
  }
}

// xp[rows[j]] = x[j / K], 16 bytes at a time when the rows allow it.
template <typename T>
__global__ void permute_copy_kernel(const T* x, const int32_t* rows, T* xp, int64_t M, int K, int64_t C) {
  const int64_t j = blockIdx.x;
  if (j >= M) return;
  const int64_t r = clamp_index(rows[j], M);
  const T* src = x + (j / K) * C;
  T* dst = xp + r * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dst[c] = src[c];
}

Status moe_permute(const OpArgs& a) {
  const char* op = "moe_permute";
  MoePermuteArgs d;
  SG_RETURN_IF_ERROR(check_moe_permute(a, &d));
  const size_t shared = (static_cast<size_t>(d.E) + 1 + kChunk) * sizeof(int32_t);
  SG_CHECK_ARG(shared <= 48 * 1024, str_cat(op, ": ", d.E, " experts need more shared memory than one block has"));
  permute_sort_kernel<<<1, kSortThreads, shared, current_stream()>>>(
      a.in(1).ptr<int32_t>(), a.out(1).ptr<int32_t>(), a.out(2).ptr<int32_t>(), d.M, static_cast<int>(d.E));
  SG_CUDA_CHECK_LAUNCH();
  if (d.M == 0) return Status::OK();
  SG_CUDA_DISPATCH_FLOAT(op, a.in(0).dtype, T, {
    permute_copy_kernel<T><<<static_cast<unsigned>(d.M), kThreads, 0, current_stream()>>>(
        a.in(0).ptr<T>(), a.out(1).ptr<int32_t>(), a.out(0).ptr<T>(), d.M, static_cast<int>(d.K), d.C);
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

// Block b: token b / chunks, columns [b % chunks * blockDim, +blockDim): a decode step's one token
// spreads over C / 256 blocks instead of one block walking C.
template <typename T, typename W>
__global__ void unpermute_fwd_kernel(const T* yp, const int32_t* rows, const W* w, T* y, int64_t M, int K, int64_t C,
                                     int64_t chunks) {
  const int64_t n = blockIdx.x / chunks, c = blockIdx.x % chunks * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float acc = 0.0f;
  for (int k = 0; k < K; ++k) {
    const int64_t r = clamp_index(rows[n * K + k], M);
    acc += (w ? ld(w[n * K + k]) : 1.0f) * ld(yp[r * C + c]);
  }
  y[n * C + c] = st<T>(acc);
}

Status moe_unpermute_fwd(const OpArgs& a) {
  const char* op = "moe_unpermute_fwd";
  MoePermuteArgs d;
  SG_RETURN_IF_ERROR(check_moe_unpermute_fwd(a, &d));
  if (d.N == 0 || d.C == 0) return Status::OK();
  const int64_t chunks = (d.C + kThreads - 1) / kThreads;
  SG_CHECK_ARG(d.N * chunks < (int64_t{1} << 31), str_cat(op, ": ", d.N, " x ", d.C, " is more than one launch covers"));
  const Tensor& yp = a.in(0);
  SG_CUDA_DISPATCH_FLOAT(op, yp.dtype, T, {
    SG_CUDA_DISPATCH_FLOAT(op, d.weights ? a.in(2).dtype : yp.dtype, W, {
      unpermute_fwd_kernel<T, W><<<static_cast<unsigned>(d.N * chunks), kThreads, 0, current_stream()>>>(
          yp.ptr<T>(), a.in(1).ptr<int32_t>(), d.weights ? a.in(2).ptr<W>() : nullptr, a.out(0).ptr<T>(), d.M,
          static_cast<int>(d.K), d.C, chunks);
    });
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

// One block per token: dyp rows scaled, and each dweights[n, k] a block reduction of dy . yp.
template <typename T, typename W>
__global__ void unpermute_bwd_kernel(const T* dy, const int32_t* rows, const T* yp, const W* w, T* dyp, W* dw,
                                     int64_t M, int K, int64_t C) {
  __shared__ float red[kThreads / 32];
  const int64_t n = blockIdx.x;
  const T* g = dy + n * C;
  for (int k = 0; k < K; ++k) {
    const int64_t r = clamp_index(rows[n * K + k], M);
    const float s = ld(w[n * K + k]);
    float part = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float gv = ld(g[c]);
      part += gv * ld(yp[r * C + c]);
      dyp[r * C + c] = st<T>(s * gv);
    }
    if (dw) {
      for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
      if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = part;
      __syncthreads();
      if (threadIdx.x == 0) {
        float t = 0.0f;
        for (int i = 0; i < kThreads / 32; ++i) t += red[i];
        dw[n * K + k] = st<W>(t);
      }
      __syncthreads();
    }
  }
}

Status moe_unpermute_bwd(const OpArgs& a) {
  const char* op = "moe_unpermute_bwd";
  MoePermuteArgs d;
  SG_RETURN_IF_ERROR(check_moe_unpermute_bwd(a, &d));
  if (d.N == 0) return Status::OK();
  const Tensor &dy = a.in(0), &w = a.in(3);
  SG_CUDA_DISPATCH_FLOAT(op, dy.dtype, T, {
    SG_CUDA_DISPATCH_FLOAT(op, w.dtype, W, {
      unpermute_bwd_kernel<T, W><<<static_cast<unsigned>(d.N), kThreads, 0, current_stream()>>>(
          dy.ptr<T>(), a.in(1).ptr<int32_t>(), a.in(2).ptr<T>(), w.ptr<W>(), a.out(0).ptr<T>(),
          d.dweights ? a.out(1).ptr<W>() : nullptr, d.M, static_cast<int>(d.K), d.C);
    });
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

// ---- load-balancing loss ----------------------------------------------------------------------

// Block e of layer l: psum[l * E + e] = sum_n probs[n, e], cnt[l * E + e] = #{j : idx[j] == e}.
__global__ void aux_layer_kernel(const float* probs, const int32_t* idx, double* psum, double* cnt, int64_t N, int E,
                                 int K, int layer) {
  __shared__ double rs[kThreads], rc[kThreads];
  const int e = blockIdx.x;
  double s = 0.0, c = 0.0;
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x) s += probs[n * E + e];
  for (int64_t j = threadIdx.x; j < N * K; j += blockDim.x) c += idx[j] == e ? 1.0 : 0.0;
  rs[threadIdx.x] = s;
  rc[threadIdx.x] = c;
  __syncthreads();
  for (int o = blockDim.x / 2; o > 0; o >>= 1) {
    if (threadIdx.x < o) rs[threadIdx.x] += rs[threadIdx.x + o], rc[threadIdx.x] += rc[threadIdx.x + o];
    __syncthreads();
  }
  if (threadIdx.x == 0) psum[int64_t{layer} * E + e] = rs[0], cnt[int64_t{layer} * E + e] = rc[0];
}

__global__ void aux_total_kernel(const double* psum, const double* cnt, float* loss, float* counts, int L, int E,
                                 double R) {
  if (threadIdx.x != 0) return;
  double total = 0.0;
  for (int e = 0; e < E; ++e) {
    double c = 0.0, s = 0.0;
    for (int l = 0; l < L; ++l) c += cnt[int64_t{l} * E + e], s += psum[int64_t{l} * E + e];
    counts[e] = static_cast<float>(c);
    total += (c / R) * (s / R);
  }
  loss[0] = R > 0 ? static_cast<float>(total * E) : 0.0f;
}

Status moe_aux_loss_fwd(const OpArgs& a) {
  MoeAuxArgs d;
  SG_RETURN_IF_ERROR(check_moe_aux_loss_fwd(a, &d));
  std::shared_ptr<void> holder;
  const size_t n = static_cast<size_t>(d.L * d.E);
  SG_RETURN_IF_ERROR(allocate(a.in(0).device, 2 * n * sizeof(double), &holder));
  double* psum = static_cast<double*>(holder.get());
  double* cnt = psum + n;
  for (int64_t l = 0; l < d.L; ++l) {
    aux_layer_kernel<<<static_cast<unsigned>(d.E), kThreads, 0, current_stream()>>>(
        a.in(2 * l).ptr<float>(), a.in(2 * l + 1).ptr<int32_t>(), psum, cnt, d.N, static_cast<int>(d.E),
        static_cast<int>(d.K), static_cast<int>(l));
    SG_CUDA_CHECK_LAUNCH();
  }
  aux_total_kernel<<<1, 32, 0, current_stream()>>>(psum, cnt, a.out(0).ptr<float>(), a.out(1).ptr<float>(),
                                                   static_cast<int>(d.L), static_cast<int>(d.E),
                                                   static_cast<double>(d.L * d.N));
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

__global__ void aux_bwd_kernel(const float* dloss, const float* counts, float* dp, int64_t N, int E, double R) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= N * E) return;
  dp[i] = R > 0 ? static_cast<float>(static_cast<double>(dloss[0]) * E * counts[i % E] / (R * R)) : 0.0f;
}

Status moe_aux_loss_bwd(const OpArgs& a) {
  MoeAuxArgs d;
  SG_RETURN_IF_ERROR(check_moe_aux_loss_bwd(a, &d));
  if (d.N == 0) return Status::OK();
  aux_bwd_kernel<<<blocks_for(d.N * d.E, kThreads), kThreads, 0, current_stream()>>>(
      a.in(0).ptr<float>(), a.in(1).ptr<float>(), a.out(0).ptr<float>(), d.N, static_cast<int>(d.E),
      static_cast<double>(d.L * d.N));
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

// ---- router z-loss -----------------------------------------------------------------------------

template <typename T>
__device__ float row_logsumexp(const T* l, int E) {
  float mx = -INFINITY;
  for (int e = 0; e < E; ++e) mx = fmaxf(mx, ld(l[e]));
  float s = 0.0f;
  for (int e = 0; e < E; ++e) s += expf(ld(l[e]) - mx);
  return mx + logf(s);
}

template <typename T>
__global__ void z_layer_kernel(const T* logits, double* part, int64_t N, int E, int layer) {
  __shared__ double rs[kThreads];
  double s = 0.0;
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
    const double z = row_logsumexp(logits + n * E, E);
    s += z * z;
  }
  rs[threadIdx.x] = s;
  __syncthreads();
  for (int o = blockDim.x / 2; o > 0; o >>= 1) {
    if (threadIdx.x < o) rs[threadIdx.x] += rs[threadIdx.x + o];
    __syncthreads();
  }
  if (threadIdx.x == 0) part[layer] = rs[0];
}

__global__ void z_total_kernel(const double* part, float* loss, int L, double R) {
  if (threadIdx.x != 0) return;
  double total = 0.0;
  for (int l = 0; l < L; ++l) total += part[l];
  loss[0] = R > 0 ? static_cast<float>(total / R) : 0.0f;
}

Status moe_z_loss_fwd(const OpArgs& a) {
  const char* op = "moe_z_loss_fwd";
  MoeZLossArgs d;
  SG_RETURN_IF_ERROR(check_moe_z_loss_fwd(a, &d));
  std::shared_ptr<void> holder;
  SG_RETURN_IF_ERROR(allocate(a.in(0).device, static_cast<size_t>(d.L) * sizeof(double), &holder));
  double* part = static_cast<double*>(holder.get());
  for (int64_t l = 0; l < d.L; ++l) {
    SG_CUDA_DISPATCH_FLOAT(op, a.in(l).dtype, T, {
      z_layer_kernel<T><<<1, kThreads, 0, current_stream()>>>(a.in(l).ptr<T>(), part, d.N, static_cast<int>(d.E),
                                                              static_cast<int>(l));
    });
    SG_CUDA_CHECK_LAUNCH();
  }
  z_total_kernel<<<1, 32, 0, current_stream()>>>(part, a.out(0).ptr<float>(), static_cast<int>(d.L),
                                                 static_cast<double>(d.L * d.N));
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

template <typename T>
__global__ void z_bwd_kernel(const float* dloss, const T* logits, T* dlogits, int64_t N, int E, double R) {
  const int64_t n = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (n >= N) return;
  const T* l = logits + n * E;
  const float c = R > 0 ? static_cast<float>(2.0 * dloss[0] / R) : 0.0f;
  const float z = row_logsumexp(l, E);
  for (int e = 0; e < E; ++e) dlogits[n * E + e] = st<T>(c * z * expf(ld(l[e]) - z));
}

Status moe_z_loss_bwd(const OpArgs& a) {
  const char* op = "moe_z_loss_bwd";
  MoeZLossArgs d;
  SG_RETURN_IF_ERROR(check_moe_z_loss_bwd(a, &d));
  if (d.N == 0) return Status::OK();
  SG_CUDA_DISPATCH_FLOAT(op, a.in(1).dtype, T, {
    z_bwd_kernel<T><<<blocks_for(d.N, kThreads), kThreads, 0, current_stream()>>>(
        a.in(0).ptr<float>(), a.in(1).ptr<T>(), a.out(0).ptr<T>(), d.N, static_cast<int>(d.E),
        static_cast<double>(d.L * d.N));
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

}  // namespace

void register_cuda_moe(OpRegistry& reg) {
  add_op(reg, "moe_router_fwd", moe_router_fwd);
  add_op(reg, "moe_router_bwd", moe_router_bwd);
  add_op(reg, "moe_permute", moe_permute);
  add_op(reg, "moe_unpermute_fwd", moe_unpermute_fwd);
  add_op(reg, "moe_unpermute_bwd", moe_unpermute_bwd);
  add_op(reg, "moe_aux_loss_fwd", moe_aux_loss_fwd);
  add_op(reg, "moe_aux_loss_bwd", moe_aux_loss_bwd);
  add_op(reg, "moe_z_loss_fwd", moe_z_loss_fwd);
  add_op(reg, "moe_z_loss_bwd", moe_z_loss_bwd);
}

}  // namespace surogate::cuda
