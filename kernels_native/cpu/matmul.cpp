// CPU matmul: C = alpha * op(A) @ op(B) + beta * C_old (+ bias[N] added to every row).
//
// Shapes: op(A) is [M,K]: A is stored [M,K], or [K,M] with trans_a, or is batched [B,T,K]
// (flattened to M = B*T rows; no trans_a). op(B) is [K,N]: B is stored [K,N], or [N,K] with
// trans_b (the nn.Linear weight layout). C has A's leading dims and N columns.
//
// f32 operands go straight to OpenBLAS sgemm. bf16 / f16 operands are widened to f32 in panels
// (rows of op(A), columns of op(B), at most kPanelElems elements each), multiplied with sgemm and
// rounded once into C. Any mix of f32 / bf16 / f16 is accepted, so bf16 inputs can accumulate
// into an f32 C (beta = 1) for gradient accumulation. beta == 0 ignores C's old contents.
// C must not overlap A, B or bias.
#include <algorithm>
#include <vector>

#include "cpu/common.h"
#include "cpu/gemm.h"
#include "runtime/op_checks_matmul.h"

namespace surogate::cpu {

namespace {

constexpr int64_t kPanelElems = int64_t{4} << 20;  // 16 MiB of f32 per scratch panel
constexpr int64_t kMinPanel = 64;                   // rows / columns: keeps each sgemm worth threading
constexpr int64_t kGrainElems = 1 << 16;            // elements per parallel_for task (>= ~10 us)

int64_t row_grain(int64_t row_len) { return std::max<int64_t>(1, kGrainElems / std::max<int64_t>(row_len, 1)); }

// dst[nr, nc] (f32, contiguous) = src[r0 : r0+nr, c0 : c0+nc] of a row-major matrix of dtype dt
// with row stride ld.
void widen_block(const void* src, DType dt, int64_t ld, int64_t r0, int64_t c0, int64_t nr, int64_t nc,
                 float* dst) {
  const size_t es = dtype_size(dt);
  parallel_for(0, nr, row_grain(nc), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      to_f32(static_cast<const char*>(src) + ((r0 + i) * ld + c0) * es, dt, dst + i * nc, nc);
    }
  });
}

// c[i, :] = beta * c[i, :] + bias for nr rows of nb f32 values (row stride ldc); beta == 0 drops
// the old values, a null bias adds nothing.
void prefill_rows(float* c, int64_t ldc, int64_t nr, int64_t nb, float beta, const float* bias) {
  parallel_for(0, nr, row_grain(nb), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      float* row = c + i * ldc;
      if (beta == 0.0f) {
        for (int64_t j = 0; j < nb; ++j) row[j] = bias ? bias[j] : 0.0f;
      } else {
        for (int64_t j = 0; j < nb; ++j) row[j] = beta * row[j] + (bias ? bias[j] : 0.0f);
      }
    }
  });
}

