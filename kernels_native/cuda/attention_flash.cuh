// The fast path of attention_fwd / attention_bwd (cuda/attention.cu): FlashAttention-2 kernels
// with register-resident tiles for bf16 / f16 and head dims that are multiples of 8 up to 128
// (compiled at widths 64, 80, 96, 112, 128; others zero-padded to the next), no softcap.
// attention.cu checks flash_supports, finds the documents' tiles (tile offsets for
// flash_fwd_rows / flash_bwd_keys rows per tile) and keeps everything else on its own kernels.
// Shape letters as in cpu/attention.cpp: N packed tokens, Hq / Hkv heads, D head dim, S documents.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "core/dtype.h"
#include "core/status.h"

namespace surogate::cuda {

struct FlashAttnArgs {
  DType dtype = DType::kBF16;
  int64_t N = 0, Hq = 0, Hkv = 0, D = 0;
  int S = 0;
  const int32_t* cu = nullptr;  // [S+1] device offsets
  const int* off = nullptr;     // [S+1] device: document s owns tiles [off[s], off[s+1])
  bool causal = true;
  int64_t window = 0;           // 0: none; already capped at N + 1
  const int32_t* kv_limit = nullptr;  // [N] device, causal only (op_checks_attention.h); null: none
  float scale = 1.0f;
  const void *q = nullptr, *k = nullptr, *v = nullptr;  // [N, Hq, D], [N, Hkv, D] x2
};

// bf16 / f16, D in [8, 128] and a multiple of 8, softcap 0, every pointer 16-byte aligned
// (cp.async moves 16 bytes; D % 8 == 0 keeps every row aligned).
bool flash_supports(DType dtype, int64_t D, float softcap, std::initializer_list<const void*> ptrs);

// Query rows per forward tile and keys per backward tile: `off` counts tiles of this size.
int flash_fwd_rows(int64_t D);
int flash_bwd_keys(int64_t D);

// out [N, Hq, D] in dtype, lse [N, Hq] f32 (natural log, of the scaled scores).
Status flash_attention_fwd(const FlashAttnArgs& a, void* out, float* lse);

// Adds dS K (dS: gradient of the scaled score) into dq_acc [N, Hq, D] f32 (zeroed by the caller,
// which also casts it to dq times scale); writes dk (times scale) and dv [N, Hkv, D].
// delta[N, Hq] = rowsum(dout * out), computed by the caller.
Status flash_attention_bwd(const FlashAttnArgs& a, const void* dout, const float* lse, const float* delta,
                           float* dq_acc, void* dk, void* dv);

}  // namespace surogate::cuda
