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
#include "dist/collective.h"
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

// The gather both backends run once the arguments are checked: copy(dst, src, bytes) puts each of
// this rank's pieces (inputs, in order) at its offset in the staging buffer out(0), then the
// Program's communicator fills every other piece from its owner.
template <typename Copy>
Status gather_layer(const OpArgs& a, const WeightGatherArgs& r, Copy copy) {
  const Tensor& dst = a.out(0);
  auto* base = static_cast<char*>(dst.data);
  std::vector<Tensor> pieces;
  std::vector<int> owners;
  int mine = 0;
  for (size_t i = 0; i < r.offsets.size(); ++i) {
    char* at = base + r.offsets[i];
    if (r.owners[i] == r.rank) {
      const Tensor& src = a.in(mine++);
      if (r.sizes[i] > 0) SG_RETURN_IF_ERROR(copy(at, static_cast<const char*>(src.data), r.sizes[i]));
    }
    if (r.sizes[i] == 0) continue;
    pieces.push_back(Tensor::view_of(at, DType::kU8, {r.sizes[i]}, dst.device, dst.owner));
    owners.push_back(static_cast<int>(r.owners[i]));
  }
  return a.comm->gather_from_owners(pieces, owners);
}

}  // namespace surogate
