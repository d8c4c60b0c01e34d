// The decode path of paged_attention (T <= S; cuda/paged_attention.cu dispatches, validates and
// keeps prefill on its general kernel). cpu/paged_attention.cpp is the spec: cache layout,
// visible keys (causal, window), softcap, scale, lse; paged_attention.cu's header says how
// invalid indices are made harmless, and this file keeps the same rules.
//
// Decode reads every K / V byte of the batch once and does little math per byte, so the kernel
// is a stream of 16-byte loads from the cache with the math in registers:
//   - one CTA of kWarps warps per (query row, kv head, chunk of GC of its G query heads, key
//     split); GC = G rounded up to 1, 2, 4 or 8 (padding heads compute nothing that is kept), so
//     each K / V row is read once for all the query heads of its kv head;
//   - a K or V row of D elements is NCH = D * size / 16 vectors of 16 bytes. LPK lanes (8, 16 or
//     32, the power of two >= NCH, at most 32; f32 with D > 128 takes CPL = 2 vectors per lane)
//     hold one key's row, so a warp loads KPW = 32 / LPK keys per instruction, each as whole
//     32-byte sectors. A warp takes U such steps per iteration and issues their K and V loads
//     (2 U CPL vectors per lane) before any math, and fetches the next iteration's block table
//     entries while they are in flight;
//   - each lane keeps its dims of the GC scaled queries (q * scale * log2 e) and of the GC
//     accumulators in f32 registers; a score is the lanes' partial dot products summed by
//     shuffles within the LPK lanes of its key;
//   - online softmax in the exp2 domain per key group (the LPK lanes of one key slot: running max
//     m, sum l, accumulator o), merged across the warp's groups by shuffles, then across the
//     warps in shared memory (the only __syncthreads);
//   - when rows x kv heads x head chunks would not give every SM two CTAs (decode of few
//     sequences), the keys of each row are split over up to kMaxSplits CTAs of at least
//     kMinSplitKeys keys (flash-decoding): a CTA leaves (m, l) and its unnormalised o per query
//     head in f32 scratch (m in the exp2 domain) and paged_decode_combine_kernel, one CTA per
//     (row, query head), weighs them by exp2(m - max m).
// A row of q finds its sequence by checking sequence `row` first (pure decode: cu_q[s] = s) and
// by binary search in cu_q otherwise. No host reads of device data: the split count comes from
// the shapes (max_blocks * BS bounds the context), so for a short context most splits hold no
// key; their CTAs leave at once and the combine, which works out the same ranges (row_keys),
// reads only the partials of the others.
// (Past 400 lines: the attention kernel, the combine and the launch share the partials' layout and
// row_keys, so they stay in one file.)
#include "cuda/paged_attention_decode.cuh"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <type_traits>

#include "core/allocator.h"
#include "cuda/common.cuh"

namespace surogate::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kMinSplitKeys = 32;  // a key split reads at least this many keys
constexpr int kMaxSplits = 64;
constexpr int kMaxHeadDim = 256;   // f32 rows of 64 vectors; paged_attention.cu sends no larger D
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
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
// The shift that keeps exp2 finite: the running max, or 0 while it is -inf (no key yet; every
// score is then -inf too and exp2(-inf - 0) = 0).
__device__ __forceinline__ float exp_shift(float m) { return m == -INFINITY ? 0.0f : m; }

