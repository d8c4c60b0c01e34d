// Gated MLP activations on CUDA: swiglu_fwd / swiglu_bwd and geglu_fwd / geglu_bwd (gelu_tanh),
// and act_mul_fwd / act_mul_bwd (act(a) * b over two tensors, b also one value or absent: the plain
// activation; cpu/activation.cpp).
// The contract is cpu/activation.cpp's (read its header): N rows, F channels, gu [N, 2F] = [gate, up],
// y / dy [N, F]; math in f32 with the forward's two roundings (a = T(act(gate)), y = T(a up)) and
// one rounding per backward output. The activations themselves are cuda/gated_act.cuh's.
//
// Grid-stride elementwise kernels over the N * F gate / up pairs, 16-byte packs when F is a
// multiple of the pack and the bases are aligned. dgu may alias gu: each thread reads the gate
// and up elements it then overwrites.
#include <algorithm>

#include "cuda/gated_act.cuh"
#include "cuda/norm_rope_act.cuh"
#include "runtime/op_checks_pointwise.h"

namespace surogate::cuda::nra {

namespace {

constexpr int kThreads = 256;

// Pack k of the N * F / V packs: row k / (F / V), column (k % (F / V)) * V.
template <typename Act, typename T, int V>
__global__ void gated_fwd_kernel(const T* gu, T* y, int64_t N, int64_t F) {
  const int64_t per_row = F / V, total = N * per_row;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < total; k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = k / per_row, col = (k - row * per_row) * V;
    const T* g = gu + row * 2 * F + col;
    const Pack<T, V> gv = load_pack<T, V>(g), uv = load_pack<T, V>(g + F);
    Pack<T, V> out;
#pragma unroll
    for (int i = 0; i < V; ++i) out.v[i] = st<T>(rnd<T>(Act::act(ld(gv.v[i]))) * ld(uv.v[i]));
    store_pack<T, V>(y + row * F + col, out);
  }
}

// d gate = dy up act'(gate), d up = dy act(gate).
template <typename Act, typename T, int V>
__global__ void gated_bwd_kernel(const T* dy, const T* gu, T* dgu, int64_t N, int64_t F) {
  const int64_t per_row = F / V, total = N * per_row;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < total; k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = k / per_row, col = (k - row * per_row) * V;
    const int64_t base = row * 2 * F + col;
    const Pack<T, V> dv = load_pack<T, V>(dy + row * F + col);
    const Pack<T, V> gv = load_pack<T, V>(gu + base), uv = load_pack<T, V>(gu + base + F);
    Pack<T, V> dg, du;
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const float d = ld(dv.v[i]), u = ld(uv.v[i]);
      float a;
      const float da = Act::grad(ld(gv.v[i]), &a);
      dg.v[i] = st<T>(d * u * da);
      du.v[i] = st<T>(d * a);
    }
    store_pack<T, V>(dgu + base, dg);
    store_pack<T, V>(dgu + base + F, du);
  }
}

struct NoAct {
  static __device__ __forceinline__ float act(float g) { return g; }
  static __device__ __forceinline__ float grad(float g, float* a) {
    *a = g;
    return 1.0f;
  }
};

// act_mul: element k of a / y, b[k] or (broadcast) b[0], or 1 without b (b null: the plain
// activation); the gated kernels' math per element.
template <typename T>
__device__ __forceinline__ float b_at(const T* b, int64_t k, bool broadcast) {
  return b ? ld(b[broadcast ? 0 : k]) : 1.0f;
}

template <typename Act, typename T>
__global__ void act_mul_fwd_kernel(const T* x, const T* b, T* y, int64_t n, bool broadcast) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x) {
    y[k] = st<T>(rnd<T>(Act::act(ld(x[k]))) * b_at(b, k, broadcast));
  }
}

// db may be null (not wanted; always for a broadcast b).
template <typename Act, typename T>
__global__ void act_mul_bwd_kernel(const T* dy, const T* x, const T* b, T* dx, T* db, int64_t n, bool broadcast) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x) {
    const float d = ld(dy[k]), u = b_at(b, k, broadcast);
    float a;
    const float da = Act::grad(ld(x[k]), &a);
    dx[k] = st<T>(d * u * da);
    if (db != nullptr) db[k] = st<T>(d * a);
  }
}

unsigned grid_for(int64_t items) { return grid_stride_blocks(items, kThreads); }

