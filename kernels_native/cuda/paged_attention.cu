// CUDA kernels: kv_cache_write and paged_attention (serving), the CUDA twins of
// cpu/paged_attention.cpp. The cache layout and both contracts are written down there.
//
// One difference from the CPU ops: the host never reads a device tensor. slot_mapping,
// block_tables, cu_q and context_lens stay on the GPU (a decode step must be capturable in a
// CUDA graph), so only shapes are validated here. Values the CPU op rejects are made harmless
// instead: a slot outside the cache is skipped, a block table entry outside the cache (or past
// a table row) reads as zeros, a query row with no key gets out = 0 and lse = -inf, rows of q
// that cu_q gives to no sequence are left untouched. Duplicate slots leave one writer's row.
//
// paged_attention has two paths.
//   decode (T <= S: at most one query row per sequence on average) with rows of D * element size
//   a multiple of 16 bytes and 16-byte aligned tensors: paged_attention_decode.cu. One CTA per
//   (row, kv head, up to 8 of its query heads, key split) streams the K / V rows of its kv head
//   from the cache in 16-byte vectors, many loads in flight and nothing staged in shared memory,
//   with f32 math in registers; keys are split over CTAs only when rows x kv heads would not give
//   every SM two CTAs, and the last split of a row to finish merges them in the same launch. Its
//   header says the details.
//   everything else (prefill, chunked prefill, odd head dims, and any step with a kv_limit, the
//   per-row key limit of bidirectional spans): the general kernel below.
//
// kv_limit (optional input 7): row i sees keys j <= kv_limit[i] (clamped to [p, context_len - 1],
// the harmless reading of a bad value) instead of j <= p; a CTA's key range ends at the largest
// limit of its rows.
//
// General kernel. A CTA of kWarps warps takes one (sequence, tile of R query rows,
// kv head, chunk of its Gc query heads, key split): M = R * Gc queries, QPW per warp. It walks
// its keys in tiles of 32 positions (one per lane, whatever the block size), staging each
// tile's K and V rows of its kv head in shared memory as f32 once for all M queries (GQA and
// the query rows share them). Per tile, lane t scores key t against the warp's queries (K rows
// padded so that the lanes' float4 reads hit distinct banks, Q broadcast), the online softmax
// keeps (max, sum) per query in registers, and P V gives each lane 32-strided output dims.
//   decode rows the decode path does not take (T <= S): R = 1, the tiles are q's rows (found
//   by binary search in cu_q);
//   prefill: R = 64 / Gc rows (32 / Gc for D > 128, 16 / Gc for D > 256: the f32 Q tile and the
//   per-lane accumulators grow with D), the (sequence, tile) list is a scan of
//   ceil(n_q / R) over the sequences by a one-block kernel.
// When the CTAs would not fill the GPU twice over (decode of few sequences) the key range is
// split over up to 32 CTAs of at least kMinSplitKeys keys each (flash-decoding): each leaves
// (max, sum, accumulator) per query and a second kernel combines them.
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/allocator.h"
#include "cuda/backend.h"
#include "cuda/common.cuh"
#include "cuda/paged_attention_decode.cuh"
#include "cuda/attention_sinks.cuh"
#include "runtime/op_checks_paged_attention.h"

namespace surogate::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kKeyTile = 32;          // keys per step of the online softmax: one per lane
constexpr int kMinSplitKeys = 256;    // a key split reads at least this many keys (a multiple of kKeyTile)
constexpr int kMaxSplits = 32;        // the combine kernel gives each split one lane
constexpr int kMaxHeadDim = 512;      // DCH = 16 dims per lane (Gemma 4's global layers)
constexpr int kScanThreads = 1024;
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// ---- kv_cache_write --------------------------------------------------------------------------

// One block per token: its k and v rows ([Hkv, D], contiguous in both places) copied in units U
// (16 bytes when the sizes and pointers allow).
template <typename U>
__global__ void kv_cache_write_kernel(const U* k, const U* v, const int32_t* slots, U* kc, U* vc, int64_t row_units,
                                      int64_t n_slots) {
  const int64_t i = blockIdx.x;
  const int64_t slot = slots[i];
  if (slot < 0 || slot >= n_slots) return;  // -1: padding; anything else outside the cache: not ours to write
  const U* ks = k + i * row_units;
  const U* vs = v + i * row_units;
  U* kd = kc + slot * row_units;
  U* vd = vc + slot * row_units;
  for (int64_t u = threadIdx.x; u < row_units; u += blockDim.x) {
    kd[u] = ks[u];
    vd[u] = vs[u];
  }
}

