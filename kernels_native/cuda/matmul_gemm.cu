// cuBLASLt behind gemm_rowmajor: one handle and a 32 MiB workspace per device, the plan cache,
// the f32 widening fallback, and the small kernels around a GEMM (bias, k = 0, dtype casts).
//
// Row-major to column-major: cuBLASLt sees a row-major [r, c] matrix with row stride ld as a
// column-major [c, r] one with the same ld, i.e. its transpose. So C = op(A) op(B) is computed
// as C^T = op(B)^T op(A)^T: cuBLASLt's A is our B and its B is our A, with m = N, n = M.
#include "cuda/matmul_gemm.h"

#include <cublasLt.h>

#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "core/allocator.h"
#include "cuda/common.cuh"

namespace surogate::cuda {

namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;
constexpr int kThreads = 256;

#define SG_CUBLAS_CHECK(op, expr)                                                                           \
  do {                                                                                                      \
    cublasStatus_t _sg_st = (expr);                                                                         \
    if (_sg_st != CUBLAS_STATUS_SUCCESS) {                                                                  \
      return ::surogate::Status(::surogate::StatusCode::kDeviceError,                                       \
                                ::surogate::str_cat(op, ": ", #expr, ": ", cublasLtGetStatusString(_sg_st)), \
                                __FILE__, __LINE__, "run `surogate doctor` to check the driver");           \
    }                                                                                                       \
  } while (0)

// Grid-stride kernels need no more blocks than keep every SM busy a few times over.
int grid_for(int64_t n) { return static_cast<int>(std::min<int64_t>(blocks_for(n, kThreads), 1 << 16)); }

template <typename TI, typename TO>
__global__ void cast_matrix_kernel(const TI* src, int64_t lds, TO* dst, int64_t ldd, int64_t rows, int64_t cols,
                                   bool accumulate) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    float v = ld(src[r * lds + c]);
    if (accumulate) v += ld(dst[r * ldd + c]);
    dst[r * ldd + c] = st<TO>(v);
  }
}

// c[r, j] = beta * c[r, j] + bias[j]; beta == 0 drops the old value (NaN included), a null bias adds 0.
template <typename TC, typename TB>
__global__ void beta_bias_kernel(TC* c, int64_t ldc, int64_t rows, int64_t cols, float beta, const TB* bias) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, j = i - r * cols;
    float v = beta == 0.0f ? 0.0f : beta * ld(c[r * ldc + j]);
    if (bias) v += ld(bias[j]);
    c[r * ldc + j] = st<TC>(v);
  }
}

Status beta_bias(const char* op, const GemmMatrix& C, int64_t M, int64_t N, float beta, const void* bias,
                 DType bias_dtype) {
  void* c = const_cast<void*>(C.ptr);
  SG_CUDA_DISPATCH_FLOAT(op, C.dtype, TC, {
    SG_CUDA_DISPATCH_FLOAT(op, bias_dtype, TB, {
      beta_bias_kernel<TC, TB><<<grid_for(M * N), kThreads, 0, current_stream()>>>(static_cast<TC*>(c), C.ld, M, N, beta,
                                                              static_cast<const TB*>(bias));
    });
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

cudaDataType_t cuda_type(DType dt) {
  switch (dt) {
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF16: return CUDA_R_16F;
    case DType::kF8E4M3: return CUDA_R_8F_E4M3;
    case DType::kF8E5M2: return CUDA_R_8F_E5M2;
    default: return CUDA_R_32F;
  }
}

// The largest power of two (up to cuBLASLt's 256) that divides the address: algorithms with
// vector loads need aligned bases, and the heuristic only knows what we tell it.
int64_t alignment(const void* p) {
  const uintptr_t u = reinterpret_cast<uintptr_t>(p);
  if (u == 0) return 256;
  return static_cast<int64_t>(std::min<uintptr_t>(u & (~u + 1), 256));
}

// M, N, K, lda, ldb, ldc, transposes, dtypes (A, B, C), bias present, alignments (A, B, C, bias).
using PlanKey = std::array<int64_t, 15>;

struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const {
    size_t h = 0;
    for (int64_t v : k) h ^= std::hash<int64_t>{}(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h;
  }
};

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLASLt's A (our B), B (our A), C = D
  cublasLtMatmulAlgo_t algo{};
  bool found = false;  // false: cuBLASLt has no algorithm; remembered so the miss is not re-asked
};

// Per device: a handle, a workspace and the plans. Plans are never destroyed: a training run
// has a few dozen shapes, and their descriptors are a few hundred bytes each.
struct LtDevice {
  std::mutex mu;  // held over lookup and launch: the bias pointer is set on the shared descriptor
  cublasLtHandle_t handle = nullptr;
  std::shared_ptr<void> workspace;
  std::unordered_map<PlanKey, Plan, PlanKeyHash> plans;

  Status init(const char* op, int device) {
    if (handle) return Status::OK();
    SG_RETURN_IF_ERROR(allocate(Device{DeviceType::kCUDA, device}, kWorkspaceBytes, &workspace));
    SG_CUBLAS_CHECK(op, cublasLtCreate(&handle));
    return Status::OK();
  }
};

LtDevice& lt_device(int device) {
  static std::mutex mu;
  // Leaked on purpose: destroying handles and freeing device memory during static destruction
  // races the CUDA runtime's own teardown.
  static auto* devices = new std::map<int, std::unique_ptr<LtDevice>>();
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = (*devices)[device];
  if (!slot) slot = std::make_unique<LtDevice>();
  return *slot;
}

template <typename T>
Status set_desc(const char* op, cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v) {
  SG_CUBLAS_CHECK(op, cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)));
  return Status::OK();
}

