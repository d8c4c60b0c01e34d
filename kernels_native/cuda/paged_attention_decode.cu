// The decode path of paged_attention (T <= S; cuda/paged_attention.cu dispatches, validates and
// keeps prefill on its general kernel). cpu/paged_attention.cpp is the spec: cache layout,
// visible keys (causal, window), softcap, scale, lse; paged_attention.cu's header says how
// invalid indices are made harmless, and this file keeps the same rules.
//
// Decode reads every K / V byte of the batch once and does little math per byte, so the kernel
// is a stream of 16-byte loads from the cache with the math in registers:
//   - one CTA of kWarps warps per (query row, kv head, chunk of GC of its G query heads, key
//     split); GC = G rounded up to 1, 2, 4 or 8 (padding heads compute nothing that is kept), so
//     each K / V row is read once for all the query heads of its kv head; at most 4 for D > 256,
//     whose 16 dims per lane of queries and accumulators would not fit the registers for 8;
//   - a K or V row of D elements is NCH = D * size / 16 vectors of 16 bytes. LPK lanes (8, 16 or
//     32, the power of two >= NCH, at most 32; rows of more vectors take CPL = 2 per lane, f32
//     with D > 128 and bf16 / f16 with D > 256, or 4, f32 with D > 256)
//     hold one key's row, so a warp loads KPW = 32 / LPK keys per instruction, each as whole
//     32-byte sectors. A warp takes U such steps per iteration and issues their K and V loads
//     (2 U CPL vectors per lane) before any math, and fetches the next iteration's block table
//     entries while they are in flight;
//   - each lane keeps its dims of the GC scaled queries (q * scale * log2 e) and of the GC
//     accumulators in f32 registers; a score is the lanes' partial dot products summed by
//     shuffles within the LPK lanes of its key;
//   - online softmax in the exp2 domain per key group (the LPK lanes of one key slot: running max
//     m, sum l, accumulator o), merged across the warp's groups by shuffles, then across the
//     warps in shared memory;
//   - the first K / V loads wait for one round trip, not three (row -> sequence -> block table):
//     q, cu_q, context_lens and the block table entries of the CTA's first keys are loaded
//     together, the entries guessed for a pure decode row (sequence t), no window cut yet and
//     splits of their planned length, and fetched again when the guess was wrong;
//   - when rows x kv heads x head chunks would not give every SM two CTAs (decode of few
//     sequences), the keys of each row are split over up to kMaxSplits CTAs (flash-decoding) of
//     `chunk` keys, a whole number of CTA iterations, planned from the shapes (max_blocks * BS or
//     the window bounds the keys a row sees), so a short context leaves the last splits with no
//     key: their CTAs leave at once. Each split CTA of a row with two or more live splits leaves
//     (m, l) and its unnormalised o per query head in f32 scratch (m in the exp2 domain) and
//     counts itself in the row's arrival counter; the last to arrive merges the partials, weighed
//     by exp2(m - max m), into out and lse. A row whose keys fit one split writes out directly.
// The arrival counters ([T, Hkv * head chunks] of a per-device buffer) are zero between launches:
// zeroed once when allocated, and atomicInc wraps each back to 0 at its row's last arrival, so a
// launch needs no memset and a CUDA graph replays it as is. This relies on the op's launches on
// one device never overlapping (every CUDA op runs on the legacy stream or is captured into a
// graph that runs there).
// A row of q finds its sequence by checking sequence `row` first (pure decode: cu_q[s] = s) and
// by binary search in cu_q otherwise. No host reads of device data.
// (Past 400 lines: the attention kernel, the merge and the launch share the partials' layout,
// row_keys and the arrival counters, so they stay in one file.)
#include "cuda/paged_attention_decode.cuh"


#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <type_traits>
#include <unordered_map>

#include "core/allocator.h"
#include "cuda/common.cuh"

namespace surogate::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxSplits = 32;       // the last split reads every partial of its row: keep them few
constexpr int kMergeBatch = 8;       // partials a merging thread has in flight
constexpr int kArrivalSlots = 4096;  // arrival counters per device: rows x kv heads x head chunks of a split launch
constexpr int64_t kMaxPos = 2147483647;  // key positions are int32 (context_lens)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr unsigned kFull = 0xffffffffu;

