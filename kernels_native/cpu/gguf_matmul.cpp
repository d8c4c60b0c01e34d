// gguf_matmul: y[N, M] = x[N, K] @ dequant(Wq)[M, K]^T with the weight left in its GGML blocks.
//
// Two paths, chosen by N (the number of tokens):
//
// Decode (N <= kMaxDotRows = 32): integer dot products, as llama.cpp's vec_dot. x is quantized
// once per call to int8 in groups of 32 (scale amax/127, like Q8_0). Every type's block then
// reads as: per 32 values, int8 quants q, an f32 scale per 16 and an additive term (the min of
// Q4_K, Q2_K, Q4_1..., or the -8 offset of Q4_0), value = scale * q + min, |q| <= 128. The dot
// is u8*s8 products summed in int32, scaled in f32; the mins contribute min * dx * sum(qx).
// With AVX2 (cpu/gguf_dot_avx2.cpp) each type decodes 32 quants straight into a register and
// dots them with 4 rows of x at a time; elsewhere the portable code below decodes 256 values
// at a time into an L1 chunk (Chunk) and dots that. Nothing f32 of the weight is stored.
// Accuracy: x is rounded to 8 bits per 32 values (llama.cpp rounds it to Q8_0 / Q8_K).
//
// Prefill (N > 32): a panel of weight rows (about kPanelBytes of f32) is decoded exactly (the
// bits of dequantize_row) by the thread pool, then multiplied with OpenBLAS sgemm, which
// threads itself; panel after panel. The only f32 copy of the weight is one panel.
//
// Why 32: on a Zen 4 core at K = M = 2048 the integer path costs ~0.11 ms per row of x and
// the sgemm path ~0.5 ms + 0.12 ms per row (OpenBLAS is slow for few rows): they meet near
// N = 64. A CPU with a faster sgemm moves that down; 32 keeps prefill chunks exact f32.
// F16 / BF16 weights never round x: few rows take f32 FMA dot products on the 16-bit weights
// widened in registers (AVX2), more rows the sgemm path; F32 weights go to sgemm as they are.
// Threads split the output rows M.
#include <algorithm>
#include <climits>
#include <cmath>
#include <type_traits>
#include <vector>

#include <cblas.h>

#include "core/gguf_types.h"
#include "cpu/common.h"
#include "cpu/gguf_dot.h"
#include "runtime/op_checks_gguf.h"

namespace surogate::cpu {

using gguf::GgmlType;

namespace {

// f32 weight panel on the sgemm path: 512 rows at K = 4096. Its size does not change the CPU time
// (measured 2 vs 8 MiB); larger panels mean fewer handoffs between our pool and OpenBLAS's.
constexpr int64_t kPanelBytes = 8 << 20;

// ---- activations -------------------------------------------------------------------------------

// Storage behind a QuantizedX (cpu/gguf_dot.h).
struct QuantizedXBuffers {
  std::vector<int8_t> q;
  std::vector<float> d, s16, s32;
  QuantizedX view(int64_t K) const { return {q.data(), d.data(), s16.data(), s32.data(), K}; }
};

void quantize_x_row(const float* x, int64_t K, int8_t* q, float* d, float* s16, float* s32) {
  for (int64_t g = 0; g < K / 32; ++g) {
    const float* xg = x + 32 * g;
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xg[j]));
    const float dg = amax / 127.0f;
    const float id = dg > 0 ? 1.0f / dg : 0.0f;
    int sum[2] = {0, 0};
    for (int j = 0; j < 32; ++j) {
      const int v = gguf::nearest_int(xg[j] * id);
      q[32 * g + j] = static_cast<int8_t>(v);
      sum[j / 16] += v;
    }
    d[g] = dg;
    s16[2 * g] = dg * static_cast<float>(sum[0]);
    s16[2 * g + 1] = dg * static_cast<float>(sum[1]);
    s32[g] = dg * static_cast<float>(sum[0] + sum[1]);
  }
}

// ---- the two paths -------------------------------------------------------------------------------

