// The `sample` op on the CPU: one token per logits row, on the device that computed the logits,
// so that a serving step with sampled rows moves R tokens instead of R x V floats
// (runtime/op_checks_sample.h: shapes and the params row; core/sample_math.h: the numerics the
// CUDA kernel shares; core/philox.h: the draw).
//
// Per row, shape letters R rows, V vocabulary:
//   1. a NaN or +inf logit: token -1, logprob NaN, rank 0 (the argmax op's -1; the engine's error)
//   2. best = the lowest id of the largest logit; lse = max + log(sum exp(x - max)) (float exps,
//      a double sum); temperature < 1e-5 (or a row of -inf only): token = best, rank 1
//   3. otherwise e = exp(x / T - max / T) per token and its integer weight; the kept set in the
//      order (logit desc, id asc): top-k (the first k), then top-p inside it (the shortest prefix
//      whose weight reaches top_p of the kept weight), as (cut key t, ties kept at t in id order);
//      min-p drops e < min_p (relative to the top token, e = 1), as the host Sampler (its order)
//   4. u = the Philox uniform of (seed, step); the token is the first kept id whose running weight,
//      in id order, passes u * (kept weight): inverse CDF over the kept tokens in index order
//   5. logprob = x[token] - lse (the unmodified row: the engine's raw logprobs); rank = 1 + the
//      tokens before it in the order
// With the optional mask input (a grammar's bitmask), steps 2-4 choose from the row with every
// token the mask does not allow at -inf (mask_row, the host Sampler's masking too); step 5 reads
// the unmasked row. A mask leaving no finite logit: token -2, logprob -inf, rank 0.
// The kept set is found here by sorting (nth_element / partial sort, the host Sampler's way);
// cuda/sample.cu finds the same cut by radix select. Compiled with -ffp-contract=off (CMake):
// x * (1 / T) - max / T is two roundings on both backends.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "core/philox.h"
#include "core/sample_math.h"
#include "cpu/common.h"
#include "cpu/sample.h"
#include "runtime/op_checks_sample.h"