// Steps per iteration (see the header): 2 U CPL 16-byte loads in flight per lane; fewer with 8
// query heads, whose queries and accumulators take 128 registers, and with 4 vectors per lane.
// The host plans splits with it.
__host__ __device__ constexpr int steps_per_iter(int cpl, int gc) {
  return cpl >= 4 ? 1 : cpl > 1 ? (gc >= 8 ? 1 : 2) : (gc >= 8 ? 2 : 4);
}
// Query heads a CTA takes at most for rows of D: 16 dims per lane (D > 256) hold 4.
constexpr int max_heads_per_cta(int64_t D) { return D > 256 ? 4 : 8; }

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
// The shift that keeps exp2 finite: the running max, or 0 while it is -inf (no key yet; every
// score is then -inf too and exp2(-inf - 0) = 0).
__device__ __forceinline__ float exp_shift(float m) { return m == -INFINITY ? 0.0f : m; }

// The sequence that owns row t of q (cu_q[s] <= t < cu_q[s + 1]) and its rows [q0, q1), or
// s = -1 (a padding row). a, b are cu_q[t], cu_q[t + 1] (any values when t >= S): pure decode
// (cu_q[s] = s) is answered by them; other batches search cu_q.
struct RowSeq {
  int s;
  int64_t q0, q1;
};
__device__ RowSeq find_row_seq(const int32_t* cu_q, int S, int64_t t, int64_t a, int64_t b) {
  if (t < S && a <= t && t < b) return {static_cast<int>(t), a, b};
  if (t < __ldg(cu_q) || t >= __ldg(cu_q + S)) return {-1, 0, 0};
  int lo = 0, hi = S;  // cu_q[lo] <= t < cu_q[hi]
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    if (__ldg(cu_q + mid) <= t) lo = mid; else hi = mid;
  }
  const int64_t a2 = __ldg(cu_q + lo), b2 = __ldg(cu_q + lo + 1);
  return a2 <= t && t < b2 ? RowSeq{lo, a2, b2} : RowSeq{-1, 0, 0};  // -1 only when cu_q decreases somewhere
}

struct DecodeParams {
  const void* q = nullptr;
  const void* kc = nullptr;
  const void* vc = nullptr;
  void* out = nullptr;
  float* lse = nullptr;         // nullptr: not wanted
  float* part_o = nullptr;      // split partials [nsplit, T, Hq, D]; nullptr: no split
  float* part_ml = nullptr;     // [nsplit, T, Hq, 2]: (m in the exp2 domain, l)
  unsigned* arrivals = nullptr; // [T, Hkv * head_chunks] arrival counters, 0 between launches; with part_o
  const int32_t* bt = nullptr;
  const int32_t* cu_q = nullptr;
  const int32_t* ctx = nullptr;
  int64_t T = 0, window = 0;
  int64_t chunk = 0;            // keys per split when nsplit > 1 (nsplit * chunk >= the keys a row can see)
  int Hq = 0, Hkv = 0, G = 0, D = 0, NCH = 0, BS = 0, max_blocks = 0, NB = 0, S = 0;
  int head_chunks = 1, nsplit = 1;
  float qscale = 1.0f;              // scale * log2 e
  float cap2 = 0.0f, inv_cap2 = 0.0f;  // softcap * log2 e and its inverse; 0: no softcap
};

// The keys a row at position qpos sees, [beg, end), cut in splits of `chunk` keys (all of them when
// there is no split); `live` splits hold at least one key, the others none. Every CTA of the row
// works it out alike, so they agree on who merges and what. A context longer than its table row
// (invalid; its keys past the row read as zeros) gets longer splits than planned.
struct RowKeys {
  int64_t beg, end, chunk;
  int live;
};
__device__ __forceinline__ RowKeys row_keys(const DecodeParams& p, int64_t qpos) {
  const int64_t beg = p.window > 0 ? max64(0, qpos - p.window + 1) : 0;
  const int64_t len = max64(0, qpos + 1 - beg);  // 0: context_lens smaller than the rows
  const int64_t chunk = p.nsplit > 1 ? max64(p.chunk, (len + p.nsplit - 1) / p.nsplit) : len;
  return {beg, beg + len, chunk, len == 0 ? 0 : static_cast<int>((len + chunk - 1) / chunk)};
}

