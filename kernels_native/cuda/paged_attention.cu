// CUDA kernels: kv_cache_write and paged_attention (serving).
#include "cuda/backend.h"
#include "cuda/common.cuh"

namespace surogate::cuda {

void register_cuda_paged_attention(OpRegistry& reg) { (void)reg; }

}  // namespace surogate::cuda
