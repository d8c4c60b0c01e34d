// Weighted row gather on CUDA: embedding_bag_fwd, the twin of cpu/embedding_bag.cpp (read its
// header: f32 sum over the K taps in k order, one rounding). One thread per output element
// (neighbouring threads read neighbouring columns of a table row, so loads coalesce). The ids live
// on the device and are not checked here: an out-of-range id gives a zero contribution (the CPU op
// reports it; tests/native/test_vision_tables.py runs both).
#include <algorithm>

#include "cuda/backend.h"
#include "cuda/common.cuh"
#include "runtime/op_checks_embedding_bag.h"

namespace surogate::cuda {

namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t items) { return grid_stride_blocks(items, kThreads); }

template <typename T>
__global__ void embedding_bag_fwd_kernel(const int32_t* ids, const float* w, const T* table, T* y,
                                         EmbeddingBagArgs r) {
  const int64_t total = r.N * r.C;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = e / r.C, c = e - n * r.C;
    float acc = 0.0f;
    for (int64_t k = 0; k < r.K; ++k) {
      const int32_t id = ids[n * r.K + k];
      if (id >= 0 && id < r.V) acc += w[n * r.K + k] * ld(table[static_cast<int64_t>(id) * r.C + c]);
    }
    y[e] = st<T>(acc);
  }
}

Status embedding_bag_fwd(const OpArgs& a) {
  const char* op = "embedding_bag_fwd";
  EmbeddingBagArgs r;
  SG_RETURN_IF_ERROR(check_embedding_bag_fwd(a, &r));
  const int64_t total = r.N * r.C;
  if (total == 0) return Status::OK();
  SG_CUDA_DISPATCH_FLOAT(op, a.in(2).dtype, T, {
    embedding_bag_fwd_kernel<T><<<grid_for(total), kThreads, 0, current_stream()>>>(
        a.in(0).ptr<int32_t>(), a.in(1).ptr<float>(), a.in(2).ptr<T>(), a.out(0).ptr<T>(), r);
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

}  // namespace

void register_cuda_embedding_bag(OpRegistry& reg) { add_op(reg, "embedding_bag_fwd", embedding_bag_fwd); }

}  // namespace surogate::cuda
