// The embedding / dropout / optimizer CUDA group: one registration function per file, all
// called from register_cuda_embed_optim (embed_optim.cu).
#pragma once

#include "runtime/op_registry.h"

namespace surogate::cuda {

void register_cuda_embedding(OpRegistry& reg);  // embed_optim.cu
void register_cuda_dropout(OpRegistry& reg);    // embed_optim_dropout.cu
void register_cuda_optimizer(OpRegistry& reg);  // embed_optim_optimizer.cu: global_norm, adamw, adamw8

}  // namespace surogate::cuda