template <typename T>
Status set_pref(const char* op, cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr, const T& v) {
  SG_CUBLAS_CHECK(op, cublasLtMatmulPreferenceSetAttribute(p, attr, &v, sizeof(v)));
  return Status::OK();
}

// The plan's algorithm: cuBLASLt's first heuristic for p's descriptors and the operands'
// alignments (cuBLASLt's A is our B). An unsupported type mix answers NOT_SUPPORTED (or
// INVALID_VALUE) rather than zero results: either way p->found is false (the caller widens).
Status find_algo(const char* op, cublasLtHandle_t handle, const GemmMatrix& A, const GemmMatrix& B,
                 const GemmMatrix& C, Plan* p) {
  cublasLtMatmulPreference_t pref = nullptr;
  SG_CUBLAS_CHECK(op, cublasLtMatmulPreferenceCreate(&pref));
  const std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, decltype(&cublasLtMatmulPreferenceDestroy)> pref_guard(
      pref, cublasLtMatmulPreferenceDestroy);
  const uint64_t ws = kWorkspaceBytes;
  SG_RETURN_IF_ERROR(set_pref(op, pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, ws));
  SG_RETURN_IF_ERROR(set_pref(op, pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, uint32_t(alignment(B.ptr))));
  SG_RETURN_IF_ERROR(set_pref(op, pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, uint32_t(alignment(A.ptr))));
  SG_RETURN_IF_ERROR(set_pref(op, pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, uint32_t(alignment(C.ptr))));
  SG_RETURN_IF_ERROR(set_pref(op, pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, uint32_t(alignment(C.ptr))));
  cublasLtMatmulHeuristicResult_t res{};
  int count = 0;
  const cublasStatus_t hs =
      cublasLtMatmulAlgoGetHeuristic(handle, p->desc, p->a, p->b, p->c, p->c, pref, 1, &res, &count);
  p->found = hs == CUBLAS_STATUS_SUCCESS && count > 0 && res.state == CUBLAS_STATUS_SUCCESS;
  if (p->found) p->algo = res.algo;
  return Status::OK();
}

