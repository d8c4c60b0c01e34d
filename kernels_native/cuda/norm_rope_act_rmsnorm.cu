// RMSNorm on CUDA: rmsnorm_fwd / rmsnorm_bwd and the fused residual add + norm, add_rmsnorm_fwd /
// add_rmsnorm_bwd. The contract (shapes, attrs, rounding order, aliasing) is cpu/norm.cpp's; read
// its header for the formulas. N rows, C channels.
//
// Forward: one block per row (a grid-stride loop over rows). Pass 1 sums x^2 (and writes h for
// add_rmsnorm), a block sum gives rstd, pass 2 re-reads the row (an L1 / L2 hit) and writes y.
// Every element is read and written by the same thread in both passes, so y may alias x and h
// may alias residual, as on the CPU.
// Backward: a block walks a fixed range of rows, one row at a time (pass 1: sum g x; pass 2: dx).
// When dw is wanted each thread adds dy x rstd for the columns it owns into a [C] f32 array in
// shared memory; the block writes it as one [C] partial, and reduce_dw_partials sums the
// partials in a fixed order (deterministic; the row ranges depend on N only).
// Rows whose byte length is a multiple of 16 with 16-byte aligned bases use 16-byte packs.
#include <algorithm>

#include "core/allocator.h"
#include "cuda/norm_rope_act.cuh"
#include "runtime/op_checks_norm.h"

namespace surogate::cuda::nra {

namespace {

constexpr int kMaxThreads = 512;
constexpr int64_t kMaxGrid = 1 << 20;       // rows per launch before blocks loop (forward)
constexpr int64_t kMaxDwBlocks = 512;       // dw partials at most: bounds the [blocks, C] f32 scratch
constexpr int64_t kMinRowsPerDwBlock = 4;

int threads_for(int64_t nvec) {
  const int64_t t = std::min<int64_t>(kMaxThreads, (std::max<int64_t>(nvec, 1) + 31) / 32 * 32);
  return static_cast<int>(t);
}

// ---- forward --------------------------------------------------------------------------------

// round_normed (weight_offset == 0): y = T(w * T(x rstd)); else y = T(x rstd (w + offset)).
template <typename T, typename TW, int V>
__global__ void rmsnorm_fwd_kernel(const T* x, const T* residual, const TW* w, float offset, bool round_normed,
                                   float eps, T* y, T* h, float* rstd, int64_t N, int64_t C) {
  __shared__ float red[32];
  const int64_t nvec = C / V;
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const int64_t base = row * C;
    float ss = 0.0f;
    for (int64_t k = threadIdx.x; k < nvec; k += blockDim.x) {
      Pack<T, V> xv = load_pack<T, V>(x + base + k * V);
      if (residual) {
        const Pack<T, V> rv = load_pack<T, V>(residual + base + k * V);
#pragma unroll
        for (int i = 0; i < V; ++i) xv.v[i] = st<T>(ld(xv.v[i]) + ld(rv.v[i]));
        store_pack<T, V>(h + base + k * V, xv);
      }
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float v = ld(xv.v[i]);
        ss += v * v;
      }
    }
    const float r = 1.0f / sqrtf(block_sum(ss, red) / static_cast<float>(C) + eps);
    if (threadIdx.x == 0) rstd[row] = r;
    // h was written above by this same thread, for these same k.
    const T* src = residual ? h : x;
    for (int64_t k = threadIdx.x; k < nvec; k += blockDim.x) {
      const Pack<T, V> xv = load_pack<T, V>(src + base + k * V);
      Pack<T, V> yv;
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float wf = ld(w[k * V + i]) + offset;
        const float v = ld(xv.v[i]);
        yv.v[i] = round_normed ? st<T>(wf * rnd<T>(v * r)) : st<T>(v * r * wf);
      }
      store_pack<T, V>(y + base + k * V, yv);
    }
  }
}

// ---- backward -------------------------------------------------------------------------------

