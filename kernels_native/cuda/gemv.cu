// The decode matmul y[M, N] = alpha x[M, K] W[N, K]^T + beta y + bias[N] for M <= 16 rows of x
// (tokens of a decode step), bf16 / f16 operands, f32 accumulation: pure weight streaming, which
// cuBLASLt's tiled kernels do at a fraction of the memory bandwidth for these shapes.
//
// Shape letters: M rows of x (tokens), N rows of W (output features), K the inner dim.
//
// The mma. A warp multiplies 8 rows of W at a time with mma.sync m16n8k16 (f32 accumulate): x is
// the A operand (M <= 16 token rows, the rest zero) and W^T the B operand (the 8 rows as the 8
// columns). The tensor cores make the cost per weight byte the same for any M up to 16, where f32
// FMAs would be compute-bound past M ~ 8. Each lane streams 16-byte vectors of W (8 values) with
// L1-bypassing loads. The mma's k order is free (a dot product over k), so a lane's 16-byte vector
// serves as its fragments directly, with no shuffles or shared memory. Fragments (g = lane / 4,
// t = lane % 4), two 16-bit values per 32-bit register, as in attention_flash.cu:
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
// The mmas go round 4 accumulators (2 at M > 8, for registers), summed in a fixed order: one
// chain of 16 dependent mmas adds ~0.25 us to a tile once its data is in, paid in full by a
// matrix that is one round trip.
//
// Work. A tile is 8 rows of W; a chunk is kS slabs (the loads a lane has in flight at once). A
// CTA of nw warps works on one tile at a time, warp w on its chunks w, w + nw, ... The warps'
// partial C fragments meet in shared memory (two buffers by tile parity: one barrier per tile),
// summed in warp order (deterministic), and thread e finishes C register e / 32 of lane e % 32:
// alpha, beta y, bias, stored in C's dtype. A warp issues the loads of its next chunk, in this
// tile or the next, right after the mmas of the current one, ahead of the barrier and the
// epilogue, so it has loads in flight across tiles. Two regimes by K:
//   resident x, K <= 16 x 8 slabs (4096): kS = 8 and one chunk per warp (nw = chunks); the warp's
//     x fragments are loaded once per CTA and stay in registers, so only W is streamed, and all of
//     a tile's loads (16 KB at K = 1024) are one round trip. x takes a register quad per mma at
//     any M (the A fragment's zero half at M <= 8 is registers too), so 8 slabs are ~122-127
//     registers: 4 CTAs of 4 warps per SM at K = 1024, 64 KB of loads in flight.
//   streamed x, longer K: up to 16 warps of ceil(chunks / 16) chunks each, x re-read with every
//     chunk through L1, where it stays (every CTA reads the same x; W's loads do not allocate in
//     L1); kS = 4 at M > 8, where x rows 8..15 would not fit beside 8 slabs of loads.
// The grid is persistent: CTA b takes tiles b, b + G, b + 2G, ..., where G is the resident CTAs
// (occupancy x SMs), lowered until every CTA has the same number of tiles. A weight of more tiles
// than that streams without a second wave or a tail (gate_up's 768 tiles on 528 slots are 384
// CTAs of two tiles, not 528 CTAs and a wave of 240), and one of fewer tiles (N = 1024 is 128
// tiles, about one per SM of an H100) is one round trip of the whole matrix.
//
// Fused prologues (GemvX, cuda/fused_matmul.cu's serving fusions; resident x only). x is made from
// the fused op's inputs once per CTA: each warp stages its chunk of x (its 32 vectors of every row
// < M) in shared memory, lane l making vector l of each row, and then loads its fragments from
// there instead of from global memory. Making the fragments in place would cost every lane 8
// vectors (16 at M > 8) at any M, as a lane holds rows g and g + 8 whether they exist or not;
// staging costs M vectors per lane, 8 times less at M = 1 (single-stream decode). A warp issues
// its first tile's W loads before the prologue, so they are in flight while it computes.
// kRmsNorm needs every row's sum of squares over all of K: the warps' partial sums meet in shared
// memory (two CTA barriers, summed in warp order: deterministic) before each warp scales its
// stage. Every CTA makes h = x + residual for itself; CTA 0 alone stores it.
// (Past 400 lines: the prologues are template flags of the one kernel, not a second kernel, so
// they live beside it.)
#include "cuda/gemv.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/gated_act.cuh"