// The sequence that owns row t of q (cu_q[s] <= t < cu_q[s + 1]) and its rows [q0, q1), or
// s = -1 (a padding row). Pure decode (cu_q[s] = s) is answered by the first two loads, which
// need no other; other batches search cu_q.
struct RowSeq {
  int s;
  int64_t q0, q1;
};
__device__ RowSeq find_row_seq(const int32_t* cu_q, int S, int64_t t) {
  if (t < S) {
    const int64_t a = __ldg(cu_q + t), b = __ldg(cu_q + t + 1);
    if (a <= t && t < b) return {static_cast<int>(t), a, b};
  }
  if (t < __ldg(cu_q) || t >= __ldg(cu_q + S)) return {-1, 0, 0};
  int lo = 0, hi = S;  // cu_q[lo] <= t < cu_q[hi]
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    if (__ldg(cu_q + mid) <= t) lo = mid; else hi = mid;
  }
  const int64_t a = __ldg(cu_q + lo), b = __ldg(cu_q + lo + 1);
  return a <= t && t < b ? RowSeq{lo, a, b} : RowSeq{-1, 0, 0};  // -1 only when cu_q decreases somewhere
}

struct DecodeParams {
  const void* q = nullptr;
  const void* kc = nullptr;
  const void* vc = nullptr;
  void* out = nullptr;
  float* lse = nullptr;      // nullptr: not wanted
  float* part_o = nullptr;   // split partials [nsplit, T, Hq, D]; nullptr: no split
  float* part_ml = nullptr;  // [nsplit, T, Hq, 2]: (m in the exp2 domain, l)
  const int32_t* bt = nullptr;
  const int32_t* cu_q = nullptr;
  const int32_t* ctx = nullptr;
  int64_t T = 0, window = 0;
  int Hq = 0, Hkv = 0, G = 0, D = 0, NCH = 0, BS = 0, max_blocks = 0, NB = 0, S = 0;
  int head_chunks = 1, nsplit = 1;
  float qscale = 1.0f;              // scale * log2 e
  float cap2 = 0.0f, inv_cap2 = 0.0f;  // softcap * log2 e and its inverse; 0: no softcap
};

// The keys a row at position qpos sees, [beg, end), cut in splits of `chunk` keys (all of them when
// there is no split); `live` splits hold at least one key, the others none. Both kernels use it,
// so the combine reads exactly the partials the attention kernel wrote.
struct RowKeys {
  int64_t beg, end, chunk;
  int live;
};
__device__ __forceinline__ RowKeys row_keys(const DecodeParams& p, int64_t qpos) {
  const int64_t beg = p.window > 0 ? max64(0, qpos - p.window + 1) : 0;
  const int64_t len = max64(0, qpos + 1 - beg);  // 0: context_lens smaller than the rows
  const int64_t chunk = p.nsplit > 1 ? max64(kMinSplitKeys, (len + p.nsplit - 1) / p.nsplit) : len;
  return {beg, beg + len, chunk, len == 0 ? 0 : static_cast<int>((len + chunk - 1) / chunk)};
}

