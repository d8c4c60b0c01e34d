// Token embedding CPU ops, forward and backward: embedding_fwd / embedding_bwd; and embed_rows
// (serving: given rows in place of some tokens' embeddings, runtime/op_checks_embedding.h).
//
// Shapes: N tokens, V vocabulary rows, C channels. ids: [N] int32; table, dtable: [V, C];
// y, dy: [N, C]. Storage f32, bf16 or f16; dtable is f32 or dy's dtype.
//
//   embedding_fwd:  y[n, :] = table[ids[n], :]                       (a copy: no rounding)
//   embedding_bwd:  dtable[v, :] = sum over n with ids[n] == v of dy[n, :]
//                   (+ dtable[v, :] when accumulate; rows no token uses are 0, or kept)
// Every id must lie in [0, V); the first one that does not is reported with its position
// before anything is written.
//
// The backward is a scatter-add. It is made race-free and deterministic by a stable counting
// sort of the token positions by id: each (vocabulary row, block of columns) is then one task
// that sums its tokens' gradients in token order, in f32, and stores the row once. Splitting
// rows into column blocks keeps the threads busy when one id (a padding or BOS token) is most
// of the batch.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu/common.h"
#include "runtime/op_checks_embedding.h"

namespace surogate::cpu {

namespace {

constexpr int64_t kColumnBlock = 512;

// ids [N] int32 with every id in [0, V).
// Every id in [0, V) (host memory; the shapes are checked by runtime/op_checks_embedding.h).
Status check_ids(const char* op, const Tensor& ids, int64_t V) {
  const int32_t* p = ids.ptr<int32_t>();
  for (int64_t n = 0; n < ids.shape[0]; ++n) {
    SG_CHECK(p[n] >= 0 && p[n] < V, StatusCode::kInvalidArgument,
             str_cat(op, ": ids[", n, "] = ", p[n], " is out of range for a table of ", V, " rows"),
             "token ids must be below the model's vocab_size; check the tokenizer against the model");
  }
  return Status::OK();
}

Status embedding_fwd(const OpArgs& a) {
  const char* op = "embedding_fwd";
  const Tensor &ids = a.in(0), &table = a.in(1), &y = a.out(0);
  EmbeddingArgs r;
  SG_RETURN_IF_ERROR(check_embedding_fwd(a, &r));
  const int64_t N = r.N, C = r.C;
  SG_RETURN_IF_ERROR(check_ids(op, ids, r.V));
  const size_t row_bytes = static_cast<size_t>(C) * dtype_size(table.dtype);
  const int32_t* id = ids.ptr<int32_t>();
  const char* src = static_cast<const char*>(table.data);
  char* dst = static_cast<char*>(y.data);
  parallel_for(0, N, std::max<int64_t>(1, (64 << 10) / std::max<size_t>(row_bytes, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t n = lo; n < hi; ++n) std::memcpy(dst + n * row_bytes, src + id[n] * row_bytes, row_bytes);
  });
  return Status::OK();
}

// Scatter-add of dy rows into dtable through the sorted token positions of each id.
template <typename T, typename W>
void scatter_rows(const int32_t* order, const int32_t* offsets, const std::vector<int32_t>& used, const T* dy, W* dt,
                  int64_t C, bool accumulate) {
  const int64_t blocks = (C + kColumnBlock - 1) / kColumnBlock;
  const int64_t tasks = static_cast<int64_t>(used.size()) * blocks;
  parallel_for(0, tasks, 4, [&](int64_t lo, int64_t hi) {
    float acc[kColumnBlock];
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t v = used[t / blocks];
      const int64_t c0 = (t % blocks) * kColumnBlock, width = std::min(kColumnBlock, C - c0);
      W* out = dt + v * C + c0;
      for (int64_t j = 0; j < width; ++j) acc[j] = accumulate ? load(out[j]) : 0.0f;
      for (int32_t k = offsets[v]; k < offsets[v + 1]; ++k) {
        const T* g = dy + static_cast<int64_t>(order[k]) * C + c0;
        for (int64_t j = 0; j < width; ++j) acc[j] += load(g[j]);
      }
      for (int64_t j = 0; j < width; ++j) out[j] = store<W>(acc[j]);
    }
  });
}

Status embedding_bwd(const OpArgs& a) {
  const char* op = "embedding_bwd";
  const Tensor &ids = a.in(0), &dy = a.in(1), &dtable = a.out(0);
  EmbeddingArgs r;
  SG_RETURN_IF_ERROR(check_embedding_bwd(a, &r));
  const int64_t N = r.N, V = r.V, C = r.C;
  SG_RETURN_IF_ERROR(check_ids(op, ids, V));
  const bool accumulate = r.accumulate;

  // Stable counting sort: order[offsets[v] .. offsets[v + 1]) are the positions of id v, ascending.
  Tensor offsets_t, order_t;
  SG_RETURN_IF_ERROR(zeros({V + 1}, DType::kI32, Device{}, &offsets_t));
  SG_RETURN_IF_ERROR(empty({std::max<int64_t>(N, 1)}, DType::kI32, Device{}, &order_t));
  int32_t* offsets = offsets_t.ptr<int32_t>();
  int32_t* order = order_t.ptr<int32_t>();
  const int32_t* id = ids.ptr<int32_t>();
  for (int64_t n = 0; n < N; ++n) ++offsets[id[n] + 1];
  std::vector<int32_t> used;
  for (int64_t v = 0; v < V; ++v) {
    if (offsets[v + 1] > 0) used.push_back(static_cast<int32_t>(v));
    offsets[v + 1] += offsets[v];
  }
  {
    std::vector<int32_t> next(offsets, offsets + V);
    for (int64_t n = 0; n < N; ++n) order[next[id[n]]++] = static_cast<int32_t>(n);
  }

  if (!accumulate) {  // rows no token uses get 0
    const size_t row_bytes = static_cast<size_t>(C) * dtype_size(dtable.dtype);
    char* base = static_cast<char*>(dtable.data);
    parallel_for(0, V, std::max<int64_t>(1, (256 << 10) / std::max<size_t>(row_bytes, 1)), [&](int64_t lo, int64_t hi) {
      for (int64_t v = lo; v < hi; ++v) {
        if (offsets[v + 1] == offsets[v]) std::memset(base + v * row_bytes, 0, row_bytes);
      }
    });
  }
  SG_DISPATCH_FLOAT(op, dy.dtype, T, {
    if (dtable.dtype == DType::kF32) {
      scatter_rows<T, float>(order, offsets, used, dy.ptr<T>(), dtable.ptr<float>(), C, accumulate);
    } else {
      scatter_rows<T, T>(order, offsets, used, dy.ptr<T>(), dtable.ptr<T>(), C, accumulate);
    }
  });
  return Status::OK();
}

// y = x, then the rows (f32) at their indices, rounded to y's dtype. Indices are checked (in
// range, distinct) before anything is written.
Status embed_rows(const OpArgs& a) {
  const char* op = "embed_rows";
  const Tensor &x = a.in(0), &index = a.in(1), &rows = a.in(2), &y = a.out(0);
  EmbedRowsArgs r;
  SG_RETURN_IF_ERROR(check_embed_rows(a, &r));
  const int64_t N = r.N, E = r.E, C = r.C;
  const int32_t* idx = index.ptr<int32_t>();
  std::vector<uint8_t> seen(static_cast<size_t>(N), 0);
  for (int64_t e = 0; e < E; ++e) {
    if (idx[e] == -1) continue;
    SG_CHECK(idx[e] >= 0 && idx[e] < N, StatusCode::kInvalidArgument,
             str_cat(op, ": index[", e, "] = ", idx[e], " is not a row of x (", N, " rows; -1 skips)"), "");
    SG_CHECK(!seen[idx[e]], StatusCode::kInvalidArgument,
             str_cat(op, ": index[", e, "] = ", idx[e], " repeats an earlier index"), "give each row once");
    seen[idx[e]] = 1;
  }
  const size_t row_bytes = static_cast<size_t>(C) * dtype_size(x.dtype);
  if (y.data != x.data) std::memcpy(y.data, x.data, static_cast<size_t>(N) * row_bytes);
  char* dst = static_cast<char*>(y.data);
  const float* src = rows.ptr<float>();
  parallel_for(0, E, std::max<int64_t>(1, 4096 / std::max<int64_t>(C, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t e = lo; e < hi; ++e) {
      if (idx[e] >= 0) (void)convert(src + e * r.row_stride, DType::kF32, dst + idx[e] * row_bytes, y.dtype, C);
    }
  });
  return Status::OK();
}

}  // namespace

void register_cpu_embedding(OpRegistry& reg) {
  add_op(reg, "embedding_fwd", embedding_fwd);
  add_op(reg, "embedding_bwd", embedding_bwd);
  add_op(reg, "embed_rows", embed_rows);
}

}  // namespace surogate::cpu