template <typename Act>
Status gated_fwd(const char* op, const OpArgs& a) {
  const Tensor &gu = a.in(0), &y = a.out(0);
  int64_t N = 0, F = 0;
  SG_RETURN_IF_ERROR(check_gated_fwd(op, a, &N, &F));
  if (N * F == 0) return Status::OK();
  SG_CUDA_DISPATCH_FLOAT(op, gu.dtype, T, {
    constexpr int kV = 16 / sizeof(T);
    if (F % kV == 0 && aligned16(gu.data) && aligned16(y.data)) {
      gated_fwd_kernel<Act, T, kV><<<grid_for(N * F / kV), kThreads, 0, current_stream()>>>(gu.ptr<T>(), y.ptr<T>(), N, F);
    } else {
      gated_fwd_kernel<Act, T, 1><<<grid_for(N * F), kThreads, 0, current_stream()>>>(gu.ptr<T>(), y.ptr<T>(), N, F);
    }
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

template <typename Act>
Status gated_bwd(const char* op, const OpArgs& a) {
  const Tensor &dy = a.in(0), &gu = a.in(1), &dgu = a.out(0);
  int64_t N = 0, F = 0;
  SG_RETURN_IF_ERROR(check_gated_bwd(op, a, &N, &F));
  if (N * F == 0) return Status::OK();
  SG_CUDA_DISPATCH_FLOAT(op, gu.dtype, T, {
    constexpr int kV = 16 / sizeof(T);
    if (F % kV == 0 && aligned16(dy.data) && aligned16(gu.data) && aligned16(dgu.data)) {
      gated_bwd_kernel<Act, T, kV><<<grid_for(N * F / kV), kThreads, 0, current_stream()>>>(dy.ptr<T>(), gu.ptr<T>(), dgu.ptr<T>(), N, F);
    } else {
      gated_bwd_kernel<Act, T, 1><<<grid_for(N * F), kThreads, 0, current_stream()>>>(dy.ptr<T>(), gu.ptr<T>(), dgu.ptr<T>(), N, F);
    }
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

template <typename Act>
Status act_mul_fwd_as(const OpArgs& a, const ActMulArgs& r) {
  SG_CUDA_DISPATCH_FLOAT("act_mul_fwd", a.in(0).dtype, T, {
    act_mul_fwd_kernel<Act, T><<<grid_for(r.n), kThreads, 0, current_stream()>>>(
        a.in(0).ptr<T>(), r.has_b ? a.in(1).ptr<T>() : nullptr, a.out(0).ptr<T>(), r.n, r.broadcast);
  });
  return Status::OK();
}

template <typename Act>
Status act_mul_bwd_as(const OpArgs& a, const ActMulArgs& r) {
  SG_CUDA_DISPATCH_FLOAT("act_mul_bwd", a.in(0).dtype, T, {
    act_mul_bwd_kernel<Act, T><<<grid_for(r.n), kThreads, 0, current_stream()>>>(
        a.in(0).ptr<T>(), a.in(1).ptr<T>(), r.has_b ? a.in(2).ptr<T>() : nullptr, a.out(0).ptr<T>(),
        a.has_out(1) ? a.out(1).ptr<T>() : nullptr, r.n, r.broadcast);
  });
  return Status::OK();
}

Status act_mul_fwd(const OpArgs& a) {
  ActMulArgs r;
  SG_RETURN_IF_ERROR(check_act_mul_fwd(a, &r));
  if (r.n == 0) return Status::OK();
  SG_RETURN_IF_ERROR(r.gelu_erf ? act_mul_fwd_as<GeluErf>(a, r)
                     : r.gelu   ? act_mul_fwd_as<GeluTanh>(a, r)
                                : act_mul_fwd_as<NoAct>(a, r));
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

Status act_mul_bwd(const OpArgs& a) {
  ActMulArgs r;
  SG_RETURN_IF_ERROR(check_act_mul_bwd(a, &r));
  if (r.n == 0) return Status::OK();
  SG_RETURN_IF_ERROR(r.gelu_erf ? act_mul_bwd_as<GeluErf>(a, r)
                     : r.gelu   ? act_mul_bwd_as<GeluTanh>(a, r)
                                : act_mul_bwd_as<NoAct>(a, r));
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

Status swiglu_fwd(const OpArgs& a) { return gated_fwd<Silu>("swiglu_fwd", a); }
Status swiglu_bwd(const OpArgs& a) { return gated_bwd<Silu>("swiglu_bwd", a); }
Status geglu_fwd(const OpArgs& a) { return gated_fwd<GeluTanh>("geglu_fwd", a); }
Status geglu_bwd(const OpArgs& a) { return gated_bwd<GeluTanh>("geglu_bwd", a); }

}  // namespace

void register_cuda_gated(OpRegistry& reg) {
  add_op(reg, "swiglu_fwd", swiglu_fwd);
  add_op(reg, "swiglu_bwd", swiglu_bwd);
  add_op(reg, "geglu_fwd", geglu_fwd);
  add_op(reg, "geglu_bwd", geglu_bwd);
  add_op(reg, "act_mul_fwd", act_mul_fwd);
  add_op(reg, "act_mul_bwd", act_mul_bwd);
}

}  // namespace surogate::cuda::nra