// T storage type, LPK lanes per key, CPL 16-byte vectors per lane of a row, GC query heads.
template <typename T, int LPK, int CPL, int GC>
__global__ void __launch_bounds__(kThreads) paged_decode_kernel(const DecodeParams p) {
  constexpr int VEC = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte vector
  constexpr int KPW = 32 / LPK;                           // keys per warp per step
  constexpr int DL = CPL * VEC;                           // dims per lane
  constexpr int DMAX = LPK * DL;                          // dims a group covers (>= D)
  // Steps per iteration: 2 U CPL 16-byte loads in flight per lane; fewer with 8 query heads,
  // whose queries and accumulators take 128 registers.
  constexpr int U = CPL > 1 ? (GC >= 8 ? 1 : 2) : (GC >= 8 ? 2 : 4);
  constexpr int KPI = U * KPW;                            // keys per warp per iteration
  __shared__ __align__(16) float sm_o[kWarps][GC][DMAX];
  __shared__ float sm_m[kWarps][GC], sm_l[kWarps][GC];

  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int grp = lane / LPK, gl = lane % LPK;  // key slot of this lane in a step, lane in its group
  const int64_t t = blockIdx.x;
  const int g = static_cast<int>(blockIdx.y) / p.head_chunks, hc = static_cast<int>(blockIdx.y) % p.head_chunks;
  const int z = static_cast<int>(blockIdx.z);
  const int h0 = g * p.G + hc * GC;        // first query head of this CTA
  const int nh = min(GC, p.G - hc * GC);   // its real heads; the others stay 0 and are not written

  // The queries first: their address needs no lookup. Lane gl holds vectors gl + j LPK.
  float qf[GC][DL];
  const uint4* q4 = static_cast<const uint4*>(p.q);
#pragma unroll
  for (int i = 0; i < GC; ++i) {
#pragma unroll
    for (int j = 0; j < CPL; ++j) {
      const int c = gl + j * LPK;
      uint4 u = make_uint4(0u, 0u, 0u, 0u);
      if (i < nh && c < p.NCH) u = __ldg(q4 + (t * p.Hq + h0 + i) * p.NCH + c);
      unpack16<T>(u, &qf[i][j * VEC]);
#pragma unroll
      for (int e = 0; e < VEC; ++e) qf[i][j * VEC + e] *= p.qscale;
    }
  }

  // context_lens[t] is loaded with cu_q[t], cu_q[t + 1]: pure decode needs no other round trip.
  const int32_t ctx_t = t < p.S ? __ldg(p.ctx + t) : 0;
  const RowSeq rs = find_row_seq(p.cu_q, p.S, t);
  if (rs.s < 0) return;  // a padding row: the whole CTA leaves, out stays as it was
  const int s = rs.s;
  const int64_t ctx = rs.s == t ? ctx_t : __ldg(p.ctx + s);
  const int64_t qpos = ctx - (rs.q1 - rs.q0) + (t - rs.q0);  // < context_lens[s]

  // Keys [kbeg, kend) of this CTA. A split with none leaves no partial: the combine skips it.
  const RowKeys rk = row_keys(p, qpos);
  if (p.part_o && z >= rk.live) return;
  const int64_t kbeg = rk.beg + z * rk.chunk, kend = min64(rk.end, kbeg + rk.chunk);

  const int32_t* table = p.bt + static_cast<int64_t>(s) * p.max_blocks;
  const uint4* kc4 = static_cast<const uint4*>(p.kc);
  const uint4* vc4 = static_cast<const uint4*>(p.vc);
  const uint32_t bs = static_cast<uint32_t>(p.BS);
  // The first vector of key pos's row of kv head g, or -1: a key at or past kend (masked) or one
  // whose block lies outside the table row or the cache (read as zeros, as the general kernel).
  // pos < kend <= context_lens[s] < 2^31, so 32-bit division suffices.
  auto row_of = [&](int64_t pos) -> int64_t {
    if (pos >= kend) return -1;
    const uint32_t ps = static_cast<uint32_t>(pos), bi = ps / bs;
    if (bi >= static_cast<uint32_t>(p.max_blocks)) return -1;
    const int32_t b = __ldg(table + bi);
    if (b < 0 || b >= p.NB) return -1;
    return ((static_cast<int64_t>(b) * p.BS + (ps - bi * bs)) * p.Hkv + g) * p.NCH;
  };

  float m[GC], l[GC], o[GC][DL];
#pragma unroll
  for (int i = 0; i < GC; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int d = 0; d < DL; ++d) o[i][d] = 0.0f;
  }

  // Warp w's iterations start at kbeg + (n kWarps + w) KPI; step u of one holds keys
  // kb + u KPW + grp.
  const int64_t stride = static_cast<int64_t>(kWarps) * KPI;
  int64_t kb = kbeg + warp * KPI;
  int64_t row[U];