namespace surogate::cuda {

namespace {

constexpr int kRows = 8;          // rows of W per tile: the mma's n
constexpr int kMaxM = 16;         // rows of x: the mma's m
constexpr int kVec = 8;           // 16-bit values per 16-byte vector
constexpr int kSlabK = 4 * kVec;  // k per slab: four lanes of one W row, one vector each
constexpr int kMaxWarps = 16;     // per CTA

// Slabs per chunk, the 16-byte W loads in flight per lane: 8, or 4 for streamed x at M > 8, whose
// loads of x rows 8..15 in flight beside 8 slabs of W would not fit the 128 registers that 512
// threads leave.
__host__ __device__ constexpr int chunk_slabs(bool high, bool res) { return high && !res ? 4 : 8; }
// C fragment registers that can hold a row < M: c0, c1 (row g), and c2, c3 (row g + 8) at M > 8.
__host__ __device__ constexpr int live_regs(bool high) { return high ? 4 : 2; }
// Accumulators per lane, independent mma chains: 4, or 2 at M > 8 (4 would spill beside resident x).
__host__ __device__ constexpr int acc_chains(bool high) { return high ? 2 : 4; }

struct GemvParams {
  const void* x;
  const void* w;
  void* y;
  const void* bias;
  int M, N, K;            // fits() keeps N and K below 2^30
  int64_t ldx, ldw, ldy;  // row strides in elements
  DType y_dtype, bias_dtype;
  float alpha, beta;
};

// A fused launch's parameters (GemvPrologue): x is gu for kSilu / kGeluTanh; kRmsNorm reads res
// (may be null) and norm_w, and stores h (may be null) from CTA 0. The plain kernels take
// GemvParams alone: a larger parameter block changes their register allocation.
struct FusedParams : GemvParams {
  const void* res;
  const void* norm_w;
  void* h;
  int64_t ldr, ldh;
  DType norm_w_dtype;
  float eps, w_offset;
};

template <GemvX kX>
using ParamsFor = std::conditional_t<kX == GemvX::kPlain, GemvParams, FusedParams>;

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

// Dynamic shared memory of a launch: the warps' partial C by tile parity, and with a prologue their
// x stages ([nw][M][32] vectors) and, for kRmsNorm, the sums of squares ([nw][M] + [M] floats).
constexpr size_t smem_bytes(GemvX x, bool high, int nw, int M) {
  size_t b = sizeof(float) * 2 * nw * live_regs(high) * 32;
  if (x != GemvX::kPlain) b += sizeof(uint4) * nw * M * 32;
  if (x == GemvX::kRmsNorm) b += sizeof(float) * (nw * M + M);
  return b;
}

// A fused prologue (see the header): this warp's chunk of x, vectors [32 warp, 32 warp + 32) of
// every row < M (the chunk of resident x, 8 slabs), made from the fused op's inputs into `stage`
// ([M][32] vectors), lane l making vector 32 warp + l of each row; zeros past K. kRmsNorm holds
// two CTA barriers (every warp calls this) and uses `red` ([nw][M] + [M] floats).
template <typename T, GemvX kX>
__device__ __forceinline__ void stage_x(const FusedParams& p, uint4* stage, float* red, int warp, int lane, int nw) {
  static_assert(chunk_slabs(false, true) * 4 == 32 && chunk_slabs(true, true) * 4 == 32, "32 vectors per chunk");
  const int v = warp * 32 + lane;
  const bool v_ok = v < p.K / kVec;
  float f[kVec];
  if constexpr (kX == GemvX::kSilu || kX == GemvX::kGeluTanh) {
    using Act = std::conditional_t<kX == GemvX::kSilu, Silu, GeluTanh>;
    for (int m = 0; m < p.M; ++m) {
      uint4 out = make_uint4(0, 0, 0, 0);
      if (v_ok) {  // gate at column k, up at column K + k: swiglu_fwd / geglu_fwd's two roundings
        const T* gate = static_cast<const T*>(p.x) + m * p.ldx;
        float up[kVec];
        unpack16<T>(__ldg(reinterpret_cast<const uint4*>(gate) + v), f);
        unpack16<T>(__ldg(reinterpret_cast<const uint4*>(gate + p.K) + v), up);
#pragma unroll
        for (int i = 0; i < kVec; ++i) f[i] = rnd<T>(Act::act(f[i])) * up[i];
        out = pack16<T>(f);
      }
      stage[m * 32 + lane] = out;
    }
  } else {
    static_assert(kX == GemvX::kRmsNorm);
    const T* res = static_cast<const T*>(p.res);
    float* ssq = red;              // [nw][M]: this CTA's warps' parts of each row's sum of h^2
    float* rstd = red + nw * p.M;  // [M]
    // h = T(x + residual) (or x) into the stage; CTA 0 also stores it.
    for (int m = 0; m < p.M; ++m) {
      uint4 hv = make_uint4(0, 0, 0, 0);
      float ss = 0.0f;
      if (v_ok) {
        hv = __ldg(reinterpret_cast<const uint4*>(static_cast<const T*>(p.x) + m * p.ldx) + v);
        unpack16<T>(hv, f);
        if (res) {
          float r[kVec];
          unpack16<T>(__ldg(reinterpret_cast<const uint4*>(res + m * p.ldr) + v), r);
#pragma unroll
          for (int i = 0; i < kVec; ++i) f[i] = rnd<T>(f[i] + r[i]);
          hv = pack16<T>(f);
          if (p.h && blockIdx.x == 0) reinterpret_cast<uint4*>(static_cast<T*>(p.h) + m * p.ldh)[v] = hv;
        }
#pragma unroll
        for (int i = 0; i < kVec; ++i) ss += f[i] * f[i];
      }
      stage[m * 32 + lane] = hv;
      for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      if (lane == 0) ssq[warp * p.M + m] = ss;
    }
    __syncthreads();
    if (static_cast<int>(threadIdx.x) < p.M) {
      float ss = 0.0f;
      for (int w = 0; w < nw; ++w) ss += ssq[w * p.M + threadIdx.x];
      rstd[threadIdx.x] = 1.0f / sqrtf(ss / static_cast<float>(p.K) + p.eps);
    }
    __syncthreads();
    if (!v_ok) return;
    // y = T(w T(h rstd)) at weight_offset 0 (LlamaRMSNorm's two roundings), else T(h rstd (w + offset)).
    float wf[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) wf[i] = load_as(p.norm_w, p.norm_w_dtype, int64_t{v} * kVec + i) + p.w_offset;
    const bool round_normed = p.w_offset == 0.0f;
    for (int m = 0; m < p.M; ++m) {
      const float r = rstd[m];
      unpack16<T>(stage[m * 32 + lane], f);
#pragma unroll
      for (int i = 0; i < kVec; ++i) f[i] = round_normed ? wf[i] * rnd<T>(f[i] * r) : f[i] * r * wf[i];
      stage[m * 32 + lane] = pack16<T>(f);
    }
  }
}

// kHigh: M > 8, x rows 8..15 are loaded (the A fragment's upper half); else they are zeros.
// kRes: one chunk per warp (blockDim.x / 32 == chunks), its x held in registers across tiles;
// else x is loaded with every chunk. kX: what x is made of (a prologue needs kRes). Launched with
// at most ceil(N / 8) CTAs and smem_bytes(kX, kHigh, nw, M) of dynamic shared memory. (Without
// the min-blocks hint of 1, ptxas aims at 64 registers and spills.)
template <typename T, bool kHigh, bool kRes, GemvX kX>
__global__ void __launch_bounds__(kMaxWarps * 32, 1) gemv_kernel(ParamsFor<kX> p) {
  static_assert(kRes || kX == GemvX::kPlain, "a prologue runs once per CTA: resident x only");
  constexpr int kS = chunk_slabs(kHigh, kRes), kC = live_regs(kHigh), kAcc = acc_chains(kHigh);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
  const int g = lane / 4, t = lane % 4;
  const int kv = p.K / kVec;  // vectors per row
  const int chunks = (kv + 4 * kS - 1) / (4 * kS), tiles = (p.N + kRows - 1) / kRows;
  // Chunks per warp per tile, the same in every warp (a warp's last ones may be past K): each
  // warp reaches the tile's barrier after the same number of items.
  const int per_tile = kRes ? 1 : (chunks + nw - 1) / nw;
  const bool lo_ok = g < p.M, hi_ok = kHigh && g + 8 < p.M;
  // Rows of x past M read row 0: their products land only in rows of C that are never stored.
  const T* xlo = static_cast<const T*>(p.x) + (lo_ok ? g : 0) * p.ldx;
  const T* xhi = static_cast<const T*>(p.x) + (hi_ok ? g + 8 : 0) * p.ldx;
  extern __shared__ float part[];  // [2][nw][kC][32]: the warps' partial C, by tile parity (then the stages)

  uint4 wv[kS], xa[kS], xb[kS];
  const uint4 zero = make_uint4(0, 0, 0, 0);
  // x of chunk ch: vector 4 (ch kS + u) + t of rows g and g + 8, zeros past K and past M.
  auto load_x = [&](int ch) {
    const int v0 = ch * kS * 4 + t;
    const uint4* lo = reinterpret_cast<const uint4*>(xlo + v0 * kVec);
    const uint4* hi = reinterpret_cast<const uint4*>(xhi + v0 * kVec);
#pragma unroll
    for (int u = 0; u < kS; ++u) {
      const bool k_ok = v0 + 4 * u < kv;
      xa[u] = lo_ok && k_ok ? __ldg(lo + 4 * u) : zero;
      xb[u] = hi_ok && k_ok ? __ldg(hi + 4 * u) : zero;
    }
  };
  // W of chunk ch of a tile; rows past N re-read row N - 1. A chunk inside the row (uniform across
  // the warp) loads unconditionally at fixed offsets from one pointer. In a ragged last one,
  // vectors past K re-read the row's last vector and are zeroed: x is zero there too, but garbage
  // times zero could still be NaN.
  auto load_w = [&](int tile, int ch) {
    const T* row = static_cast<const T*>(p.w) + min(tile * kRows + g, p.N - 1) * p.ldw;
    const int v0 = ch * kS * 4 + t;
    if ((ch + 1) * kS * 4 <= kv) {
      const T* w = row + v0 * kVec;
#pragma unroll
      for (int u = 0; u < kS; ++u) wv[u] = ld_stream(w + 4 * u * kVec);
      return;
    }
#pragma unroll
    for (int u = 0; u < kS; ++u) {
      const int v = v0 + 4 * u;
      wv[u] = ld_stream(row + min(v, kv - 1) * kVec);
      if (v >= kv) wv[u] = zero;
    }
  };

  float acc[kAcc][4];
#pragma unroll
  for (int a = 0; a < kAcc; ++a) acc[a][0] = acc[a][1] = acc[a][2] = acc[a][3] = 0.0f;
  // The current item: chunk warp + j nw of `tile`. The grid gives every CTA a first tile, and
  // nw <= chunks gives every warp a first chunk.
  int tile = blockIdx.x, j = 0, buf = 0;
  if constexpr (kX == GemvX::kPlain) {
    if constexpr (kRes) load_x(warp);
    load_w(tile, warp);
    if constexpr (!kRes) load_x(warp);
  } else {
    load_w(tile, warp);  // in flight while the prologue makes x
    uint4* stage = reinterpret_cast<uint4*>(part + 2 * nw * kC * 32);
    float* red = reinterpret_cast<float*>(stage + nw * p.M * 32);
    stage += warp * p.M * 32;
    stage_x<T, kX>(p, stage, red, warp, lane, nw);
    __syncwarp();
    // load_x's fragments, from the stage: vector 4 u + t of the chunk, rows g and g + 8.
#pragma unroll
    for (int u = 0; u < kS; ++u) {
      xa[u] = lo_ok ? stage[g * 32 + 4 * u + t] : zero;
      xb[u] = hi_ok ? stage[(g + 8) * 32 + 4 * u + t] : zero;
    }
  }
  for (;;) {
    if (kRes || warp + j * nw < chunks) {  // uniform across the warp: every lane reaches every mma
#pragma unroll
      for (int u = 0; u < kS; ++u) {
        mma<T>(acc[(2 * u) % kAcc], xa[u].x, xb[u].x, xa[u].y, xb[u].y, wv[u].x, wv[u].y);
        mma<T>(acc[(2 * u + 1) % kAcc], xa[u].z, xb[u].z, xa[u].w, xb[u].w, wv[u].z, wv[u].w);
      }
    }
    int next = tile;
    if (++j == per_tile) {
      j = 0;
      next += gridDim.x;
    }
    // The next item's loads sit in a block apart from the mmas that use them (in one block ptxas
    // sinks each load down to its mma and only one is in flight at a time), and ahead of the
    // barrier and the epilogue, which they overlap.
    if (next < tiles && (kRes || warp + j * nw < chunks)) {
      load_w(next, warp + j * nw);
      if constexpr (!kRes) load_x(warp + j * nw);
    }
    if (j != 0) {
      tile = next;
      continue;
    }
    // `tile` is done in every warp (per_tile items each): uniform across the CTA from here on.
    float* mine = part + (buf * nw + warp) * kC * 32;
#pragma unroll
    for (int e = 0; e < kC; ++e) {
      float c = acc[0][e];
#pragma unroll
      for (int a = 1; a < kAcc; ++a) c += acc[a][e];
      mine[e * 32 + lane] = c;
    }
#pragma unroll
    for (int a = 0; a < kAcc; ++a) acc[a][0] = acc[a][1] = acc[a][2] = acc[a][3] = 0.0f;
    __syncthreads();  // buffer buf is complete, and every warp is done reading buffer buf ^ 1
    // Thread e finishes C register e / 32 of lane e % 32 (warp i register i, when nw >= kC),
    // summing the warps' partials in warp order.
    const float* all = part + buf * nw * kC * 32;
#pragma unroll 1
    for (int e = threadIdx.x; e < kC * 32; e += blockDim.x) {
      const int i = e / 32, l = e % 32;
      const int m = l / 4 + (i >= 2 ? 8 : 0), n = tile * kRows + 2 * (l % 4) + (i & 1);
      if (m >= p.M || n >= p.N) continue;
      float s = all[e];
      for (int w = 1; w < nw; ++w) s += all[w * kC * 32 + e];
      const int64_t at = m * p.ldy + n;
      float v = p.alpha * s;
      if (p.beta != 0.0f) v += p.beta * load_as(p.y, p.y_dtype, at);
      if (p.bias) v += load_as(p.bias, p.bias_dtype, n);
      store_as(p.y, p.y_dtype, at, v);
    }
    buf ^= 1;
    if (next >= tiles) break;
    tile = next;
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// can_gemv without the environment switch.
bool fits(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const GemmMatrix& A, const GemmMatrix& B) {
  const bool half = A.dtype == DType::kBF16 || A.dtype == DType::kF16;
  // The kernel counts rows, tiles and k in int (N, K < 2^30 leave room for a tile's overhang).
  constexpr int64_t kMaxDim = int64_t{1} << 30;
  return !ta && tb && M >= 1 && M <= kMaxM && N >= 1 && N < kMaxDim && K >= kVec && K < kMaxDim && K % kVec == 0 &&
         half && B.dtype == A.dtype && A.ld % kVec == 0 && B.ld % kVec == 0 && aligned16(A.ptr) && aligned16(B.ptr);
}

// Warps of the resident-x regime: one chunk of 8 slabs each (at most kMaxWarps where it applies).
int64_t resident_warps(int64_t K) {
  constexpr int64_t kChunkK = chunk_slabs(false, true) * kSlabK;
  return (K + kChunkK - 1) / kChunkK;
}

// can_gemv_fused without the environment switch.
bool fits_fused(const GemvPrologue& pro, int64_t M, int64_t N, int64_t K, const GemmMatrix& A, const GemmMatrix& B) {
  if (pro.x == GemvX::kPlain || !fits(false, true, M, N, K, A, B)) return false;
  const int64_t nw = resident_warps(K);
  if (nw > kMaxWarps) return false;
  if (pro.x == GemvX::kRmsNorm) {
    if (!pro.norm_w) return false;
    if (pro.residual && !(aligned16(pro.residual) && pro.ld_residual % kVec == 0)) return false;
    if (pro.h && !(aligned16(pro.h) && pro.ld_h % kVec == 0)) return false;
  }
  int dev = 0, optin = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return smem_bytes(pro.x, M > 8, static_cast<int>(nw), static_cast<int>(M)) <= static_cast<size_t>(optin);
}

// One launch of nw warps per CTA on a persistent grid: the resident CTAs of this kernel and size
// (asked once), lowered until the tiles divide evenly among them.
template <typename T, bool kHigh, bool kRes, GemvX kX>
Status launch(const FusedParams& p, int nw) {
  const auto kernel = gemv_kernel<T, kHigh, kRes, kX>;
  const int threads = nw * 32;
  const size_t smem = smem_bytes(kX, kHigh, nw, p.M);
  int dev = 0, sms = 0;
  SG_CUDA_CHECK(cudaGetDevice(&dev));
  // CTAs per SM, by nw (and by M with a prologue, whose stages grow with M).
  static std::atomic<int> resident[kMaxWarps + 1][kMaxM + 1];
  std::atomic<int>& slot = resident[nw][kX == GemvX::kPlain ? 0 : p.M];
  int per_sm = slot.load(std::memory_order_relaxed);
  if (per_sm == 0) {
    if constexpr (kX != GemvX::kPlain) {
      // Stages past the 48 KiB default: let the kernel have the device's limit (can_gemv_fused
      // kept smem within it), before the occupancy question, which counts smem.
      int optin = 0;
      SG_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
      SG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
    }
    SG_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
    per_sm = std::max(per_sm, 1);
    slot.store(per_sm, std::memory_order_relaxed);
  }
  SG_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int64_t tiles = (p.N + kRows - 1) / kRows, slots = int64_t{per_sm} * std::max(sms, 1);
  const int64_t per_cta = (tiles + slots - 1) / slots;
  const int64_t grid = (tiles + per_cta - 1) / per_cta;
  kernel<<<static_cast<unsigned>(grid), threads, smem, current_stream()>>>(static_cast<const ParamsFor<kX>&>(p));
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

// Resident x where one chunk of 8 slabs per warp covers K (K <= 4096), always with a prologue;
// else the fewest chunks per warp that 16 warps allow, spread over as few warps as that takes.
template <typename T, bool kHigh>
Status dispatch(const FusedParams& p, GemvX x) {
  const int64_t chunks = resident_warps(p.K);
  switch (x) {
    case GemvX::kSilu: return launch<T, kHigh, true, GemvX::kSilu>(p, static_cast<int>(chunks));
    case GemvX::kGeluTanh: return launch<T, kHigh, true, GemvX::kGeluTanh>(p, static_cast<int>(chunks));
    case GemvX::kRmsNorm: return launch<T, kHigh, true, GemvX::kRmsNorm>(p, static_cast<int>(chunks));
    case GemvX::kPlain: break;
  }
  if (chunks <= kMaxWarps) return launch<T, kHigh, true, GemvX::kPlain>(p, static_cast<int>(chunks));
  const int64_t streamed = (p.K + chunk_slabs(kHigh, false) * kSlabK - 1) / (chunk_slabs(kHigh, false) * kSlabK);
  const int64_t per_warp = (streamed + kMaxWarps - 1) / kMaxWarps;
  return launch<T, kHigh, false, GemvX::kPlain>(p, static_cast<int>((streamed + per_warp - 1) / per_warp));
}

bool gemv_off() {
  static const bool off = [] {
    const char* e = std::getenv("SUROGATE_NO_GEMV");
    return e && *e && *e != '0';
  }();
  return off;
}

}  // namespace

bool can_gemv(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const GemmMatrix& A, const GemmMatrix& B) {
  // Big weights stream as fast through cuBLASLt, which wins there as M grows (H200: a 151936 x
  // 1024 LM head 77 vs 84 us at M = 1; a 4096 x 12288 down_proj 27 vs 30 us at M = 1 but 31 vs
  // 30 at M = 8 and 45 vs 28 at M = 16): gemv takes what is latency-bound.
  const int64_t max_elems = M <= 4 ? (int64_t{64} << 20) : (int64_t{24} << 20);
  return !gemv_off() && N * K <= max_elems && fits(ta, tb, M, N, K, A, B);
}

bool can_gemv_fused(const GemvPrologue& pro, int64_t M, int64_t N, int64_t K, const GemmMatrix& A,
                    const GemmMatrix& B) {
  return !gemv_off() && fits_fused(pro, M, N, K, A, B);
}

Status gemv(const char* op, int64_t M, int64_t N, int64_t K, float alpha, const GemmMatrix& A, const GemmMatrix& B,
            float beta, const GemmMatrix& C, const void* bias, DType bias_dtype, const GemvPrologue& pro) {
  const bool ok = pro.x == GemvX::kPlain ? fits(false, true, M, N, K, A, B) : fits_fused(pro, M, N, K, A, B);
  SG_CHECK(ok, StatusCode::kInternal,
           str_cat(op, ": gemv called on a matmul it does not take (M=", M, ", K=", K, ", ", dtype_name(A.dtype),
                   " x ", dtype_name(B.dtype), pro.x == GemvX::kPlain ? ")" : ", with a prologue)"),
           "call gemv only where can_gemv (with a prologue: can_gemv_fused) is true");
  const FusedParams p{{A.ptr, B.ptr, const_cast<void*>(C.ptr), bias, static_cast<int>(M), static_cast<int>(N),
                       static_cast<int>(K), A.ld, B.ld, C.ld, C.dtype, bias ? bias_dtype : DType::kF32, alpha, beta},
                      pro.residual, pro.norm_w, pro.h, pro.ld_residual, pro.ld_h, pro.norm_w_dtype, pro.eps,
                      pro.weight_offset};
  if (A.dtype == DType::kBF16) {
    return M > 8 ? dispatch<__nv_bfloat16, true>(p, pro.x) : dispatch<__nv_bfloat16, false>(p, pro.x);
  }
  return M > 8 ? dispatch<__half, true>(p, pro.x) : dispatch<__half, false>(p, pro.x);
}

}  // namespace surogate::cuda
