// CUDA kernels: gguf_dequantize and gguf_matmul.
#include "cuda/backend.h"
#include "cuda/common.cuh"

namespace surogate::cuda {

void register_cuda_gguf(OpRegistry& reg) { (void)reg; }

}  // namespace surogate::cuda
