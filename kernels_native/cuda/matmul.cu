// CUDA matmul (a shell over gemm_rowmajor, cuBLASLt, with cuda/gemv.cu for decode-sized x W^T)
// and the fused LM head + softmax cross-entropy, lm_head_ce_fwd / lm_head_ce_bwd: the CUDA twins
// of cpu/matmul.cpp and cpu/cross_entropy.cpp, whose header comments give the math.
//
// Shape letters: N tokens, C channels (hidden size), V vocabulary.
//
// The cross-entropy never holds the [N, V] logits: vocab chunks of `chunk` rows of W outside,
// row blocks of h inside; each step GEMMs its logits into f32 scratch [rows, chunk] and a row
// kernel (one block per row) folds them into the per-row state (forward: running max, sum of
// exp, target logit, sum of logits) or turns them into dlogits in place (backward), which two
// more GEMMs take into dh and dW. Unlike the CPU op, ignored rows are not compacted away: the
// row count would have to be read back from the device. They run through the GEMMs with zero
// dlogits instead, and a target outside [0, V) (an error on the CPU) cannot be reported without
// a host sync, so its row gets a NaN loss and NaN gradients.
//
// Just over 400 lines: matmul's checks are the CPU op's, copied so the messages match, and the
// cross-entropy's forward and backward share their argument checks and scratch plan.
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "core/allocator.h"
#include "cuda/backend.h"
#include "cuda/common.cuh"
#include "cuda/gemv.h"
#include "cuda/matmul_gemm.h"
#include "runtime/op_checks_matmul.h"