// Rows [b * rows_per_block, (b + 1) * rows_per_block) for block b. dx = r g - k x (+ dh) with
// g = dy (w + offset), k = r^3 sum(g x) / C; partial[b, :] = sum over the rows of dy x r.
template <typename T, typename TW, int V>
__global__ void rmsnorm_bwd_kernel(const T* dy, const T* dh, const T* x, const TW* w, float offset,
                                   const float* rstd, T* dx, float* partial, int64_t N, int64_t C,
                                   int64_t rows_per_block) {
  extern __shared__ float dw_acc[];  // [C] when partial != nullptr
  __shared__ float red[32];
  const int64_t nvec = C / V;
  const int64_t row0 = blockIdx.x * rows_per_block;
  const int64_t row1 = row0 + rows_per_block < N ? row0 + rows_per_block : N;
  // Each thread owns columns k * V + i for its k: it alone touches those entries of dw_acc.
  if (partial) {
    for (int64_t k = threadIdx.x; k < nvec; k += blockDim.x) {
#pragma unroll
      for (int i = 0; i < V; ++i) dw_acc[k * V + i] = 0.0f;
    }
  }
  for (int64_t row = row0; row < row1; ++row) {
    const int64_t base = row * C;
    const float r = rstd[row];
    float s = 0.0f;
    for (int64_t k = threadIdx.x; k < nvec; k += blockDim.x) {
      const Pack<T, V> dv = load_pack<T, V>(dy + base + k * V);
      const Pack<T, V> xv = load_pack<T, V>(x + base + k * V);
#pragma unroll
      for (int i = 0; i < V; ++i) s += ld(dv.v[i]) * (ld(w[k * V + i]) + offset) * ld(xv.v[i]);
    }
    const float kx = r * r * r * block_sum(s, red) / static_cast<float>(C);
    // Same k as pass 1: dx may alias dy, each element is read before this thread overwrites it.
    for (int64_t k = threadIdx.x; k < nvec; k += blockDim.x) {
      const Pack<T, V> dv = load_pack<T, V>(dy + base + k * V);
      const Pack<T, V> xv = load_pack<T, V>(x + base + k * V);
      Pack<T, V> hv;
      if (dh) hv = load_pack<T, V>(dh + base + k * V);
      Pack<T, V> out;
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float d = ld(dv.v[i]), xf = ld(xv.v[i]);
        const float g = d * (ld(w[k * V + i]) + offset);
        float v = r * g - kx * xf;
        if (dh) v += ld(hv.v[i]);
        out.v[i] = st<T>(v);
        if (partial) dw_acc[k * V + i] += d * xf * r;
      }
      store_pack<T, V>(dx + base + k * V, out);
    }
  }
  if (partial) {
    for (int64_t k = threadIdx.x; k < nvec; k += blockDim.x) {
#pragma unroll
      for (int i = 0; i < V; ++i) partial[blockIdx.x * C + k * V + i] = dw_acc[k * V + i];
    }
  }
}

// ---- launchers ------------------------------------------------------------------------------

