// The check every collective backend makes of one call before moving any data: every rank's
// call against rank 0's (kind, tensor count, op, root, owners, each tensor's size and dtype),
// then the call's own rules (reducible dtypes, chunk sizes, ranks in range). Every rank gets the
// same verdict from the same descriptions, so all ranks pass or all fail with the same message:
// a mismatch never leaves a rank waiting. The threads backend describes its ranks' tensors in
// place; the TCP backend sends each rank's description to rank 0.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dist/collective.h"

namespace surogate::dist {

enum class Kind : uint32_t { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kReduceToOwners, kGatherFromOwners,
                             kBarrier };

const char* kind_name(Kind k);

// What the check needs to know of one tensor of a rank's call.
struct TensorDesc {
  int64_t numel = 0;
  DType dtype = DType::kF32;
  bool cpu = true, contiguous = true, has_data = true, readonly = false;
  std::string describe;
};

struct CallDesc {
  Kind kind = Kind::kBarrier;
  ReduceOp op = ReduceOp::kSum;
  int32_t root = 0;
  std::vector<int32_t> owners;
  std::vector<TensorDesc> bufs;
};

CallDesc describe_call(Kind kind, const std::vector<Tensor>& bufs, ReduceOp op, int root, const std::vector<int>& owners);

bool reducible(DType dt);

// calls[r]: rank r's call. `backend` names the backend in the host-memory error.
Status validate(const std::vector<CallDesc>& calls, const char* backend);

}  // namespace surogate::dist
