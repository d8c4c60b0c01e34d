// The decode path of paged_attention (cuda/paged_attention.cu): batches of at most one query row
// per sequence on average (T <= S), K / V rows 16-byte aligned. paged_attention.cu validates the
// arguments, checks paged_decode_supports and keeps every other case on its general kernel.
// Shape letters as in cpu/paged_attention.cpp: T query rows, S sequences, Hq / Hkv heads, D head
// dim, BS block size.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"

namespace surogate::cuda {

struct PagedDecodeArgs {
  DType dtype = DType::kBF16;
  Device device;                 // where the split-K scratch and arrival counters live
  const void* q = nullptr;       // [T, Hq, D]
  const void* kc = nullptr;      // [NB, BS, Hkv, D]
  const void* vc = nullptr;
  void* out = nullptr;           // [T, Hq, D]
  float* lse = nullptr;          // [T, Hq] or nullptr
  const int32_t* bt = nullptr;   // [S, max_blocks] device
  const int32_t* cu_q = nullptr; // [S + 1] device
  const int32_t* ctx = nullptr;  // [S] device
  int64_t T = 0, window = 0;
  int Hq = 0, Hkv = 0, D = 0, BS = 0, max_blocks = 0, NB = 0, S = 0;
  int sms = 132;                 // multiprocessors, for the split heuristic
  float scale = 1.0f, softcap = 0.0f;
};

// f32 / bf16 / f16 rows of D * element size a multiple of 16 bytes (D <= 512: at most 64 such
// units for bf16 / f16, 128 for f32) and every pointer 16-byte aligned: K, V, q and out move in
// 16-byte vectors.
bool paged_decode_supports(DType dtype, int64_t D, std::initializer_list<const void*> ptrs);

// out (and lse) of every row of q that cu_q gives to a sequence; other rows are left untouched.
Status paged_attention_decode(const PagedDecodeArgs& a);

}  // namespace surogate::cuda
