// Muon and NorMuon on CUDA: muon_momentum and muon_update, the twins of cpu/muon.cpp (read its
// header for the math; the checks are runtime/op_checks_optimizer.h's). The Newton-Schulz
// iterations between the two ops are the Program's matmuls (cuBLASLt).
//
// hp and norm stay on the device: each thread computes the scalars it needs from them. Row sums
// of squares are taken in double, one block per row, and added over rows by one block in a fixed
// order: deterministic, within an f32 ulp or so of the CPU's (whose order differs); per-element
// f32 operations use the _rn intrinsics (no FMA contraction), as the CPU rounds them.
#include <algorithm>
#include <memory>

#include "core/allocator.h"
#include "cuda/backend.h"
#include "cuda/common.cuh"
#include "runtime/op_checks_optimizer.h"

namespace surogate::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__device__ double block_sum_d(double v, double* smem) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) smem[threadIdx.x / 32] = v;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < kWarps; ++w) total += smem[w];
  __syncthreads();
  return total;
}

__device__ __forceinline__ float lerp_rn(float a, float b, float w) {
  return w < 0.5f ? __fadd_rn(a, __fmul_rn(w, __fsub_rn(b, a)))
                  : __fsub_rn(b, __fmul_rn(__fsub_rn(b, a), __fsub_rn(1.0f, w)));
}

__device__ __forceinline__ float clip_coef(const float* hp, const float* norm) {
  const float max_norm = hp[6];
  if (norm == nullptr || max_norm <= 0.0f) return 1.0f;
  const float coef = __fdiv_rn(max_norm, __fadd_rn(*norm, 1e-6f));
  return coef > 1.0f ? 1.0f : coef;
}

// One block per row of this part: m = lerp(m, g, 1 - mu); u = nesterov ? lerp(g, m, mu) : m,
// written into x (transposed when asked); the row's sum of u^2 into partial[row].
__global__ void __launch_bounds__(kThreads)
    momentum_kernel(const float* hp, const float* norm, const void* g, DType gdt, float* m, float* x, double* partial,
                    int64_t R, int64_t C, bool nesterov, bool transpose) {
  __shared__ double smem[kWarps];
  const float clip = clip_coef(hp, norm), mu = hp[1], w1 = __fsub_rn(1.0f, mu);
  for (int64_t i = blockIdx.x; i < R; i += gridDim.x) {
    double acc = 0.0;
    for (int64_t j = threadIdx.x; j < C; j += kThreads) {
      const int64_t k = i * C + j;
      const float gi = __fmul_rn(load_as(g, gdt, k), clip);
      const float mi = lerp_rn(m[k], gi, w1);
      m[k] = mi;
      const float u = nesterov ? lerp_rn(gi, mi, mu) : mi;
      x[transpose ? j * R + i : k] = u;
      acc += static_cast<double>(u) * u;
    }
    const double s = block_sum_d(acc, smem);
    if (threadIdx.x == 0) partial[i] = s;
  }
}

// One block: the partials in a fixed order. mode 0 (momentum): out = 1 / (sqrt(sum) + 1e-7).
// mode 1 (NorMuon's step): out = 0.2 lr sqrt(R C) / sqrt(sum), 0 for a zero update.
__global__ void __launch_bounds__(kThreads)
    finish_kernel(const double* partial, int64_t R, int64_t C, const float* hp, int mode, float* out) {
  __shared__ double smem[kWarps];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < R; i += kThreads) acc += partial[i];
  const double total = block_sum_d(acc, smem);
  if (threadIdx.x != 0) return;
  if (mode == 0) {
    *out = __fdiv_rn(1.0f, __fadd_rn(static_cast<float>(sqrt(total)), 1e-7f));
  } else {
    const double fro = sqrt(total);
    *out = fro > 0 ? static_cast<float>(0.2 * static_cast<double>(hp[0]) * sqrt(static_cast<double>(R) * C) / fro)
                   : 0.0f;
  }
}

__global__ void scale_kernel(float* x, int64_t n, const float* s) {
  const float v = *s;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    x[i] = __fmul_rn(x[i], v);
  }
}

// NorMuon: one block per row: v_i = beta2 v_i + (1 - beta2) mean_j o_ij^2; row_scale_i =
// 1 / (sqrt(v_i) + eps); partial_i = the row's sum of (o row_scale)^2.
__global__ void __launch_bounds__(kThreads)
    neuron_kernel(const float* hp, const float* o, float* v, float* row_scale, double* partial, int64_t R, int64_t C,
                  bool transpose) {
  __shared__ double smem[kWarps];
  const float beta2 = hp[2], eps = hp[3];
  for (int64_t i = blockIdx.x; i < R; i += gridDim.x) {
    double acc = 0.0;
    for (int64_t j = threadIdx.x; j < C; j += kThreads) {
      const double x = o[transpose ? j * R + i : i * C + j];
      acc += x * x;
    }
    const double s = block_sum_d(acc, smem);
    if (threadIdx.x == 0) {
      const float vi = __fadd_rn(__fmul_rn(beta2, v[i]),
                                 __fmul_rn(__fsub_rn(1.0f, beta2), static_cast<float>(s / static_cast<double>(C))));
      v[i] = vi;
      const float rs = __fdiv_rn(1.0f, __fadd_rn(__fsqrt_rn(vi), eps));
      row_scale[i] = rs;
      partial[i] = s * static_cast<double>(rs) * rs;
    }
  }
}

