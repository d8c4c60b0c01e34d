// LayerNorm on CUDA: layer_norm_fwd / layer_norm_bwd, the twins of cpu/norm.cpp's LayerNorm (read its
// header for the formulas: biased variance, one rounding of y, mean and rstd saved in f32). N rows,
// C channels. The layout follows norm_rope_act_rmsnorm.cu:
//
// Forward: one block per row (a grid-stride loop over rows); pass 1 sums x (mean), pass 2 sums
// (x - mean)^2 (rstd), pass 3 writes y; passes 2 and 3 re-read the row from L1 / L2.
// Backward: a block walks a fixed range of rows; per row pass 1 sums g = dy w and g xh, pass 2
// writes dx. For dw / db each thread adds dy xh and dy for the columns it owns into [C] f32 arrays
// in shared memory; the block writes them as one partial each, and reduce_dw_partials sums the
// partials in a fixed order (deterministic; the row ranges depend on N only).
// Rows whose byte length is a multiple of 16 with 16-byte aligned bases use 16-byte packs. Every
// element is read and written by the same thread, so y may alias x and dx may alias dy.
#include <algorithm>

#include "core/allocator.h"
#include "cuda/norm_rope_act.cuh"
#include "runtime/op_checks_norm.h"

namespace surogate::cuda::nra {

namespace {

constexpr int kMaxThreads = 512;
constexpr int64_t kMaxGrid = 1 << 20;  // rows per launch before blocks loop (forward)
constexpr int64_t kMaxDwBlocks = 512;  // partials at most: bounds the [blocks, C] f32 scratch
constexpr int64_t kMinRowsPerDwBlock = 4;

int threads_for(int64_t nvec) {
  return static_cast<int>(std::min<int64_t>(kMaxThreads, (std::max<int64_t>(nvec, 1) + 31) / 32 * 32));
}

// b null: no bias.
template <typename T, typename TW, int V>
__global__ void layer_norm_fwd_kernel(const T* x, const TW* w, const TW* b, float eps, T* y, float* mean,
                                      float* rstd, int64_t N, int64_t C) {
  __shared__ float red[32];
  const int64_t nvec = C / V;
  const float inv_c = 1.0f / static_cast<float>(C);
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* xr = x + row * C;
    float s = 0.0f;
    for (int64_t k = threadIdx.x; k < nvec; k += blockDim.x) {
      const Pack<T, V> xv = load_pack<T, V>(xr + k * V);
#pragma unroll
      for (int i = 0; i < V; ++i) s += ld(xv.v[i]);
    }
    const float m = block_sum(s, red) * inv_c;
    float ss = 0.0f;
    for (int64_t k = threadIdx.x; k < nvec; k += blockDim.x) {
      const Pack<T, V> xv = load_pack<T, V>(xr + k * V);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float d = ld(xv.v[i]) - m;
        ss += d * d;
      }
    }
    const float r = 1.0f / sqrtf(block_sum(ss, red) * inv_c + eps);
    if (threadIdx.x == 0) mean[row] = m, rstd[row] = r;
    for (int64_t k = threadIdx.x; k < nvec; k += blockDim.x) {
      const Pack<T, V> xv = load_pack<T, V>(xr + k * V);
      Pack<T, V> yv;
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float bias = b ? ld(b[k * V + i]) : 0.0f;
        yv.v[i] = st<T>((ld(xv.v[i]) - m) * r * ld(w[k * V + i]) + bias);
      }
      store_pack<T, V>(y + row * C + k * V, yv);
    }
  }
}

