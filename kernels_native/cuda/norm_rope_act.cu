// CUDA kernels: rmsnorm, add_rmsnorm, rope, qk_norm_rope, swiglu, geglu (fwd + bwd).
#include "cuda/backend.h"
#include "cuda/common.cuh"

namespace surogate::cuda {

void register_cuda_norm_rope_act(OpRegistry& reg) { (void)reg; }

}  // namespace surogate::cuda