// w = master or param; w *= 1 - lr wd (cautious: where u w >= 0); w -= step u; u = o row_scale.
__global__ void apply_kernel(const float* hp, const float* o, void* p, DType pdt, float* master,
                             const float* row_scale, const float* step_dev, double step_mul, int64_t R, int64_t C,
                             bool transpose, bool cautious) {
  const float decay = static_cast<float>(1.0 - static_cast<double>(hp[0]) * static_cast<double>(hp[4]));
  const float step = step_dev ? *step_dev : static_cast<float>(static_cast<double>(hp[0]) * step_mul);
  const int64_t n = R * C;
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < n; k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = k / C, j = k - i * C;
    float u = o[transpose ? j * R + i : k];
    if (row_scale) u = __fmul_rn(u, row_scale[i]);
    float w = master ? master[k] : load_as(p, pdt, k);
    if (!cautious || __fmul_rn(u, w) >= 0.0f) w = __fmul_rn(w, decay);
    w = __fsub_rn(w, __fmul_rn(step, u));
    if (master) master[k] = w;
    store_as(p, pdt, k, w);
  }
}

int grid_for(int64_t n) { return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535)); }
int row_grid(int64_t R) { return static_cast<int>(std::min<int64_t>(R, 65535)); }

Status muon_momentum(const OpArgs& a) {
  MuonArgs r;
  SG_RETURN_IF_ERROR(check_muon_momentum(a, &r));
  const int64_t R = r.rows, C = r.cols, off = r.row0 * C;
  const Tensor& x = a.out(0);
  std::shared_ptr<void> scratch;
  SG_RETURN_IF_ERROR(allocate(x.device, static_cast<size_t>(R) * sizeof(double) + 16, &scratch));
  double* partial = static_cast<double*>(scratch.get());
  float* inv = reinterpret_cast<float*>(partial + R);
  const Tensor& g = a.in(2);
  const void* gp = static_cast<const char*>(g.data) + off * static_cast<int64_t>(dtype_size(g.dtype));
  const float* norm = a.has_in(1) ? a.in(1).ptr<const float>() : nullptr;
  momentum_kernel<<<row_grid(R), kThreads, 0, current_stream()>>>(
      a.in(0).ptr<const float>(), norm, gp, g.dtype, a.in(3).ptr<float>() + off, x.ptr<float>(), partial, R, C,
      a.attr().get_bool("nesterov", false), r.transpose);
  SG_CUDA_CHECK_LAUNCH();
  finish_kernel<<<1, kThreads, 0, current_stream()>>>(partial, R, C, a.in(0).ptr<const float>(), 0, inv);
  SG_CUDA_CHECK_LAUNCH();
  scale_kernel<<<grid_for(R * C), kThreads, 0, current_stream()>>>(x.ptr<float>(), R * C, inv);
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

Status muon_update(const OpArgs& a) {
  MuonArgs r;
  SG_RETURN_IF_ERROR(check_muon_update(a, &r));
  const int64_t R = r.rows, C = r.cols, off = r.row0 * C;
  const float* hp = a.in(0).ptr<const float>();
  const float* o = a.in(1).ptr<const float>();
  const Tensor& p = a.in(2);
  void* pp = static_cast<char*>(p.data) + off * static_cast<int64_t>(dtype_size(p.dtype));
  float* master = a.has_in(3) ? a.in(3).ptr<float>() + off : nullptr;
  const bool normuon = a.has_in(4);
  std::shared_ptr<void> scratch;
  float* row_scale = nullptr;
  float* step = nullptr;
  if (normuon) {
    SG_RETURN_IF_ERROR(allocate(p.device, static_cast<size_t>(R) * (sizeof(double) + sizeof(float)) + 16, &scratch));
    double* partial = static_cast<double*>(scratch.get());
    row_scale = reinterpret_cast<float*>(partial + R);
    step = row_scale + R;
    neuron_kernel<<<row_grid(R), kThreads, 0, current_stream()>>>(hp, o, a.in(4).ptr<float>() + r.row0, row_scale,
                                                                  partial, R, C, r.transpose);
    SG_CUDA_CHECK_LAUNCH();
    finish_kernel<<<1, kThreads, 0, current_stream()>>>(partial, R, C, hp, 1, step);
    SG_CUDA_CHECK_LAUNCH();
  }
  apply_kernel<<<grid_for(R * C), kThreads, 0, current_stream()>>>(
      hp, o, pp, p.dtype, master, row_scale, step, a.attr().get_float("scale", 1.0), R, C,
      r.transpose, a.attr().get_bool("cautious", false));
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

}  // namespace

void register_cuda_muon(OpRegistry& reg) {
  add_op(reg, "muon_momentum", muon_momentum);
  add_op(reg, "muon_update", muon_update);
}

}  // namespace surogate::cuda
