// CPU ops: rope. (Kernels land here; see kernels_native/README-dev.md for the op conventions.)
#include "cpu/common.h"

namespace surogate::cpu {

void register_cpu_rope(OpRegistry& reg) { (void)reg; }

}  // namespace surogate::cpu
