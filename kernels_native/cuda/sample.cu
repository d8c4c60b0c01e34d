// The `sample` op on CUDA, the twin of cpu/sample.cpp (read its header for the five steps of a
// row; runtime/op_checks_sample.h for the params row, core/sample_math.h for the numerics both
// share, core/philox.h for the draw). One block of 512 threads per row, and no sort:
//   pass 1     the largest logit (its lowest id), NaN / +inf (a block reduction)
//   top-k      radix select over the logits' order keys: 4 rounds of 8-bit digits, per-warp count
//              histograms (digits aggregated in a warp with __match_any_sync), the k-th key t and
//              how many of the ids tied at t are kept
//   top-p      the same select by weight inside the top-k set (per-warp-pair uint64 histograms;
//              the round-0 total is the kept mass): the cut and its ties (sample::top_p_ties)
//   draw       the kept weight of each warp's slice of the row (their sum is the mass, the lse's
//              sum rides along), the slice holding floor(u * mass), split into 16 again, ..., down
//              to 32 ids and a warp scan: the inverse CDF in id order, ~1.07 reads of the row
//   rank       one count over the row (skipped for the top token)
// With the mask input, the choice (the max, the selects, the draw) reads a disallowed token as
// -inf (masked_ld), the lse and the rank the raw row; no allowed finite logit: token -2.
// The weights are integers, so every partial sum is exact and the slices' sums add up to the
// mass: the choice is the CPU's whenever the exps are (expf may differ from the host's by an ulp,
// which moves a boundary by ~1e-7 of the mass). x / T - max / T is rounded as on the CPU
// (__fmul_rn, __fsub_rn: no contraction into an fma).
#include <climits>

#include "core/philox.h"
#include "core/sample_math.h"
#include "cuda/backend.h"
#include "cuda/common.cuh"
#include "runtime/op_checks_sample.h"