// Where key pos lies: its block (the table entry; -1 when pos is at or past `end` or its block
// past the table row) and its slot in the block. Only the table load may be in flight: nothing
// branches on it until cache_row, so a warp issues all its keys' loads before waiting on one.
// pos < 2^31 wherever blk is used (end <= context_lens or kMaxPos + 1), so 32-bit division
// suffices.
struct KeySlot {
  int32_t blk;
  uint32_t off;
};
__device__ __forceinline__ KeySlot locate(const DecodeParams& p, const int32_t* table, int64_t pos, int64_t end) {
  const uint32_t bs = static_cast<uint32_t>(p.BS);
  const uint32_t ps = static_cast<uint32_t>(pos), bi = ps / bs;
  const bool in = pos < end && bi < static_cast<uint32_t>(p.max_blocks);
  return {in ? __ldg(table + bi) : -1, ps - bi * bs};
}
// The first vector of the key's row of kv head g, or -1: no block, or one outside the cache (read
// as zeros, as the general kernel).
__device__ __forceinline__ int64_t cache_row(const DecodeParams& p, KeySlot k, int g) {
  if (k.blk < 0 || k.blk >= p.NB) return -1;
  return ((static_cast<int64_t>(k.blk) * p.BS + k.off) * p.Hkv + g) * p.NCH;
}

template <typename T>
__device__ __forceinline__ void store4(T* dst, const float4& v, float s) {
  dst[0] = st<T>(v.x * s);
  dst[1] = st<T>(v.y * s);
  dst[2] = st<T>(v.z * s);
  dst[3] = st<T>(v.w * s);
}

// The last split CTA of row t's heads [h0, h0 + nh): every live split's (m, l, o) weighed by
// exp2(m - max m), written to out and lse. Thread (item, zl) of zn per item, item = (head, float4
// of D), takes splits zl, zl + zn, ... kMergeBatch at a time (loads independent of each other,
// merged online); the zn partial merges then meet in shared memory. Partials are read through
// L2 (__ldcg): other CTAs wrote them.
template <typename T>
__device__ void merge_splits(const DecodeParams& p, int64_t t, int h0, int nh, int live, float4* sm_acc,
                             float2* sm_ml) {
  const int tid = static_cast<int>(threadIdx.x);
  const int nv = p.D / 4;  // float4 per head row
  const int items = nh * nv;
  const int zn = max(1, kThreads / items);  // zn > 1: items * zn <= kThreads, one pass
  const int64_t rows = p.T * p.Hq;
  const float2* pml = reinterpret_cast<const float2*>(p.part_ml);
  const float4* po = reinterpret_cast<const float4*>(p.part_o);
  auto finish = [&](int64_t qh, int c4, float M, float L, const float4& acc) {
    store4<T>(static_cast<T*>(p.out) + qh * p.D + 4 * c4, acc, L > 0.0f ? 1.0f / L : 0.0f);
    if (c4 == 0 && p.lse) p.lse[qh] = L > 0.0f ? (M + log2f(L)) * kLn2 : -INFINITY;
  };
  for (int idx = tid; idx < items * zn; idx += kThreads) {
    const int item = idx % items, zl = idx / items;
    const int c4 = item % nv;
    const int64_t qh = t * p.Hq + h0 + item / nv;
    float M = -INFINITY, L = 0.0f;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int z0 = zl; z0 < live; z0 += kMergeBatch * zn) {
      float2 ml[kMergeBatch];
      float4 v[kMergeBatch];
#pragma unroll
      for (int k = 0; k < kMergeBatch; ++k) {
        const int z = z0 + k * zn;
        ml[k] = make_float2(-INFINITY, 0.0f);
        v[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (z < live) {
          const int64_t at = z * rows + qh;
          ml[k] = __ldcg(pml + at);
          v[k] = __ldcg(po + at * nv + c4);
        }
      }
      float mn = M;
#pragma unroll
      for (int k = 0; k < kMergeBatch; ++k) mn = fmaxf(mn, ml[k].x);
      const float sh = exp_shift(mn), a = exp2f(M - sh);
      L *= a;
      acc = make_float4(acc.x * a, acc.y * a, acc.z * a, acc.w * a);
#pragma unroll
      for (int k = 0; k < kMergeBatch; ++k) {
        const float w = exp2f(ml[k].x - sh);  // 0 for a slot past `live`
        L = fmaf(w, ml[k].y, L);
        acc = make_float4(fmaf(w, v[k].x, acc.x), fmaf(w, v[k].y, acc.y), fmaf(w, v[k].z, acc.z),
                          fmaf(w, v[k].w, acc.w));
      }
      M = mn;
    }
    if (zn == 1) {
      finish(qh, c4, M, L, acc);
    } else {
      sm_acc[idx] = acc;
      sm_ml[idx] = make_float2(M, L);
    }
  }
  if (zn == 1) return;  // CTA-uniform
  __syncthreads();
  for (int item = tid; item < items; item += kThreads) {
    float M = -INFINITY;
    for (int zl = 0; zl < zn; ++zl) M = fmaxf(M, sm_ml[zl * items + item].x);
    const float sh = exp_shift(M);
    float L = 0.0f;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int zl = 0; zl < zn; ++zl) {
      const float2 ml = sm_ml[zl * items + item];
      const float4 v = sm_acc[zl * items + item];
      const float w = exp2f(ml.x - sh);
      L = fmaf(w, ml.y, L);
      acc = make_float4(fmaf(w, v.x, acc.x), fmaf(w, v.y, acc.y), fmaf(w, v.z, acc.z), fmaf(w, v.w, acc.w));
    }
    finish(t * p.Hq + h0 + item / nv, item % nv, M, L, acc);
  }
}

