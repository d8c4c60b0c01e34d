// GGUF ops on CUDA: gguf_dequantize and gguf_matmul, the twins of cpu/gguf.cpp and
// cpu/gguf_matmul.cpp (same inputs and attrs; the checks are runtime/op_checks_gguf.h's).
//
// A quantized tensor is a uint8 tensor [rows, bytes_per_row] of raw GGML blocks; attr `type` is
// its ggml id. The block decoders (cuda/gguf_decode.cuh) work on 32-value units and give the
// CPU's bits exactly.
//
//   gguf_dequantize: one warp decodes 32 consecutive units (1024 values) into shared memory, one
//     unit per lane, then writes them out coalesced. F32 / F16 / BF16 sources, whose rows need
//     not be multiples of 32, take a plain elementwise kernel.
//   gguf_matmul, decode (N <= kMaxDecodeN = 8 rows of x): one warp per weight row; x is staged in
//     shared memory as f32 in tiles of 1024 columns; each lane decodes one unit of the row per tile
//     and dots it with every row of x; a warp shuffle sums the lanes. x stays exact f32 (the CPU
//     rounds it to 8 bits here, so the two agree to that rounding, not bit for bit).
//   gguf_matmul, prefill (N > 8): panels of up to kPanelElems weight values are dequantized into
//     scratch (bf16 for bf16 x, else f32) and multiplied by the registered CUDA `matmul` op with
//     trans_b (cuBLASLt, tensor cores).
// Shape letters: N rows of x (tokens), K inner dim, M rows of Wq (output features).
#include <algorithm>
#include <memory>
#include <vector>

#include "core/allocator.h"
#include "core/gguf_types.h"
#include "cuda/backend.h"
#include "cuda/common.cuh"
#include "cuda/gguf_decode.cuh"
#include "runtime/op_checks_gguf.h"

namespace surogate::cuda {

namespace {

using gguf::GgmlType;
using gguf_dev::Block;

constexpr int kDequantWarps = 8;
constexpr int kMaxDecodeN = 8;               // N at or below which gguf_matmul takes the decode kernel
constexpr int kDecodeWarps = 16;             // weight rows per CTA of the decode kernel
constexpr int kTile = 1024;                  // columns of x per shared-memory tile: one unit per lane
constexpr int kTileStride = kTile + kTile / 32;  // a pad float per unit: lanes reading unit `lane` hit distinct banks
constexpr int64_t kPanelElems = int64_t{16} << 20;  // dequantized weight values per prefill panel (32 MiB bf16)

int capped_grid(int64_t blocks) { return static_cast<int>(std::clamp<int64_t>(blocks, 1, 65535)); }

// ---- dequantize --------------------------------------------------------------------------------

// y (flat, contiguous [rows, cols]) from `units` 32-value units; unit u is value 32u of y, and sits
// in row u / units_per_row of q.
template <GgmlType kT>
__global__ void __launch_bounds__(kDequantWarps * 32)
    dequant_units_kernel(const uint8_t* q, int64_t bpr, int64_t units_per_row, int64_t units, void* y, DType ydt) {
  using B = Block<kT>;
  __shared__ float stage[kDequantWarps][32 * 33];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* s = stage[warp];
  const int64_t chunks = (units + 31) / 32;
  // The loop bound depends on the warp only: __syncwarp is reached by all 32 lanes.
  for (int64_t c = blockIdx.x * int64_t{kDequantWarps} + warp; c < chunks; c += int64_t{gridDim.x} * kDequantWarps) {
    const int64_t u = c * 32 + lane;
    if (u < units) {
      const int64_t r = u / units_per_row, ur = u % units_per_row;
      float w[32];
      B::unit(q + r * bpr + ur / B::kUnits * B::kBytes, static_cast<int>(ur % B::kUnits), w);
#pragma unroll
      for (int l = 0; l < 32; ++l) s[lane * 33 + l] = w[l];
    }
    __syncwarp();
    const int n = static_cast<int>(min(int64_t{32}, units - c * 32));
    for (int i = 0; i < n; ++i) store_as(y, ydt, (c * 32 + i) * 32 + lane, s[i * 33 + lane]);
    __syncwarp();  // the stage is rewritten by the next chunk
  }
}

// F32 / F16 / BF16 sources: value i is at byte i * size of q, whatever the row length.
template <GgmlType kT>
__global__ void dequant_float_kernel(const uint8_t* q, int64_t n, void* y, DType ydt) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    float v;
    if constexpr (kT == GgmlType::F32) {
      v = reinterpret_cast<const float*>(q)[i];
    } else if constexpr (kT == GgmlType::F16) {
      v = __half2float(reinterpret_cast<const __half*>(q)[i]);
    } else {
      v = __uint_as_float(uint32_t{reinterpret_cast<const uint16_t*>(q)[i]} << 16);
    }
    store_as(y, ydt, i, v);
  }
}

