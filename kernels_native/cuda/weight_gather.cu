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
#include "dist/collective.h"
#include "runtime/op_checks_weight_stream.h"

namespace surogate::cuda {

namespace {

Status weight_gather(const OpArgs& a) {
  WeightGatherArgs r;
  SG_RETURN_IF_ERROR(check_weight_gather(a, &r));
  const Tensor& dst = a.out(0);
  auto* base = static_cast<char*>(dst.data);
  std::vector<Tensor> pieces;
  std::vector<int> owners;
  int mine = 0;
  for (size_t i = 0; i < r.offsets.size(); ++i) {
    char* at = base + r.offsets[i];
    if (r.owners[i] == r.rank) {
      const Tensor& src = a.in(mine++);
      if (r.sizes[i] > 0) {
        SG_CUDA_CHECK(cudaMemcpyAsync(at, src.data, static_cast<size_t>(r.sizes[i]), cudaMemcpyDeviceToDevice,
                                      current_stream()));
      }
    }
    if (r.sizes[i] == 0) continue;
    pieces.push_back(Tensor::view_of(at, DType::kU8, {r.sizes[i]}, dst.device, dst.owner));
    owners.push_back(static_cast<int>(r.owners[i]));
  }
  return a.comm->gather_from_owners(pieces, owners);
}

}  // namespace

void register_cuda_weight_gather(OpRegistry& reg) { add_op(reg, "weight_gather", weight_gather); }

}  // namespace surogate::cuda
