// Token embedding CUDA ops, the twins of cpu/embedding.cpp: embedding_fwd / embedding_bwd and
// embed_rows (serving's per-request rows in place of token embeddings). Also the registration
// hook of the embedding / dropout / optimizer group.
//
// Shapes: N tokens, V vocabulary rows, C channels. ids: [N] int32; table, dtable: [V, C];
// y, dy: [N, C]. Storage f32, bf16 or f16; dtable is f32 or dy's dtype.
//
// Out-of-range ids: the CPU op reports the first one before writing anything. Here the ids live
// on the device and reading them on the host would stall the stream, so the kernels treat them
// instead: embedding_fwd writes a zero row for such a token, embedding_bwd drops its gradient.
// Validate ids upstream (the tokenizer against vocab_size) or run the CPU op to find them.
//
// The backward is bit-identical to the CPU's: a stable radix sort (CUB) of the token positions
// by id gives, for each used id, its tokens in ascending order; one block per (used id, column
// chunk) sums them in that order in f32 from 0 (or from dtable when accumulate) and stores the
// row once. No atomics on dtable, so the result is deterministic. A very frequent id (padding)
// is summed serially by one block per column chunk; that is the price of the CPU's order.
#include <algorithm>
#include <cstdint>

#include <cub/device/device_radix_sort.cuh>

#include "core/allocator.h"
#include "cuda/backend.h"
#include "cuda/common.cuh"
#include "cuda/embed_optim.cuh"
#include "runtime/op_checks_embedding.h"