bool is_float_type(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }

// rows x cols values of type t (rows of bpr bytes at q) into y [rows, cols] of dtype ydt.
Status launch_dequant(GgmlType t, const uint8_t* q, int64_t bpr, int64_t rows, int64_t cols, void* y, DType ydt) {
  if (rows == 0 || cols == 0) return Status::OK();
  if (is_float_type(t)) {
    const int64_t n = rows * cols;
    const int grid = capped_grid(blocks_for(n, 256));
    if (t == GgmlType::F32) dequant_float_kernel<GgmlType::F32><<<grid, 256, 0, current_stream()>>>(q, n, y, ydt);
    if (t == GgmlType::F16) dequant_float_kernel<GgmlType::F16><<<grid, 256, 0, current_stream()>>>(q, n, y, ydt);
    if (t == GgmlType::BF16) dequant_float_kernel<GgmlType::BF16><<<grid, 256, 0, current_stream()>>>(q, n, y, ydt);
  } else {
    // Every quantized type has a block of 32 or 256 values, so cols is a multiple of 32.
    const int64_t units_per_row = cols / 32, units = rows * units_per_row;
    const int grid = capped_grid((units + 32 * kDequantWarps - 1) / (32 * kDequantWarps));
    gguf_dev::dispatch_block(t, [&]<GgmlType kT>() {
      dequant_units_kernel<kT><<<grid, kDequantWarps * 32, 0, current_stream()>>>(q, bpr, units_per_row, units, y, ydt);
    });
  }
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

// The shared checks (runtime/op_checks_gguf.h) accept the types the CPU decodes; the CUDA
// decoders cover exactly those (gguf_decode.cuh), and asking dispatch_block keeps that honest.
Status check_decodable(const char* op, const GgufArgs& g) {
  SG_CHECK(gguf_dev::has_block(g.type), StatusCode::kUnsupported, str_cat(op, ": unsupported GGUF type ", g.info->name),
           "supported on CUDA: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q8_K, IQ4_NL, IQ4_XS, MXFP4; "
           "requantize the weight to one of them");
  return Status::OK();
}

Status gguf_dequantize(const OpArgs& a) {
  const Tensor& q = a.in(0);
  const Tensor& y = a.out(0);
  GgufArgs g;
  SG_RETURN_IF_ERROR(check_gguf_dequantize(a, &g));
  SG_RETURN_IF_ERROR(check_decodable("gguf_dequantize", g));
  const GgmlType t = g.type;
  const int64_t rows = g.rows, cols = g.cols, bpr = g.bpr;
  return launch_dequant(t, q.ptr<uint8_t>(), bpr, rows, cols, y.data, y.dtype);
}

// ---- matmul, decode: few rows of x ---------------------------------------------------------

// y[n, m] = sum_k x[n, k] * W[m, k] for n < N <= kMaxDecodeN; K a multiple of 32. One warp per
// weight row m; all warps of the CTA share each x tile, so every warp runs every tile (and
// reaches each __syncthreads) even when its row is past M.
template <GgmlType kT>
__global__ void __launch_bounds__(kDecodeWarps * 32)
    decode_matmul_kernel(const void* x, DType xdt, const uint8_t* W, int64_t bpr, int N, int64_t K, int64_t M,
                         void* y, DType ydt) {
  using B = Block<kT>;
  __shared__ float xs[kMaxDecodeN * kTileStride];  // 33 KiB
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t m = blockIdx.x * int64_t{kDecodeWarps} + warp;
  const bool active = m < M;
  const uint8_t* row = W + (active ? m : 0) * bpr;
  float acc[kMaxDecodeN];
#pragma unroll
  for (int n = 0; n < kMaxDecodeN; ++n) acc[n] = 0.0f;

  for (int64_t k0 = 0; k0 < K; k0 += kTile) {
    const int kt = static_cast<int>(min(int64_t{kTile}, K - k0));
    __syncthreads();  // every warp is done with the previous tile
    for (int i = threadIdx.x; i < N * kt; i += blockDim.x) {
      const int n = i / kt, k = i - n * kt;
      xs[n * kTileStride + k + k / 32] = load_as(x, xdt, n * K + k0 + k);
    }
    __syncthreads();
    if (active && lane < kt / 32) {
      const int64_t u = k0 / 32 + lane;  // unit of the weight row
      float w[32];
      B::unit(row + u / B::kUnits * B::kBytes, static_cast<int>(u % B::kUnits), w);
#pragma unroll
      for (int n = 0; n < kMaxDecodeN; ++n) {
        if (n < N) {
          const float* xr = xs + n * kTileStride + lane * 33;
          float s = 0.0f;
#pragma unroll
          for (int l = 0; l < 32; ++l) s = fmaf(w[l], xr[l], s);
          acc[n] += s;
        }
      }
    }
  }
#pragma unroll
  for (int n = 0; n < kMaxDecodeN; ++n) {
    if (n < N) {  // N is uniform: every lane shuffles
      float v = acc[n];
#pragma unroll
      for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0 && active) store_as(y, ydt, n * M + m, v);
    }
  }
}

