// The packed documents of the training attention kernels, shared by cuda/attention.cu and
// cuda/attention_flash.cu: int64 min / max for device code, a document's bounds from cu_seqlens,
// the document that owns a tile, and the two bounds a kv_limit gives (op_checks_attention.h).
// cu_seqlens' values are not validated on the device, so a document's bounds are clamped into
// [0, N] (attention.cu's header).
#pragma once

#include <cstdint>

namespace surogate::cuda::attn {

// std::min / std::clamp are host-only without --expt-relaxed-constexpr.
__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
__device__ __forceinline__ int64_t clamp64(int64_t x, int64_t lo, int64_t hi) { return min64(max64(x, lo), hi); }

// Document s as [start, start + len), clamped into [0, N].
__device__ __forceinline__ void doc_bounds(const int32_t* cu, int s, int64_t N, int64_t* start, int64_t* len) {
  const int64_t a = clamp64(cu[s], 0, N);
  const int64_t b = clamp64(cu[s + 1], a, N);
  *start = a;
  *len = b - a;
}

// The document that owns tile b (off[s] <= b < off[s + 1]); b < off[S] is the caller's check.
__device__ __forceinline__ int find_doc(const int* off, int S, int b) {
  int lo = 0, hi = S - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (off[mid] <= b) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// kv_limit (`lim`: the document's slice; validated only on the CPU): query i of a document of
// length L sees keys up to lim[i], so its keys end at lim[i] + 1, clamped into [i + 1, L] (a
// malformed value gives wrong numbers, never an out-of-bounds read or an empty row); a row past
// the document's end gets L, as the causal bound min(L, i + 1) does.
__device__ __forceinline__ int64_t limit_hi(const int32_t* lim, int64_t i, int64_t L) {
  return i < L ? clamp64(int64_t(lim[i]) + 1, i + 1, L) : L;
}

// The lowest query i < min(j, L) with lim[i] >= j, else min(j, L): the first query that sees key
// j (lim is nondecreasing, and lim[j] >= j). A binary search over the document's slice.
__device__ __forceinline__ int64_t limit_first_query(const int32_t* lim, int64_t j, int64_t L) {
  int64_t lo = 0, hi = min64(j, L);
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (lim[mid] >= j) hi = mid; else lo = mid + 1;
  }
  return lo;
}

}  // namespace surogate::cuda::attn