// The integer dot kernels (AVX2 or portable), split over output rows.
template <typename Ty>
void dot_path(GgmlType t, bool avx2, const uint8_t* W, int64_t row_bytes, const QuantizedX& xq, int64_t N, int64_t M,
              Ty* y) {
  const auto rows = avx2 ? dot_avx2_rows : dot_portable_rows;
  const int64_t grain = std::max<int64_t>(4, (1 << 16) / xq.K);
  parallel_for(0, M, grain, [&](int64_t lo, int64_t hi) {
    if constexpr (std::is_same_v<Ty, float>) {
      rows(t, W, row_bytes, xq, N, lo, hi, y, M);
    } else {
      constexpr int64_t kRows = 16;  // f32 results of a few weight rows, then rounded into y
      float buf[kMaxDotRows * kRows];
      for (int64_t m0 = lo; m0 < hi; m0 += kRows) {
        const int64_t p = std::min(kRows, hi - m0);
        rows(t, W + m0 * row_bytes, row_bytes, xq, N, 0, p, buf, kRows);
        for (int64_t i = 0; i < N; ++i) {
          for (int64_t r = 0; r < p; ++r) y[i * M + m0 + r] = store<Ty>(buf[i * kRows + r]);
        }
      }
    }
  });
}

// F16 / BF16 weights and few rows of x: f32 dot products straight from the 16-bit weights.
template <typename Ty>
void float_dot_path(GgmlType t, const uint8_t* W, const float* x, int64_t N, int64_t K, int64_t M, Ty* y) {
  const int64_t grain = std::max<int64_t>(4, (1 << 16) / K);
  parallel_for(0, M, grain, [&](int64_t lo, int64_t hi) {
    if constexpr (std::is_same_v<Ty, float>) {
      dot_float_avx2_rows(t, W, x, K, N, lo, hi, y, M);
    } else {
      constexpr int64_t kRows = 16;
      float buf[kMaxDotRows * kRows];
      for (int64_t m0 = lo; m0 < hi; m0 += kRows) {
        const int64_t p = std::min(kRows, hi - m0);
        dot_float_avx2_rows(t, W + m0 * K * 2, x, K, N, 0, p, buf, kRows);
        for (int64_t i = 0; i < N; ++i) {
          for (int64_t r = 0; r < p; ++r) y[i * M + m0 + r] = store<Ty>(buf[i * kRows + r]);
        }
      }
    }
  });
}

// Panels of weight rows decoded in parallel by our pool, then multiplied by OpenBLAS with its
// own threads. (This OpenBLAS has no per-thread thread count, so our workers cannot each call a
// single-threaded sgemm on their own panel without oversubscribing the cores.)
template <typename Ty>
Status sgemm_path(GgmlType t, const uint8_t* W, int64_t row_bytes, const float* x, int64_t N, int64_t K, int64_t M,
                  Ty* y) {
  constexpr bool kF32Out = std::is_same_v<Ty, float>;
  if constexpr (kF32Out) {
    if (t == GgmlType::F32) {  // nothing to decode
      scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, M, K, 1.0f, x, K,
                        reinterpret_cast<const float*>(W), K, 0.0f, y, M);
      return Status::OK();
    }
  }
  const bool avx2 = decode_avx2_supported(t);
  const int64_t panel = std::min(M, std::max<int64_t>(16, kPanelBytes / (K * 4)));
  Tensor wf, yp;
  SG_RETURN_IF_ERROR(empty({panel * K}, DType::kF32, Device{}, &wf));
  if (!kF32Out) SG_RETURN_IF_ERROR(empty({N * panel}, DType::kF32, Device{}, &yp));
  float* w = wf.ptr<float>();
  for (int64_t m0 = 0; m0 < M; m0 += panel) {
    const int64_t p = std::min(panel, M - m0);
    parallel_for(0, p, std::max<int64_t>(1, (1 << 16) / K), [&](int64_t lo, int64_t hi) {
      if (avx2) {
        decode_avx2(t, W + (m0 + lo) * row_bytes, w + lo * K, (hi - lo) * K);
      } else {
        (void)gguf::dequantize_row(t, W + (m0 + lo) * row_bytes, w + lo * K, (hi - lo) * K);
      }
    });
    if constexpr (kF32Out) {
      scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, p, K, 1.0f, x, K, w, K, 0.0f, y + m0, M);
    } else {
      float* yt = yp.ptr<float>();
      scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, p, K, 1.0f, x, K, w, K, 0.0f, yt, p);
      for (int64_t i = 0; i < N; ++i) {
        for (int64_t r = 0; r < p; ++r) y[i * M + m0 + r] = store<Ty>(yt[i * p + r]);
      }
    }
  }
  return Status::OK();
}