template <typename U>
Status launch_kv_cache_write(const Tensor& k, const Tensor& v, const Tensor& sm, const Tensor& kc, const Tensor& vc,
                             int64_t T, size_t row_bytes, int64_t n_slots) {
  const int64_t units = static_cast<int64_t>(row_bytes / sizeof(U));
  const int threads = static_cast<int>(std::min<int64_t>(256, (units + 31) / 32 * 32));
  kv_cache_write_kernel<U><<<static_cast<unsigned>(T), threads, 0, current_stream()>>>(
      static_cast<const U*>(k.data), static_cast<const U*>(v.data), sm.ptr<int32_t>(), static_cast<U*>(kc.data),
      static_cast<U*>(vc.data), units, n_slots);
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

Status kv_cache_write(const OpArgs& a) {
  const char* op = "kv_cache_write";
  const Tensor& k = a.in(0);
  const Tensor& v = a.in(1);
  const Tensor& sm = a.in(2);
  const Tensor& kc = a.out(0);
  const Tensor& vc = a.out(1);
  KvCacheWriteArgs kw;
  SG_RETURN_IF_ERROR(check_kv_cache_write(a, &kw));
  const int64_t T = kw.T, Hkv = kw.Hkv, D = kw.D;
  SG_CHECK_SHAPE(T <= std::numeric_limits<int32_t>::max(),
                 str_cat(op, ": ", T, " tokens in one call is more than the kernel's grid takes"));
  const int64_t n_slots = kc.shape[0] * kc.shape[1];
  const size_t row_bytes = static_cast<size_t>(Hkv * D) * dtype_size(k.dtype);
  if (T == 0 || row_bytes == 0) return Status::OK();

  // The widest copy unit that divides the row and every base address.
  const uintptr_t bits = reinterpret_cast<uintptr_t>(k.data) | reinterpret_cast<uintptr_t>(v.data) |
                         reinterpret_cast<uintptr_t>(kc.data) | reinterpret_cast<uintptr_t>(vc.data) | row_bytes;
  if (bits % 16 == 0) return launch_kv_cache_write<uint4>(k, v, sm, kc, vc, T, row_bytes, n_slots);
  if (bits % 8 == 0) return launch_kv_cache_write<uint2>(k, v, sm, kc, vc, T, row_bytes, n_slots);
  if (bits % 4 == 0) return launch_kv_cache_write<uint32_t>(k, v, sm, kc, vc, T, row_bytes, n_slots);
  return launch_kv_cache_write<uint16_t>(k, v, sm, kc, vc, T, row_bytes, n_slots);
}

// ---- paged_attention -------------------------------------------------------------------------

struct PagedParams {
  const void* q = nullptr;
  const void* kc = nullptr;
  const void* vc = nullptr;
  void* out = nullptr;
  float* lse = nullptr;         // absent: nullptr
  float* part = nullptr;        // split partials [nsplit, T, Hq, D + 2]; nullptr: no split
  const int32_t* bt = nullptr;
  const int32_t* cu_q = nullptr;
  const int32_t* ctx = nullptr;
  const int32_t* tile_start = nullptr;  // [S + 1] prefix sums of ceil(n_q / R); nullptr when R = 1
  const int32_t* kv_limit = nullptr;    // [T] last visible key of each row; nullptr: causal
  int64_t T = 0, window = 0;
  int Hq = 0, Hkv = 0, G = 0, D = 0, Dp4 = 0, BS = 0, max_blocks = 0, NB = 0, S = 0;
  int R = 1, Gc = 1, head_chunks = 1, nsplit = 1;
  float scale = 1.0f, softcap = 0.0f;
  bool vec = false;  // K / V rows can be read in 16-byte vectors
};

// tile_start[s + 1] = sum over s' <= s of ceil(n_q(s') / R): where sequence s's row tiles begin
// in the flat list the attention grid walks.
__global__ void tile_start_kernel(const int32_t* cu_q, int S, int R, int32_t* tile_start) {
  using Scan = cub::BlockScan<int, kScanThreads>;
  __shared__ typename Scan::TempStorage tmp;
  __shared__ int carry;
  if (threadIdx.x == 0) {
    carry = 0;
    tile_start[0] = 0;
  }
  __syncthreads();
  for (int base = 0; base < S; base += kScanThreads) {
    const int s = base + static_cast<int>(threadIdx.x);
    int n = 0;
    if (s < S) n = (max(0, cu_q[s + 1] - cu_q[s]) + R - 1) / R;
    int incl = 0, total = 0;
    Scan(tmp).InclusiveSum(n, incl, total);
    if (s < S) tile_start[s + 1] = carry + incl;
    __syncthreads();  // every thread has read carry, and tmp may be reused
    if (threadIdx.x == 0) carry += total;
    __syncthreads();
  }
}

// DCH: output dims per lane (D <= 32 * DCH); QPW: queries per warp.
template <typename T, int DCH, int QPW>
__global__ void __launch_bounds__(kThreads) paged_attention_kernel(const PagedParams p) {
  extern __shared__ float4 smem4[];
  const int Dp4 = p.Dp4, D = p.D;
  const int DK = Dp4 + 4;  // K row stride: rows 4 banks apart, so 8 lanes' float4 reads cover all 32 banks
  constexpr int DV = DCH * 32;
  float* Qs = reinterpret_cast<float*>(smem4);  // [kWarps * QPW][Dp4] scaled queries, pad and unused rows 0
  float* Ks = Qs + kWarps * QPW * Dp4;           // [kKeyTile][DK], columns [D, Dp4) 0
  float* Vs = Ks + kKeyTile * DK;                // [kKeyTile][DV], columns [D, DV) 0
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;

  // This CTA's sequence s and first row r0 (relative to the sequence's first row of q). The
  // exits depend on blockIdx only, so the whole CTA leaves together.
  const int64_t tile = blockIdx.x;
  const int32_t* starts = p.tile_start ? p.tile_start : p.cu_q;
  if (tile >= starts[p.S]) return;
  int lo = 0, hi = p.S;  // largest s with starts[s] <= tile: a sequence with tiles, since starts[S] > tile
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (starts[mid] <= tile) lo = mid; else hi = mid;
  }
  const int s = lo;
  const int64_t r0 = (tile - starts[s]) * p.R;
  const int64_t q0 = p.cu_q[s];
  const int64_t nq = static_cast<int64_t>(p.cu_q[s + 1]) - q0;
  const int64_t r1 = min64(nq, r0 + p.R);
  if (r0 >= r1) return;
  const int64_t ctx = p.ctx[s];
  const int g = static_cast<int>(blockIdx.y) / p.head_chunks, hc = static_cast<int>(blockIdx.y) % p.head_chunks;
  const int M = p.R * p.Gc;

  // Keys [kbeg, kend): those of any of the rows, then this CTA's split of them.
  const int64_t pos_first = ctx - nq + r0, pos_last = ctx - nq + r1 - 1;
  int64_t kbeg = p.window > 0 ? max64(0, pos_first - p.window + 1) : 0;
  int64_t kend = pos_last + 1;
  if (p.kv_limit) {
    for (int64_t r = r0; r < r1; ++r) kend = max64(kend, min64(ctx - 1, p.kv_limit[q0 + r]) + 1);
  }
  const int z = static_cast<int>(blockIdx.z);
  if (p.nsplit > 1) {
    const int64_t len = max64(0, kend - kbeg);
    int64_t chunk = (len + p.nsplit - 1) / p.nsplit;
    chunk = max64(kMinSplitKeys, (chunk + kKeyTile - 1) / kKeyTile * kKeyTile);
    kbeg += z * chunk;
    kend = min64(kend, kbeg + chunk);
  }

  // The queries of this warp: m = m0 + i, row r0 + m / Gc, head g * G + hc * Gc + m % Gc (Gc
  // divides G). The valid ones are a prefix i < nvalid (rows grow with m); positions and rows
  // are recomputed where needed rather than held in registers for all QPW.
  const int m0 = warp * QPW;
  const int64_t row0 = q0 + r0;  // q's row of the CTA's first query row
  int nvalid = 0;
#pragma unroll
  for (int i = 0; i < QPW; ++i) {
    const int m = m0 + i;
    const int64_t ri = m / p.Gc;
    if (nvalid == i && m < M && r0 + ri < r1 && row0 + ri >= 0 && row0 + ri < p.T) nvalid = i + 1;
  }
  const int64_t pos0 = ctx - nq + r0;  // position of the CTA's first query row

  const T* q = static_cast<const T*>(p.q);
  for (int idx = tid; idx < kWarps * QPW * Dp4; idx += kThreads) {
    const int m = idx / Dp4, d = idx % Dp4;
    const int64_t ri = m / p.Gc, row = row0 + ri;
    const int h = g * p.G + hc * p.Gc + m % p.Gc;
    const bool ok = m < M && r0 + ri < r1 && row >= 0 && row < p.T && d < D;
    Qs[idx] = ok ? ld(q[(row * p.Hq + h) * D + d]) * p.scale : 0.0f;
  }
  for (int idx = tid; idx < kKeyTile * (Dp4 - D); idx += kThreads) {
    Ks[(idx / (Dp4 - D)) * DK + D + idx % (Dp4 - D)] = 0.0f;
  }
  for (int idx = tid; idx < kKeyTile * (DV - D); idx += kThreads) {
    Vs[(idx / (DV - D)) * DV + D + idx % (DV - D)] = 0.0f;
  }

  float o[QPW][DCH];
  float mrun[QPW], lrun[QPW];
#pragma unroll
  for (int i = 0; i < QPW; ++i) {
    mrun[i] = -INFINITY;
    lrun[i] = 0.0f;
#pragma unroll
    for (int j = 0; j < DCH; ++j) o[i][j] = 0.0f;
  }

  const T* kc = static_cast<const T*>(p.kc);
  const T* vc = static_cast<const T*>(p.vc);
  const int32_t* table = p.bt + static_cast<int64_t>(s) * p.max_blocks;
  const int64_t bs = p.BS;
  // Element offset of key position pos's row of kv head g in the cache, or -1 (read as zeros).
  auto row_offset = [&](int64_t pos) -> int64_t {
    if (pos >= kend || pos / bs >= p.max_blocks) return -1;
    const int64_t blk = table[pos / bs];
    if (blk < 0 || blk >= p.NB) return -1;
    return ((blk * bs + pos % bs) * p.Hkv + g) * D;
  };

  for (int64_t kt0 = kbeg; kt0 < kend; kt0 += kKeyTile) {
    __syncthreads();  // Qs and the pads are written, and every warp is done with the previous tile
    if (p.vec) {
      constexpr int kVec = 16 / sizeof(T);
      const int nvec = D / kVec;
      for (int idx = tid; idx < kKeyTile * nvec; idx += kThreads) {
        const int t = idx / nvec, c = idx % nvec;
        const int64_t off = row_offset(kt0 + t);
        float kf[kVec], vf[kVec];
        if (off >= 0) {
          unpack16<T>(__ldg(reinterpret_cast<const uint4*>(kc + off) + c), kf);
          unpack16<T>(__ldg(reinterpret_cast<const uint4*>(vc + off) + c), vf);
        } else {
#pragma unroll
          for (int e = 0; e < kVec; ++e) kf[e] = vf[e] = 0.0f;
        }
        float* kd = Ks + t * DK + c * kVec;
        float* vd = Vs + t * DV + c * kVec;
#pragma unroll
        for (int e = 0; e < kVec; e += 4) {
          *reinterpret_cast<float4*>(kd + e) = make_float4(kf[e], kf[e + 1], kf[e + 2], kf[e + 3]);
          *reinterpret_cast<float4*>(vd + e) = make_float4(vf[e], vf[e + 1], vf[e + 2], vf[e + 3]);
        }
      }
    } else {
      for (int idx = tid; idx < kKeyTile * D; idx += kThreads) {
        const int t = idx / D, d = idx % D;
        const int64_t off = row_offset(kt0 + t);
        Ks[t * DK + d] = off >= 0 ? ld(kc[off + d]) : 0.0f;
        Vs[t * DV + d] = off >= 0 ? ld(vc[off + d]) : 0.0f;
      }
    }
    __syncthreads();
    if (nvalid == 0) continue;  // warp-uniform: this warp has no query (it still joins the barriers)

    // Scores: lane t against key kt0 + t, for each of the warp's queries.
    float sc[QPW];
#pragma unroll
    for (int i = 0; i < QPW; ++i) sc[i] = 0.0f;
    const float* kr = Ks + lane * DK;
    const float* qw = Qs + warp * QPW * Dp4;
    for (int d = 0; d < Dp4; d += 4) {
      const float4 k4 = *reinterpret_cast<const float4*>(kr + d);
#pragma unroll
      for (int i = 0; i < QPW; ++i) {
        const float4 q4 = *reinterpret_cast<const float4*>(qw + i * Dp4 + d);
        sc[i] = fmaf(q4.x, k4.x, fmaf(q4.y, k4.y, fmaf(q4.z, k4.z, fmaf(q4.w, k4.w, sc[i]))));
      }
    }

    // Online softmax step per query; pr = this lane's probability for its key.
    const int64_t j = kt0 + lane;
    const int nt = static_cast<int>(min64(kKeyTile, kend - kt0));
    float pr[QPW];
#pragma unroll
    for (int i = 0; i < QPW; ++i) {
      pr[i] = 0.0f;
      if (i >= nvalid) continue;  // warp-uniform
      const int64_t qp = pos0 + (m0 + i) / p.Gc;
      const int64_t lim = p.kv_limit ? max64(qp, min64(ctx - 1, p.kv_limit[row0 + (m0 + i) / p.Gc])) : qp;
      const bool ok = lane < nt && j <= lim && (p.window == 0 || j > qp - p.window);
      float x = sc[i];
      if (p.softcap > 0.0f) x = p.softcap * tanhf(x * (1.0f / p.softcap));
      x = ok ? x : -INFINITY;
      const float mn = fmaxf(mrun[i], warp_max(x));
      if (mn == -INFINITY) continue;  // no key of this query yet
      const float e = expf(x - mn);
      const float alpha = expf(mrun[i] - mn);  // 0 on the first keys (mrun = -inf)
      lrun[i] = lrun[i] * alpha + warp_sum(e);
      mrun[i] = mn;
#pragma unroll
      for (int jj = 0; jj < DCH; ++jj) o[i][jj] *= alpha;
      pr[i] = e;
    }

    // o += P V: each V row read once for the warp's queries.
    for (int t = 0; t < nt; ++t) {
      float vv[DCH];
#pragma unroll
      for (int jj = 0; jj < DCH; ++jj) vv[jj] = Vs[t * DV + lane + 32 * jj];
#pragma unroll
      for (int i = 0; i < QPW; ++i) {
        const float pt = __shfl_sync(kFull, pr[i], t);
#pragma unroll
        for (int jj = 0; jj < DCH; ++jj) o[i][jj] = fmaf(pt, vv[jj], o[i][jj]);
      }
    }
  }

#pragma unroll
  for (int i = 0; i < QPW; ++i) {
    if (i >= nvalid) continue;
    const int m = m0 + i;
    const int64_t qrow = row0 + m / p.Gc;
    const int qhead = g * p.G + hc * p.Gc + m % p.Gc;
    if (p.part) {
      float* dst = p.part + ((z * p.T + qrow) * p.Hq + qhead) * (D + 2);
      if (lane == 0) {
        dst[0] = mrun[i];
        dst[1] = lrun[i];
      }
#pragma unroll
      for (int jj = 0; jj < DCH; ++jj) {
        const int d = lane + 32 * jj;
        if (d < D) dst[2 + d] = o[i][jj];
      }
    } else {
      const float inv = lrun[i] > 0.0f ? 1.0f / lrun[i] : 0.0f;
      T* dst = static_cast<T*>(p.out) + (qrow * p.Hq + qhead) * D;
#pragma unroll
      for (int jj = 0; jj < DCH; ++jj) {
        const int d = lane + 32 * jj;
        if (d < D) dst[d] = st<T>(o[i][jj] * inv);
      }
      if (p.lse && lane == 0) p.lse[qrow * p.Hq + qhead] = lrun[i] > 0.0f ? mrun[i] + logf(lrun[i]) : -INFINITY;
    }
  }
}