namespace surogate::cuda {

namespace {

constexpr int kRowWarps = 4;         // embedding_fwd: one warp per token row, 4 per block
constexpr int kBwdThreads = 128;     // embedding_bwd: threads per (id, column chunk) block
constexpr int64_t kMaxRunBlocks = 8192;

// VEC elements of T moved as one aligned load / store.
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
  T v[VEC];
};

bool aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

// The kernels index tokens in int32 (runtime/op_checks_embedding.h has the shared checks).
Status check_token_count(const char* op, int64_t N) {
  SG_CHECK_ARG(N < INT32_MAX, str_cat(op, ": ", N, " tokens; at most 2^31 - 2 in one call"));
  return Status::OK();
}

// ---- embedding_fwd ----------------------------------------------------------------------

// A row is row_units units U (16, 4 or 2 bytes: the widest that the row size and both base
// pointers allow); the copy is bitwise, as the CPU's memcpy.
template <typename U>
__global__ void embedding_fwd_kernel(const int32_t* ids, const U* table, U* y, int64_t N, int64_t V,
                                     int64_t row_units) {
  const int64_t n = blockIdx.x * int64_t(kRowWarps) + threadIdx.x / 32;
  if (n >= N) return;
  const int lane = threadIdx.x % 32;
  const int32_t id = ids[n];
  U* dst = y + n * row_units;
  if (id < 0 || id >= V) {  // out of range: a zero row (see the header)
    for (int64_t j = lane; j < row_units; j += 32) dst[j] = U{};
    return;
  }
  const U* src = table + int64_t(id) * row_units;
  for (int64_t j = lane; j < row_units; j += 32) dst[j] = src[j];
}

template <typename U>
Status launch_embedding_fwd(const Tensor& ids, const Tensor& table, const Tensor& y, int64_t N, int64_t V,
                            size_t row_bytes) {
  const int64_t blocks = (N + kRowWarps - 1) / kRowWarps;
  embedding_fwd_kernel<U><<<static_cast<unsigned>(blocks), 32 * kRowWarps, 0, current_stream()>>>(
      ids.ptr<int32_t>(), static_cast<const U*>(table.data), static_cast<U*>(y.data), N, V,
      static_cast<int64_t>(row_bytes / sizeof(U)));
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

Status embedding_fwd(const OpArgs& a) {
  const char* op = "embedding_fwd";
  const Tensor &ids = a.in(0), &table = a.in(1), &y = a.out(0);
  EmbeddingArgs r;
  SG_RETURN_IF_ERROR(check_embedding_fwd(a, &r));
  const int64_t N = r.N, V = r.V, C = r.C;
  SG_RETURN_IF_ERROR(check_token_count(op, N));
  const size_t row_bytes = static_cast<size_t>(C) * dtype_size(table.dtype);
  if (N == 0 || row_bytes == 0) return Status::OK();
  if (row_bytes % 16 == 0 && aligned(table.data, 16) && aligned(y.data, 16)) {
    return launch_embedding_fwd<uint4>(ids, table, y, N, V, row_bytes);
  }
  if (row_bytes % 4 == 0 && aligned(table.data, 4) && aligned(y.data, 4)) {
    return launch_embedding_fwd<uint32_t>(ids, table, y, N, V, row_bytes);
  }
  return launch_embedding_fwd<uint16_t>(ids, table, y, N, V, row_bytes);  // every float dtype is >= 2 bytes
}

// ---- embedding_bwd ----------------------------------------------------------------------

// Sort keys and values: key = id, or V for an out-of-range id (sorted last and skipped); value =
// the token position, so that the stable sort lists each id's tokens in ascending order.
__global__ void sort_input_kernel(const int32_t* ids, uint32_t* keys, int32_t* pos, int64_t N, int64_t V) {
  for (int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; n < N; n += int64_t(gridDim.x) * blockDim.x) {
    const int32_t id = ids[n];
    keys[n] = (id >= 0 && id < V) ? static_cast<uint32_t>(id) : static_cast<uint32_t>(V);
    pos[n] = static_cast<int32_t>(n);
  }
}

// Over the sorted keys: list each used id once in `runs` (in any order: each run's sum does not
// depend on which block takes it) and record its sorted range [begin[id], end[id]).
__global__ void find_runs_kernel(const uint32_t* keys, int64_t N, int64_t V, int32_t* runs, int32_t* num_runs,
                                 int32_t* begin, int32_t* end) {
  for (int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; n < N; n += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t k = keys[n];
    if (k >= V) continue;
    if (n == 0 || keys[n - 1] != k) {
      begin[k] = static_cast<int32_t>(n);
      runs[atomicAdd(num_runs, 1)] = static_cast<int32_t>(k);
    }
    if (n == N - 1 || keys[n + 1] != k) end[k] = static_cast<int32_t>(n + 1);
  }
}

// Block (r, chunk): for runs r, r + gridDim.x, ..., the columns [chunk * kBwdThreads * VEC, ...)
// of that id's dtable row: the sum of its tokens' dy in token order, stored once.
template <typename T, typename W, int VEC>
__global__ void scatter_rows_kernel(const int32_t* runs, const int32_t* num_runs, const int32_t* begin,
                                    const int32_t* end, const int32_t* pos, const T* dy, W* dt, int64_t C,
                                    bool accumulate) {
  const int64_t c = (blockIdx.y * int64_t(kBwdThreads) + threadIdx.x) * VEC;
  if (c >= C) return;  // C % VEC == 0 when VEC > 1, so a thread's VEC columns are all in or all out
  const int n_runs = *num_runs;
  for (int r = blockIdx.x; r < n_runs; r += gridDim.x) {
    const int64_t v = runs[r];
    W* out = dt + v * C + c;
    float acc[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc[j] = accumulate ? ld(out[j]) : 0.0f;
    const int32_t k1 = end[v];
#pragma unroll 4
    for (int32_t k = begin[v]; k < k1; ++k) {
      const Pack<T, VEC> g = *reinterpret_cast<const Pack<T, VEC>*>(dy + int64_t(pos[k]) * C + c);
#pragma unroll
      for (int j = 0; j < VEC; ++j) acc[j] += ld(g.v[j]);
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) out[j] = st<W>(acc[j]);
  }
}

template <typename T, typename W>
Status launch_scatter(const int32_t* runs, const int32_t* num_runs, const int32_t* begin, const int32_t* end,
                      const int32_t* pos, const Tensor& dy, const Tensor& dtable, int64_t N, int64_t V, int64_t C,
                      bool accumulate) {
  constexpr int kVec = 16 / sizeof(T);
  const bool vec = C % kVec == 0 && aligned(dy.data, 16);
  const int width = kBwdThreads * (vec ? kVec : 1);
  const int64_t chunks = (C + width - 1) / width;  // <= 65535: checked before any work
  const dim3 grid(static_cast<unsigned>(std::min({N, V, kMaxRunBlocks})), static_cast<unsigned>(chunks));
  if (vec) {
    scatter_rows_kernel<T, W, kVec><<<grid, kBwdThreads, 0, current_stream()>>>(runs, num_runs, begin, end, pos, dy.ptr<T>(),
                                                           dtable.ptr<W>(), C, accumulate);
  } else {
    scatter_rows_kernel<T, W, 1><<<grid, kBwdThreads, 0, current_stream()>>>(runs, num_runs, begin, end, pos, dy.ptr<T>(),
                                                        dtable.ptr<W>(), C, accumulate);
  }
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

size_t round_up(size_t x) { return (x + 255) / 256 * 256; }

Status embedding_bwd(const OpArgs& a) {
  const char* op = "embedding_bwd";
  const Tensor &ids = a.in(0), &dy = a.in(1), &dtable = a.out(0);
  EmbeddingArgs r;
  SG_RETURN_IF_ERROR(check_embedding_bwd(a, &r));
  const int64_t N = r.N, V = r.V, C = r.C;
  SG_CHECK_ARG(V < INT32_MAX, str_cat(op, ": a table of ", V, " rows; at most 2^31 - 2"));
  const bool accumulate = r.accumulate;
  SG_CHECK_SHAPE((C + kBwdThreads - 1) / kBwdThreads <= 65535,
                 str_cat(op, ": ", C, " channels; this kernel takes at most ", 65535 * kBwdThreads));
  if (V == 0 || C == 0) return Status::OK();
  if (!accumulate) SG_CUDA_CHECK(cudaMemsetAsync(dtable.data, 0, dtable.nbytes(), current_stream()));  // unused rows: 0
  if (N == 0) return Status::OK();

  // One scratch block: sort keys and positions (in and out), runs, num_runs, begin / end per id,
  // CUB's temporary storage. Keys hold 0..V: sorting bits [0, end_bit) is enough.
  const int end_bit = 32 - __builtin_clz(static_cast<uint32_t>(V));
  const int n = static_cast<int>(N);
  size_t cub_bytes = 0;
  SG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, cub_bytes, static_cast<const uint32_t*>(nullptr),
                                                static_cast<uint32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                                static_cast<int32_t*>(nullptr), n, 0, end_bit, current_stream()));
  const size_t nb = round_up(sizeof(int32_t) * N), vb = round_up(sizeof(int32_t) * V);
  const size_t total = 5 * nb + 256 + 2 * vb + round_up(cub_bytes);
  std::shared_ptr<void> scratch;
  SG_RETURN_IF_ERROR(allocate(dtable.device, total, &scratch));
  char* p = static_cast<char*>(scratch.get());
  auto* keys_in = reinterpret_cast<uint32_t*>(p);
  auto* keys = reinterpret_cast<uint32_t*>(p + nb);
  auto* pos_in = reinterpret_cast<int32_t*>(p + 2 * nb);
  auto* pos = reinterpret_cast<int32_t*>(p + 3 * nb);
  auto* runs = reinterpret_cast<int32_t*>(p + 4 * nb);
  auto* num_runs = reinterpret_cast<int32_t*>(p + 5 * nb);
  auto* begin = reinterpret_cast<int32_t*>(p + 5 * nb + 256);
  auto* end = reinterpret_cast<int32_t*>(p + 5 * nb + 256 + vb);
  void* cub_tmp = p + 5 * nb + 256 + 2 * vb;

  const int grid = static_cast<int>(std::min<int64_t>(blocks_for(N, 256), 4096));
  sort_input_kernel<<<grid, 256, 0, current_stream()>>>(ids.ptr<int32_t>(), keys_in, pos_in, N, V);
  SG_CUDA_CHECK_LAUNCH();
  SG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(cub_tmp, cub_bytes, keys_in, keys, pos_in, pos, n, 0, end_bit,
                                                current_stream()));
  SG_CUDA_CHECK(cudaMemsetAsync(num_runs, 0, sizeof(int32_t), current_stream()));
  find_runs_kernel<<<grid, 256, 0, current_stream()>>>(keys, N, V, runs, num_runs, begin, end);
  SG_CUDA_CHECK_LAUNCH();
  SG_CUDA_DISPATCH_FLOAT(op, dy.dtype, T, {
    if (dtable.dtype == DType::kF32) {
      SG_RETURN_IF_ERROR((launch_scatter<T, float>(runs, num_runs, begin, end, pos, dy, dtable, N, V, C, accumulate)));
    } else {
      SG_RETURN_IF_ERROR((launch_scatter<T, T>(runs, num_runs, begin, end, pos, dy, dtable, N, V, C, accumulate)));
    }
  });
  return Status::OK();
}

// ---- embed_rows -------------------------------------------------------------------------

// One warp per given row: y[index[e]] = rows[e] (f32, rounded to T; rows row_stride apart); index -1
// or past N skips.
// y = x was copied before (cudaMemcpyAsync), so the two launches are one stream's order.
template <typename T>
__global__ void embed_rows_kernel(const int32_t* index, const float* rows, T* y, int64_t E, int64_t N, int64_t C,
                                  int64_t row_stride) {
  const int64_t e = blockIdx.x * int64_t(kRowWarps) + threadIdx.x / 32;
  if (e >= E) return;
  const int lane = threadIdx.x % 32;
  const int32_t i = index[e];
  if (i < 0 || i >= N) return;
  const float* src = rows + e * row_stride;
  T* dst = y + int64_t(i) * C;
  for (int64_t j = lane; j < C; j += 32) dst[j] = st<T>(src[j]);
}

Status embed_rows(const OpArgs& a) {
  const char* op = "embed_rows";
  const Tensor &x = a.in(0), &index = a.in(1), &rows = a.in(2), &y = a.out(0);
  EmbedRowsArgs r;
  SG_RETURN_IF_ERROR(check_embed_rows(a, &r));
  SG_RETURN_IF_ERROR(check_token_count(op, r.N));
  const size_t bytes = static_cast<size_t>(r.N * r.C) * dtype_size(x.dtype);
  if (y.data != x.data && bytes > 0) {
    SG_CUDA_CHECK(cudaMemcpyAsync(y.data, x.data, bytes, cudaMemcpyDeviceToDevice, current_stream()));
  }
  if (r.E == 0 || r.C == 0) return Status::OK();
  const unsigned blocks = static_cast<unsigned>((r.E + kRowWarps - 1) / kRowWarps);
  SG_CUDA_DISPATCH_FLOAT(op, x.dtype, T, {
    embed_rows_kernel<T><<<blocks, 32 * kRowWarps, 0, current_stream()>>>(index.ptr<int32_t>(), rows.ptr<float>(),
                                                                          y.ptr<T>(), r.E, r.N, r.C, r.row_stride);
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

}  // namespace

void register_cuda_embedding(OpRegistry& reg) {
  // ids are not checked on the host: out-of-range ids give zero rows (forward) or are skipped (backward).
  add_op(reg, "embedding_fwd", embedding_fwd);
  add_op(reg, "embedding_bwd", embedding_bwd);
  add_op(reg, "embed_rows", embed_rows);
}

void register_cuda_embed_optim(OpRegistry& reg) {
  register_cuda_embedding(reg);
  register_cuda_dropout(reg);
  register_cuda_optimizer(reg);
}

}  // namespace surogate::cuda