// matmul: (A, B, [bias]) -> (C); attrs: trans_a, trans_b, alpha (1), beta (0).
Status matmul(const OpArgs& a) {
  MatmulArgs d;
  SG_RETURN_IF_ERROR(check_matmul(a, &d));
  const bool ta = d.trans_a, tb = d.trans_b;
  const float alpha = d.alpha, beta = d.beta;
  const int64_t M = d.M, N = d.N, K = d.K;
  if (M == 0 || N == 0) return Status::OK();
  const Tensor& A = a.in(0);
  const Tensor& B = a.in(1);
  const Tensor& C = a.out(0);

  Tensor bias_buf;
  const float* bias = nullptr;
  if (a.has_in(2)) {
    SG_RETURN_IF_ERROR(empty({N}, DType::kF32, Device{}, &bias_buf));
    to_f32(a.in(2).data, a.in(2).dtype, bias_buf.ptr<float>(), N);
    bias = bias_buf.ptr<float>();
  }

  // Row strides in elements (the leading dimensions BLAS takes).
  const int64_t sa = A.ndim == 2 ? A.strides[0] : K;
  const int64_t sb = B.strides[0];
  const int64_t sc = C.ndim == 2 ? C.strides[0] : N;
  const bool wide_a = A.dtype == DType::kF32, wide_b = B.dtype == DType::kF32, wide_c = C.dtype == DType::kF32;
  if (wide_a && wide_b && wide_c) {
    float* c = C.ptr<float>();
    float gemm_beta = beta;
    if (bias) {
      prefill_rows(c, sc, M, N, beta, bias);
      gemm_beta = 1.0f;
    }
    return gemm_f32("matmul", ta, tb, M, N, K, alpha, A.ptr<float>(), sa, B.ptr<float>(), sb, gemm_beta, c, sc);
  }

  // Panels: nb columns of op(B) and mb rows of op(A) at a time, each widened only if not f32.
  const int64_t k1 = std::max<int64_t>(K, 1);
  const int64_t nb = wide_b ? N : std::min(N, std::max(kMinPanel, kPanelElems / k1));
  int64_t mb = wide_a ? M : std::min(M, std::max(kMinPanel, kPanelElems / k1));
  if (!wide_c) mb = std::min(mb, std::max(kMinPanel, kPanelElems / nb));
  Tensor a_buf, b_buf, c_buf;
  if (!wide_a) SG_RETURN_IF_ERROR(empty({mb * K}, DType::kF32, Device{}, &a_buf));
  if (!wide_b) SG_RETURN_IF_ERROR(empty({nb * K}, DType::kF32, Device{}, &b_buf));
  if (!wide_c) SG_RETURN_IF_ERROR(empty({mb * nb}, DType::kF32, Device{}, &c_buf));

  float gemm_beta = beta;
  if (wide_c && bias) {
    prefill_rows(C.ptr<float>(), sc, M, N, beta, bias);
    gemm_beta = 1.0f;
  } else if (!wide_c) {
    gemm_beta = (beta != 0.0f || bias) ? 1.0f : 0.0f;  // the C panel is prefilled below
  }

  const size_t c_es = dtype_size(C.dtype);
  for (int64_t n0 = 0; n0 < N; n0 += nb) {
    const int64_t nn = std::min(nb, N - n0);
    const float* bp;
    int64_t ldb;
    if (wide_b) {
      bp = B.ptr<float>() + (tb ? n0 * sb : n0);
      ldb = sb;
    } else {
      bp = b_buf.ptr<float>();
      ldb = tb ? K : nn;
      if (tb) widen_block(B.data, B.dtype, sb, n0, 0, nn, K, b_buf.ptr<float>());
      else widen_block(B.data, B.dtype, sb, 0, n0, K, nn, b_buf.ptr<float>());
    }
    for (int64_t m0 = 0; m0 < M; m0 += mb) {
      const int64_t mm = std::min(mb, M - m0);
      const float* ap;
      int64_t lda;
      if (wide_a) {
        ap = A.ptr<float>() + (ta ? m0 : m0 * sa);
        lda = sa;
      } else {
        ap = a_buf.ptr<float>();
        lda = ta ? mm : K;
        if (ta) widen_block(A.data, A.dtype, sa, 0, m0, K, mm, a_buf.ptr<float>());
        else widen_block(A.data, A.dtype, sa, m0, 0, mm, K, a_buf.ptr<float>());
      }
      if (wide_c) {
        SG_RETURN_IF_ERROR(
            gemm_f32("matmul", ta, tb, mm, nn, K, alpha, ap, lda, bp, ldb, gemm_beta, C.ptr<float>() + m0 * sc + n0, sc));
        continue;
      }
      float* cp = c_buf.ptr<float>();
      if (beta != 0.0f) widen_block(C.data, C.dtype, sc, m0, n0, mm, nn, cp);
      if (beta != 0.0f || bias) prefill_rows(cp, nn, mm, nn, beta, bias ? bias + n0 : nullptr);
      SG_RETURN_IF_ERROR(gemm_f32("matmul", ta, tb, mm, nn, K, alpha, ap, lda, bp, ldb, gemm_beta, cp, nn));
      char* cdst = static_cast<char*>(C.data);
      parallel_for(0, mm, row_grain(nn), [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) from_f32(cp + i * nn, cdst + ((m0 + i) * sc + n0) * c_es, C.dtype, nn);
      });
    }
  }
  return Status::OK();
}

}  // namespace

void register_cpu_matmul(OpRegistry& reg) {
  add_op(reg, "matmul", matmul);
}

}  // namespace surogate::cpu