// One warp per (row, query head): the nsplit partials (max, sum, accumulator) weighed by
// exp(max - overall max), as the CPU op's combine_group.
template <typename T>
__global__ void __launch_bounds__(kThreads) paged_attention_combine_kernel(const float* part, T* out, float* lse,
                                                                           int64_t n_rows, int D, int nsplit) {
  const int64_t w = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32;
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (w >= n_rows) return;  // warp-uniform
  const int64_t stride = n_rows * (D + 2);  // floats between two splits of one row
  const float* base = part + w * (D + 2);
  const float mz = lane < nsplit ? base[lane * stride] : -INFINITY;
  const float lz = lane < nsplit ? base[lane * stride + 1] : 0.0f;
  const float mx = warp_max(mz);
  const float wz = mz == -INFINITY ? 0.0f : expf(mz - mx);  // a split with no key of this query weighs 0
  const float l = warp_sum(wz * lz);
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  T* dst = out + w * D;
  for (int d0 = 0; d0 < D; d0 += 32) {  // every lane runs every step: the shuffles need the full warp
    const int d = d0 + lane;
    float acc = 0.0f;
    for (int zz = 0; zz < nsplit; ++zz) {
      const float wzz = __shfl_sync(kFull, wz, zz);
      if (d < D && wzz != 0.0f) acc = fmaf(wzz, base[zz * stride + 2 + d], acc);
    }
    if (d < D) dst[d] = st<T>(acc * inv);
  }
  if (lse && lane == 0) lse[w] = l > 0.0f ? mx + logf(l) : -INFINITY;
}

