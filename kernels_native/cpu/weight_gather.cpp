// ZeRO-3's weight gather on the CPU: a layer's weights are sharded among the data-parallel ranks
// (whole tensors, each kept by its owner only), and before the layer runs every rank assembles
// the whole layer in a staging buffer its parameters are bound in (surogate/train/zero3.py).
// This rank's pieces are copied into dst (1 MiB chunks over the thread pool), then the group's
// gather_from_owners fills every other piece from its owner (the threads backend: a memcpy from
// the owner's dst; TCP: through rank 0). The op returns when dst holds the whole layer.
// The reference for cuda/weight_gather.cu; argument rules in runtime/op_checks_weight_stream.h.
#include <algorithm>
#include <cstring>

#include "cpu/common.h"
#include "runtime/op_checks_weight_stream.h"

namespace surogate::cpu {

namespace {

constexpr int64_t kChunk = int64_t{1} << 20;

void copy_bytes(char* dst, const char* src, int64_t n) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  parallel_for(0, chunks, 1, [&](int64_t lo, int64_t hi) {
    const int64_t begin = lo * kChunk, end = std::min(n, hi * kChunk);
    std::memcpy(dst + begin, src + begin, static_cast<size_t>(end - begin));
  });
}

Status weight_gather(const OpArgs& a) {
  WeightGatherArgs r;
  SG_RETURN_IF_ERROR(check_weight_gather(a, &r));
  return gather_layer(a, r, [](char* dst, const char* src, int64_t n) {
    copy_bytes(dst, src, n);
    return Status::OK();
  });
}

}  // namespace

void register_cpu_weight_gather(OpRegistry& reg) { add_op(reg, "weight_gather", weight_gather); }

}  // namespace surogate::cpu