namespace surogate::cuda {

namespace {

constexpr int kThreads = 512, kWarps = kThreads / 32, kBins = 256;
constexpr unsigned kFull = 0xffffffffu;
constexpr uint32_t kNoDigit = 0xffffffffu;

using u64 = unsigned long long;

struct Shared {
  uint32_t count[kWarps][kBins];   // radix rounds: per warp
  u64 mass[kWarps / 2][kBins];     // per warp pair
  uint32_t hc[kBins];              // merged
  u64 hm[kBins];
  u64 slice_mass[kWarps];          // the draw: per slice
  int slice_ties[kWarps];
  double red_d[kWarps];
  int red_i[kWarps];
  float red_f[kWarps], red_fm[kWarps];
  int red_im[kWarps];
  // one thread's answers, read by all after a barrier
  uint32_t sel_bin, sel_count;
  u64 sel_above, sel_c;
  double target;
  int lo, hi, tb;
  u64 base, point;
  int token;
};

// Row state every step reads.
struct Row {
  float inv_t, m;
  double scale;
  __device__ float e(float v) const { return expf(__fsub_rn(__fmul_rn(v, inv_t), m)); }
  __device__ u64 w(float v) const { return sample::weight(e(v), scale); }
};

// The row's value for the choice: -inf where the grammar's mask (null: none) disallows the token.
template <typename T>
__device__ __forceinline__ float masked_ld(const T* x, const uint32_t* mk, int i) {
  return sample::allows(mk, i) ? ld(x[i]) : -INFINITY;
}

__device__ __forceinline__ uint32_t key_of(float v) { return sample::order_key(__float_as_uint(v)); }

// The logit of an order key (its inverse; -0 comes back as +0).
__device__ __forceinline__ float logit_of(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

__device__ __forceinline__ int lane_id() { return threadIdx.x & 31; }
__device__ __forceinline__ int warp_id() { return threadIdx.x >> 5; }

template <typename V>
__device__ __forceinline__ V warp_sum(V v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// Sum over the block (every thread gets it); `red` is reused, so a barrier comes first.
template <typename V>
__device__ V block_sum(V v, V* red) {
  v = warp_sum(v);
  __syncthreads();
  if (lane_id() == 0) red[warp_id()] = v;
  __syncthreads();
  V s = 0;
  for (int w = 0; w < kWarps; ++w) s += red[w];
  return s;
}

struct Select {
  uint32_t t = 0;   // the cut key
  int64_t ties = 0;  // count mode: ties needed at t; mass mode: the set's ids at t
  u64 above = 0;     // mass mode: the set's weight above t
  double target = 0;  // mass mode: the top-p target
};

// Radix select over the row's keys, from the top. Count mode: the k-th key of the order. Mass mode:
// the key where the set's weight, from the top, reaches top_p of the set's total (ids of weight 0
// left out: they never reach anything). The set: every id, or (limited) those above lim plus
// lim_ties ids at lim (the top-k set, for top-p).
template <typename T>
__device__ Select radix_select(const T* x, const uint32_t* mk, int V, const Row& row, bool by_mass, int64_t k,
                               float top_p, bool limited, uint32_t lim, int64_t lim_ties, Shared& sm) {
  const int lane = lane_id(), warp = warp_id();
  const u64 lim_w = limited && by_mass ? row.w(logit_of(lim)) : 0;
  uint32_t prefix = 0, mask = 0;
  int64_t k_rem = k;
  u64 above = 0;
  double target = 0.0;
  for (int round = 0; round < 4; ++round) {
    const int shift = 24 - 8 * round;
    for (int j = threadIdx.x; j < kWarps * kBins; j += kThreads) (&sm.count[0][0])[j] = 0;
    if (by_mass) {
      for (int j = threadIdx.x; j < kWarps / 2 * kBins; j += kThreads) (&sm.mass[0][0])[j] = 0;
    }
    __syncthreads();
    uint32_t* cnt = sm.count[warp];
    u64* ms = sm.mass[warp / 2];
    for (int base = warp * 32; base < V; base += kThreads) {  // warp-uniform trip count
      const int i = base + lane;
      uint32_t d = kNoDigit;
      u64 w = 0;
      if (i < V) {
        const float v = masked_ld(x, mk, i);
        const uint32_t key = key_of(v);
        bool in = (key & mask) == prefix && (!limited || key > lim);
        if (in && by_mass) {
          w = row.w(v);
          in = w != 0;
        }
        if (in) d = (key >> shift) & 0xffu;
      }
      const unsigned peers = __match_any_sync(kFull, d);
      if (d != kNoDigit) {
        if (lane == __ffs(peers) - 1) atomicAdd(&cnt[d], static_cast<uint32_t>(__popc(peers)));
        if (by_mass) atomicAdd(&ms[d], w);
      }
    }
    __syncthreads();
    for (int b = threadIdx.x; b < kBins; b += kThreads) {
      uint32_t c = 0;
      u64 s = 0;
      for (int w = 0; w < kWarps; ++w) c += sm.count[w][b];
      if (by_mass) {
        for (int w = 0; w < kWarps / 2; ++w) s += sm.mass[w][b];
      }
      if (limited && (lim & mask) == prefix && ((lim >> shift) & 0xffu) == static_cast<uint32_t>(b) &&
          (!by_mass || lim_w != 0)) {
        c += static_cast<uint32_t>(lim_ties);
        s += static_cast<u64>(lim_ties) * lim_w;
      }
      sm.hc[b] = c;
      sm.hm[b] = s;
    }
    __syncthreads();
    if (warp == 0) {  // lane l holds bins 255 - 8 l down to 248 - 8 l: lane order is the order
      uint32_t c8 = 0;
      u64 s8 = 0;
      for (int j = 0; j < 8; ++j) {
        c8 += sm.hc[255 - 8 * lane - j];
        s8 += sm.hm[255 - 8 * lane - j];
      }
      if (round == 0 && by_mass) target = sample::top_p_target(top_p, warp_sum(s8));  // the set's mass
      uint32_t c_ex = c8;
      u64 s_ex = s8;
      for (int o = 1; o < 32; o <<= 1) {
        const uint32_t c2 = __shfl_up_sync(kFull, c_ex, o);
        const u64 s2 = __shfl_up_sync(kFull, s_ex, o);
        if (lane >= o) c_ex += c2, s_ex += s2;
      }
      c_ex -= c8;
      s_ex -= s8;
      const bool crosses = by_mass ? sample::reaches(above + s_ex + s8, target) : int64_t{c_ex} + c8 >= k_rem;
      const unsigned ball = __ballot_sync(kFull, crosses);
      const int first = ball ? __ffs(ball) - 1 : 31;  // (always one: the set reaches its own total)
      if (lane == first) {
        uint32_t c = c_ex;
        u64 s = above + s_ex;
        int b = 255 - 8 * lane;
        for (int j = 0; j < 8; ++j, --b) {
          if (by_mass ? sample::reaches(s + sm.hm[b], target) : int64_t{c} + sm.hc[b] >= k_rem) break;
          c += sm.hc[b];
          s += sm.hm[b];
        }
        b = max(b, 248 - 8 * lane);
        sm.sel_bin = static_cast<uint32_t>(b);
        sm.sel_count = sm.hc[b];
        sm.sel_c = c;
        sm.sel_above = s;
        if (round == 0) sm.target = target;
      }
    }
    __syncthreads();
    prefix |= sm.sel_bin << shift;
    mask |= 0xffu << shift;
    k_rem -= static_cast<int64_t>(sm.sel_c);
    above = sm.sel_above;
    target = sm.target;
  }
  Select out;
  out.t = prefix;
  out.ties = by_mass ? int64_t{sm.sel_count} : k_rem;
  out.above = above;
  out.target = target;
  __syncthreads();  // sm.sel_* are rewritten by the next select
  return out;
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 1) sample_kernel(const T* logits, int64_t row_stride, int V,
                                                          const float* params, const uint32_t* masks, int64_t words,
                                                          int32_t* token_out, float* lp_out, int32_t* rank_out) {
  __shared__ Shared sm;
  const int tid = threadIdx.x, lane = lane_id(), warp = warp_id();
  const T* x = logits + blockIdx.x * row_stride;
  const float* p = params + blockIdx.x * int64_t{kSampleParamCols};
  const uint32_t* mk = masks != nullptr ? masks + blockIdx.x * words : nullptr;

  // Pass 1: the largest logit and its lowest id (of the raw row and of the masked one); NaN / +inf.
  float bv = -INFINITY, mv = -INFINITY;
  int bi = INT_MAX, mi = INT_MAX;
  bool bad = false;
  for (int i = tid; i < V; i += kThreads) {
    const float v = ld(x[i]);
    bad |= isnan(v) || v == INFINITY;
    if (v > bv || (v == bv && i < bi)) bv = v, bi = i;
    const float w = sample::allows(mk, i) ? v : -INFINITY;
    if (w > mv || (w == mv && i < mi)) mv = w, mi = i;
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(kFull, bv, o);
    const int oi = __shfl_xor_sync(kFull, bi, o);
    if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
    const float omv = __shfl_xor_sync(kFull, mv, o);
    const int omi = __shfl_xor_sync(kFull, mi, o);
    if (omv > mv || (omv == mv && omi < mi)) mv = omv, mi = omi;
  }
  if (lane == 0) sm.red_f[warp] = bv, sm.red_i[warp] = bi, sm.red_fm[warp] = mv, sm.red_im[warp] = mi;
  if (__syncthreads_or(bad)) {
    if (tid == 0) {
      token_out[blockIdx.x] = -1;
      lp_out[blockIdx.x] = __int_as_float(0x7fc00000);
      if (rank_out != nullptr) rank_out[blockIdx.x] = 0;
    }
    return;
  }
  bv = sm.red_f[0], bi = sm.red_i[0];
  mv = sm.red_fm[0], mi = sm.red_im[0];
  for (int w = 1; w < kWarps; ++w) {
    if (sm.red_f[w] > bv || (sm.red_f[w] == bv && sm.red_i[w] < bi)) bv = sm.red_f[w], bi = sm.red_i[w];
    if (sm.red_fm[w] > mv || (sm.red_fm[w] == mv && sm.red_im[w] < mi)) mv = sm.red_fm[w], mi = sm.red_im[w];
  }
  if (mk != nullptr && mv == -INFINITY) {  // the mask allows no finite logit (uniform over the block)
    if (tid == 0) {
      token_out[blockIdx.x] = sample::kNothingAllowed;
      lp_out[blockIdx.x] = -INFINITY;
      if (rank_out != nullptr) rank_out[blockIdx.x] = 0;
    }
    return;
  }

  const float temperature = p[kSampleTemperature];
  const bool greedy = !(temperature >= kSampleGreedyBelow) || mv == -INFINITY;
  double sum = 0.0;  // of exp(x - max) over the raw row, for the lse
  int token = mi;
  if (greedy) {
    for (int i = tid; i < V; i += kThreads) sum += expf(ld(x[i]) - bv);
    sum = block_sum(sum, sm.red_d);
  } else {
    Row row;
    row.inv_t = 1.0f / temperature;
    row.m = __fmul_rn(mv, row.inv_t);
    row.scale = static_cast<double>(1ull << sample::weight_shift(V));
    // The kept set: key > t, or key == t among the first n_tie such ids.
    uint32_t t = 0;
    int64_t n_tie = 0;
    const float top_kf = p[kSampleTopK], top_p = p[kSampleTopP];
    const bool use_k = top_kf >= 1.0f && top_kf < static_cast<float>(V), use_p = top_p < 1.0f;
    if (use_k) {
      const Select s = radix_select(x, mk, V, row, false, static_cast<int64_t>(top_kf), 0.0f, false, 0u, 0, sm);
      t = s.t;
      n_tie = s.ties;
    }
    if (use_p) {
      const Select s = radix_select(x, mk, V, row, true, 0, top_p, use_k, t, n_tie, sm);
      n_tie = sample::top_p_ties(s.above, row.w(logit_of(s.t)), s.ties, s.target);
      t = s.t;
    }
    const float min_p = fminf(p[kSampleMinP], 1.0f);
    const float e_t = row.e(logit_of(t));
    const u64 tie_w = n_tie > 0 && e_t >= min_p ? sample::weight(e_t, row.scale) : 0;
    auto gt_weight = [&](float v, uint32_t key) -> u64 {
      if (key <= t) return 0;
      const float e = row.e(v);
      return e >= min_p ? sample::weight(e, row.scale) : 0;
    };
    const uint32_t seed_lo = __float_as_uint(p[kSampleSeedLo]), seed_hi = __float_as_uint(p[kSampleSeedHi]);
    const uint32_t step = __float_as_uint(p[kSampleStep]);

    // The draw: slices of [lo, hi), each a warp's; the one holding the point; again, down to 32 ids.
    int lo = 0, hi = V;
    u64 base = 0;  // kept weight before lo
    int tb = 0;    // ids tied at t before lo
    bool first_level = true;
    while (hi - lo > 32) {
      const int n = hi - lo;
      const int sub = ((n + kWarps - 1) / kWarps + 31) / 32 * 32;
      const int s_lo = min(hi, lo + warp * sub), s_hi = min(hi, s_lo + sub);
      u64 mass = 0;
      int ties = 0;
      for (int i = s_lo + lane; i < s_hi; i += 32) {
        const float raw = ld(x[i]);
        const float v = sample::allows(mk, i) ? raw : -INFINITY;
        const uint32_t key = key_of(v);
        mass += gt_weight(v, key);
        ties += key == t;
        if (first_level) sum += expf(raw - bv);
      }
      mass = warp_sum(mass);
      ties = warp_sum(ties);
      if (lane == 0) sm.slice_mass[warp] = mass, sm.slice_ties[warp] = ties;
      __syncthreads();
      if (tid == 0) {
        auto kept = [&](int s, int before) {
          const int64_t left = n_tie - before > 0 ? n_tie - before : 0;
          const int64_t k = left < sm.slice_ties[s] ? left : sm.slice_ties[s];
          return sm.slice_mass[s] + static_cast<u64>(k) * tie_w;
        };
        if (first_level) {
          u64 total = 0;
          for (int s = 0, b = 0; s < kWarps; b += sm.slice_ties[s], ++s) total += kept(s, b);
          sm.point = sample::draw_point(sample_uniform(seed_lo, seed_hi, step), total);
        }
        int s = 0, b = tb;
        u64 c = base;
        for (; s < kWarps - 1; b += sm.slice_ties[s], ++s) {  // (the point is below the mass: a slice has it)
          const u64 m = kept(s, b);
          if (c + m > sm.point) break;
          c += m;
        }
        sm.lo = min(hi, lo + s * sub);
        sm.hi = min(hi, sm.lo + sub);
        sm.base = c;
        sm.tb = b;
      }
      __syncthreads();
      lo = sm.lo, hi = sm.hi, base = sm.base, tb = sm.tb;
      first_level = false;
      __syncthreads();  // slice_* and lo / hi are written again next level
    }
    if (first_level) {  // a row of at most 32 ids: the sum and the point here
      for (int i = tid; i < V; i += kThreads) sum += expf(ld(x[i]) - bv);
    }
    if (warp == 0) {
      const int i = lo + lane;
      float v = 0.0f;
      uint32_t key = 0;
      if (i < hi) v = masked_ld(x, mk, i), key = key_of(v);
      const bool tie = i < hi && key == t;
      const unsigned tie_ball = __ballot_sync(kFull, tie);
      const int tie_rank = tb + __popc(tie_ball & ((1u << lane) - 1u));
      u64 w = i < hi ? (tie ? (tie_rank < n_tie ? tie_w : 0) : gt_weight(v, key)) : 0;
      if (first_level) {
        const u64 total = warp_sum(w);
        if (lane == 0) sm.point = sample::draw_point(sample_uniform(seed_lo, seed_hi, step), total);
        __syncwarp();
      }
      u64 cum = w;
      for (int o = 1; o < 32; o <<= 1) {
        const u64 c2 = __shfl_up_sync(kFull, cum, o);
        if (lane >= o) cum += c2;
      }
      const unsigned ball = __ballot_sync(kFull, i < hi && w != 0 && base + cum > sm.point);
      if (lane == 0) sm.token = ball ? lo + __ffs(ball) - 1 : mi;
    }
    sum = block_sum(sum, sm.red_d);  // (its barriers publish sm.token)
    token = sm.token;
  }

  const float xt = ld(x[token]);
  int rank = 1;
  if (token != bi) {
    int before = 0;
    for (int i = tid; i < V; i += kThreads) {
      const float v = ld(x[i]);
      before += v > xt || (v == xt && i < token);
    }
    rank += block_sum(before, sm.red_i);
  }
  if (tid == 0) {
    const double lse = static_cast<double>(bv) + log(sum);
    token_out[blockIdx.x] = token;
    lp_out[blockIdx.x] = static_cast<float>(static_cast<double>(xt) - lse);
    if (rank_out != nullptr) rank_out[blockIdx.x] = rank;
  }
}

Status sample(const OpArgs& a) {
  SampleDims d;
  SG_RETURN_IF_ERROR(check_sample(a, &d));
  if (d.R == 0) return Status::OK();
  const Tensor& logits = a.in(0);
  int32_t* rank = d.rank ? a.out(2).ptr<int32_t>() : nullptr;
  const auto* mask = d.mask ? static_cast<const uint32_t*>(a.in(2).data) : nullptr;
  SG_CUDA_DISPATCH_FLOAT("sample", logits.dtype, T, {
    sample_kernel<T><<<static_cast<unsigned>(d.R), kThreads, 0, current_stream()>>>(
        logits.ptr<T>(), d.row_stride, static_cast<int>(d.V), a.in(1).ptr<float>(), mask, (d.V + 31) / 32,
        a.out(0).ptr<int32_t>(), a.out(1).ptr<float>(), rank);
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

}  // namespace

void register_cuda_sample(OpRegistry& reg) { add_op(reg, "sample", sample); }

}  // namespace surogate::cuda