// residual / h null for rmsnorm_fwd.
Status forward(const char* op, const Tensor& x, const Tensor* residual, const Tensor& w, const Tensor& y,
               const Tensor* h, const Tensor& rstd, float eps, float offset) {
  const int64_t N = x.shape[0], C = x.shape[1];
  if (N == 0) return Status::OK();
  const bool packed = C % (16 / dtype_size(x.dtype)) == 0 && aligned16(x.data) && aligned16(y.data) &&
                      (!residual || (aligned16(residual->data) && aligned16(h->data)));
  const auto grid = static_cast<unsigned>(std::min(N, kMaxGrid));
  SG_CUDA_DISPATCH_FLOAT(op, x.dtype, T, {
    constexpr int kV = 16 / sizeof(T);
    const T* res = residual ? residual->ptr<T>() : nullptr;
    T* hp = h ? h->ptr<T>() : nullptr;
    SG_CUDA_DISPATCH_FLOAT(op, w.dtype, TW, {
      if (packed) {
        rmsnorm_fwd_kernel<T, TW, kV><<<grid, threads_for(C / kV), 0, current_stream()>>>(
            x.ptr<T>(), res, w.ptr<TW>(), offset, offset == 0.0f, eps, y.ptr<T>(), hp, rstd.ptr<float>(), N, C);
      } else {
        rmsnorm_fwd_kernel<T, TW, 1><<<grid, threads_for(C), 0, current_stream()>>>(
            x.ptr<T>(), res, w.ptr<TW>(), offset, offset == 0.0f, eps, y.ptr<T>(), hp, rstd.ptr<float>(), N, C);
      }
    });
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

// dh null for rmsnorm_bwd; dw null when absent.
Status backward(const char* op, const Tensor& dy, const Tensor* dh, const Tensor& x, const Tensor& w,
                const Tensor& rstd, const Tensor& dx, const Tensor* dw, float offset, bool accumulate) {
  const int64_t N = x.shape[0], C = x.shape[1];
  if (N == 0) {
    // No rows: dw is the sum over nothing, so it is zeroed unless accumulating (as on the CPU).
    if (dw && !accumulate) return fill_zero(*dw);
    return Status::OK();
  }
  // Without dw every row is its own block; with dw the row ranges are fixed by N alone.
  const int64_t rows_per_block =
      dw ? std::max(kMinRowsPerDwBlock, (N + kMaxDwBlocks - 1) / kMaxDwBlocks) : (N + kMaxGrid - 1) / kMaxGrid;
  const int64_t blocks = (N + rows_per_block - 1) / rows_per_block;
  std::shared_ptr<void> scratch;
  float* partial = nullptr;
  if (dw) {
    SG_RETURN_IF_ERROR(allocate(x.device, static_cast<size_t>(blocks * C) * sizeof(float), &scratch));
    partial = static_cast<float*>(scratch.get());
  }
  const size_t smem = dw ? static_cast<size_t>(C) * sizeof(float) : 0;
  const bool packed = C % (16 / dtype_size(x.dtype)) == 0 && aligned16(dy.data) && aligned16(x.data) &&
                      aligned16(dx.data) && (!dh || aligned16(dh->data));
  SG_CUDA_DISPATCH_FLOAT(op, x.dtype, T, {
    constexpr int kV = 16 / sizeof(T);
    const T* dhp = dh ? dh->ptr<T>() : nullptr;
    SG_CUDA_DISPATCH_FLOAT(op, w.dtype, TW, {
      auto kernel = packed ? rmsnorm_bwd_kernel<T, TW, kV> : rmsnorm_bwd_kernel<T, TW, 1>;
      const int threads = threads_for(packed ? C / kV : C);
      SG_RETURN_IF_ERROR(allow_dynamic_smem(op, reinterpret_cast<const void*>(kernel), smem, x.device.index,
                                            "the dw accumulator of one row"));
      kernel<<<static_cast<unsigned>(blocks), threads, smem, current_stream()>>>(dy.ptr<T>(), dhp, x.ptr<T>(), w.ptr<TW>(), offset,
                                                              rstd.ptr<float>(), dx.ptr<T>(), partial, N, C,
                                                              rows_per_block);
    });
  });
  SG_CUDA_CHECK_LAUNCH();
  if (dw) SG_RETURN_IF_ERROR(reduce_dw_partials(op, partial, blocks, C, *dw, accumulate));
  return Status::OK();
}

Status rmsnorm_fwd(const OpArgs& a) {
  RmsNormArgs r;
  SG_RETURN_IF_ERROR(check_rmsnorm_fwd(a, &r));
  return forward("rmsnorm_fwd", a.in(0), nullptr, a.in(1), a.out(0), nullptr, a.out(1), r.eps, r.offset);
}

Status add_rmsnorm_fwd(const OpArgs& a) {
  RmsNormArgs r;
  SG_RETURN_IF_ERROR(check_add_rmsnorm_fwd(a, &r));
  return forward("add_rmsnorm_fwd", a.in(0), &a.in(1), a.in(2), a.out(0), &a.out(1), a.out(2), r.eps, r.offset);
}

Status rmsnorm_bwd(const OpArgs& a) {
  RmsNormArgs r;
  SG_RETURN_IF_ERROR(check_rmsnorm_bwd(a, &r));
  return backward("rmsnorm_bwd", a.in(0), nullptr, a.in(1), a.in(2), a.in(3), a.out(0), r.dw, r.offset,
                  r.accumulate);
}

Status add_rmsnorm_bwd(const OpArgs& a) {
  RmsNormArgs r;
  SG_RETURN_IF_ERROR(check_add_rmsnorm_bwd(a, &r));
  return backward("add_rmsnorm_bwd", a.in(0), r.dh, a.in(2), a.in(3), a.in(4), a.out(0), r.dw, r.offset,
                  r.accumulate);
}

}  // namespace

void register_cuda_rmsnorm(OpRegistry& reg) {
  add_op(reg, "rmsnorm_fwd", rmsnorm_fwd);
  add_op(reg, "rmsnorm_bwd", rmsnorm_bwd);
  add_op(reg, "add_rmsnorm_fwd", add_rmsnorm_fwd);
  add_op(reg, "add_rmsnorm_bwd", add_rmsnorm_bwd);
}

}  // namespace surogate::cuda::nra
