// CPU ops: cross_entropy. (Kernels land here; see kernels_native/README-dev.md for the op conventions.)
#include "cpu/common.h"

namespace surogate::cpu {

void register_cpu_cross_entropy(OpRegistry& reg) { (void)reg; }

}  // namespace surogate::cpu