namespace surogate::cuda {

namespace {

// ---- matmul ---------------------------------------------------------------------------------

// matmul: (A, B, [bias]) -> (C); attrs: trans_a, trans_b, alpha (1), beta (0).
Status matmul(const OpArgs& a) {
  MatmulArgs d;
  SG_RETURN_IF_ERROR(check_matmul(a, &d));
  const bool ta = d.trans_a, tb = d.trans_b;
  const float alpha = d.alpha, beta = d.beta;
  if (d.M == 0 || d.N == 0) return Status::OK();
  const Tensor& A = a.in(0);
  const Tensor& B = a.in(1);
  const Tensor& C = a.out(0);
  // Row strides in elements; a 3-D A or C is contiguous.
  const GemmMatrix ga{A.data, A.dtype, A.ndim == 2 ? A.strides[0] : d.K};
  const GemmMatrix gb{B.data, B.dtype, B.strides[0]};
  const GemmMatrix gc{C.data, C.dtype, C.ndim == 2 ? C.strides[0] : d.N};
  const void* bias = a.has_in(2) ? a.in(2).data : nullptr;
  const DType bias_dtype = a.has_in(2) ? a.in(2).dtype : DType::kF32;
  // A few rows of x against an [N, K] weight (a decode step's linear layers): streamed by gemv.
  if (can_gemv(ta, tb, d.M, d.N, d.K, ga, gb)) {
    return gemv("matmul", d.M, d.N, d.K, alpha, ga, gb, beta, gc, bias, bias_dtype);
  }
  return gemm_rowmajor("matmul", C.device.index, ta, tb, d.M, d.N, d.K, alpha, ga, gb, beta, gc, bias, bias_dtype);
}

// ---- lm_head_ce: row kernels ----------------------------------------------------------------

constexpr int kRowThreads = 256;
constexpr int kWarps = kRowThreads / 32;
// Logits per row block: 128 MiB of f32, 8192 rows at chunk 4096. Large enough that each GEMM
// fills the GPU, small enough to sit beside a model's activations.
constexpr int64_t kLogitsElems = int64_t{1} << 25;
constexpr int64_t kMinRows = 16;
constexpr int64_t kLdAlign = 8;  // logits / dlogits row stride in elements: 16-byte rows for the GEMMs

// Fold (m2, s2) into the online logsumexp state (m, s): s = sum exp(z - m).
__device__ __forceinline__ void lse_merge(float& m, float& s, float m2, float s2) {
  const float mn = fmaxf(m, m2);
  if (mn == -INFINITY) return;  // both empty: exp(-inf - -inf) would be NaN
  s = s * expf(m - mn) + s2 * expf(m2 - mn);
  m = mn;
}

__device__ __forceinline__ float capped(float z, float cap, float inv_cap) {
  return cap > 0.0f ? cap * tanhf(z * inv_cap) : z;
}

// Online logsumexp plus the sum of logits over one chunk of one row; row (state) index n.
__global__ void ce_fwd_chunk_kernel(const float* logits, int64_t ldl, int64_t vc, int64_t v0, const int32_t* tgt,
                                    int64_t row0, int64_t ignore, float cap, float* m_st, float* s_st, float* zt_st,
                                    float* zsum_st) {
  const int64_t n = row0 + blockIdx.x;
  const int64_t t = tgt[n];
  if (t == ignore) return;  // the whole block leaves, before any barrier
  const float* z = logits + int64_t(blockIdx.x) * ldl;
  const float inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
  float m = -INFINITY, s = 0.0f, zs = 0.0f;
  for (int64_t i = threadIdx.x; i < vc; i += kRowThreads) {
    const float x = capped(z[i], cap, inv_cap);
    zs += x;
    if (x > m) {
      s = s * expf(m - x) + 1.0f;
      m = x;
    } else if (x != -INFINITY) {  // adds 0 anyway; skipping keeps m = -inf from making NaN
      s += expf(x - m);
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
    const float s2 = __shfl_xor_sync(0xffffffffu, s, o);
    zs += __shfl_xor_sync(0xffffffffu, zs, o);
    lse_merge(m, s, m2, s2);
  }
  __shared__ float sh_m[kWarps], sh_s[kWarps], sh_z[kWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    sh_m[warp] = m;
    sh_s[warp] = s;
    sh_z[warp] = zs;
  }
  __syncthreads();
  if (warp != 0) return;
  m = lane < kWarps ? sh_m[lane] : -INFINITY;
  s = lane < kWarps ? sh_s[lane] : 0.0f;
  zs = lane < kWarps ? sh_z[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
    const float s2 = __shfl_xor_sync(0xffffffffu, s, o);
    zs += __shfl_xor_sync(0xffffffffu, zs, o);
    lse_merge(m, s, m2, s2);
  }
  if (lane != 0) return;
  // Chunks of one row are processed in order by successive launches: no race on the state.
  float M = m_st[n], S = s_st[n];
  lse_merge(M, S, m, s);
  m_st[n] = M;
  s_st[n] = S;
  zsum_st[n] += zs;
  const int64_t j = t - v0;
  if (j >= 0 && j < vc) zt_st[n] = capped(z[j], cap, inv_cap);
}

__global__ void ce_fwd_init_kernel(float* m, float* s, float* zt, float* zsum, int64_t n_rows) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_rows; i += int64_t(gridDim.x) * blockDim.x) {
    m[i] = -INFINITY;
    s[i] = 0.0f;
    zt[i] = 0.0f;
    zsum[i] = 0.0f;
  }
}

// loss = lse - (1 - eps) z_t - eps mean_v z_v; ignored rows 0, out-of-range targets NaN.
__global__ void ce_fwd_finish_kernel(const int32_t* tgt, int64_t n_rows, int64_t V, int64_t ignore, float eps,
                                     const float* m, const float* s, const float* zt, const float* zsum, float* loss,
                                     float* lse) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_rows; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = tgt[i];
    if (t == ignore) {
      loss[i] = 0.0f;
      lse[i] = 0.0f;
    } else if (t < 0 || t >= V) {
      loss[i] = NAN;
      lse[i] = NAN;
    } else {
      const float l = m[i] + logf(s[i]);
      lse[i] = l;
      loss[i] = l - (1.0f - eps) * zt[i] - eps * zsum[i] / static_cast<float>(V);
    }
  }
}

