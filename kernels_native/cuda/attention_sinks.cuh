// Attention sinks on CUDA (GPT-OSS; the math is cpu/attention.cpp's header): the attention
// kernels run without the sink, then these fold it in. Forward: per (token, query head) row,
// lse' = log(exp(lse) + exp(z_h)) and out *= exp(lse - lse') (one more rounding of out to its
// dtype than the CPU's single one; exact for f32 up to the f32 products). Backward: the training
// kernels already run on lse' (P = exp(s - lse') is the probability with the sink), and
// dz_h = -sum_i exp(z_h - lse'_i) Delta_i, Delta_i = dout_i . out_i, is the op attention_sinks_bwd.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "core/tensor.h"
#include "runtime/op_registry.h"

namespace surogate::cuda {

// rows = tokens (each with Hq heads of D values); out in out_dtype, sinks [Hq] in sinks_dtype.
Status attention_sinks_fwd(const void* sinks, DType sinks_dtype, void* out, DType out_dtype, float* lse,
                           int64_t tokens, int64_t Hq, int64_t D);

// The op attention_sinks_bwd: (dout, out, lse, sinks) -> (dsinks); attr accumulate.
Status attention_sinks_bwd(const OpArgs& a);

}  // namespace surogate::cuda
