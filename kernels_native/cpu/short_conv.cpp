// LFM2's gated short convolution on the CPU, forward, backward and the serving step, the
// reference for cuda/short_conv.cu. Shape letters: N tokens (packed documents), C channels, L
// taps (conv_L_cache), S documents (cu_seqlens) or serving sequences.
//
// bcx [N, 3C] is in_proj's output, HF's chunks in order: B = bcx[:, :C], Cg = bcx[:, C:2C],
// x = bcx[:, 2C:]. w [C, L] (or HF's Conv1d [C, 1, L]). HF's Lfm2ShortConv, per channel c:
//   u[t]    = T(B[t] x[t])
//   conv[t] = T(bias + sum_k w[k] u[t - (L-1) + k])     (causal depthwise conv1d; u = 0 before
//                                                       the document's first token)
//   y[t]    = T(Cg[t] conv[t])
// with the roundings where HF's tensors of the activation dtype round (no-ops in f32), math in f32.
// Documents of a packed row never see each other: the window stops at the document start.
//
// Backward (dy [N, C]), with g[t] = dy[t] Cg[t] (f32):
//   dCg[t] = dy[t] conv[t]                 (conv recomputed as the forward does)
//   du[t]  = sum_k w[k] g[t + (L-1) - k]   (terms past the document's end are 0)
//   dB[t]  = du[t] x[t],  dx[t] = du[t] B[t]
//   dw[k]  = sum_t g[t] u[t - (L-1) + k],  dbias = sum_t g[t]   (+= with accumulate)
//
// Serving (short_conv_cache): the same forward over each sequence's span of the step, its window
// continued from conv_state[slot] ([L-1, C], the last L-1 u values of the sequence so far, oldest
// first), which is then rewritten with the span's last L-1 (in place). A span that starts the
// sequence (context_lens - span = 0: a new or preempted sequence) starts from zeros, so a stale
// slot is never read; slot -1 runs from zeros and keeps nothing. Rows past cu_q[S] (bucket padding)
// are written as 0.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu/common.h"
#include "cpu/vec_math.h"
#include "runtime/op_checks_short_conv.h"