Status make_plan(const char* op, cublasLtHandle_t handle, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                 const GemmMatrix& A, const GemmMatrix& B, const GemmMatrix& C, const void* bias, Plan* out) {
  Plan p;
  // CUBLAS_COMPUTE_32F, not _FAST_TF32: f32 operands keep full f32 products.
  SG_CUBLAS_CHECK(op, cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = tb ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A is our B
  const cublasOperation_t op_b = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  SG_RETURN_IF_ERROR(set_desc(op, p.desc, CUBLASLT_MATMUL_DESC_TRANSA, op_a));
  SG_RETURN_IF_ERROR(set_desc(op, p.desc, CUBLASLT_MATMUL_DESC_TRANSB, op_b));
  if (bias) {
    // The bias type defaults to D's; the caller has cast it. The pointer is set here too: the
    // heuristic reads its alignment.
    SG_RETURN_IF_ERROR(set_desc(op, p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t{CUBLASLT_EPILOGUE_BIAS}));
    SG_RETURN_IF_ERROR(set_desc(op, p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias));
  }
  // Stored shapes in column-major terms: a row-major [r, c] is a column-major [c, r].
  SG_CUBLAS_CHECK(op, cublasLtMatrixLayoutCreate(&p.a, cuda_type(B.dtype), tb ? K : N, tb ? N : K, B.ld));
  SG_CUBLAS_CHECK(op, cublasLtMatrixLayoutCreate(&p.b, cuda_type(A.dtype), ta ? M : K, ta ? K : M, A.ld));
  SG_CUBLAS_CHECK(op, cublasLtMatrixLayoutCreate(&p.c, cuda_type(C.dtype), N, M, C.ld));

  SG_RETURN_IF_ERROR(find_algo(op, handle, A, B, C, &p));
  *out = p;
  return Status::OK();
}

// One cuBLASLt matmul with the bias (already in C's dtype, or null) in the epilogue. *found is
// false, and nothing launched, when cuBLASLt has no algorithm for this plan.
Status lt_gemm(const char* op, int device, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
               const GemmMatrix& A, const GemmMatrix& B, float beta, const GemmMatrix& C, const void* bias,
               bool* found) {
  LtDevice& dev = lt_device(device);
  std::lock_guard<std::mutex> lock(dev.mu);
  SG_RETURN_IF_ERROR(dev.init(op, device));
  const PlanKey key{M, N, K, A.ld, B.ld, C.ld, ta, tb, static_cast<int64_t>(A.dtype), static_cast<int64_t>(B.dtype),
                    static_cast<int64_t>(C.dtype), bias != nullptr, alignment(A.ptr), alignment(B.ptr),
                    alignment(C.ptr) * 512 + (bias ? alignment(bias) : 0)};
  auto it = dev.plans.find(key);
  if (it == dev.plans.end()) {
    Plan p;
    SG_RETURN_IF_ERROR(make_plan(op, dev.handle, ta, tb, M, N, K, A, B, C, bias, &p));
    it = dev.plans.emplace(key, p).first;
  }
  const Plan& p = it->second;
  *found = p.found;
  if (!p.found) return Status::OK();
  if (bias) SG_RETURN_IF_ERROR(set_desc(op, p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias));
  void* c = const_cast<void*>(C.ptr);
  SG_CUBLAS_CHECK(op, cublasLtMatmul(dev.handle, p.desc, &alpha, B.ptr, p.a, A.ptr, p.b, &beta, c, p.c, c, p.c,
                                     &p.algo, dev.workspace.get(), kWorkspaceBytes, current_stream()));
  return Status::OK();
}

// lt_gemm with a bias of any dtype: cast to C's dtype for the epilogue (exact when C is f32);
// if no algorithm takes the epilogue, a plain GEMM and a bias pass.
Status lt_gemm_bias(const char* op, int device, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                    const GemmMatrix& A, const GemmMatrix& B, float beta, const GemmMatrix& C, const void* bias,
                    DType bias_dtype, bool* found) {
  std::shared_ptr<void> buf;
  const void* bias_c = bias;
  if (bias && bias_dtype != C.dtype) {
    SG_RETURN_IF_ERROR(allocate(Device{DeviceType::kCUDA, device}, N * dtype_size(C.dtype), &buf));
    SG_RETURN_IF_ERROR(cast_matrix(op, {bias, bias_dtype, N}, {buf.get(), C.dtype, N}, 1, N));
    bias_c = buf.get();
  }
  SG_RETURN_IF_ERROR(lt_gemm(op, device, ta, tb, M, N, K, alpha, A, B, beta, C, bias_c, found));
  if (*found || !bias) return Status::OK();
  SG_RETURN_IF_ERROR(lt_gemm(op, device, ta, tb, M, N, K, alpha, A, B, beta, C, nullptr, found));
  if (!*found) return Status::OK();
  return beta_bias(op, C, M, N, 1.0f, bias, bias_dtype);
}

// The fallback for dtype mixes cuBLASLt has no kernel for (f32 x bf16, f32 operands into a bf16
// C, ...): widen every non-f32 operand into contiguous f32 scratch, as the CPU backend does.
Status widened_gemm(const char* op, int device, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                    const GemmMatrix& A, const GemmMatrix& B, float beta, const GemmMatrix& C, const void* bias,
                    DType bias_dtype) {
  const Device dev{DeviceType::kCUDA, device};
  auto widen = [&](const GemmMatrix& m, int64_t rows, int64_t cols, bool copy, std::shared_ptr<void>* buf,
                   GemmMatrix* out) -> Status {
    if (m.dtype == DType::kF32) {
      *out = m;
      return Status::OK();
    }
    SG_RETURN_IF_ERROR(allocate(dev, static_cast<size_t>(rows * cols) * sizeof(float), buf));
    *out = GemmMatrix{buf->get(), DType::kF32, cols};
    return copy ? cast_matrix(op, m, *out, rows, cols) : Status::OK();
  };
  std::shared_ptr<void> a_buf, b_buf, c_buf;
  GemmMatrix A32, B32, C32;
  SG_RETURN_IF_ERROR(widen(A, ta ? K : M, ta ? M : K, true, &a_buf, &A32));
  SG_RETURN_IF_ERROR(widen(B, tb ? N : K, tb ? K : N, true, &b_buf, &B32));
  SG_RETURN_IF_ERROR(widen(C, M, N, beta != 0.0f, &c_buf, &C32));
  bool found = false;
  SG_RETURN_IF_ERROR(lt_gemm_bias(op, device, ta, tb, M, N, K, alpha, A32, B32, beta, C32, bias, bias_dtype, &found));
  SG_CHECK(found, StatusCode::kUnsupported,
           str_cat(op, ": cuBLASLt has no f32 algorithm for a [", M, ", ", K, "] x [", K, "] x [", N,
                   "] GEMM (trans_a=", ta, ", trans_b=", tb, ", leading dims ", A.ld, ", ", B.ld, ", ", C.ld, ")"),
           "make the operands contiguous; run `surogate doctor` to check the cuBLAS install");
  if (C.dtype != DType::kF32) SG_RETURN_IF_ERROR(cast_matrix(op, C32, C, M, N));
  return Status::OK();
}

bool is_gemm_dtype(DType dt) { return dt == DType::kF32 || dt == DType::kBF16 || dt == DType::kF16; }

// The FP8 plan: cuBLASLt's A is our B (op T: [N,K] row-major is a column-major [K,N]), its B is
// our A (op N), so both are K-major; the scale pointers are set per call, like the bias pointer.
Status make_fp8_plan(const char* op, cublasLtHandle_t handle, int64_t M, int64_t N, int64_t K, const GemmMatrix& A,
                     const float* a_scale, const GemmMatrix& B, const float* b_scale, const GemmMatrix& C,
                     const void* bias, Plan* out) {
  Plan p;
  SG_CUBLAS_CHECK(op, cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  SG_RETURN_IF_ERROR(set_desc(op, p.desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T));
  SG_RETURN_IF_ERROR(set_desc(op, p.desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N));
  SG_RETURN_IF_ERROR(set_desc(op, p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(b_scale)));
  SG_RETURN_IF_ERROR(set_desc(op, p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(a_scale)));
  if (bias) {  // (bf16 / f16 C only: the caller adds an f32 C's bias itself)
    SG_RETURN_IF_ERROR(set_desc(op, p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t{CUBLASLT_EPILOGUE_BIAS}));
    SG_RETURN_IF_ERROR(set_desc(op, p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias));
  }
  SG_CUBLAS_CHECK(op, cublasLtMatrixLayoutCreate(&p.a, cuda_type(B.dtype), K, N, B.ld));
  SG_CUBLAS_CHECK(op, cublasLtMatrixLayoutCreate(&p.b, cuda_type(A.dtype), K, M, A.ld));
  SG_CUBLAS_CHECK(op, cublasLtMatrixLayoutCreate(&p.c, cuda_type(C.dtype), N, M, C.ld));
  SG_RETURN_IF_ERROR(find_algo(op, handle, A, B, C, &p));
  *out = p;
  return Status::OK();
}

}  // namespace

Status gemm_fp8_rowmajor(const char* op, int device, int64_t M, int64_t N, int64_t K, float alpha, const GemmMatrix& A,
                         const float* a_scale, const GemmMatrix& B, const float* b_scale, float beta,
                         const GemmMatrix& C, const void* bias, DType bias_dtype) {
  if (M <= 0 || N <= 0) return Status::OK();
  if (K <= 0) return beta_bias(op, C, M, N, beta, bias, bias_dtype);
  // bf16 / f16 C: the bias (cast to C's dtype) in the epilogue; f32 C: added after the GEMM (an
  // FP8 GEMM into f32 wants a bias of another dtype, and f32 needs no single rounding).
  const bool epilogue = bias && C.dtype != DType::kF32;
  std::shared_ptr<void> buf;
  const void* bias_c = epilogue ? bias : nullptr;
  if (epilogue && bias_dtype != C.dtype) {
    SG_RETURN_IF_ERROR(allocate(Device{DeviceType::kCUDA, device}, N * dtype_size(C.dtype), &buf));
    SG_RETURN_IF_ERROR(cast_matrix(op, {bias, bias_dtype, N}, {buf.get(), C.dtype, N}, 1, N));
    bias_c = buf.get();
  }
  {
    LtDevice& dev = lt_device(device);
    std::lock_guard<std::mutex> lock(dev.mu);
    SG_RETURN_IF_ERROR(dev.init(op, device));
    // ta = 0, tb = 1 always; the fp8 dtypes keep these keys apart from gemm_rowmajor's.
    const PlanKey key{M, N, K, A.ld, B.ld, C.ld, 0, 1, static_cast<int64_t>(A.dtype), static_cast<int64_t>(B.dtype),
                      static_cast<int64_t>(C.dtype), bias_c != nullptr, alignment(A.ptr), alignment(B.ptr),
                      alignment(C.ptr) * 512 + (bias_c ? alignment(bias_c) : 0)};
    auto it = dev.plans.find(key);
    if (it == dev.plans.end()) {
      Plan p;
      SG_RETURN_IF_ERROR(make_fp8_plan(op, dev.handle, M, N, K, A, a_scale, B, b_scale, C, bias_c, &p));
      it = dev.plans.emplace(key, p).first;
    }
    const Plan& p = it->second;
    SG_CHECK(p.found, StatusCode::kUnsupported,
             str_cat(op, ": cuBLASLt has no FP8 algorithm for [", M, ", ", K, "] ", dtype_name(A.dtype), " x [", N,
                     ", ", K, "]^T ", dtype_name(B.dtype), " -> ", dtype_name(C.dtype)),
             "FP8 GEMMs need an SM 8.9+ GPU (Ada, Hopper) and 16-byte aligned operands; use recipe: bf16");
    SG_RETURN_IF_ERROR(set_desc(op, p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(b_scale)));
    SG_RETURN_IF_ERROR(set_desc(op, p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(a_scale)));
    if (bias_c) SG_RETURN_IF_ERROR(set_desc(op, p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias_c));
    void* c = const_cast<void*>(C.ptr);
    SG_CUBLAS_CHECK(op, cublasLtMatmul(dev.handle, p.desc, &alpha, B.ptr, p.a, A.ptr, p.b, &beta, c, p.c, c, p.c,
                                       &p.algo, dev.workspace.get(), kWorkspaceBytes, current_stream()));
  }
  if (bias && !epilogue) return beta_bias(op, C, M, N, 1.0f, bias, bias_dtype);
  return Status::OK();
}

Status cast_matrix(const char* op, const GemmMatrix& src, const GemmMatrix& dst, int64_t rows, int64_t cols,
                   bool accumulate) {
  if (rows <= 0 || cols <= 0) return Status::OK();
  void* d = const_cast<void*>(dst.ptr);
  SG_CUDA_DISPATCH_FLOAT(op, src.dtype, TI, {
    SG_CUDA_DISPATCH_FLOAT(op, dst.dtype, TO, {
      cast_matrix_kernel<TI, TO><<<grid_for(rows * cols), kThreads, 0, current_stream()>>>(static_cast<const TI*>(src.ptr), src.ld,
                                                                      static_cast<TO*>(d), dst.ld, rows, cols,
                                                                      accumulate);
    });
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

Status gemm_rowmajor(const char* op, int device, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                     const GemmMatrix& A, const GemmMatrix& B, float beta, const GemmMatrix& C, const void* bias,
                     DType bias_dtype) {
  if (M <= 0 || N <= 0) return Status::OK();
  SG_CHECK(is_gemm_dtype(A.dtype) && is_gemm_dtype(B.dtype) && is_gemm_dtype(C.dtype) &&
               (!bias || is_gemm_dtype(bias_dtype)),
           StatusCode::kDTypeUnsupported,
           str_cat(op, ": no CUDA GEMM for ", dtype_name(A.dtype), " x ", dtype_name(B.dtype), " -> ",
                   dtype_name(C.dtype)),
           "use float32, bfloat16 or float16");
  // An empty inner dimension is a GEMM cuBLASLt may refuse: C = beta * C + bias directly.
  if (K <= 0) return beta_bias(op, C, M, N, beta, bias, bias_dtype);
  // cuBLASLt's f32-compute kernels take equal A / B types and a C of that type or f32.
  if (A.dtype == B.dtype && (C.dtype == A.dtype || C.dtype == DType::kF32)) {
    bool found = false;
    SG_RETURN_IF_ERROR(lt_gemm_bias(op, device, ta, tb, M, N, K, alpha, A, B, beta, C, bias, bias_dtype, &found));
    if (found) return Status::OK();
  }
  return widened_gemm(op, device, ta, tb, M, N, K, alpha, A, B, beta, C, bias, bias_dtype);
}

}  // namespace surogate::cuda
