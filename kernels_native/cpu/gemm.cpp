// gemm_f32 over OpenBLAS (scipy-openblas32: 32-bit integers, scipy_ symbol prefix) and the
// f32 <-> storage conversions, compiled per x86-64 level (SG_CPU_CLONES) so they vectorize.
#include "cpu/gemm.h"

#include <cblas.h>
#include <immintrin.h>

#include "core/thread_pool.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <mutex>

namespace surogate::cpu {

namespace {

constexpr double kSerialMNK = 1 << 21;  // m*n*k below: ~4 MFLOP, tens of microseconds on one core
constexpr int64_t kSmallM = 32;           // rows of A up to which a weight-streaming kernel runs
constexpr int64_t kSmallMMinNK = 1 << 16;  // ... when B is at least this big

// out[m] = dot(A[m, :K], b[:K]) for m < M: b (one row of a [N, K] weight) is read once from
// memory for all M rows, each row's sum in one fixed order (8 lanes, then the tail) whatever M
// is, so a row of a decode step (M = 1) and the same row in a speculative verification span
// (M = 1 + k) get the same bits. The AVX2 version takes four rows per pass over b.
void dot_rows_portable(const float* A, int64_t lda, int64_t M, const float* b, int64_t K, float* out) {
  const int64_t K8 = K / 8 * 8;
  for (int64_t m = 0; m < M; ++m) {
    const float* a = A + m * lda;
    float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t k = 0; k < K8; k += 8) {
      for (int l = 0; l < 8; ++l) lane[l] += a[k + l] * b[k + l];
    }
    float s = ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
    for (int64_t k = K8; k < K; ++k) s += a[k] * b[k];
    out[m] = s;
  }
}

__attribute__((target("avx2,fma"))) inline float hsum8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));  // lanes l + l+4
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));  // (0+4)+(2+6), (1+5)+(3+7)
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

__attribute__((target("avx2,fma"))) void dot_rows_avx2(const float* A, int64_t lda, int64_t M, const float* b,
                                                         int64_t K, float* out) {
  const int64_t K8 = K / 8 * 8;
  auto tail = [&](const float* a, float s) {
    for (int64_t k = K8; k < K; ++k) s += a[k] * b[k];
    return s;
  };
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) {
    const float *a0 = A + m * lda, *a1 = a0 + lda, *a2 = a1 + lda, *a3 = a2 + lda;
    __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
    for (int64_t k = 0; k < K8; k += 8) {
      const __m256 bv = _mm256_loadu_ps(b + k);
      c0 = _mm256_fmadd_ps(_mm256_loadu_ps(a0 + k), bv, c0);
      c1 = _mm256_fmadd_ps(_mm256_loadu_ps(a1 + k), bv, c1);
      c2 = _mm256_fmadd_ps(_mm256_loadu_ps(a2 + k), bv, c2);
      c3 = _mm256_fmadd_ps(_mm256_loadu_ps(a3 + k), bv, c3);
    }
    out[m] = tail(a0, hsum8(c0));
    out[m + 1] = tail(a1, hsum8(c1));
    out[m + 2] = tail(a2, hsum8(c2));
    out[m + 3] = tail(a3, hsum8(c3));
  }
  for (; m < M; ++m) {  // the same operations as one lane of the loop above
    const float* a = A + m * lda;
    __m256 c = _mm256_setzero_ps();
    for (int64_t k = 0; k < K8; k += 8) c = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), c);
    out[m] = tail(a, hsum8(c));
  }
}

const bool g_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");

void dot_rows(const float* A, int64_t lda, int64_t M, const float* b, int64_t K, float* out) {
  if (g_avx2) {
    dot_rows_avx2(A, lda, M, b, K, out);
  } else {
    dot_rows_portable(A, lda, M, b, K, out);
  }
}

// C[:, n0:n1] = A @ B[:, n0:n1] for a few rows of A and a [K, N] B read once, row by row; each
// element summed over k in order whatever M is (as dot_rows). out: [M, n1 - n0], overwritten.
SG_CPU_CLONES void axpy_rows(const float* A, int64_t lda, int64_t M, const float* B, int64_t ldb, int64_t K,
                             int64_t n0, int64_t n1, float* out) {
  const int64_t w = n1 - n0;
  for (int64_t i = 0; i < M * w; ++i) out[i] = 0.0f;
  for (int64_t k = 0; k < K; ++k) {
    const float* b = B + k * ldb + n0;
    for (int64_t m = 0; m < M; ++m) {
      const float a = A[m * lda + k];
      float* o = out + m * w;
      for (int64_t j = 0; j < w; ++j) o[j] += a * b[j];
    }
  }
}

// C = alpha * A @ op(B) + beta * C for a few rows of A against a large B (decode and
// speculative-verification steps): OpenBLAS packs all of B for every call with M > 1, which
// made a 5-row step cost 4 single-row ones; this streams B once, split over the pool by N (1.5x).
void gemm_small_m(bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
                  int64_t ldb, float beta, float* C, int64_t ldc) {
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(K, 1));
  auto store = [&](int64_t m, int64_t n, float v) {
    float& c = C[m * ldc + n];
    c = beta == 0.0f ? alpha * v : alpha * v + beta * c;
  };
  if (!trans_b) {  // B is [K, N]: column panels of kPanel, each streamed over all of K
    constexpr int64_t kPanel = 128;
    parallel_for(0, (N + kPanel - 1) / kPanel, 1, [&](int64_t lo, int64_t hi) {
      float out[kSmallM * kPanel];
      for (int64_t p = lo; p < hi; ++p) {
        const int64_t n0 = p * kPanel, n1 = std::min(N, n0 + kPanel);
        axpy_rows(A, lda, M, B, ldb, K, n0, n1, out);
        for (int64_t m = 0; m < M; ++m) {
          for (int64_t n = n0; n < n1; ++n) store(m, n, out[m * (n1 - n0) + n - n0]);
        }
      }
    });
    return;
  }
  parallel_for(0, N, grain, [&](int64_t lo, int64_t hi) {
    float out[kSmallM];
    for (int64_t n = lo; n < hi; ++n) {
      dot_rows(A, lda, M, B + n * ldb, K, out);
      for (int64_t m = 0; m < M; ++m) store(m, n, out[m]);
    }
  });
}
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
  if (!trans_a && M <= kSmallM && N * K >= kSmallMMinNK) {
    gemm_small_m(trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
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
