// The weight streaming ops' argument checks, shared by cpu/weight_stream.cpp and
// cuda/weight_stream.cu. Serving a model some of whose layers keep their weights in host memory
// (surogate/serve/offload.py): each such layer's weights are packed into one host buffer, and
// before the layer runs they are copied into one of two device staging buffers its parameters
// are bound to.
//   weight_fetch (src [n] in host memory) -> (dst [n] on the op's device): the copy
//   weight_wait (dst [n]) -> (): what follows waits for the copy into dst
// src and dst: contiguous, the same number of bytes (any dtypes: packed bytes). The compiler
// places the fetch of a layer after the last instruction reading the staging buffer's previous
// layer and the wait before the first one reading the new layer (surogate/compile/offload.py).
//
// ZeRO-3 (surogate/train/zero3.py) stages the same way, the bytes coming from the ranks that own
// them instead of from host memory:
//   weight_gather (the rank's own pieces, in piece order) -> (dst [n]); attrs offsets, sizes,
//   owners: piece i is bytes [offsets[i], offsets[i] + sizes[i]) of dst, owned by rank owners[i]
// Each rank copies its pieces into dst, then gather_from_owners (dist/collective.h) over the
// pieces fills the others: on return every rank's dst holds the whole layer. Pieces lie inside
// dst in increasing order without overlapping; the op needs the Program's communicator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/status.h"
#include "runtime/op_registry.h"

namespace surogate {

struct WeightFetchArgs {
  size_t bytes = 0;
};

Status check_weight_fetch(const OpArgs& a, WeightFetchArgs* r);
Status check_weight_wait(const OpArgs& a);

struct WeightGatherArgs {
  std::vector<int64_t> offsets, sizes, owners;
  int rank = 0;
};

Status check_weight_gather(const OpArgs& a, WeightGatherArgs* r);

}  // namespace surogate