// Rows [blk * rows_per_block, ...) for block blk. dx = r (g - sum g / C - xh sum g xh / C), g = dy w;
// dw_part[blk, :] = sum of dy xh, db_part[blk, :] = sum of dy over the rows (each null when absent).
template <typename T, typename TW, int V>
__global__ void layer_norm_bwd_kernel(const T* dy, const T* x, const TW* w, const float* mean, const float* rstd,
                                      T* dx, float* dw_part, float* db_part, int64_t N, int64_t C,
                                      int64_t rows_per_block) {
  extern __shared__ float acc[];  // [C] dw, then [C] db, those wanted
  __shared__ float red[32];
  float* dw_acc = dw_part ? acc : nullptr;
  float* db_acc = db_part ? acc + (dw_part ? C : 0) : nullptr;
  const int64_t nvec = C / V;
  const float inv_c = 1.0f / static_cast<float>(C);
  const int64_t row0 = blockIdx.x * rows_per_block;
  const int64_t row1 = row0 + rows_per_block < N ? row0 + rows_per_block : N;
  // Each thread owns columns k * V + i for its k: it alone touches those entries of the accumulators.
  for (int64_t k = threadIdx.x; k < nvec; k += blockDim.x) {
#pragma unroll
    for (int i = 0; i < V; ++i) {
      if (dw_acc) dw_acc[k * V + i] = 0.0f;
      if (db_acc) db_acc[k * V + i] = 0.0f;
    }
  }
  for (int64_t row = row0; row < row1; ++row) {
    const int64_t base = row * C;
    const float m = mean[row], r = rstd[row];
    float sg = 0.0f, sgx = 0.0f;
    for (int64_t k = threadIdx.x; k < nvec; k += blockDim.x) {
      const Pack<T, V> dv = load_pack<T, V>(dy + base + k * V);
      const Pack<T, V> xv = load_pack<T, V>(x + base + k * V);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float g = ld(dv.v[i]) * ld(w[k * V + i]);
        sg += g;
        sgx += g * (ld(xv.v[i]) - m) * r;
      }
    }
    const float mg = block_sum(sg, red) * inv_c;
    const float mgx = block_sum(sgx, red) * inv_c;
    for (int64_t k = threadIdx.x; k < nvec; k += blockDim.x) {
      const Pack<T, V> dv = load_pack<T, V>(dy + base + k * V);
      const Pack<T, V> xv = load_pack<T, V>(x + base + k * V);
      Pack<T, V> out;
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float d = ld(dv.v[i]), xh = (ld(xv.v[i]) - m) * r;
        out.v[i] = st<T>(r * (d * ld(w[k * V + i]) - mg - xh * mgx));
        if (dw_acc) dw_acc[k * V + i] += d * xh;
        if (db_acc) db_acc[k * V + i] += d;
      }
      store_pack<T, V>(dx + base + k * V, out);
    }
  }
  for (int64_t k = threadIdx.x; k < nvec; k += blockDim.x) {
#pragma unroll
    for (int i = 0; i < V; ++i) {
      if (dw_acc) dw_part[blockIdx.x * C + k * V + i] = dw_acc[k * V + i];
      if (db_acc) db_part[blockIdx.x * C + k * V + i] = db_acc[k * V + i];
    }
  }
}

