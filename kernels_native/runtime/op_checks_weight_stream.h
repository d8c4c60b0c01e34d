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
#pragma once

#include <cstddef>

#include "core/status.h"
#include "runtime/op_registry.h"

namespace surogate {

struct WeightFetchArgs {
  size_t bytes = 0;
};

Status check_weight_fetch(const OpArgs& a, WeightFetchArgs* r);
Status check_weight_wait(const OpArgs& a);

}  // namespace surogate