Status decode_matmul(GgmlType t, const Tensor& x, const uint8_t* W, int64_t bpr, int64_t M, const Tensor& y) {
  const int64_t N = x.size(0), K = x.size(1);
  const int64_t blocks = (M + kDecodeWarps - 1) / kDecodeWarps;
  SG_CHECK(blocks <= INT32_MAX, StatusCode::kInvalidArgument,
           str_cat("gguf_matmul: M = ", M, " weight rows is more than one launch can cover"), "split Wq by rows");
  gguf_dev::dispatch_block(t, [&]<GgmlType kT>() {
    decode_matmul_kernel<kT><<<static_cast<int>(blocks), kDecodeWarps * 32, 0, current_stream()>>>(
        x.data, x.dtype, W, bpr, static_cast<int>(N), K, M, y.data, y.dtype);
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

// ---- matmul, prefill: dequantize panels, then the CUDA matmul op -----------------------------

// dst[r, c] (row stride ld_dst) = src[r, c] (row stride ld_src), converting dtypes.
__global__ void copy2d_kernel(const void* src, DType sdt, int64_t ld_src, void* dst, DType ddt, int64_t ld_dst,
                              int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    store_as(dst, ddt, r * ld_dst + c, load_as(src, sdt, r * ld_src + c));
  }
}

Status launch_copy2d(const void* src, DType sdt, int64_t ld_src, void* dst, DType ddt, int64_t ld_dst, int64_t rows,
                     int64_t cols) {
  if (rows == 0 || cols == 0) return Status::OK();
  copy2d_kernel<<<capped_grid(blocks_for(rows * cols, 256)), 256, 0, current_stream()>>>(src, sdt, ld_src, dst, ddt, ld_dst, rows, cols);
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

Status scratch(const Device& dev, const std::vector<int64_t>& shape, DType dt, std::shared_ptr<void>* owner,
               Tensor* out) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  SG_RETURN_IF_ERROR(allocate(dev, static_cast<size_t>(n) * dtype_size(dt), owner));
  *out = Tensor::view_of(owner->get(), dt, shape, dev, *owner);
  return Status::OK();
}

// C = A @ B^T through the registered CUDA matmul (looked up per call: the registration order of the
// op groups is not ours to rely on).
Status call_matmul_tb(const Tensor& A, const Tensor& B, const Tensor& C) {
  const OpDef* mm = OpRegistry::global().find("matmul", DeviceType::kCUDA);
  SG_CHECK(mm, StatusCode::kUnsupported,
           "gguf_matmul: more than 8 rows of x need the CUDA `matmul` op, which this build does not register",
           "build with the CUDA matmul (cuda/matmul.cu), or call gguf_matmul with at most 8 rows at a time");
  Attrs at;
  at.set("trans_a", int64_t{0});
  at.set("trans_b", int64_t{1});
  at.set("alpha", 1.0);
  at.set("beta", 0.0);
  const Tensor ins[2] = {A, B};
  OpArgs args;
  args.inputs = ins;
  args.num_inputs = 2;
  args.outputs = &C;
  args.num_outputs = 1;
  args.attrs = &at;
  return mm->fn(args);
}

// The matmul op's documented dtypes are bf16 x bf16 -> bf16 / f32 and f32 x f32 -> f32: bf16 x
// multiplies a bf16 weight, anything else goes through f32 (f16 x is widened, never narrowed).
Status prefill_matmul(GgmlType t, const Tensor& x, const Tensor& Wq, int64_t bpr, const Tensor& y) {
  const int64_t N = x.size(0), K = x.size(1), M = Wq.size(0);
  const Device dev = x.device;
  const DType cdt = x.dtype == DType::kBF16 ? DType::kBF16 : DType::kF32;
  if (K == 0) {  // an empty sum: cuBLAS may refuse k = 0
    SG_CUDA_CHECK(cudaMemsetAsync(y.data, 0, y.nbytes(), current_stream()));
    return Status::OK();
  }

  std::shared_ptr<void> x_owner, w_owner, c_owner;
  Tensor xa = x;
  if (x.dtype != cdt) {
    SG_RETURN_IF_ERROR(scratch(dev, {N, K}, cdt, &x_owner, &xa));
    SG_RETURN_IF_ERROR(launch_copy2d(x.data, x.dtype, K, xa.data, cdt, K, N, K));
  }

  // The weight already in the compute dtype is used as it is.
  const bool direct_w = (t == GgmlType::F32 && cdt == DType::kF32) || (t == GgmlType::BF16 && cdt == DType::kBF16);
  const int64_t panel = direct_w ? M : std::clamp<int64_t>(kPanelElems / K, 1, M);
  // C straight into y when one product covers all of y and the matmul can write y's dtype;
  // otherwise each panel's [N, p] lands in scratch and is copied into y's columns.
  const DType cdc = (y.dtype == DType::kF32 || y.dtype == cdt) ? y.dtype : DType::kF32;
  const bool direct_c = panel == M && cdc == y.dtype;
  Tensor wp, cp;
  if (!direct_w) SG_RETURN_IF_ERROR(scratch(dev, {panel, K}, cdt, &w_owner, &wp));
  if (!direct_c) SG_RETURN_IF_ERROR(scratch(dev, {N, panel}, cdc, &c_owner, &cp));

  for (int64_t m0 = 0; m0 < M; m0 += panel) {
    const int64_t p = std::min(panel, M - m0);
    Tensor B, C;
    if (direct_w) {
      B = Tensor::view_of(Wq.data, cdt, {M, K}, dev);
    } else {
      SG_RETURN_IF_ERROR(launch_dequant(t, Wq.ptr<uint8_t>() + m0 * bpr, bpr, p, K, wp.data, cdt));
      B = Tensor::view_of(wp.data, cdt, {p, K}, dev);
    }
    C = direct_c ? y : Tensor::view_of(cp.data, cdc, {N, p}, dev);
    SG_RETURN_IF_ERROR(call_matmul_tb(xa, B, C));
    if (!direct_c) SG_RETURN_IF_ERROR(launch_copy2d(cp.data, cdc, p, static_cast<char*>(y.data) +
                                                    m0 * static_cast<int64_t>(dtype_size(y.dtype)),
                                                    y.dtype, M, N, p));
  }
  // The scratch blocks return to the cache here; later work on the default stream is ordered
  // after the kernels above, so their reuse is safe.
  return Status::OK();
}

// gguf_matmul: (x[N, K] f32/bf16/f16, Wq[M, row_bytes(K)] u8) -> (y[N, M] f32/bf16/f16); attrs: type.
Status gguf_matmul(const OpArgs& a) {
  const Tensor& x = a.in(0);
  const Tensor& Wq = a.in(1);
  const Tensor& y = a.out(0);
  GgufArgs g;
  SG_RETURN_IF_ERROR(check_gguf_matmul(a, &g));
  SG_RETURN_IF_ERROR(check_decodable("gguf_matmul", g));
  const GgmlType t = g.type;
  const int64_t N = g.rows, K = g.cols, M = g.M, bpr = g.bpr;
  if (N == 0 || M == 0) return Status::OK();
  // The decode kernel reads whole 32-value units; F32 / F16 / BF16 rows of other lengths take
  // the prefill path.
  if (N <= kMaxDecodeN && K % 32 == 0) return decode_matmul(t, x, Wq.ptr<uint8_t>(), bpr, M, y);
  return prefill_matmul(t, x, Wq, bpr, y);
}

}  // namespace

void register_cuda_gguf(OpRegistry& reg) {
  add_op(reg, "gguf_dequantize", gguf_dequantize);
  add_op(reg, "gguf_matmul", gguf_matmul);
}

}  // namespace surogate::cuda