// dz = dloss (softmax(z) - (1 - eps) onehot(t) - eps / V) (times 1 - tanh^2 under a softcap),
// from raw chunk logits; 0 on ignored rows. dz may alias logits (same element, same thread).
template <typename TD>
__global__ void ce_grad_kernel(const float* logits, int64_t ldl, TD* dz, int64_t ldz, int64_t vc, int64_t v0,
                               int64_t V, const int32_t* tgt, const float* lse, const float* dloss, int64_t row0,
                               int64_t ignore, float eps, float cap) {
  const int64_t n = row0 + blockIdx.x;
  const int64_t t = tgt[n];
  const float* z = logits + int64_t(blockIdx.x) * ldl;
  TD* d = dz + int64_t(blockIdx.x) * ldz;
  if (t == ignore) {
    for (int64_t i = threadIdx.x; i < vc; i += kRowThreads) d[i] = st<TD>(0.0f);
    return;
  }
  const bool bad = t < 0 || t >= V;
  const float l = lse[n], dl = dloss[n];
  const float eps_v = eps / static_cast<float>(V);
  const float inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
  const int64_t j = t - v0;
  for (int64_t i = threadIdx.x; i < vc; i += kRowThreads) {
    float x = z[i], g = 1.0f;
    if (cap > 0.0f) {
      const float th = tanhf(x * inv_cap);
      x = cap * th;
      g = 1.0f - th * th;
    }
    float p = expf(x - l) - eps_v;
    if (i == j) p -= 1.0f - eps;
    d[i] = st<TD>(bad ? NAN : dl * p * g);
  }
}

// ---- lm_head_ce: ops ------------------------------------------------------------------------

// Scratch from the caching allocator; `keep` holds it until the op returns (stream-ordered reuse).
Status scratch(const Device& dev, int64_t elems, DType dt, std::shared_ptr<void>* keep, void** out) {
  SG_RETURN_IF_ERROR(allocate(dev, static_cast<size_t>(std::max<int64_t>(elems, 1)) * dtype_size(dt), keep));
  *out = keep->get();
  return Status::OK();
}

// Row `r` of a contiguous [rows, C] tensor as a GEMM operand.
GemmMatrix rows_of(const Tensor& t, int64_t r) {
  const int64_t c = t.shape[1];
  return GemmMatrix{static_cast<const char*>(t.data) + r * c * static_cast<int64_t>(dtype_size(t.dtype)), t.dtype, c};
}

// The row-block size: as many rows as fit kLogitsElems of logits with row stride ldl.
int64_t row_block(int64_t N, int64_t ldl) { return std::min(N, std::max(kMinRows, kLogitsElems / ldl)); }

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