namespace surogate::cpu {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

struct Scratch {
  std::vector<float> x, xm, e;
  std::vector<uint32_t> key;
  std::vector<uint64_t> w;
  std::vector<int32_t> order;
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

uint32_t bits_of(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof(b));
  return b;
}

struct RowOut {
  int32_t token = -1;
  float logprob = std::numeric_limits<float>::quiet_NaN();
  int32_t rank = 0;
};

// The lowest id of the largest value of a row without NaN / +inf.
int64_t argmax_row(const float* x, int64_t V) {
  int64_t best = 0;
  for (int64_t i = 1; i < V; ++i) best = x[i] > x[best] ? i : best;
  return best;
}

// The kept set of step 3 as (cut key t, ties kept): key > t, or key == t among the first n_tie
// such ids. Fills s.key, s.e, s.w.
void kept_set(Scratch& s, const float* x, int64_t V, const float* p, float best_value, uint32_t* t, int64_t* n_tie) {
  const float inv_t = 1.0f / p[kSampleTemperature];
  const float m = best_value * inv_t;
  const double scale = std::ldexp(1.0, sample::weight_shift(V));
  s.key.resize(V);
  s.e.resize(V);
  s.w.resize(V);
  for (int64_t i = 0; i < V; ++i) {
    const float e = std::exp(x[i] * inv_t - m);
    s.e[i] = e;
    s.w[i] = sample::weight(e, scale);
    s.key[i] = sample::order_key(bits_of(x[i]));
  }
  *t = 0;  // below every key: all kept
  *n_tie = 0;
  const float top_kf = p[kSampleTopK], top_p = p[kSampleTopP];
  const bool use_k = top_kf >= 1.0f && top_kf < static_cast<float>(V);
  const bool use_p = top_p < 1.0f;
  if (!use_k && !use_p) return;
  const int64_t k = use_k ? static_cast<int64_t>(top_kf) : V;
  std::vector<int32_t>& order = s.order;
  order.resize(V);
  std::iota(order.begin(), order.end(), 0);
  const uint32_t* key = s.key.data();
  auto before = [key](int32_t a, int32_t b) { return key[a] > key[b] || (key[a] == key[b] && a < b); };
  int64_t n = k;  // the kept prefix of the order
  if (use_k) std::nth_element(order.begin(), order.begin() + (k - 1), order.end(), before);
  if (use_p) {
    uint64_t kept = 0;
    for (int64_t i = 0; i < k; ++i) kept += s.w[order[i]];
    const double target = sample::top_p_target(top_p, kept);
    // Sort a head likely to reach the target; the rest of the kept range only when it does not.
    int64_t head = std::min<int64_t>(k, 256);
    std::partial_sort(order.begin(), order.begin() + head, order.begin() + k, before);
    uint64_t acc = 0;
    n = 0;
    while (n < k && !sample::reaches(acc, target)) {
      if (n == head) {
        std::sort(order.begin() + head, order.begin() + k, before);
        head = k;
      }
      acc += s.w[order[n++]];
    }
  }
  *t = key[order[n - 1]];
  for (int64_t i = 0; i < n; ++i) *n_tie += key[order[i]] == *t;
}

// Steps 2-4: the token of a row without NaN / +inf whose largest value is at `best`.
int64_t choose(const float* x, int64_t V, const float* p, int64_t best) {
  const float temperature = p[kSampleTemperature];
  if (!(temperature >= kSampleGreedyBelow) || x[best] == -kInf) return best;
  Scratch& s = scratch();
  uint32_t t = 0;
  int64_t n_tie = 0;
  kept_set(s, x, V, p, x[best], &t, &n_tie);
  const float min_p = std::min(p[kSampleMinP], 1.0f);  // the top token (e = 1) always stays
  auto kept_weight = [&](int64_t i, int64_t* ties) -> uint64_t {
    if (s.key[i] < t || (s.key[i] == t && (*ties)++ >= n_tie)) return 0;
    return s.e[i] >= min_p ? s.w[i] : 0;
  };
  uint64_t mass = 0;
  int64_t ties = 0;
  for (int64_t i = 0; i < V; ++i) mass += kept_weight(i, &ties);
  uint32_t bits[3];
  std::memcpy(bits, p + kSampleSeedLo, sizeof(bits));
  const uint64_t point = sample::draw_point(sample_uniform(bits[0], bits[1], bits[2]), mass);
  uint64_t acc = 0;
  ties = 0;
  for (int64_t i = 0; i < V; ++i) {
    acc += kept_weight(i, &ties);
    if (acc > point) return i;
  }
  return best;  // (not reached: the point is below the mass)
}

// mask: the row's grammar bitmask, or null. The choice reads the masked row (xm, scratch), the
// logprob and rank the unmasked one.
RowOut sample_row(const float* x, int64_t V, const float* p, const uint32_t* mask) {
  RowOut out;
  for (int64_t i = 0; i < V; ++i) {
    if (std::isnan(x[i]) || x[i] == kInf) return out;
  }
  const int64_t best = argmax_row(x, V);
  const float bv = x[best];
  double sum = 0.0;
  for (int64_t i = 0; i < V; ++i) sum += std::exp(x[i] - bv);
  const double lse = static_cast<double>(bv) + std::log(sum);
  int64_t token = best;
  if (mask == nullptr) {
    token = choose(x, V, p, best);
  } else {
    std::vector<float>& xm = scratch().xm;
    xm.assign(x, x + V);
    mask_row(xm.data(), V, mask);
    const int64_t best_m = argmax_row(xm.data(), V);
    if (xm[best_m] == -kInf) {
      out.token = sample::kNothingAllowed;
      out.logprob = -kInf;
      return out;
    }
    token = choose(xm.data(), V, p, best_m);
  }
  out.token = static_cast<int32_t>(token);
  out.logprob = static_cast<float>(static_cast<double>(x[token]) - lse);
  int64_t rank = 1;
  if (token != best) {
    for (int64_t i = 0; i < V; ++i) rank += x[i] > x[token] || (x[i] == x[token] && i < token);
  }
  out.rank = static_cast<int32_t>(rank);
  return out;
}

Status sample(const OpArgs& a) {
  SampleDims d;
  SG_RETURN_IF_ERROR(check_sample(a, &d));
  const Tensor& logits = a.in(0);
  const float* params = a.in(1).ptr<float>();
  int32_t* token = a.out(0).ptr<int32_t>();
  float* logprob = a.out(1).ptr<float>();
  int32_t* rank = d.rank ? a.out(2).ptr<int32_t>() : nullptr;
  const auto* mask = d.mask ? static_cast<const uint32_t*>(a.in(2).data) : nullptr;
  const int64_t W = (d.V + 31) / 32;
  SG_DISPATCH_FLOAT("sample", logits.dtype, T, {
    parallel_for(0, d.R, 1, [&](int64_t lo, int64_t hi) {
      std::vector<float>& x = scratch().x;
      x.resize(d.V);
      for (int64_t r = lo; r < hi; ++r) {
        const T* row = logits.ptr<T>() + r * d.row_stride;
        for (int64_t i = 0; i < d.V; ++i) x[i] = load(row[i]);
        const RowOut o = sample_row(x.data(), d.V, params + r * kSampleParamCols,
                                    mask != nullptr ? mask + r * W : nullptr);
        token[r] = o.token;
        logprob[r] = o.logprob;
        if (rank != nullptr) rank[r] = o.rank;
      }
    });
  });
  return Status::OK();
}

}  // namespace

void mask_row(float* x, int64_t V, const uint32_t* mask) {
  for (int64_t i = 0; i < V; ++i) {
    if (!sample::allows(mask, i)) x[i] = -kInf;
  }
}

int32_t sample_token(const float* x, int64_t V, const float* params) {
  return static_cast<int32_t>(choose(x, V, params, argmax_row(x, V)));
}

void register_cpu_sample(OpRegistry& reg) { add_op(reg, "sample", sample); }

}  // namespace surogate::cpu
