// The decode matmul y[M, N] = alpha x[M, K] W[N, K]^T + beta y + bias[N] for M <= 16 rows of x
// (tokens of a decode step), bf16 / f16 operands, f32 accumulation: pure weight streaming, which
// cuBLASLt's tiled kernels do at a fraction of the memory bandwidth for these shapes.
//
// Shape letters: M rows of x (tokens), N rows of W (output features), K the inner dim.
//
// Design. Each CTA owns 8 rows of W and splits K among its warps; each lane streams 16-byte
// vectors of W (8 values) with L1-bypassing loads, kU of them in flight per step, and the warp
// multiplies them with mma.sync m16n8k16 (f32 accumulate): x is the A operand (M <= 16 token
// rows, the rest zero) and W^T the B operand (the CTA's 8 rows as the 8 columns). The tensor
// cores make the cost per weight byte the same for any M up to 16, where f32 FMAs would be
// compute-bound past M ~ 8. x is read straight from global memory through L1, where it stays:
// every CTA reads the same x, and W's loads do not allocate in L1.
//
// The mma's k order is free (a dot product over k), so a lane's 16-byte vector serves as its
// fragments directly, with no shuffles or shared memory. Fragments (g = lane / 4, t = lane % 4),
// two 16-bit values per 32-bit register, as in attention_flash.cu:
//   A (16 x 16): a0 = A[g][2t, 2t+1], a1 = A[g+8][2t, 2t+1], a2 = A[g][2t+8, 2t+9], a3 = A[g+8][2t+8, 2t+9]
//   B (16 x 8):  b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g]
//   C (16 x 8):  c0, c1 = C[g][2t, 2t+1], c2, c3 = C[g+8][2t, 2t+1]
// A "slab" is 32 consecutive k (four vectors); in slab s, lane (g, t) loads vector 4s + t of W row
// g and of x rows g and g + 8 (words w0..w3, xa0..xa3, xb0..xb3) and runs two mmas: logical k
// {2t, 2t+1, 2t+8, 2t+9} are its words {0, 1} in the first and {2, 3} in the second, the same
// physical k in A and in B. So b = (w0, w1), a = (xa0, xb0, xa1, xb1), then b = (w2, w3),
// a = (xa2, xb2, xa3, xb3); the C fragment is y[g][n0 + 2t, +1] and y[g + 8][n0 + 2t, +1].
// Edges: vectors past K are zeros in both operands (in every lane of that t), rows of x past M
// are zeros, and rows of W past N re-read row N - 1 into columns of C that are never stored.
//
// Warps: warp w takes slabs [w kU, w kU + kU) of each step of nw kU slabs, nw = ceil(slabs / kU)
// up to kMaxWarps, so K <= nw kU 32 (4096 at M <= 8, where kU = 8; 2048 above) is one step with
// the whole CTA's loads in flight at once. The warps' partial C fragments are summed in shared
// memory in warp order (deterministic), and warp 0 applies alpha, beta and the bias and stores
// in C's dtype. A CTA reads 8 rows of W, so N = 1024 is 128 CTAs, about one per SM of an H100:
// small weights are one DRAM round trip of the whole matrix.
#include "cuda/gemv.h"

#include <algorithm>
#include <cstdlib>
#include <type_traits>

#include "cuda/common.cuh"