Status lm_head_ce_fwd(const OpArgs& a) {
  const char* op = "lm_head_ce_fwd";
  const Tensor& h = a.in(0);
  const Tensor& W = a.in(1);
  const Tensor& targets = a.in(2);
  const Tensor& loss = a.out(0);
  const Tensor& lse = a.out(1);
  LmHeadCeArgs at;
  SG_RETURN_IF_ERROR(check_lm_head_ce_fwd(a, &at));
  const int64_t N = at.N, C = at.C, V = at.V;
  if (N == 0) return Status::OK();
  const Device dev = h.device;
  const int32_t* tgt = targets.ptr<int32_t>();

  std::shared_ptr<void> st_keep, l_keep;
  void* st_p = nullptr;
  SG_RETURN_IF_ERROR(scratch(dev, 4 * N, DType::kF32, &st_keep, &st_p));
  float* m = static_cast<float*>(st_p);
  float *s = m + N, *zt = m + 2 * N, *zsum = m + 3 * N;
  const int init_grid = static_cast<int>(std::min<int64_t>(blocks_for(N, kRowThreads), 1 << 16));
  ce_fwd_init_kernel<<<init_grid, kRowThreads, 0, current_stream()>>>(m, s, zt, zsum, N);
  SG_CUDA_CHECK_LAUNCH();

  if (V > 0) {
    const int64_t Vc = std::min(at.chunk, V);
    const int64_t ldl = round_up(Vc, kLdAlign);
    const int64_t RB = row_block(N, ldl);
    void* l_p = nullptr;
    SG_RETURN_IF_ERROR(scratch(dev, RB * ldl, DType::kF32, &l_keep, &l_p));
    float* logits = static_cast<float*>(l_p);
    for (int64_t v0 = 0; v0 < V; v0 += Vc) {
      const int64_t vc = std::min(Vc, V - v0);
      for (int64_t b0 = 0; b0 < N; b0 += RB) {
        const int64_t rb = std::min(RB, N - b0);
        SG_RETURN_IF_ERROR(gemm_rowmajor(op, dev.index, false, true, rb, vc, C, 1.0f, rows_of(h, b0),
                                         rows_of(W, v0), 0.0f, GemmMatrix{logits, DType::kF32, ldl}));
        ce_fwd_chunk_kernel<<<static_cast<unsigned>(rb), kRowThreads, 0, current_stream()>>>(logits, ldl, vc, v0, tgt, b0, at.ignore_index,
                                                                       at.cap, m, s, zt, zsum);
        SG_CUDA_CHECK_LAUNCH();
      }
    }
  }
  ce_fwd_finish_kernel<<<init_grid, kRowThreads, 0, current_stream()>>>(tgt, N, V, at.ignore_index, at.eps, m, s, zt, zsum,
                                                   loss.ptr<float>(), lse.ptr<float>());
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

Status lm_head_ce_bwd(const OpArgs& a) {
  const char* op = "lm_head_ce_bwd";
  const Tensor& h = a.in(0);
  const Tensor& W = a.in(1);
  const Tensor& targets = a.in(2);
  const Tensor& lse = a.in(3);
  const Tensor& dloss = a.in(4);
  const Tensor& dh = a.out(0);
  LmHeadCeArgs at;
  SG_RETURN_IF_ERROR(check_lm_head_ce_bwd(a, &at));
  const bool has_dw = at.dW != nullptr;
  const int64_t N = at.N, C = at.C, V = at.V;
  const bool accumulate = at.accumulate;
  if (N == 0 || V == 0) {
    // No logits: dh is zero and dW is empty (V == 0) or untouched by zero rows.
    SG_RETURN_IF_ERROR(fill_zero(dh));
    if (has_dw && !accumulate) SG_RETURN_IF_ERROR(fill_zero(a.out(1)));
    return Status::OK();
  }
  const Device dev = h.device;
  const int32_t* tgt = targets.ptr<int32_t>();

  const int64_t Vc = std::min(at.chunk, V);
  const int64_t ldl = round_up(Vc, kLdAlign);
  const int64_t RB = row_block(N, ldl);
  const bool one_chunk = Vc == V, one_block = RB == N;
  // dlogits go into the GEMMs in h / W's dtype (bf16 tensor cores); a mixed pair takes f32.
  const DType gd = h.dtype == W.dtype ? h.dtype : DType::kF32;

  std::shared_ptr<void> l_keep, dz_keep, dh_keep, dw_keep;
  void *l_p = nullptr, *dz_p = nullptr;
  SG_RETURN_IF_ERROR(scratch(dev, RB * ldl, DType::kF32, &l_keep, &l_p));
  if (gd == DType::kF32) dz_p = l_p;  // dlogits overwrite the logits in place
  else SG_RETURN_IF_ERROR(scratch(dev, RB * ldl, gd, &dz_keep, &dz_p));
  float* logits = static_cast<float*>(l_p);
  const GemmMatrix dz{dz_p, gd, ldl};

  // dh sums over vocab chunks: straight into dh when it is f32 (or there is one chunk, one
  // rounding either way), else in an f32 [N, C] buffer rounded once at the end.
  const bool dh_direct = dh.dtype == DType::kF32 || one_chunk;
  void* dh_acc = dh.data;
  if (!dh_direct) SG_RETURN_IF_ERROR(scratch(dev, N * C, DType::kF32, &dh_keep, &dh_acc));
  const Tensor dh_sum = dh_direct ? dh : Tensor::view_of(dh_acc, DType::kF32, {N, C}, dev);
  // dW chunk sums over row blocks: straight into dW when f32 or a single block, else in an f32
  // [chunk, C] buffer that is stored (or added, with accumulate) once per chunk.
  const bool dw_direct = has_dw && (a.out(1).dtype == DType::kF32 || one_block);
  void* dw_buf = nullptr;
  if (has_dw && !dw_direct) SG_RETURN_IF_ERROR(scratch(dev, Vc * C, DType::kF32, &dw_keep, &dw_buf));

  for (int64_t v0 = 0; v0 < V; v0 += Vc) {
    const int64_t vc = std::min(Vc, V - v0);
    const GemmMatrix w_chunk = rows_of(W, v0);
    for (int64_t b0 = 0; b0 < N; b0 += RB) {
      const int64_t rb = std::min(RB, N - b0);
      const GemmMatrix h_block = rows_of(h, b0);
      SG_RETURN_IF_ERROR(gemm_rowmajor(op, dev.index, false, true, rb, vc, C, 1.0f, h_block, w_chunk, 0.0f,
                                       GemmMatrix{logits, DType::kF32, ldl}));
      SG_CUDA_DISPATCH_FLOAT(op, gd, TD, {
        ce_grad_kernel<TD><<<static_cast<unsigned>(rb), kRowThreads, 0, current_stream()>>>(
            logits, ldl, static_cast<TD*>(dz_p), ldl, vc, v0, V, tgt, lse.ptr<float>(), dloss.ptr<float>(), b0,
            at.ignore_index, at.eps, at.cap);
      });
      SG_CUDA_CHECK_LAUNCH();
      // dh[rows] (+)= dz @ W_chunk: overwritten by the first chunk.
      SG_RETURN_IF_ERROR(gemm_rowmajor(op, dev.index, false, false, rb, C, vc, 1.0f, dz, w_chunk,
                                       v0 == 0 ? 0.0f : 1.0f, rows_of(dh_sum, b0)));
      if (!has_dw) continue;
      // dW[chunk] (+)= dz^T @ h[rows]: the first block overwrites unless accumulate adds to dW itself.
      if (dw_direct) {
        const float beta = (b0 == 0 && !accumulate) ? 0.0f : 1.0f;
        SG_RETURN_IF_ERROR(gemm_rowmajor(op, dev.index, true, false, vc, C, rb, 1.0f, dz, h_block, beta,
                                         rows_of(a.out(1), v0)));
      } else {
        SG_RETURN_IF_ERROR(gemm_rowmajor(op, dev.index, true, false, vc, C, rb, 1.0f, dz, h_block,
                                         b0 == 0 ? 0.0f : 1.0f, GemmMatrix{dw_buf, DType::kF32, C}));
      }
    }
    if (has_dw && !dw_direct) {
      SG_RETURN_IF_ERROR(cast_matrix(op, GemmMatrix{dw_buf, DType::kF32, C}, rows_of(a.out(1), v0), vc, C, accumulate));
    }
  }
  if (!dh_direct) SG_RETURN_IF_ERROR(cast_matrix(op, GemmMatrix{dh_acc, DType::kF32, C}, rows_of(dh, 0), N, C));
  return Status::OK();
}

}  // namespace

void register_cuda_matmul(OpRegistry& reg) {
  add_op(reg, "matmul", matmul);
  add_op(reg, "lm_head_ce_fwd", lm_head_ce_fwd);
  add_op(reg, "lm_head_ce_bwd", lm_head_ce_bwd);
}

}  // namespace surogate::cuda