Status layer_norm_fwd(const OpArgs& a) {
  const char* op = "layer_norm_fwd";
  LayerNormArgs r;
  SG_RETURN_IF_ERROR(check_layer_norm_fwd(a, &r));
  const Tensor &x = a.in(0), &w = a.in(1), &y = a.out(0);
  if (r.N == 0) return Status::OK();
  const bool packed = r.C % (16 / dtype_size(x.dtype)) == 0 && aligned16(x.data) && aligned16(y.data);
  const auto grid = static_cast<unsigned>(std::min(r.N, kMaxGrid));
  SG_CUDA_DISPATCH_FLOAT(op, x.dtype, T, {
    constexpr int kV = 16 / sizeof(T);
    SG_CUDA_DISPATCH_FLOAT(op, w.dtype, TW, {
      const TW* b = r.b ? r.b->ptr<TW>() : nullptr;
      if (packed) {
        layer_norm_fwd_kernel<T, TW, kV><<<grid, threads_for(r.C / kV), 0, current_stream()>>>(
            x.ptr<T>(), w.ptr<TW>(), b, r.eps, y.ptr<T>(), a.out(1).ptr<float>(), a.out(2).ptr<float>(), r.N, r.C);
      } else {
        layer_norm_fwd_kernel<T, TW, 1><<<grid, threads_for(r.C), 0, current_stream()>>>(
            x.ptr<T>(), w.ptr<TW>(), b, r.eps, y.ptr<T>(), a.out(1).ptr<float>(), a.out(2).ptr<float>(), r.N, r.C);
      }
    });
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

Status layer_norm_bwd(const OpArgs& a) {
  const char* op = "layer_norm_bwd";
  LayerNormArgs r;
  SG_RETURN_IF_ERROR(check_layer_norm_bwd(a, &r));
  const Tensor &dy = a.in(0), &x = a.in(1), &w = a.in(2), &dx = a.out(0);
  const int64_t N = r.N, C = r.C;
  if (N == 0) {  // the sums over no rows are zeros (as on the CPU), unless accumulating
    for (const Tensor* t : {r.dw, r.db}) {
      if (t && !r.accumulate) SG_RETURN_IF_ERROR(fill_zero(*t));
    }
    return Status::OK();
  }
  const int64_t nparts = (r.dw ? 1 : 0) + (r.db ? 1 : 0);
  const int64_t rows_per_block = nparts > 0 ? std::max(kMinRowsPerDwBlock, (N + kMaxDwBlocks - 1) / kMaxDwBlocks)
                                            : (N + kMaxGrid - 1) / kMaxGrid;
  const int64_t blocks = (N + rows_per_block - 1) / rows_per_block;
  std::shared_ptr<void> scratch;
  float *dw_part = nullptr, *db_part = nullptr;
  if (nparts > 0) {
    SG_RETURN_IF_ERROR(allocate(x.device, static_cast<size_t>(nparts * blocks * C) * sizeof(float), &scratch));
    float* p = static_cast<float*>(scratch.get());
    if (r.dw) dw_part = p, p += blocks * C;
    if (r.db) db_part = p;
  }
  const size_t smem = static_cast<size_t>(nparts * C) * sizeof(float);
  const bool packed =
      C % (16 / dtype_size(x.dtype)) == 0 && aligned16(dy.data) && aligned16(x.data) && aligned16(dx.data);
  SG_CUDA_DISPATCH_FLOAT(op, x.dtype, T, {
    constexpr int kV = 16 / sizeof(T);
    SG_CUDA_DISPATCH_FLOAT(op, w.dtype, TW, {
      auto kernel = packed ? layer_norm_bwd_kernel<T, TW, kV> : layer_norm_bwd_kernel<T, TW, 1>;
      SG_RETURN_IF_ERROR(allow_dynamic_smem(op, reinterpret_cast<const void*>(kernel), smem, x.device.index,
                                            "the dw / db accumulators of one row"));
      kernel<<<static_cast<unsigned>(blocks), threads_for(packed ? C / kV : C), smem, current_stream()>>>(
          dy.ptr<T>(), x.ptr<T>(), w.ptr<TW>(), a.in(3).ptr<float>(), a.in(4).ptr<float>(), dx.ptr<T>(), dw_part,
          db_part, N, C, rows_per_block);
    });
  });
  SG_CUDA_CHECK_LAUNCH();
  if (r.dw) SG_RETURN_IF_ERROR(reduce_dw_partials(op, dw_part, blocks, C, *r.dw, r.accumulate));
  if (r.db) SG_RETURN_IF_ERROR(reduce_dw_partials(op, db_part, blocks, C, *r.db, r.accumulate));
  return Status::OK();
}

}  // namespace

void register_cuda_layernorm(OpRegistry& reg) {
  add_op(reg, "layer_norm_fwd", layer_norm_fwd);
  add_op(reg, "layer_norm_bwd", layer_norm_bwd);
}

}  // namespace surogate::cuda::nra