namespace surogate::cuda {

namespace {

constexpr int kRows = 8;         // rows of W per CTA: the mma's n
constexpr int kMaxM = 16;        // rows of x: the mma's m
constexpr int kVec = 8;          // 16-bit values per 16-byte vector
constexpr int kSlabK = 4 * kVec; // k per slab: four lanes of one W row, one vector each
// Slabs per warp per step, the 16-byte W loads in flight per lane: 8, or 4 when x rows 8..15 are
// loaded too (12 registers per slab in flight; 8 would spill at 512 threads' 128 registers).
__host__ __device__ constexpr int slabs_per_step(bool high) { return high ? 4 : 8; }
constexpr int kMaxWarps = 16;

struct GemvParams {
  const void* x;
  const void* w;
  void* y;
  const void* bias;
  int64_t M, N, K;
  int64_t ldx, ldw, ldy;  // row strides in elements
  DType y_dtype, bias_dtype;
  float alpha, beta;
};

// 16 bytes of W, read once: no L1 allocation, and a 256-byte L2 prefetch along the row.
__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  return r;
}

// c += A B for one 16 x 8 x 16 tile (layouts in the header).
template <typename T>
__device__ __forceinline__ void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                    uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// Loads and stores through a runtime dtype: the epilogue touches M x 8 values per CTA, so one
// kernel per operand dtype serves every y / bias dtype.
__device__ __forceinline__ float load_as(const void* p, DType dt, int64_t i) {
  switch (dt) {
    case DType::kBF16: return ld(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::kF16: return ld(static_cast<const __half*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ void store_as(void* p, DType dt, int64_t i, float v) {
  switch (dt) {
    case DType::kBF16: static_cast<__nv_bfloat16*>(p)[i] = st<__nv_bfloat16>(v); break;
    case DType::kF16: static_cast<__half*>(p)[i] = st<__half>(v); break;
    default: static_cast<float*>(p)[i] = v; break;
  }
}

// kHigh: M > 8, x rows 8..15 are loaded (the A fragment's upper half); else they are zeros.
template <typename T, bool kHigh>
__global__ void __launch_bounds__(kMaxWarps * 32) gemv_kernel(GemvParams p) {
  constexpr int kU = slabs_per_step(kHigh);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int nw = blockDim.x / 32;
  const int64_t n0 = int64_t{blockIdx.x} * kRows;
  const int64_t kv = p.K / kVec;  // vectors per row
  const bool lo_ok = g < p.M, hi_ok = kHigh && g + 8 < p.M;
  // Rows past N read row N - 1 and rows past M read row 0: mapped memory whose products land
  // only in columns / rows of C that are never stored (the mma keeps them apart).
  const T* w = static_cast<const T*>(p.w) + (n0 + g < p.N ? n0 + g : p.N - 1) * p.ldw;
  const T* xlo = static_cast<const T*>(p.x) + (lo_ok ? g : 0) * p.ldx;
  const T* xhi = static_cast<const T*>(p.x) + (hi_ok ? g + 8 : 0) * p.ldx;

  float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  uint4 wv[kU], xa[kU], xb[kU];
  const uint4 zero = make_uint4(0, 0, 0, 0);
  // One step's loads, all issued before any is used. A step inside the row (every step but a
  // ragged last one; uniform across the warp) loads W unconditionally at fixed offsets from one
  // pointer. In the last one, vectors past K read the row's last vector and are zeroed in both
  // operands: garbage times zero could still be NaN.
  auto load = [&](int64_t s0) {
    const int64_t v0 = s0 * 4 + t;
    if ((s0 + kU) * 4 <= kv) {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int64_t v = v0 + 4 * u;
        wv[u] = ld_stream(w + v * kVec);
        xa[u] = lo_ok ? __ldg(reinterpret_cast<const uint4*>(xlo + v * kVec)) : zero;
        xb[u] = hi_ok ? __ldg(reinterpret_cast<const uint4*>(xhi + v * kVec)) : zero;
      }
      return;
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t v = v0 + 4 * u;
      const bool k_ok = v < kv;
      wv[u] = ld_stream(w + (k_ok ? v : kv - 1) * kVec);
      if (!k_ok) wv[u] = zero;
      xa[u] = lo_ok && k_ok ? __ldg(reinterpret_cast<const uint4*>(xlo + v * kVec)) : zero;
      xb[u] = hi_ok && k_ok ? __ldg(reinterpret_cast<const uint4*>(xhi + v * kVec)) : zero;
    }
  };
  // The next step's loads sit at the end of the loop body, a block apart from the mmas that use
  // them: in one block ptxas sinks each load down to its mma and only one is in flight at a time.
  // s0 is uniform across the warp: every lane reaches every mma.
  const int64_t slabs = (kv + 3) / 4, step = int64_t{nw} * kU;
  int64_t s0 = int64_t{warp} * kU;
  if (s0 < slabs) load(s0);
  while (s0 < slabs) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      mma<T>(c, xa[u].x, xb[u].x, xa[u].y, xb[u].y, wv[u].x, wv[u].y);
      mma<T>(c, xa[u].z, xb[u].z, xa[u].w, xb[u].w, wv[u].z, wv[u].w);
    }
    s0 += step;
    if (s0 < slabs) load(s0);
  }

  if (nw > 1) {  // uniform across the CTA: every thread reaches the barrier
    __shared__ float part[kMaxWarps - 1][4][32];
    if (warp > 0) {
#pragma unroll
      for (int i = 0; i < 4; ++i) part[warp - 1][i][lane] = c[i];
    }
    __syncthreads();
    if (warp > 0) return;
    for (int k = 0; k < nw - 1; ++k) {
#pragma unroll
      for (int i = 0; i < 4; ++i) c[i] += part[k][i][lane];
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t m = g + (i >= 2 ? 8 : 0);
    const int64_t n = n0 + 2 * t + (i & 1);
    if (m >= p.M || n >= p.N) continue;
    const int64_t at = m * p.ldy + n;
    float v = p.alpha * c[i];
    if (p.beta != 0.0f) v += p.beta * load_as(p.y, p.y_dtype, at);
    if (p.bias) v += load_as(p.bias, p.bias_dtype, n);
    store_as(p.y, p.y_dtype, at, v);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// can_gemv without the environment switch.
bool fits(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const GemmMatrix& A, const GemmMatrix& B) {
  const bool half = A.dtype == DType::kBF16 || A.dtype == DType::kF16;
  return !ta && tb && M >= 1 && M <= kMaxM && N >= 1 && N / kRows < (int64_t{1} << 31) - 1 && K >= kVec &&
         K % kVec == 0 && half && B.dtype == A.dtype && A.ld % kVec == 0 && B.ld % kVec == 0 && aligned16(A.ptr) &&
         aligned16(B.ptr);
}

template <typename T, bool kHigh>
void launch(const GemvParams& p) {
  constexpr int kU = slabs_per_step(kHigh);
  const int64_t slabs = (p.K + kSlabK - 1) / kSlabK;
  const int warps = static_cast<int>(std::clamp<int64_t>((slabs + kU - 1) / kU, 1, kMaxWarps));
  const dim3 grid(static_cast<unsigned>((p.N + kRows - 1) / kRows));
  gemv_kernel<T, kHigh><<<grid, warps * 32, 0, current_stream()>>>(p);
}

}  // namespace

bool can_gemv(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const GemmMatrix& A, const GemmMatrix& B) {
  static const bool off = [] {
    const char* e = std::getenv("SUROGATE_NO_GEMV");
    return e && *e && *e != '0';
  }();
  return !off && fits(ta, tb, M, N, K, A, B);
}

Status gemv(const char* op, int64_t M, int64_t N, int64_t K, float alpha, const GemmMatrix& A, const GemmMatrix& B,
            float beta, const GemmMatrix& C, const void* bias, DType bias_dtype) {
  SG_CHECK(fits(false, true, M, N, K, A, B), StatusCode::kInternal,
           str_cat(op, ": gemv called on a matmul it does not take (M=", M, ", K=", K, ", ", dtype_name(A.dtype),
                   " x ", dtype_name(B.dtype), ")"),
           "call gemv only where can_gemv is true");
  const GemvParams p{A.ptr,  B.ptr,  const_cast<void*>(C.ptr), bias,       M,     N,   K,
                     A.ld,   B.ld,   C.ld,                     C.dtype,    bias ? bias_dtype : DType::kF32,
                     alpha,  beta};
  if (A.dtype == DType::kBF16) {
    if (M > 8) launch<__nv_bfloat16, true>(p);
    else launch<__nv_bfloat16, false>(p);
  } else {
    if (M > 8) launch<__half, true>(p);
    else launch<__half, false>(p);
  }
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

}  // namespace surogate::cuda
