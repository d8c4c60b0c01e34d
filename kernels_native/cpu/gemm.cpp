// gemm_f32 over OpenBLAS (scipy-openblas32: 32-bit integers, scipy_ symbol prefix) and the
// f32 <-> storage conversions, compiled per x86-64 level (SG_CPU_CLONES) so they vectorize.
#include "cpu/gemm.h"

#include <cblas.h>

#include <climits>
#include <cstring>
#include <mutex>

namespace surogate::cpu {

namespace {

constexpr double kSerialMNK = 1 << 21;  // m*n*k below: ~4 MFLOP, tens of microseconds on one core
std::mutex g_blas_threads_mu;

}  // namespace

Status gemm_f32(const char* op, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return Status::OK();
  for (int64_t v : {M, N, K, lda, ldb, ldc}) {
    SG_CHECK(v <= INT_MAX, StatusCode::kInvalidArgument,
             str_cat(op, ": GEMM of [", M, ", ", K, "] x [", K, ", ", N, "] has a size or stride over 2^31 - 1"),
             "the CPU backend's OpenBLAS uses 32-bit indices; split the operands");
  }
  if (K == 0) {  // BLAS leaves this corner to the implementation; define it: C = beta * C
    for (int64_t i = 0; i < M; ++i) {
      float* c = C + i * ldc;
      if (beta == 0.0f) {
        std::memset(c, 0, static_cast<size_t>(N) * sizeof(float));
      } else {
        for (int64_t j = 0; j < N; ++j) c[j] *= beta;
      }
    }
    return Status::OK();
  }
  auto sgemm = [&] {
    scipy_cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                      static_cast<blasint>(M), static_cast<blasint>(N), static_cast<blasint>(K), alpha, A,
                      static_cast<blasint>(lda), B, static_cast<blasint>(ldb), beta, C, static_cast<blasint>(ldc));
  };
  if (static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) >= kSerialMNK) {
    sgemm();
    return Status::OK();
  }
  // OpenBLAS threads every GEMM above m*n*k = 2^18; for one this small, waking its workers
  // costs as much as the work, and far more when the cores are shared (two busy shared cores:
  // 0.4 ms became 130 ms for the chunks of a 97 x 1000 x 64 lm_head_ce_fwd). Run it on this
  // thread. The thread count is process-wide: a large GEMM that another thread starts
  // meanwhile runs single-threaded.
  std::lock_guard<std::mutex> lock(g_blas_threads_mu);
  const int threads = scipy_openblas_get_num_threads();
  if (threads > 1) scipy_openblas_set_num_threads(1);
  sgemm();
  if (threads > 1) scipy_openblas_set_num_threads(threads);
  return Status::OK();
}

namespace {

SG_CPU_CLONES void bf16_to_f32_n(const uint16_t* s, float* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = bf16_to_f32(s[i]);
}
// Exact f16 -> f32 in integer and float arithmetic (GCC does not vectorize _Float16 casts):
// shifting the exponent-mantissa field into place and scaling by 2^112 rebiases normals and
// normalizes subnormals in one multiply; inf / NaN keep an all-ones exponent.
SG_CPU_CLONES void f16_to_f32_n(const uint16_t* s, float* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t em = s[i] & 0x7fffu;
    const uint32_t sign = static_cast<uint32_t>(s[i] & 0x8000u) << 16;
    const float mag = bits_f32(em << 13) * 0x1p112f;
    const uint32_t bits = em >= 0x7c00u ? ((em << 13) | 0x7f800000u) : f32_bits(mag);
    d[i] = bits_f32(bits | sign);
  }
}
SG_CPU_CLONES void f32_to_bf16_n(const float* s, uint16_t* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(s[i]);
}
SG_CPU_CLONES void f32_to_f16_n(const float* s, uint16_t* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(s[i]);
}
SG_CPU_CLONES void add_f32_n(const float* s, float* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] += s[i];
}
SG_CPU_CLONES void add_bf16_n(const float* s, uint16_t* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(bf16_to_f32(d[i]) + s[i]);
}
SG_CPU_CLONES void add_f16_n(const float* s, uint16_t* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(f16_to_f32(d[i]) + s[i]);
}

}  // namespace

void to_f32(const void* src, DType dt, float* dst, int64_t n) {
  switch (dt) {
    case DType::kF32: std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float)); break;
    case DType::kBF16: bf16_to_f32_n(static_cast<const uint16_t*>(src), dst, n); break;
    case DType::kF16: f16_to_f32_n(static_cast<const uint16_t*>(src), dst, n); break;
    default: convert(src, dt, dst, DType::kF32, n); break;
  }
}

void from_f32(const float* src, void* dst, DType dt, int64_t n) {
  switch (dt) {
    case DType::kF32: std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float)); break;
    case DType::kBF16: f32_to_bf16_n(src, static_cast<uint16_t*>(dst), n); break;
    case DType::kF16: f32_to_f16_n(src, static_cast<uint16_t*>(dst), n); break;
    default: convert(src, DType::kF32, dst, dt, n); break;
  }
}

void add_from_f32(const float* src, void* dst, DType dt, int64_t n) {
  switch (dt) {
    case DType::kF32: add_f32_n(src, static_cast<float*>(dst), n); break;
    case DType::kBF16: add_bf16_n(src, static_cast<uint16_t*>(dst), n); break;
    case DType::kF16: add_f16_n(src, static_cast<uint16_t*>(dst), n); break;
    default: break;  // callers check is_gemm_dtype first
  }
}

}  // namespace surogate::cpu