// T storage type, LPK lanes per key, CPL 16-byte vectors per lane of a row, GC query heads.
template <typename T, int LPK, int CPL, int GC>
__global__ void __launch_bounds__(kThreads) paged_decode_kernel(const DecodeParams p) {
  constexpr int VEC = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte vector
  constexpr int KPW = 32 / LPK;                           // keys per warp per step
  constexpr int DL = CPL * VEC;                           // dims per lane
  constexpr int DMAX = LPK * DL;                          // dims a group covers (>= D)
  constexpr int U = steps_per_iter(CPL, GC);
  constexpr int KPI = U * KPW;                            // keys per warp per iteration
  __shared__ __align__(16) float sm_o[kWarps][GC][DMAX];
  __shared__ float sm_m[kWarps][GC], sm_l[kWarps][GC];
  __shared__ float4 sm_macc[kThreads];  // the merge's partial sums
  __shared__ float2 sm_mml[kThreads];
  __shared__ int sm_last;

  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int grp = lane / LPK, gl = lane % LPK;  // key slot of this lane in a step, lane in its group
  const int64_t t = blockIdx.x;
  const int g = static_cast<int>(blockIdx.y) / p.head_chunks, hc = static_cast<int>(blockIdx.y) % p.head_chunks;
  const int z = static_cast<int>(blockIdx.z);
  const int h0 = g * p.G + hc * GC;        // first query head of this CTA
  const int nh = min(GC, p.G - hc * GC);   // its real heads; the others stay 0 and are not written

  // Every load that needs no other first, none used before all are issued: the queries (lane gl
  // holds vectors gl + j LPK), context_lens[t], cu_q[t], cu_q[t + 1], and the block table entries
  // of this warp's first keys guessed for sequence t, no window cut and a planned-length split.
  uint4 qv[GC][CPL];
  const uint4* q4 = static_cast<const uint4*>(p.q);
#pragma unroll
  for (int i = 0; i < GC; ++i) {
#pragma unroll
    for (int j = 0; j < CPL; ++j) {
      const int c = gl + j * LPK;
      qv[i][j] = make_uint4(0u, 0u, 0u, 0u);
      if (i < nh && c < p.NCH) qv[i][j] = __ldg(q4 + (t * p.Hq + h0 + i) * p.NCH + c);
    }
  }
  const bool t_seq = t < p.S;  // always (T <= S); the guard keeps every read inside cu_q and the table
  const int32_t ctx_t = t_seq ? __ldg(p.ctx + t) : 0;
  const int32_t cu_a = t_seq ? __ldg(p.cu_q + t) : 0, cu_b = t_seq ? __ldg(p.cu_q + t + 1) : 0;
  const int s_guess = t_seq ? static_cast<int>(t) : 0;
  const int64_t kbeg_guess = static_cast<int64_t>(z) * p.chunk;  // beg = 0; p.chunk = 0 without a split
  KeySlot ks[U];  // the keys of this warp's next iteration
#pragma unroll
  for (int u = 0; u < U; ++u) {
    ks[u] = locate(p, p.bt + static_cast<int64_t>(s_guess) * p.max_blocks, kbeg_guess + warp * KPI + u * KPW + grp,
                   kMaxPos + 1);
  }

  const RowSeq rs = find_row_seq(p.cu_q, p.S, t, cu_a, cu_b);
  if (rs.s < 0) return;  // a padding row: the whole CTA leaves, out stays as it was
  const int s = rs.s;
  const int64_t ctx = rs.s == t ? ctx_t : __ldg(p.ctx + s);
  const int64_t qpos = ctx - (rs.q1 - rs.q0) + (t - rs.q0);  // < context_lens[s]

  // Keys [kbeg, kend) of this CTA. A split with none leaves at once; split 0 always runs, so a
  // row with no key at all still gets out = 0, lse = -inf.
  const RowKeys rk = row_keys(p, qpos);
  if (z > 0 && z >= rk.live) return;
  const bool merged = rk.live > 1;  // partials, then the last split merges them
  const int64_t kbeg = rk.beg + z * rk.chunk, kend = min64(rk.end, kbeg + rk.chunk);

  const int32_t* table = p.bt + static_cast<int64_t>(s) * p.max_blocks;
  const uint4* kc4 = static_cast<const uint4*>(p.kc);
  const uint4* vc4 = static_cast<const uint4*>(p.vc);

  // Warp w's iterations start at kbeg + (n kWarps + w) KPI; step u of one holds keys
  // kb + u KPW + grp. The guessed slots stand when the guess was right (a CTA-uniform branch);
  // either way keys at or past kend get no block (masked, read as zeros).
  const int64_t stride = static_cast<int64_t>(kWarps) * KPI;
  int64_t kb = kbeg + warp * KPI;
  if (s != s_guess || kbeg != kbeg_guess) {
#pragma unroll
    for (int u = 0; u < U; ++u) ks[u] = locate(p, table, kb + u * KPW + grp, kend);
  } else {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (kb + u * KPW + grp >= kend) ks[u].blk = -1;
    }
  }

  float qf[GC][DL];