#pragma unroll
  for (int u = 0; u < U; ++u) row[u] = row_of(kb + u * KPW + grp);
  for (; kb < kend; kb += stride) {  // warp-uniform
    uint4 kr[U][CPL], vr[U][CPL];
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int j = 0; j < CPL; ++j) {
        const int c = gl + j * LPK;
        kr[u][j] = vr[u][j] = make_uint4(0u, 0u, 0u, 0u);
        if (row[u] >= 0 && c < p.NCH) {
          kr[u][j] = __ldg(kc4 + row[u] + c);
          vr[u][j] = __ldg(vc4 + row[u] + c);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) row[u] = row_of(kb + stride + u * KPW + grp);  // next iteration's

    // Scores (exp2 domain): partial dot products over this lane's dims, summed over the group.
    float sc[U][GC];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float kf[DL];
#pragma unroll
      for (int j = 0; j < CPL; ++j) unpack16<T>(kr[u][j], &kf[j * VEC]);
#pragma unroll
      for (int i = 0; i < GC; ++i) {
        float acc = 0.0f;
#pragma unroll
        for (int d = 0; d < DL; ++d) acc = fmaf(qf[i][d], kf[d], acc);
        sc[u][i] = acc;
      }
    }
#pragma unroll
    for (int off = LPK / 2; off > 0; off >>= 1) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int i = 0; i < GC; ++i) sc[u][i] += __shfl_xor_sync(kFull, sc[u][i], off);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const bool live = kb + u * KPW + grp < kend;
#pragma unroll
      for (int i = 0; i < GC; ++i) {
        float x = sc[u][i];
        if (p.cap2 > 0.0f) x = p.cap2 * tanhf(x * p.inv_cap2);  // = log2 e * softcap * tanh(score / softcap)
        sc[u][i] = live ? x : -INFINITY;
      }
    }

    // Online softmax of the group's keys, then o += p V.
    float ms[GC];
#pragma unroll
    for (int i = 0; i < GC; ++i) {
      float cm = sc[0][i];
#pragma unroll
      for (int u = 1; u < U; ++u) cm = fmaxf(cm, sc[u][i]);
      const float mn = fmaxf(m[i], cm);
      ms[i] = exp_shift(mn);
      const float alpha = exp2f(m[i] - ms[i]);  // 0 while m = -inf
      m[i] = mn;
      l[i] *= alpha;
#pragma unroll
      for (int d = 0; d < DL; ++d) o[i][d] *= alpha;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float vf[DL];
#pragma unroll
      for (int j = 0; j < CPL; ++j) unpack16<T>(vr[u][j], &vf[j * VEC]);
#pragma unroll
      for (int i = 0; i < GC; ++i) {
        const float pr = exp2f(sc[u][i] - ms[i]);  // 0 for a masked key
        l[i] += pr;
#pragma unroll
        for (int d = 0; d < DL; ++d) o[i][d] = fmaf(pr, vf[d], o[i][d]);
      }
    }
  }

  // Merge the warp's KPW groups (lanes gl, gl + LPK, ... hold the same dims), then the warps.
#pragma unroll
  for (int off = LPK; off < 32; off <<= 1) {
#pragma unroll
    for (int i = 0; i < GC; ++i) {
      const float mo = __shfl_xor_sync(kFull, m[i], off), lo = __shfl_xor_sync(kFull, l[i], off);
      const float mn = fmaxf(m[i], mo), sh = exp_shift(mn);
      const float a = exp2f(m[i] - sh), b = exp2f(mo - sh);
      m[i] = mn;
      l[i] = l[i] * a + lo * b;
#pragma unroll
      for (int d = 0; d < DL; ++d) o[i][d] = o[i][d] * a + __shfl_xor_sync(kFull, o[i][d], off) * b;
    }
  }
  if (grp == 0) {
#pragma unroll
    for (int i = 0; i < GC; ++i) {
#pragma unroll
      for (int j = 0; j < CPL; ++j) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) sm_o[warp][i][(gl + j * LPK) * VEC + e] = o[i][j * VEC + e];
      }
      if (gl == 0) {
        sm_m[warp][i] = m[i];
        sm_l[warp][i] = l[i];
      }
    }
  }
  __syncthreads();

  // Thread per (query head i, vector c of its row).
  constexpr int NCMAX = LPK * CPL;
  for (int idx = tid; idx < GC * NCMAX; idx += kThreads) {
    const int i = idx / NCMAX, c = idx % NCMAX;
    if (i >= nh || c >= p.NCH) continue;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm_m[w][i]);
    const float sh = exp_shift(M);
    float L = 0.0f, acc[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) acc[e] = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float wt = exp2f(sm_m[w][i] - sh);
      L = fmaf(wt, sm_l[w][i], L);
