// The gated short convolution's argument checks (LFM2's conv block, between its in_proj and
// out_proj), shared by cpu/short_conv.cpp and cuda/short_conv.cu. Shape letters: N tokens
// (packed documents, or a serving step's spans), C channels, L taps (HF's conv_L_cache), S
// documents / sequences, P state slots.
//   short_conv_fwd   (bcx[N,3C], w[C,L] | [C,1,L], cu_seqlens[S+1] i32, [bias[C]]) -> (y[N,C])
//   short_conv_bwd   (dy[N,C], bcx, w, cu_seqlens, [bias]) -> (dbcx[N,3C], [dw], [dbias]); attr accumulate
//   short_conv_cache (bcx[T,3C], w, state_slots[S] i32, cu_q[S+1] i32, context_lens[S] i32, [bias])
//                    -> (y[T,C], conv_state[P, L-1, C] in place)
// bcx = [B, C, x] (in_proj's output, HF's chunk order); w may be HF's Conv1d layout [C, 1, L].
#pragma once

#include <cstdint>

#include "core/status.h"
#include "runtime/op_registry.h"

namespace surogate {

constexpr int64_t kShortConvMaxTaps = 16;  // a register window per channel in the CUDA kernels

struct ShortConvArgs {
  int64_t N = 0, C = 0, L = 0, S = 0;
  bool bias = false;
  const Tensor* dw = nullptr;     // backward: the weight gradient (absent: frozen)
  const Tensor* dbias = nullptr;  // backward: the bias gradient
  bool accumulate = false;
  int64_t P = 0;                  // cache: state slots
};

Status check_short_conv_fwd(const OpArgs& a, ShortConvArgs* r);
Status check_short_conv_bwd(const OpArgs& a, ShortConvArgs* r);
Status check_short_conv_cache(const OpArgs& a, ShortConvArgs* r);

}  // namespace surogate