#pragma unroll
  for (int i = 0; i < GC; ++i) {
#pragma unroll
    for (int j = 0; j < CPL; ++j) {
      unpack16<T>(qv[i][j], &qf[i][j * VEC]);
#pragma unroll
      for (int e = 0; e < VEC; ++e) qf[i][j * VEC + e] *= p.qscale;
    }
  }
  float m[GC], l[GC], o[GC][DL];
#pragma unroll
  for (int i = 0; i < GC; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int d = 0; d < DL; ++d) o[i][d] = 0.0f;
  }

  for (; kb < kend; kb += stride) {  // warp-uniform
    uint4 kr[U][CPL], vr[U][CPL];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t row = cache_row(p, ks[u], g);
#pragma unroll
      for (int j = 0; j < CPL; ++j) {
        const int c = gl + j * LPK;
        kr[u][j] = vr[u][j] = make_uint4(0u, 0u, 0u, 0u);
        if (row >= 0 && c < p.NCH) {
          kr[u][j] = __ldg(kc4 + row + c);
          vr[u][j] = __ldg(vc4 + row + c);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) ks[u] = locate(p, table, kb + stride + u * KPW + grp, kend);  // next iteration's

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
    if (merged) {
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
  if (!merged) return;

  // Arrive. The barrier orders every thread's partial before thread 0's fence, whose release is
  // cumulative, so the count implies the partial is visible device-wide (CUTLASS's arrive
  // pattern); the row's last arrival wraps the counter back to 0, fences again (acquire) and,
  // after the barrier, the whole CTA merges.
  __syncthreads();
  if (tid == 0) {
    const unsigned last = static_cast<unsigned>(rk.live - 1);
    __threadfence();
    const bool is_last = atomicInc(p.arrivals + t * gridDim.y + blockIdx.y, last) == last;
    if (is_last) __threadfence();
    sm_last = is_last;
  }
  __syncthreads();
  if (!sm_last) return;
  merge_splits<T>(p, t, h0, nh, rk.live, sm_macc, sm_mml);
}

template <typename T, int LPK, int CPL, int GC>
Status launch_decode(const DecodeParams& p, dim3 grid) {
  paged_decode_kernel<T, LPK, CPL, GC><<<grid, kThreads, 0, current_stream()>>>(p);
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

template <typename T, int LPK, int CPL>
Status launch_decode_gc(const DecodeParams& p, int gc, dim3 grid) {
  constexpr int DL = CPL * 16 / static_cast<int>(sizeof(T));  // dims per lane
  switch (gc) {
    case 1: return launch_decode<T, LPK, CPL, 1>(p, grid);
    case 2: return launch_decode<T, LPK, CPL, 2>(p, grid);
    case 4: return launch_decode<T, LPK, CPL, 4>(p, grid);
    default:
      if constexpr (DL < 16) return launch_decode<T, LPK, CPL, 8>(p, grid);  // max_heads_per_cta
      return SG_ERROR(StatusCode::kInternal, str_cat("paged_attention: no decode kernel for ", gc, " heads of ",
                                                     p.D, " dims"), "report this as a bug");
  }
}

// Lanes per key and vectors per lane for rows of nch vectors: the kernel that launch_decode_lanes
// picks, and the keys a CTA takes per iteration with gc query heads.
int lanes_per_key(int nch) { return nch <= 8 ? 8 : nch <= 16 ? 16 : 32; }
int vectors_per_lane(int nch) { return nch <= 32 ? 1 : nch <= 64 ? 2 : 4; }
int64_t keys_per_cta_iter(int nch, int gc) {
  return int64_t{kWarps} * steps_per_iter(vectors_per_lane(nch), gc) * (32 / lanes_per_key(nch));
}

template <typename T>
Status launch_decode_lanes(const DecodeParams& p, int gc, dim3 grid) {
  if (p.NCH <= 8) return launch_decode_gc<T, 8, 1>(p, gc, grid);
  if (p.NCH <= 16) return launch_decode_gc<T, 16, 1>(p, gc, grid);
  if (p.NCH <= 32) return launch_decode_gc<T, 32, 1>(p, gc, grid);
  if (p.NCH <= 64) return launch_decode_gc<T, 32, 2>(p, gc, grid);  // f32 D > 128, bf16 / f16 D > 256
  if constexpr (sizeof(T) == 4) {
    if (p.NCH <= 128) return launch_decode_gc<T, 32, 4>(p, gc, grid);  // f32 D > 256
  }
  return SG_ERROR(StatusCode::kInternal, str_cat("paged_attention: no decode kernel for ", p.NCH, " vectors per row"),
                  "report this as a bug");
}

// The arrival counters of `dev` (kArrivalSlots, zero between launches): allocated and zeroed on
// first use, then held for the process (graphs keep the pointer). The zeroing goes to the legacy
// stream, never a capturing one, so that it runs now, before any eager launch or graph replay
// (both of which run on the legacy stream), even when the first use is being captured.
Status arrival_counters(const Device& dev, unsigned** out) {
  static std::mutex mu;
  static auto* held = new std::unordered_map<int, std::shared_ptr<void>>();  // never destroyed
  std::lock_guard<std::mutex> lock(mu);
  std::shared_ptr<void>& buf = (*held)[dev.index];
  if (!buf) {
    const size_t bytes = kArrivalSlots * sizeof(unsigned);
    std::shared_ptr<void> fresh;
    SG_RETURN_IF_ERROR(allocate(dev, bytes, &fresh));
    SG_CUDA_CHECK(cudaMemsetAsync(fresh.get(), 0, bytes, cudaStreamLegacy));
    buf = std::move(fresh);
  }
  *out = static_cast<unsigned*>(buf.get());
  return Status::OK();
}

}  // namespace

bool paged_decode_supports(DType dtype, int64_t D, std::initializer_list<const void*> ptrs) {
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16) return false;
  const int64_t bytes = D * static_cast<int64_t>(dtype_size(dtype));
  const int64_t max_vectors = dtype == DType::kF32 ? 128 : 64;  // D <= 512
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
  while (gc < p.G && gc < max_heads_per_cta(a.D)) gc *= 2;
  p.head_chunks = (p.G + gc - 1) / gc;
  const int64_t grid_y = static_cast<int64_t>(a.Hkv) * p.head_chunks;
  const int64_t i32max = std::numeric_limits<int32_t>::max();
  SG_CHECK_SHAPE(grid_y <= 65535 && a.T * a.Hq <= i32max,
                 str_cat(op, ": ", a.Hkv, " kv heads x ", p.head_chunks, " head chunks, or ", a.T, " rows x ", a.Hq,
                         " heads, is past the CUDA grid limits"));

  // Key splits while the CTAs would not give every SM two: about four CTAs per SM then. A split
  // is a whole number of CTA iterations (kpi keys), as few per split as that allows: each more
  // is one more round trip to memory on the critical path, while the merge reads all partials in
  // one round (a few for many splits). The keys a row can see are bounded by its table row and
  // the window.
  const int64_t n_cta = a.T * grid_y, sms = std::max(1, a.sms);
  if (n_cta < 2 * sms && n_cta <= kArrivalSlots) {
    const int64_t ctx_cap = static_cast<int64_t>(a.max_blocks) * a.BS;
    const int64_t keys_cap = a.window > 0 ? std::min(ctx_cap, a.window) : ctx_cap;
    const int64_t kpi = keys_per_cta_iter(p.NCH, gc);
    const int64_t iters = (keys_cap + kpi - 1) / kpi;  // CTA iterations of the longest row
    const int64_t want = std::min<int64_t>({(4 * sms + n_cta - 1) / n_cta, iters, int64_t{kMaxSplits}});
    if (want > 1) {
      const int64_t per = (iters + want - 1) / want;  // iterations per split
      p.nsplit = static_cast<int>((iters + per - 1) / per);
      p.chunk = per * kpi;
    }
  }
  std::shared_ptr<void> part_buf;
  if (p.nsplit > 1) {
    const size_t per_split = static_cast<size_t>(a.T) * static_cast<size_t>(a.Hq) * static_cast<size_t>(a.D + 2);
    SG_RETURN_IF_ERROR(allocate(a.device, static_cast<size_t>(p.nsplit) * per_split * sizeof(float), &part_buf));
    p.part_o = static_cast<float*>(part_buf.get());
    // After the o block: D is a multiple of 4, so this stays 16-byte aligned.
    p.part_ml = p.part_o + static_cast<size_t>(p.nsplit) * static_cast<size_t>(a.T * a.Hq) * a.D;
    SG_RETURN_IF_ERROR(arrival_counters(a.device, &p.arrivals));
  }

  const dim3 grid(static_cast<unsigned>(a.T), static_cast<unsigned>(grid_y), static_cast<unsigned>(p.nsplit));
  SG_CUDA_DISPATCH_FLOAT(op, a.dtype, Ty, { SG_RETURN_IF_ERROR(launch_decode_lanes<Ty>(p, gc, grid)); });
  return Status::OK();
}

}  // namespace surogate::cuda