#pragma unroll
      for (int e = 0; e < VEC; ++e) acc[e] = fmaf(wt, sm_o[w][i][c * VEC + e], acc[e]);
    }
    const int64_t qh = t * p.Hq + h0 + i;  // (row, query head)
    if (p.part_o) {
      const int64_t at = static_cast<int64_t>(z) * p.T * p.Hq + qh;
      float4* dst = reinterpret_cast<float4*>(p.part_o + at * p.D + c * VEC);
#pragma unroll
      for (int e = 0; e < VEC; e += 4) dst[e / 4] = make_float4(acc[e], acc[e + 1], acc[e + 2], acc[e + 3]);
      if (c == 0) reinterpret_cast<float2*>(p.part_ml)[at] = make_float2(M, L);
    } else {
      const float inv = L > 0.0f ? 1.0f / L : 0.0f;
#pragma unroll
      for (int e = 0; e < VEC; ++e) acc[e] *= inv;
      static_cast<uint4*>(p.out)[qh * p.NCH + c] = pack16<T>(acc);
      if (c == 0 && p.lse) p.lse[qh] = L > 0.0f ? (M + log2f(L)) * kLn2 : -INFINITY;
    }
  }
}

// One CTA per (row, query head): the live splits' partials weighed by exp2(m - max m). Warp w
// adds splits w, w + kWarps, ... (lanes over the dims, every load independent of the others), then
// the warps' sums meet in shared memory. Lane i holds the (m, l) of splits i and i + 32.
template <typename T>
__global__ void __launch_bounds__(kThreads) paged_decode_combine_kernel(const DecodeParams p) {
  static_assert(kMaxSplits <= 64, "two splits per lane");
  __shared__ float4 sm_acc[kWarps][kMaxHeadDim / 4];
  const int64_t rows = p.T * p.Hq;
  const int64_t w = blockIdx.x;  // (row, query head)
  const int64_t t = w / p.Hq;
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const float2* ml = reinterpret_cast<const float2*>(p.part_ml) + w;  // split z at ml[z * rows]
  const float2 mla = lane < p.nsplit ? ml[lane * rows] : make_float2(-INFINITY, 0.0f);
  const float2 mlb = lane + 32 < p.nsplit ? ml[(lane + 32) * rows] : make_float2(-INFINITY, 0.0f);
  const int32_t ctx_t = t < p.S ? __ldg(p.ctx + t) : 0;
  const RowSeq rs = find_row_seq(p.cu_q, p.S, t);
  if (rs.s < 0) return;  // a padding row: no partials, out stays as it was (the whole CTA leaves)
  const int64_t ctx = rs.s == t ? ctx_t : __ldg(p.ctx + rs.s);
  const int live = row_keys(p, ctx - (rs.q1 - rs.q0) + (t - rs.q0)).live;

  // Splits past `live` wrote nothing: their (m, l) are not read.
  const float ma = lane < live ? mla.x : -INFINITY, mb = lane + 32 < live ? mlb.x : -INFINITY;
  const float mx = warp_max(fmaxf(ma, mb)), sh = exp_shift(mx);
  const float wa = exp2f(ma - sh), wb = exp2f(mb - sh);  // 0 for a split that is not live
  const float l = warp_sum(wa * (lane < live ? mla.y : 0.0f) + wb * (lane + 32 < live ? mlb.y : 0.0f));

  const int D4 = p.D / 4;  // <= kMaxHeadDim / 4 = 64: two float4 per lane
  const float4* po = reinterpret_cast<const float4*>(p.part_o) + w * D4;  // split z at po[z * rows * D4]
  float4 acc[2] = {make_float4(0.0f, 0.0f, 0.0f, 0.0f), make_float4(0.0f, 0.0f, 0.0f, 0.0f)};
  for (int z = warp; z < live; z += kWarps) {  // warp-uniform
    const float a = __shfl_sync(kFull, wa, z & 31), b = __shfl_sync(kFull, wb, z & 31);
    const float wt = z < 32 ? a : b;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int c = lane + 32 * k;
      if (c < D4) {
        const float4 v = po[z * rows * D4 + c];
        acc[k].x = fmaf(wt, v.x, acc[k].x);
        acc[k].y = fmaf(wt, v.y, acc[k].y);
        acc[k].z = fmaf(wt, v.z, acc[k].z);
        acc[k].w = fmaf(wt, v.w, acc[k].w);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    if (lane + 32 * k < D4) sm_acc[warp][lane + 32 * k] = acc[k];
  }
  __syncthreads();

  const float inv = l > 0.0f ? 1.0f / l : 0.0f;  // l = 0: no key at all, out = 0
  T* dst = static_cast<T*>(p.out) + w * p.D;
  for (int c = tid; c < D4; c += kThreads) {
    float4 v = sm_acc[0][c];
#pragma unroll
    for (int ww = 1; ww < kWarps; ++ww) {
      const float4 u = sm_acc[ww][c];
      v.x += u.x;
      v.y += u.y;
      v.z += u.z;
      v.w += u.w;
    }
    dst[4 * c] = st<T>(v.x * inv);
    dst[4 * c + 1] = st<T>(v.y * inv);
    dst[4 * c + 2] = st<T>(v.z * inv);
    dst[4 * c + 3] = st<T>(v.w * inv);
  }
  if (p.lse && tid == 0) p.lse[w] = l > 0.0f ? (mx + log2f(l)) * kLn2 : -INFINITY;
}

template <typename T, int LPK, int CPL, int GC>
Status launch_decode(const DecodeParams& p, dim3 grid) {
  paged_decode_kernel<T, LPK, CPL, GC><<<grid, kThreads, 0, current_stream()>>>(p);
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

template <typename T, int LPK, int CPL>
Status launch_decode_gc(const DecodeParams& p, int gc, dim3 grid) {
  switch (gc) {
    case 1: return launch_decode<T, LPK, CPL, 1>(p, grid);
    case 2: return launch_decode<T, LPK, CPL, 2>(p, grid);
    case 4: return launch_decode<T, LPK, CPL, 4>(p, grid);
    default: return launch_decode<T, LPK, CPL, 8>(p, grid);
  }
}

template <typename T>
Status launch_decode_lanes(const DecodeParams& p, int gc, dim3 grid) {
  if (p.NCH <= 8) return launch_decode_gc<T, 8, 1>(p, gc, grid);
  if (p.NCH <= 16) return launch_decode_gc<T, 16, 1>(p, gc, grid);
  if (p.NCH <= 32) return launch_decode_gc<T, 32, 1>(p, gc, grid);
  if constexpr (sizeof(T) == 4) return launch_decode_gc<T, 32, 2>(p, gc, grid);  // f32, D > 128
  return SG_ERROR(StatusCode::kInternal, str_cat("paged_attention: no decode kernel for ", p.NCH, " vectors per row"),
                  "report this as a bug");
}

}  // namespace

bool paged_decode_supports(DType dtype, int64_t D, std::initializer_list<const void*> ptrs) {
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16) return false;
  const int64_t bytes = D * static_cast<int64_t>(dtype_size(dtype));
  const int64_t max_vectors = dtype == DType::kF32 ? 64 : 32;
  if (D <= 0 || bytes % 16 != 0 || bytes / 16 > max_vectors) return false;
  for (const void* ptr : ptrs) {
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0) return false;
  }
  return true;
}

