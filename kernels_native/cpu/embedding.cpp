// CPU ops: embedding. (Kernels land here; see kernels_native/README-dev.md for the op conventions.)
#include "cpu/common.h"

namespace surogate::cpu {

void register_cpu_embedding(OpRegistry& reg) { (void)reg; }

}  // namespace surogate::cpu