int sm_count() {
  int dev = 0, n = 0;
  const bool ok = cudaGetDevice(&dev) == cudaSuccess &&
                  cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess;
  return ok ? n : 132;  // else the H100 / H200 count; only the split heuristic uses it
}

template <typename T, int DCH, int QPW>
Status launch_attention(const PagedParams& p, dim3 grid, size_t smem) {
  auto kernel = paged_attention_kernel<T, DCH, QPW>;
  if (smem > 48 * 1024) {
    SG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  }
  kernel<<<grid, kThreads, smem, current_stream()>>>(p);
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

template <typename T, int DCH>
Status launch_attention_qpw(const PagedParams& p, int qpw, dim3 grid, size_t smem) {
  switch (qpw) {
    case 1: return launch_attention<T, DCH, 1>(p, grid, smem);
    case 2: return launch_attention<T, DCH, 2>(p, grid, smem);
    case 4: return launch_attention<T, DCH, 4>(p, grid, smem);
    case 8:
      if constexpr (DCH <= 8) return launch_attention<T, DCH, 8>(p, grid, smem);  // D > 256 keeps M <= 16
      break;
    case 16:
      if constexpr (DCH <= 4) return launch_attention<T, DCH, 16>(p, grid, smem);  // D > 128 keeps M <= 32
      break;
    default:
      break;
  }
  return SG_ERROR(StatusCode::kInternal, str_cat("paged_attention: no kernel for ", qpw, " queries per warp"),
                  "report this as a bug");
}

template <typename T>
Status launch_attention_dch(const PagedParams& p, int qpw, dim3 grid, size_t smem) {
  if (p.D <= 64) return launch_attention_qpw<T, 2>(p, qpw, grid, smem);
  if (p.D <= 128) return launch_attention_qpw<T, 4>(p, qpw, grid, smem);
  if (p.D <= 256) return launch_attention_qpw<T, 8>(p, qpw, grid, smem);
  return launch_attention_qpw<T, 16>(p, qpw, grid, smem);
}

Status paged_attention_core(const OpArgs& a, float* lse_scratch);

// With sinks (input 6): the kernels run without them into an lse (the op's, or scratch), and
// attention_sinks_fwd folds each head's sink into out and lse (attention_sinks.cuh).
Status paged_attention(const OpArgs& a) {
  if (!a.has_in(6)) return paged_attention_core(a, nullptr);
  PagedAttentionArgs pa;
  SG_RETURN_IF_ERROR(check_paged_attention(a, &pa));
  if (pa.T == 0) return Status::OK();
  std::shared_ptr<void> scratch;
  float* lse = pa.lse != nullptr ? a.out(1).ptr<float>() : nullptr;
  if (lse == nullptr) {
    SG_RETURN_IF_ERROR(allocate(a.in(0).device, static_cast<size_t>(pa.T * pa.Hq) * sizeof(float), &scratch));
    lse = static_cast<float*>(scratch.get());
  }
  SG_RETURN_IF_ERROR(paged_attention_core(a, lse));
  return attention_sinks_fwd(a.in(6).data, a.in(6).dtype, a.out(0).data, a.out(0).dtype, lse, pa.T, pa.Hq, pa.D);
}

// lse_scratch: where lse goes when the op has no lse output (null: nowhere).
Status paged_attention_core(const OpArgs& a, float* lse_scratch) {
  const char* op = "paged_attention";
  const Tensor& q = a.in(0);
  const Tensor& kc = a.in(1);
  const Tensor& vc = a.in(2);
  const Tensor& bt = a.in(3);
  const Tensor& cu = a.in(4);
  const Tensor& cl = a.in(5);
  const Tensor& out = a.out(0);
  PagedAttentionArgs pa;
  SG_RETURN_IF_ERROR(check_paged_attention(a, &pa));
  const bool want_lse = pa.lse != nullptr;
  const int64_t T = pa.T, Hq = pa.Hq, D = pa.D, NB = pa.NB, BS = pa.BS, Hkv = pa.Hkv, S = pa.S;
  const int64_t max_blocks = pa.max_blocks, window = pa.window;
  const double scale = pa.scale, softcap = pa.softcap;
  SG_CHECK(D <= kMaxHeadDim, StatusCode::kUnsupported,
           str_cat(op, ": head dim ", D, " has no CUDA kernel (at most ", kMaxHeadDim, ")"),
           "run this model's attention on the CPU backend");
  const int64_t i32max = std::numeric_limits<int32_t>::max();
  SG_CHECK_SHAPE(T <= i32max && Hq <= i32max && NB <= i32max && BS <= i32max && max_blocks <= i32max && S < i32max,
                 str_cat(op, ": q ", q.shape_str(), ", k_cache ", kc.shape_str(), " or block_tables ", bt.shape_str(),
                         " has a dimension past 2^31"));
  if (T == 0) return Status::OK();

  PagedParams p;
  p.q = q.data;
  p.kc = kc.data;
  p.vc = vc.data;
  p.out = out.data;
  p.lse = want_lse ? a.out(1).ptr<float>() : lse_scratch;
  p.bt = bt.ptr<int32_t>();
  p.cu_q = cu.ptr<int32_t>();
  p.ctx = cl.ptr<int32_t>();
  p.T = T;
  p.window = window;
  p.Hq = static_cast<int>(Hq);
  p.Hkv = static_cast<int>(Hkv);
  p.G = static_cast<int>(Hq / Hkv);
  p.D = static_cast<int>(D);
  p.Dp4 = static_cast<int>((D + 3) / 4 * 4);
  p.BS = static_cast<int>(BS);
  p.max_blocks = static_cast<int>(max_blocks);
  p.NB = static_cast<int>(NB);
  p.S = static_cast<int>(S);
  p.scale = static_cast<float>(scale);
  p.softcap = static_cast<float>(softcap);
  p.kv_limit = pa.kv_limit ? pa.kv_limit->ptr<int32_t>() : nullptr;
  const int64_t esize = static_cast<int64_t>(dtype_size(q.dtype));
  p.vec = (D * esize) % 16 == 0 && reinterpret_cast<uintptr_t>(kc.data) % 16 == 0 &&
          reinterpret_cast<uintptr_t>(vc.data) % 16 == 0;

  // Decode batches with 16-byte rows take the streaming kernel of paged_attention_decode.cu.
  if (T <= S && p.kv_limit == nullptr && paged_decode_supports(q.dtype, D, {q.data, kc.data, vc.data, out.data})) {
    PagedDecodeArgs d;
    d.dtype = q.dtype;
    d.device = q.device;
    d.q = q.data;
    d.kc = kc.data;
    d.vc = vc.data;
    d.out = out.data;
    d.lse = p.lse;
    d.bt = p.bt;
    d.cu_q = p.cu_q;
    d.ctx = p.ctx;
    d.T = T;
    d.window = window;
    d.Hq = p.Hq;
    d.Hkv = p.Hkv;
    d.D = p.D;
    d.BS = p.BS;
    d.max_blocks = p.max_blocks;
    d.NB = p.NB;
    d.S = p.S;
    d.sms = sm_count();
    d.scale = p.scale;
    d.softcap = p.softcap;
    return paged_attention_decode(d);
  }

  // Queries per CTA: up to 64 (32 for D > 128 and 16 for D > 256, whose f32 tiles and per-lane
  // accumulators are two and four times as large): a divisor Gc of the group's G heads, times R
  // rows. Decode-only batches (T <= S) take one row per CTA.
  const int target = D <= 128 ? 64 : D <= 256 ? 32 : 16;
  p.Gc = 1;
  for (int c = std::min(p.G, target); c >= 1; --c) {
    if (p.G % c == 0) {
      p.Gc = c;
      break;
    }
  }
  p.head_chunks = p.G / p.Gc;
  p.R = T <= S ? 1 : std::max(1, target / p.Gc);
  const int M = p.R * p.Gc;
  int qpw = 1;
  while (qpw * kWarps < M) qpw *= 2;

  const int64_t n_tiles = p.R == 1 ? T : (T + p.R - 1) / p.R + S;  // bound on sum of ceil(n_q / R)
  const int64_t grid_y = Hkv * p.head_chunks;
  SG_CHECK_SHAPE(grid_y <= 65535 && n_tiles <= i32max,
                 str_cat(op, ": ", Hkv, " kv heads x ", p.head_chunks, " head chunks or ", n_tiles,
                         " query tiles is past the CUDA grid limits"));

  // Key splits while the CTAs would not fill the GPU twice; the kernel keeps >= kMinSplitKeys
  // keys per split of the actual context (a short context leaves the extra splits empty).
  const int64_t ctx_cap = max_blocks * BS;
  const int64_t keys_cap = window > 0 && !p.kv_limit ? std::min<int64_t>(ctx_cap, window + p.R - 1) : ctx_cap;
  const int64_t n_cta = n_tiles * grid_y, want = 2LL * sm_count();
  if (n_cta < want) {
    p.nsplit = static_cast<int>(std::min<int64_t>(
        {(want + n_cta - 1) / n_cta, (keys_cap + kMinSplitKeys - 1) / kMinSplitKeys, int64_t{kMaxSplits}}));
    p.nsplit = std::max(1, p.nsplit);
  }

  std::shared_ptr<void> tile_buf, part_buf;
  if (p.R > 1) {
    SG_RETURN_IF_ERROR(allocate(q.device, static_cast<size_t>(S + 1) * sizeof(int32_t), &tile_buf));
    p.tile_start = static_cast<const int32_t*>(tile_buf.get());
    tile_start_kernel<<<1, kScanThreads, 0, current_stream()>>>(p.cu_q, p.S, p.R, static_cast<int32_t*>(tile_buf.get()));
    SG_CUDA_CHECK_LAUNCH();
  }
  if (p.nsplit > 1) {
    const size_t floats = static_cast<size_t>(p.nsplit) * static_cast<size_t>(T * Hq * (D + 2));
    SG_RETURN_IF_ERROR(allocate(q.device, floats * sizeof(float), &part_buf));
    p.part = static_cast<float*>(part_buf.get());
  }

  const int dch = D <= 64 ? 2 : D <= 128 ? 4 : D <= 256 ? 8 : 16;
  const size_t smem =
      static_cast<size_t>(kWarps * qpw * p.Dp4 + kKeyTile * (p.Dp4 + 4) + kKeyTile * dch * 32) * sizeof(float);
  const dim3 grid(static_cast<unsigned>(n_tiles), static_cast<unsigned>(grid_y), static_cast<unsigned>(p.nsplit));
  SG_CUDA_DISPATCH_FLOAT(op, q.dtype, Ty, { SG_RETURN_IF_ERROR(launch_attention_dch<Ty>(p, qpw, grid, smem)); });
  if (p.nsplit > 1) {
    const int64_t n_rows = T * Hq;
    const unsigned blocks = static_cast<unsigned>((n_rows + kWarps - 1) / kWarps);
    SG_CUDA_DISPATCH_FLOAT(op, q.dtype, Ty, {
      paged_attention_combine_kernel<Ty><<<blocks, kThreads, 0, current_stream()>>>(p.part, out.ptr<Ty>(), p.lse, n_rows, p.D, p.nsplit);
    });
    SG_CUDA_CHECK_LAUNCH();
  }
  return Status::OK();
}

}  // namespace

void register_cuda_paged_attention(OpRegistry& reg) {
  add_op(reg, "kv_cache_write", kv_cache_write);
  add_op(reg, "paged_attention", paged_attention);
}

}  // namespace surogate::cuda