Status paged_attention_decode(const PagedDecodeArgs& a) {
  const char* op = "paged_attention";
  DecodeParams p;
  p.q = a.q;
  p.kc = a.kc;
  p.vc = a.vc;
  p.out = a.out;
  p.lse = a.lse;
  p.bt = a.bt;
  p.cu_q = a.cu_q;
  p.ctx = a.ctx;
  p.T = a.T;
  p.window = a.window;
  p.Hq = a.Hq;
  p.Hkv = a.Hkv;
  p.G = a.Hq / a.Hkv;
  p.D = a.D;
  p.NCH = static_cast<int>(a.D * static_cast<int64_t>(dtype_size(a.dtype)) / 16);
  p.BS = a.BS;
  p.max_blocks = a.max_blocks;
  p.NB = a.NB;
  p.S = a.S;
  p.qscale = a.scale * kLog2e;
  if (a.softcap > 0.0f) {
    p.cap2 = a.softcap * kLog2e;
    p.inv_cap2 = 1.0f / p.cap2;
  }
  int gc = 1;
  while (gc < p.G && gc < 8) gc *= 2;
  p.head_chunks = (p.G + gc - 1) / gc;
  const int64_t grid_y = static_cast<int64_t>(a.Hkv) * p.head_chunks;
  const int64_t i32max = std::numeric_limits<int32_t>::max();
  SG_CHECK_SHAPE(grid_y <= 65535 && a.T * a.Hq <= i32max,
                 str_cat(op, ": ", a.Hkv, " kv heads x ", p.head_chunks, " head chunks, or ", a.T, " rows x ", a.Hq,
                         " heads, is past the CUDA grid limits"));

  // Key splits while the CTAs would not give every SM two: about four per SM then, each of at
  // least kMinSplitKeys of the keys a row can see (bounded by the table row and the window).
  const int64_t n_cta = a.T * grid_y, sms = std::max(1, a.sms);
  if (n_cta < 2 * sms) {
    const int64_t ctx_cap = static_cast<int64_t>(a.max_blocks) * a.BS;
    const int64_t keys_cap = a.window > 0 ? std::min(ctx_cap, a.window) : ctx_cap;
    p.nsplit = static_cast<int>(std::max<int64_t>(
        1, std::min<int64_t>({(4 * sms + n_cta - 1) / n_cta, (keys_cap + kMinSplitKeys - 1) / kMinSplitKeys,
                              int64_t{kMaxSplits}})));
  }
  std::shared_ptr<void> part_buf;
  if (p.nsplit > 1) {
    const size_t per_split = static_cast<size_t>(a.T) * static_cast<size_t>(a.Hq) * static_cast<size_t>(a.D + 2);
    SG_RETURN_IF_ERROR(allocate(a.device, static_cast<size_t>(p.nsplit) * per_split * sizeof(float), &part_buf));
    p.part_o = static_cast<float*>(part_buf.get());
    // After the o block: D is a multiple of 4, so this stays 16-byte aligned.
    p.part_ml = p.part_o + static_cast<size_t>(p.nsplit) * static_cast<size_t>(a.T * a.Hq) * a.D;
  }

  const dim3 grid(static_cast<unsigned>(a.T), static_cast<unsigned>(grid_y), static_cast<unsigned>(p.nsplit));
  SG_CUDA_DISPATCH_FLOAT(op, a.dtype, Ty, { SG_RETURN_IF_ERROR(launch_decode_lanes<Ty>(p, gc, grid)); });
  if (p.nsplit > 1) {
    const unsigned blocks = static_cast<unsigned>(a.T * a.Hq);
    SG_CUDA_DISPATCH_FLOAT(op, a.dtype, Ty, {
      paged_decode_combine_kernel<Ty><<<blocks, kThreads, 0, current_stream()>>>(p);
    });
    SG_CUDA_CHECK_LAUNCH();
  }
  return Status::OK();
}

}  // namespace surogate::cuda
