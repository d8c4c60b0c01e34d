// Weight streaming on the CPU: weight_fetch is a memcpy from the host buffer into the staging
// buffer (in 1 MiB chunks over the thread pool) and weight_wait nothing, the copy being done when
// the fetch returns. The reference for cuda/weight_stream.cu, which copies on a stream of its
// own: the same bytes land in the same buffers, so a CPU run checks that the compiler placed every
// fetch after the last reader of the buffer's previous layer and before the first of its own.
#include <algorithm>
#include <cstring>

#include "cpu/common.h"
#include "runtime/op_checks_weight_stream.h"

namespace surogate::cpu {

namespace {

constexpr int64_t kChunk = int64_t{1} << 20;

Status weight_fetch(const OpArgs& a) {
  WeightFetchArgs r;
  SG_RETURN_IF_ERROR(check_weight_fetch(a, &r));
  const auto* src = static_cast<const char*>(a.in(0).data);
  auto* dst = static_cast<char*>(a.out(0).data);
  const int64_t n = static_cast<int64_t>(r.bytes), chunks = (n + kChunk - 1) / kChunk;
  parallel_for(0, chunks, 1, [&](int64_t lo, int64_t hi) {
    const int64_t begin = lo * kChunk, end = std::min(n, hi * kChunk);
    std::memcpy(dst + begin, src + begin, static_cast<size_t>(end - begin));
  });
  return Status::OK();
}

Status weight_wait(const OpArgs& a) { return check_weight_wait(a); }

}  // namespace

void register_cpu_weight_stream(OpRegistry& reg) {
  add_op(reg, "weight_fetch", weight_fetch);
  add_op(reg, "weight_wait", weight_wait);
}

}  // namespace surogate::cpu
