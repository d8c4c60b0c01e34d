// Weighted row gather on the CPU: embedding_bag_fwd (argument rules in
// runtime/op_checks_embedding_bag.h). Qwen3-VL's position embeddings resampled to an image grid:
// transformers' (pos_embed(idx) * weights[:, :, None]).sum(1), K = 4 bilinear taps.
//
// N rows, K taps, table [V, C]:  y[n] = T(sum over k < K of w[n, k] table[ids[n, k]]), summed in f32
// in k order, one rounding. Out-of-range ids are reported (the first one) before anything is written.
#include <algorithm>
#include <vector>

#include "cpu/common.h"
#include "runtime/op_checks_embedding_bag.h"

namespace surogate::cpu {

namespace {

template <typename T>
void gather_weighted(const int32_t* ids, const float* w, const T* table, T* y, const EmbeddingBagArgs& r) {
  const int64_t K = r.K, C = r.C;
  parallel_for(0, r.N, std::max<int64_t>(1, 4096 / std::max<int64_t>(C * K, 1)), [&](int64_t lo, int64_t hi) {
    std::vector<float> acc(static_cast<size_t>(C));
    for (int64_t n = lo; n < hi; ++n) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t k = 0; k < K; ++k) {
        const T* row = table + static_cast<int64_t>(ids[n * K + k]) * C;
        const float wk = w[n * K + k];
        for (int64_t c = 0; c < C; ++c) acc[c] += wk * load(row[c]);
      }
      T* out = y + n * C;
      for (int64_t c = 0; c < C; ++c) out[c] = store<T>(acc[c]);
    }
  });
}

Status embedding_bag_fwd(const OpArgs& a) {
  const char* op = "embedding_bag_fwd";
  EmbeddingBagArgs r;
  SG_RETURN_IF_ERROR(check_embedding_bag_fwd(a, &r));
  const int32_t* ids = a.in(0).ptr<int32_t>();
  for (int64_t e = 0; e < r.N * r.K; ++e) {
    SG_CHECK(ids[e] >= 0 && ids[e] < r.V, StatusCode::kInvalidArgument,
             str_cat(op, ": ids[", e / r.K, ", ", e % r.K, "] = ", ids[e], " is out of range for a table of ", r.V,
                     " rows"),
             "the gather indices must address the table's rows; check how they were made");
  }
  SG_DISPATCH_FLOAT(op, a.in(2).dtype, T, {
    gather_weighted<T>(ids, a.in(1).ptr<float>(), a.in(2).ptr<T>(), a.out(0).ptr<T>(), r);
  });
  return Status::OK();
}

}  // namespace

void register_cpu_embedding_bag(OpRegistry& reg) { add_op(reg, "embedding_bag_fwd", embedding_bag_fwd); }

}  // namespace surogate::cpu
