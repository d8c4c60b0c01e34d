// ZeRO-3's weight gather on CUDA (the CPU reference is cpu/weight_gather.cpp; argument rules in
// runtime/op_checks_weight_stream.h): this rank's pieces are copied into the staging buffer dst on
// current_stream(), then the Program's communicator fills the other pieces from their owners
// (gather_from_owners; the NCCL backend waits for the work queued on the default stream, these
// copies among it, and returns when the data has moved). Synchronous, so a Program holding it
// runs eagerly (the NCCL backend's wait cannot be captured in a CUDA graph: the capture fails and
// the Program turns graphs off). UNTESTED ON A GPU: compiled with nvcc on a machine without one;
// GPU ranks are refused before a Program gets here (surogate/train/data_parallel.py).
#include <cuda_runtime.h>

#include "cuda/backend.h"
#include "cuda/common.cuh"
#include "runtime/op_checks_weight_stream.h"

namespace surogate::cuda {

namespace {

Status weight_gather(const OpArgs& a) {
  WeightGatherArgs r;
  SG_RETURN_IF_ERROR(check_weight_gather(a, &r));
  return gather_layer(a, r, [](char* dst, const char* src, int64_t n) -> Status {
    SG_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(n), cudaMemcpyDeviceToDevice, current_stream()));
    return Status::OK();
  });
}

}  // namespace

void register_cuda_weight_gather(OpRegistry& reg) { add_op(reg, "weight_gather", weight_gather); }

}  // namespace surogate::cuda
