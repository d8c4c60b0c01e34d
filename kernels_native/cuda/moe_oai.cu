// GPT-OSS's expert pieces on CUDA, the twins of cpu/moe_oai.cpp (its header is the spec: the
// clamped interleaved SwiGLU with torch's roundings and clamp gradient, the per-expert bias over
// moe_permute's rows). offsets is device memory: a row finds its expert by binary search, and
// every index is clamped, so malformed offsets give wrong numbers, never an out-of-bounds access.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "cuda/backend.h"
#include "cuda/common.cuh"
#include "runtime/op_checks_moe_oai.h"

namespace surogate::cuda {

namespace {

__device__ __forceinline__ float sigmoidf_(float v) { return 1.0f / (1.0f + expf(-v)); }

template <typename T>
__global__ void swiglu_oai_fwd_kernel(const T* gu, T* y, int64_t M, int64_t F, float alpha, float limit) {
  const int64_t n = M * F;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / F, j = i % F;
    const float g = fminf(ld(gu[r * 2 * F + 2 * j]), limit);
    const float u = fminf(fmaxf(ld(gu[r * 2 * F + 2 * j + 1]), -limit), limit);
    const float s = rnd<T>(sigmoidf_(rnd<T>(g * alpha)));
    const float glu = rnd<T>(g * s);
    y[i] = st<T>(rnd<T>(u + 1.0f) * glu);
  }
}

template <typename T>
__global__ void swiglu_oai_bwd_kernel(const T* dy, const T* gu, T* dgu, int64_t M, int64_t F, float alpha,
                                      float limit) {
  const int64_t n = M * F;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / F, j = i % F;
    const float gate = ld(gu[r * 2 * F + 2 * j]), up = ld(gu[r * 2 * F + 2 * j + 1]), d = ld(dy[i]);
    const float g = fminf(gate, limit), u = fminf(fmaxf(up, -limit), limit);
    const float s = sigmoidf_(alpha * g);
    const float dup = up >= -limit && up <= limit ? d * g * s : 0.0f;
    const float dgate = gate <= limit ? d * (u + 1.0f) * (s + alpha * g * s * (1.0f - s)) : 0.0f;
    dgu[r * 2 * F + 2 * j] = st<T>(dgate);
    dgu[r * 2 * F + 2 * j + 1] = st<T>(dup);
  }
}

// The expert of permuted row r: the last e with offsets[e] <= r (clamped into [0, E)).
__device__ __forceinline__ int expert_of(const int32_t* off, int E, int64_t r) {
  int lo = 0, hi = E;  // invariant: off[lo] <= r < off[hi] for valid offsets
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (off[mid] <= r) lo = mid; else hi = mid;
  }
  return lo;
}

template <typename T>
__global__ void moe_bias_add_kernel(const T* x, const T* b, const int32_t* off, T* y, int64_t M, int64_t C, int E) {
  const int64_t n = M * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / C, c = i % C;
    const int e = expert_of(off, E, r);
    y[i] = st<T>(ld(x[i]) + ld(b[int64_t(e) * C + c]));
  }
}

// One thread per (expert, column), summing its rows in order (deterministic).
template <typename T, typename G>
__global__ void moe_bias_grad_kernel(const T* dy, const int32_t* off, G* db, int64_t M, int64_t C, int E,
                                     bool accumulate) {
  const int64_t n = int64_t(E) * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t e = i / C, c = i % C;
    const int64_t r0 = min(max(int64_t(off[e]), int64_t(0)), M), r1 = min(max(int64_t(off[e + 1]), r0), M);
    float acc = 0.0f;
    for (int64_t r = r0; r < r1; ++r) acc += ld(dy[r * C + c]);
    db[i] = st<G>((accumulate ? ld(db[i]) : 0.0f) + acc);
  }
}

unsigned grid_for(int64_t n) { return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((n + 255) / 256, 65535))); }

Status swiglu_oai_fwd(const OpArgs& a) {
  SwigluOaiArgs r;
  SG_RETURN_IF_ERROR(check_swiglu_oai_fwd(a, &r));
  if (r.M * r.F == 0) return Status::OK();
  SG_CUDA_DISPATCH_FLOAT("swiglu_oai_fwd", a.in(0).dtype, T, {
    swiglu_oai_fwd_kernel<T><<<grid_for(r.M * r.F), 256, 0, current_stream()>>>(a.in(0).ptr<T>(), a.out(0).ptr<T>(),
                                                                                r.M, r.F, r.alpha, r.limit);
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

Status swiglu_oai_bwd(const OpArgs& a) {
  SwigluOaiArgs r;
  SG_RETURN_IF_ERROR(check_swiglu_oai_bwd(a, &r));
  if (r.M * r.F == 0) return Status::OK();
  SG_CUDA_DISPATCH_FLOAT("swiglu_oai_bwd", a.in(0).dtype, T, {
    swiglu_oai_bwd_kernel<T><<<grid_for(r.M * r.F), 256, 0, current_stream()>>>(
        a.in(0).ptr<T>(), a.in(1).ptr<T>(), a.out(0).ptr<T>(), r.M, r.F, r.alpha, r.limit);
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

Status moe_bias_add(const OpArgs& a) {
  MoeBiasArgs r;
  SG_RETURN_IF_ERROR(check_moe_bias_add(a, &r));
  if (r.M * r.C == 0) return Status::OK();
  SG_CUDA_DISPATCH_FLOAT("moe_bias_add", a.in(0).dtype, T, {
    moe_bias_add_kernel<T><<<grid_for(r.M * r.C), 256, 0, current_stream()>>>(
        a.in(0).ptr<T>(), a.in(1).ptr<T>(), a.in(2).ptr<int32_t>(), a.out(0).ptr<T>(), r.M, r.C,
        static_cast<int>(r.E));
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

Status moe_bias_grad(const OpArgs& a) {
  MoeBiasArgs r;
  SG_RETURN_IF_ERROR(check_moe_bias_grad(a, &r));
  const Tensor& db = a.out(0);
  SG_CUDA_DISPATCH_FLOAT("moe_bias_grad", a.in(0).dtype, T, {
    const unsigned g = grid_for(r.E * r.C);
    if (db.dtype == DType::kF32) {
      moe_bias_grad_kernel<T, float><<<g, 256, 0, current_stream()>>>(
          a.in(0).ptr<T>(), a.in(1).ptr<int32_t>(), db.ptr<float>(), r.M, r.C, static_cast<int>(r.E), r.accumulate);
    } else {
      moe_bias_grad_kernel<T, T><<<g, 256, 0, current_stream()>>>(
          a.in(0).ptr<T>(), a.in(1).ptr<int32_t>(), db.ptr<T>(), r.M, r.C, static_cast<int>(r.E), r.accumulate);
    }
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

}  // namespace

void register_cuda_moe_oai(OpRegistry& reg) {
  add_op(reg, "swiglu_oai_fwd", swiglu_oai_fwd);
  add_op(reg, "swiglu_oai_bwd", swiglu_oai_bwd);
  add_op(reg, "moe_bias_add", moe_bias_add);
  add_op(reg, "moe_bias_grad", moe_bias_grad);
}

}  // namespace surogate::cuda