namespace surogate::cpu {

namespace {

template <typename T> inline float rnd(float v) { return load(store<T>(v)); }

// Each token's document [start, end), from cu_seqlens (checked: 0, non-decreasing, N).
Status doc_bounds(const char* op, const Tensor& cu_t, int64_t N, std::vector<int64_t>* start, std::vector<int64_t>* end) {
  const int32_t* cu = cu_t.ptr<int32_t>();
  const int64_t S = cu_t.shape[0] - 1;
  SG_CHECK_ARG(cu[0] == 0 && cu[S] == N, str_cat(op, ": cu_seqlens must run from 0 to the ", N, " tokens, got ", cu[0],
                                                 " .. ", cu[S]));
  start->assign(N, 0);
  end->assign(N, 0);
  for (int64_t s = 0; s < S; ++s) {
    SG_CHECK_ARG(cu[s] <= cu[s + 1], str_cat(op, ": cu_seqlens decreases at ", s));
    for (int64_t t = cu[s]; t < cu[s + 1]; ++t) {
      (*start)[t] = cu[s];
      (*end)[t] = cu[s + 1];
    }
  }
  return Status::OK();
}

// w as f32 [L][C] (taps outer, so that the inner loops run over contiguous channels), bias as f32 [C].
template <typename T>
void taps(const Tensor& w, const Tensor* bias, int64_t C, int64_t L, std::vector<float>* wt, std::vector<float>* b) {
  const T* wp = w.ptr<T>();
  wt->assign(L * C, 0.0f);
  for (int64_t c = 0; c < C; ++c)
    for (int64_t k = 0; k < L; ++k) (*wt)[k * C + c] = load(wp[c * L + k]);
  b->assign(C, 0.0f);
  if (bias) {
    const T* bp = bias->ptr<T>();
    for (int64_t c = 0; c < C; ++c) (*b)[c] = load(bp[c]);
  }
}

// acc[c] += w[c] * T(B[c] x[c]) over one row's channels.
template <typename T>
SG_CPU_CLONES void tap_row(float* acc, const float* w, const T* B, const T* x, int64_t C) {
  for (int64_t c = 0; c < C; ++c) acc[c] += w[c] * rnd<T>(load(B[c]) * load(x[c]));
}

// conv[t] (rounded) of row t into acc.
template <typename T>
void conv_row(float* acc, const T* bcx, const float* wt, const float* b, int64_t t, int64_t start, int64_t C,
              int64_t L) {
  std::copy(b, b + C, acc);
  for (int64_t k = 0; k < L; ++k) {
    const int64_t tt = t - (L - 1) + k;
    if (tt < start) continue;
    tap_row<T>(acc, wt + k * C, bcx + tt * 3 * C, bcx + tt * 3 * C + 2 * C, C);
  }
  for (int64_t c = 0; c < C; ++c) acc[c] = rnd<T>(acc[c]);
}

template <typename T>
SG_CPU_CLONES void gate_row(T* y, const float* conv, const T* Cg, int64_t C) {
  for (int64_t c = 0; c < C; ++c) y[c] = store<T>(load(Cg[c]) * conv[c]);
}

int64_t row_grain(int64_t C) { return std::max<int64_t>(1, 4096 / std::max<int64_t>(C, 1)); }

Status short_conv_fwd(const OpArgs& a) {
  constexpr const char* op = "short_conv_fwd";
  ShortConvArgs r;
  SG_RETURN_IF_ERROR(check_short_conv_fwd(a, &r));
  std::vector<int64_t> start, end;
  SG_RETURN_IF_ERROR(doc_bounds(op, a.in(2), r.N, &start, &end));
  const int64_t C = r.C, L = r.L;
  SG_DISPATCH_FLOAT(op, a.in(0).dtype, T, {
    std::vector<float> wt, b;
    taps<T>(a.in(1), r.bias ? &a.in(3) : nullptr, C, L, &wt, &b);
    const T* bcx = a.in(0).ptr<T>();
    T* y = a.out(0).ptr<T>();
    parallel_for(0, r.N, row_grain(C), [&](int64_t lo, int64_t hi) {
      std::vector<float> acc(C);
      for (int64_t t = lo; t < hi; ++t) {
        conv_row<T>(acc.data(), bcx, wt.data(), b.data(), t, start[t], C, L);
        gate_row<T>(y + t * C, acc.data(), bcx + t * 3 * C + C, C);
      }
    });
  });
  return Status::OK();
}

// du[c] += w[c] * dy[c] Cg[c] over one row's channels.
template <typename T>
SG_CPU_CLONES void back_tap_row(float* du, const float* w, const T* dy, const T* Cg, int64_t C) {
  for (int64_t c = 0; c < C; ++c) du[c] += w[c] * (load(dy[c]) * load(Cg[c]));
}

template <typename T>
SG_CPU_CLONES void dbcx_row(T* d, const T* row, const T* dy, const float* du, const float* conv, int64_t C) {
  for (int64_t c = 0; c < C; ++c) {
    d[c] = store<T>(du[c] * load(row[2 * C + c]));          // dB = du x
    d[C + c] = store<T>(load(dy[c]) * conv[c]);              // dCg = dy conv
    d[2 * C + c] = store<T>(du[c] * load(row[c]));          // dx = du B
  }
}

template <typename T, typename G>
void write_grad(G* dst, int64_t i, float v, bool accumulate) {
  dst[i] = store<G>(accumulate ? load(dst[i]) + v : v);
}

Status short_conv_bwd(const OpArgs& a) {
  constexpr const char* op = "short_conv_bwd";
  ShortConvArgs r;
  SG_RETURN_IF_ERROR(check_short_conv_bwd(a, &r));
  std::vector<int64_t> start, end;
  SG_RETURN_IF_ERROR(doc_bounds(op, a.in(3), r.N, &start, &end));
  const int64_t N = r.N, C = r.C, L = r.L;
  SG_DISPATCH_FLOAT(op, a.in(1).dtype, T, {
    std::vector<float> wt, b;
    taps<T>(a.in(2), r.bias ? &a.in(4) : nullptr, C, L, &wt, &b);  // the bias enters conv, which dCg needs
    const T* dy = a.in(0).ptr<T>();
    const T* bcx = a.in(1).ptr<T>();
    T* d = a.out(0).ptr<T>();
    parallel_for(0, N, row_grain(C), [&](int64_t lo, int64_t hi) {
      std::vector<float> du(C), conv(C);
      for (int64_t t = lo; t < hi; ++t) {
        std::fill(du.begin(), du.end(), 0.0f);
        for (int64_t k = 0; k < L; ++k) {
          const int64_t tt = t + (L - 1) - k;
          if (tt >= end[t]) continue;
          back_tap_row<T>(du.data(), wt.data() + k * C, dy + tt * C, bcx + tt * 3 * C + C, C);
        }
        conv_row<T>(conv.data(), bcx, wt.data(), b.data(), t, start[t], C, L);
        dbcx_row<T>(d + t * 3 * C, bcx + t * 3 * C, dy + t * C, du.data(), conv.data(), C);
      }
    });
    if (r.dw || r.dbias) {
      // Per channel block, over every token: dw[k] = sum g[t] u[t - (L-1) + k], dbias = sum g[t].
      std::vector<float> dw(C * L, 0.0f), db(C, 0.0f);
      parallel_for(0, C, 64, [&](int64_t lo, int64_t hi) {
        for (int64_t t = 0; t < N; ++t) {
          const T* dyr = dy + t * C;
          const T* cg = bcx + t * 3 * C + C;
          for (int64_t k = 0; k < L; ++k) {
            const int64_t tt = t - (L - 1) + k;
            if (tt < start[t]) continue;
            const T* B = bcx + tt * 3 * C;
            const T* x = B + 2 * C;
            float* acc = dw.data() + k * C;
            for (int64_t c = lo; c < hi; ++c) acc[c] += load(dyr[c]) * load(cg[c]) * rnd<T>(load(B[c]) * load(x[c]));
          }
          for (int64_t c = lo; c < hi; ++c) db[c] += load(dyr[c]) * load(cg[c]);
        }
      });
      if (r.dw) {
        const bool f32 = r.dw->dtype == DType::kF32;
        for (int64_t c = 0; c < C; ++c)
          for (int64_t k = 0; k < L; ++k) {
            if (f32) write_grad<T, float>(r.dw->ptr<float>(), c * L + k, dw[k * C + c], r.accumulate);
            else write_grad<T, T>(r.dw->ptr<T>(), c * L + k, dw[k * C + c], r.accumulate);
          }
      }
      if (r.dbias) {
        const bool f32 = r.dbias->dtype == DType::kF32;
        for (int64_t c = 0; c < C; ++c) {
          if (f32) write_grad<T, float>(r.dbias->ptr<float>(), c, db[c], r.accumulate);
          else write_grad<T, T>(r.dbias->ptr<T>(), c, db[c], r.accumulate);
        }
      }
    }
  });
  return Status::OK();
}

Status short_conv_cache(const OpArgs& a) {
  constexpr const char* op = "short_conv_cache";
  ShortConvArgs r;
  SG_RETURN_IF_ERROR(check_short_conv_cache(a, &r));
  const int64_t C = r.C, L = r.L, W = L - 1, S = r.S;
  const int32_t* slots = a.in(2).ptr<int32_t>();
  const int32_t* cu = a.in(3).ptr<int32_t>();
  const int32_t* ctx = a.in(4).ptr<int32_t>();
  SG_CHECK_ARG(cu[0] == 0 && cu[S] <= r.N, str_cat(op, ": cu_q must start at 0 and end within the ", r.N, " rows"));
  for (int64_t s = 0; s < S; ++s) {
    const int32_t n = cu[s + 1] - cu[s];
    SG_CHECK_ARG(n >= 0 && ctx[s] >= n, str_cat(op, ": sequence ", s, " has ", n, " rows but context length ", ctx[s]));
    SG_CHECK_ARG(n == 0 || (slots[s] >= -1 && slots[s] < r.P),
                 str_cat(op, ": sequence ", s, " has state slot ", slots[s], " of ", r.P));
  }
  SG_DISPATCH_FLOAT(op, a.in(0).dtype, T, {
    std::vector<float> wt, b;
    taps<T>(a.in(1), r.bias ? &a.in(5) : nullptr, C, L, &wt, &b);
    const T* bcx = a.in(0).ptr<T>();
    T* y = a.out(0).ptr<T>();
    T* state = a.out(1).ptr<T>();
    std::fill(y + int64_t(cu[S]) * C, y + r.N * C, store<T>(0.0f));
    constexpr int64_t kChunk = 256;  // channels per task
    const int64_t chunks = (C + kChunk - 1) / kChunk;
    parallel_for(0, S * chunks, 1, [&](int64_t lo, int64_t hi) {
      std::vector<float> hist(kShortConvMaxTaps * kChunk);
      for (int64_t task = lo; task < hi; ++task) {
        const int64_t s = task / chunks, c0 = (task % chunks) * kChunk, c1 = std::min(C, c0 + kChunk), nc = c1 - c0;
        const int64_t n = cu[s + 1] - cu[s];
        if (n == 0) continue;
        const int32_t slot = slots[s];
        T* st = slot >= 0 ? state + int64_t(slot) * W * C : nullptr;
        const bool resume = st != nullptr && ctx[s] > n;
        for (int64_t j = 0; j < W; ++j)
          for (int64_t c = 0; c < nc; ++c) hist[j * kChunk + c] = resume ? load(st[j * C + c0 + c]) : 0.0f;
        for (int64_t i = 0; i < n; ++i) {
          const int64_t t = cu[s] + i;
          const T* row = bcx + t * 3 * C;
          for (int64_t c = 0; c < nc; ++c) {
            const int64_t cc = c0 + c;
            const float u = rnd<T>(load(row[cc]) * load(row[2 * C + cc]));
            float acc = b[cc];
            for (int64_t j = 0; j < W; ++j) acc += wt[j * C + cc] * hist[j * kChunk + c];
            acc += wt[W * C + cc] * u;
            y[t * C + cc] = store<T>(load(row[C + cc]) * rnd<T>(acc));
            for (int64_t j = 0; j + 1 < W; ++j) hist[j * kChunk + c] = hist[(j + 1) * kChunk + c];
            if (W > 0) hist[(W - 1) * kChunk + c] = u;
          }
        }
        if (st != nullptr)
          for (int64_t j = 0; j < W; ++j)
            for (int64_t c = 0; c < nc; ++c) st[j * C + c0 + c] = store<T>(hist[j * kChunk + c]);
      }
    });
  });
  return Status::OK();
}

}  // namespace

void register_cpu_short_conv(OpRegistry& reg) {
  add_op(reg, "short_conv_fwd", short_conv_fwd);
  add_op(reg, "short_conv_bwd", short_conv_bwd);
  add_op(reg, "short_conv_cache", short_conv_cache);
}

}  // namespace surogate::cpu