template <typename Tx>
void to_f32(const Tx* x, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = load(x[i]);
}

}  // namespace

// gguf_matmul: (x[N, K] f32/bf16/f16, Wq[M, row_bytes(K)] uint8) -> (y[N, M] f32/bf16/f16);
// attrs: type (ggml type id of Wq).
Status gguf_matmul(const OpArgs& a) {
  const Tensor& x = a.in(0);
  const Tensor& Wq = a.in(1);
  const Tensor& y = a.out(0);
  GgufArgs g;
  SG_RETURN_IF_ERROR(check_gguf_matmul(a, &g));
  const GgmlType t = g.type;
  const int64_t N = g.rows, K = g.cols, M = g.M, row_bytes = g.bpr;
  SG_CHECK(N <= INT_MAX && M <= INT_MAX && K <= INT_MAX, StatusCode::kInvalidArgument,
           str_cat("gguf_matmul: x ", x.shape_str(), " and Wq ", Wq.shape_str(), " have a size over 2^31 - 1"),
           "the CPU backend's OpenBLAS uses 32-bit indices; split the operands");
  if (N == 0 || M == 0) return Status::OK();
  const uint8_t* W = Wq.ptr<uint8_t>();

  const bool avx2 = dot_avx2_supported(t);
  if (N <= kMaxDotRows && K % 32 == 0 && (avx2 || dot_portable_supported(t))) {
    QuantizedXBuffers xb;
    xb.q.resize(N * K);
    xb.d.resize(N * K / 32);
    xb.s16.resize(N * K / 16);
    xb.s32.resize(N * K / 32);
    std::vector<float> row(K);
    for (int64_t i = 0; i < N; ++i) {
      SG_DISPATCH_FLOAT("gguf_matmul", x.dtype, Tx, to_f32(x.ptr<Tx>() + i * K, K, row.data()));
      quantize_x_row(row.data(), K, xb.q.data() + i * K, xb.d.data() + i * K / 32, xb.s16.data() + i * K / 16,
                     xb.s32.data() + i * K / 32);
    }
    SG_DISPATCH_FLOAT("gguf_matmul", y.dtype, Ty, dot_path(t, avx2, W, row_bytes, xb.view(K), N, M, y.ptr<Ty>()));
    return Status::OK();
  }

  Tensor xf;
  const float* xp = x.ptr<float>();
  if (x.dtype != DType::kF32) {
    SG_RETURN_IF_ERROR(empty({N * K}, DType::kF32, Device{}, &xf));
    SG_DISPATCH_FLOAT("gguf_matmul", x.dtype, Tx, to_f32(x.ptr<Tx>(), N * K, xf.ptr<float>()));
    xp = xf.ptr<float>();
  }
  if (N <= kMaxDotRows && dot_float_avx2_supported(t)) {  // F16 / BF16 weights, few rows: f32 FMA
    SG_DISPATCH_FLOAT("gguf_matmul", y.dtype, Ty, float_dot_path(t, W, xp, N, K, M, y.ptr<Ty>()));
    return Status::OK();
  }
  SG_DISPATCH_FLOAT("gguf_matmul", y.dtype, Ty,
                    SG_RETURN_IF_ERROR(sgemm_path(t, W, row_bytes, xp, N, K, M, y.ptr<Ty>())));
  return Status::OK();
}

}  // namespace surogate::cpu
