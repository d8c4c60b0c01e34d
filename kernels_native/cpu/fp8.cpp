// CPU FP8 ops of the fp8_hybrid recipe: the exact emulation the CUDA kernels (cuda/fp8.cu) are
// compared with. The scale rule and the NaN / saturation policy are in runtime/op_checks_fp8.h.
//
//   quantize_fp8  x -> q = satfinite(x * scale) (e4m3 or e5m2, round to nearest even; core/dtype.h's
//                 _sat conversions, which torch's float8 casts match on finite values), scale_inv
//   matmul_fp8    c = alpha a_scale_inv b_scale_inv (a @ b^T) + beta c + bias: the fp8 codes
//                 decoded to f32 (exact), multiplied by sgemm (products of fp8 values are exact in
//                 f32; the sums round in f32 as a tensor core's f32 accumulator does, in another
//                 order), the bias added in f32 and c rounded once.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

#include "cpu/common.h"
#include "cpu/gemm.h"
#include "runtime/op_checks_fp8.h"

namespace surogate::cpu {

namespace {

constexpr int64_t kGrainElems = 1 << 15;

int64_t grain_rows(int64_t row_len) { return std::max<int64_t>(1, kGrainElems / std::max<int64_t>(row_len, 1)); }

// max |v| with NaN winning (op_checks_fp8.h).
inline float nan_max(float m, float v) {
  const float a = std::fabs(v);
  return (a > m || std::isnan(a)) && !std::isnan(m) ? a : m;
}

// The scale of op_checks_fp8.h: fp8_max / amax, capped at FLT_MAX, 1 for amax 0.
float scale_from_amax(float amax, float fp8_max) {
  if (amax == 0.0f) return 1.0f;
  const float s = fp8_max / amax;
  return std::isinf(s) ? FLT_MAX : s;
}

template <typename T>
float amax_of(const T* x, int64_t R, int64_t C, int64_t ld) {
  std::vector<float> rows(static_cast<size_t>(R), 0.0f);
  parallel_for(0, R, grain_rows(C), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      float m = 0.0f;
      const T* row = x + i * ld;
      for (int64_t j = 0; j < C; ++j) m = nan_max(m, load(row[j]));
      rows[i] = m;
    }
  });
  float m = 0.0f;
  for (float v : rows) m = nan_max(m, v);
  return m;
}

Status quantize_fp8(const OpArgs& a) {
  QuantizeFp8Args r;
  SG_RETURN_IF_ERROR(check_quantize_fp8(a, &r));
  const Tensor& x = a.in(0);
  uint8_t* q = a.out(0).ptr<uint8_t>();
  float* scale_inv = a.out(1).ptr<float>();
  const int64_t R = r.R, C = r.C, ld = r.ld;
  auto enc = r.e5m2 ? f32_to_f8e5m2_sat : f32_to_f8e4m3_sat;
  SG_DISPATCH_FLOAT("quantize_fp8", x.dtype, T, {
    const T* xp = x.ptr<T>();
    float amax = amax_of(xp, R, C, ld);
    if (r.H > 0) amax = delayed_amax(amax, a.out(2).ptr<float>(), r.H, r.roll);
    const float s = scale_from_amax(amax, r.fp8_max);
    *scale_inv = 1.0f / s;
    if (!r.transpose) {
      parallel_for(0, R, grain_rows(C), [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) {
          for (int64_t j = 0; j < C; ++j) q[i * C + j] = enc(load(xp[i * ld + j]) * s);
        }
      });
    } else {  // q[j, i] = x[i, j], in 64-row tiles of x so each tile's rows stay in cache
      parallel_for(0, C, grain_rows(R), [&](int64_t lo, int64_t hi) {
        for (int64_t i0 = 0; i0 < R; i0 += 64) {
          const int64_t i1 = std::min(R, i0 + 64);
          for (int64_t j = lo; j < hi; ++j) {
            for (int64_t i = i0; i < i1; ++i) q[j * R + i] = enc(load(xp[i * ld + j]) * s);
          }
        }
      });
    }
  });
  return Status::OK();
}

void decode(const Tensor& t, float* out) {
  const uint8_t* p = t.ptr<uint8_t>();
  const int64_t n = t.numel();
  auto dec = t.dtype == DType::kF8E5M2 ? f8e5m2_to_f32 : f8e4m3_to_f32;
  parallel_for(0, n, kGrainElems, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) out[i] = dec(p[i]);
  });
}

Status matmul_fp8(const OpArgs& a) {
  MatmulFp8Args r;
  SG_RETURN_IF_ERROR(check_matmul_fp8(a, &r));
  const int64_t M = r.M, N = r.N, K = r.K;
  if (M == 0 || N == 0) return Status::OK();
  const Tensor& C = a.out(0);
  const float alpha = r.alpha * *a.in(1).ptr<float>() * *a.in(3).ptr<float>();
  Tensor a32, b32, c_buf, bias_buf;
  SG_RETURN_IF_ERROR(empty({M, K}, DType::kF32, Device{}, &a32));
  SG_RETURN_IF_ERROR(empty({N, K}, DType::kF32, Device{}, &b32));
  decode(a.in(0), a32.ptr<float>());
  decode(a.in(2), b32.ptr<float>());
  const bool wide_c = C.dtype == DType::kF32;
  float* c = C.ptr<float>();
  if (!wide_c) {
    SG_RETURN_IF_ERROR(empty({M, N}, DType::kF32, Device{}, &c_buf));
    c = c_buf.ptr<float>();
    if (r.beta != 0.0f) to_f32(C.data, C.dtype, c, M * N);
  }
  float gemm_beta = r.beta;
  if (r.bias) {  // c = beta c + bias first, then the GEMM adds into it
    SG_RETURN_IF_ERROR(empty({N}, DType::kF32, Device{}, &bias_buf));
    const float* b = bias_buf.ptr<float>();
    to_f32(r.bias->data, r.bias->dtype, bias_buf.ptr<float>(), N);
    const float beta = r.beta;
    parallel_for(0, M, grain_rows(N), [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        float* row = c + i * N;
        for (int64_t j = 0; j < N; ++j) row[j] = (beta == 0.0f ? 0.0f : beta * row[j]) + b[j];
      }
    });
    gemm_beta = 1.0f;
  }
  SG_RETURN_IF_ERROR(gemm_f32("matmul_fp8", false, true, M, N, K, alpha, a32.ptr<float>(), K, b32.ptr<float>(), K,
                              gemm_beta, c, N));
  if (!wide_c) {
    parallel_for(0, M, grain_rows(N), [&](int64_t lo, int64_t hi) {
      from_f32(c + lo * N, static_cast<char*>(C.data) + lo * N * dtype_size(C.dtype), C.dtype, (hi - lo) * N);
    });
  }
  return Status::OK();
}

}  // namespace

void register_cpu_fp8(OpRegistry& reg) {
  add_op(reg, "quantize_fp8", quantize_fp8);
  add_op(reg, "matmul_fp8", matmul_fp8);
}

}  // namespace surogate::cpu
