// Mixture-of-experts CPU ops, forward and backward side by side: the router (softmax, top-k,
// optional renormalisation), the token permutation into expert-contiguous rows and the weighted
// un-permutation, the grouped GEMM over experts and its weight gradient, and the Switch
// Transformer load-balancing loss. runtime/op_checks_moe.h has the shapes; the letters: N tokens,
// C channels, E experts, K experts per token, M = N * K permuted rows.
//
//   moe_router_fwd:  p = softmax(logits) (f32), idx = the K largest p per row (descending, ties
//                    to the lower expert), w = p[idx] (/ sum_k p[idx_k] with norm_topk_prob),
//                    rounded once to the logits' dtype: HF's Qwen3MoeTopKRouter.
//   moe_router_bwd:  g = dprobs (0 without it) + the chain through w: g[idx_k] += dw_k, or with
//                    renormalisation (dw_k - sum_j dw_j w_j) / S, S = sum_k p[idx_k];
//                    dlogits = p (g - sum_e g_e p_e) (softmax's backward).
//   moe_permute:     rows[n, k] = the row of (n, k) in xp: experts in order, and inside one expert
//                    the (n, k) pairs in token order (a stable counting sort), xp[rows[n, k]] = x[n];
//                    offsets[e] = the first row of expert e, offsets[E] = M.
//   moe_unpermute_fwd: y[n] = sum_k w[n, k] yp[rows[n, k]] (w = 1 without weights: that is
//                    moe_permute's backward), in f32, rounded once.
//   moe_unpermute_bwd: dyp[rows[n, k]] = w[n, k] dy[n], dweights[n, k] = dy[n] . yp[rows[n, k]].
//   moe_grouped_matmul: y[offsets[e] : offsets[e+1]] = x[same rows] @ op(W[e]), op(W[e]) = W[e]^T
//                    (trans_b, W [E, Nout, Kin]: HF's experts layout) or W[e] ([E, Kin, Nout]);
//                    moe_grouped_matmul_wgrad: dW[e] = dy[rows of e]^T @ x[rows of e] (+ dW[e]).
//   moe_aux_loss_fwd: over the L layers given, counts[e] = how often e is among the K chosen,
//                    P[e] = sum of p[:, e]; loss = E * sum_e (counts[e] / R) (P[e] / R), R = L N:
//                    transformers' load_balancing_loss_func without an attention mask.
//   moe_aux_loss_bwd: dprobs[n, e] = dloss E counts[e] / R^2, the same for every layer (counts
//                    come from the top-k choice, which has no gradient).
//   moe_z_loss_fwd:  ST-MoE's router z-loss over the L layers' logits: z[n] = logsumexp(logits[n]),
//                    loss = sum z^2 / R, R = L N (the layers' rows concatenated, as HF's
//                    router_z_loss_func takes them).
//   moe_z_loss_bwd:  dlogits[n, e] = dloss 2 z[n] softmax(logits[n])[e] / R, per layer.
//
// The GEMMs go to OpenBLAS one expert at a time (each call threads itself, so they are issued
// from the kernel's thread, never from inside parallel_for); bf16 / f16 operands are widened to
// f32 per expert and the result rounded once. Row loops run in parallel_for over tokens, their
// inner loops over contiguous channels so that the compiler vectorizes them.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu/common.h"
#include "cpu/gemm.h"
#include "cpu/vec_math.h"
#include "runtime/op_checks_moe.h"

namespace surogate::cpu {

namespace {

int64_t row_grain(int64_t row_len) { return std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(row_len, 1)); }

// ---- router -----------------------------------------------------------------------------------

template <typename T>
void router_fwd_rows(const MoeRouterArgs& d, const T* logits, T* weights, int32_t* idx, float* probs) {
  const int64_t E = d.E, K = d.K;
  parallel_for(0, d.N, row_grain(E), [&](int64_t lo, int64_t hi) {
    std::vector<char> taken(E);
    for (int64_t n = lo; n < hi; ++n) {
      const T* l = logits + n * E;
      float* p = probs + n * E;
      float mx = -INFINITY;
      for (int64_t e = 0; e < E; ++e) {
        p[e] = load(l[e]);
        mx = std::max(mx, p[e]);
      }
      float sum = 0.0f;
      for (int64_t e = 0; e < E; ++e) {
        p[e] = std::exp(p[e] - mx);
        sum += p[e];
      }
      const float inv = 1.0f / sum;
      for (int64_t e = 0; e < E; ++e) p[e] *= inv;
      std::fill(taken.begin(), taken.end(), 0);
      float top[64];
      float s = 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; ++e) {
          if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
        }
        taken[best] = 1;
        idx[n * K + k] = static_cast<int32_t>(best);
        const float v = p[best];
        if (k < 64) top[k] = v;
        s += v;
      }
      for (int64_t k = 0; k < K; ++k) {
        const float v = k < 64 ? top[k] : p[idx[n * K + k]];
        weights[n * K + k] = store<T>(d.norm_topk_prob ? v / s : v);
      }
    }
  });
}

Status moe_router_fwd(const OpArgs& a) {
  MoeRouterArgs d;
  SG_RETURN_IF_ERROR(check_moe_router_fwd(a, &d));
  SG_DISPATCH_FLOAT("moe_router_fwd", a.in(0).dtype, T, {
    router_fwd_rows<T>(d, a.in(0).ptr<T>(), a.out(0).ptr<T>(), a.out(1).ptr<int32_t>(), a.out(2).ptr<float>());
  });
  return Status::OK();
}

Status check_indices(const char* op, const char* name, const int32_t* v, int64_t n, int64_t bound) {
  for (int64_t i = 0; i < n; ++i) {
    SG_CHECK(v[i] >= 0 && v[i] < bound, StatusCode::kInvalidArgument,
             str_cat(op, ": ", name, "[", i, "] = ", v[i], " is outside [0, ", bound, ")"),
             str_cat("pass the ", name, " the forward op made"));
  }
  return Status::OK();
}

template <typename T, typename D>
void router_bwd_rows(const MoeRouterArgs& d, const T* dw, const float* probs, const int32_t* idx,
                     const float* dprobs, D* dlogits) {
  const int64_t E = d.E, K = d.K;
  parallel_for(0, d.N, row_grain(E), [&](int64_t lo, int64_t hi) {
    std::vector<float> g(E);
    for (int64_t n = lo; n < hi; ++n) {
      const float* p = probs + n * E;
      const int32_t* ix = idx + n * K;
      for (int64_t e = 0; e < E; ++e) g[e] = dprobs ? dprobs[n * E + e] : 0.0f;
      if (d.norm_topk_prob) {
        float s = 0.0f, dot = 0.0f;
        for (int64_t k = 0; k < K; ++k) s += p[ix[k]];
        for (int64_t k = 0; k < K; ++k) dot += load(dw[n * K + k]) * (p[ix[k]] / s);
        for (int64_t k = 0; k < K; ++k) g[ix[k]] += (load(dw[n * K + k]) - dot) / s;
      } else {
        for (int64_t k = 0; k < K; ++k) g[ix[k]] += load(dw[n * K + k]);
      }
      float gp = 0.0f;
      for (int64_t e = 0; e < E; ++e) gp += g[e] * p[e];
      for (int64_t e = 0; e < E; ++e) dlogits[n * E + e] = store<D>(p[e] * (g[e] - gp));
    }
  });
}

Status moe_router_bwd(const OpArgs& a) {
  const char* op = "moe_router_bwd";
  MoeRouterArgs d;
  SG_RETURN_IF_ERROR(check_moe_router_bwd(a, &d));
  SG_RETURN_IF_ERROR(check_indices(op, "idx", a.in(2).ptr<int32_t>(), d.N * d.K, d.E));
  const float* dprobs = d.dprobs ? a.in(3).ptr<float>() : nullptr;
  const Tensor& dl = a.out(0);
  SG_DISPATCH_FLOAT(op, a.in(0).dtype, T, {
    SG_DISPATCH_FLOAT(op, dl.dtype, D, {
      router_bwd_rows<T, D>(d, a.in(0).ptr<T>(), a.in(1).ptr<float>(), a.in(2).ptr<int32_t>(), dprobs,
                            dl.ptr<D>());
    });
  });
  return Status::OK();
}

// ---- permutation ------------------------------------------------------------------------------

Status moe_permute(const OpArgs& a) {
  const char* op = "moe_permute";
  MoePermuteArgs d;
  SG_RETURN_IF_ERROR(check_moe_permute(a, &d));
  const int32_t* idx = a.in(1).ptr<int32_t>();
  SG_RETURN_IF_ERROR(check_indices(op, "idx", idx, d.M, d.E));
  int32_t* rows = a.out(1).ptr<int32_t>();
  int32_t* offsets = a.out(2).ptr<int32_t>();
  // Stable counting sort of the (n, k) pairs by expert.
  std::fill(offsets, offsets + d.E + 1, 0);
  for (int64_t j = 0; j < d.M; ++j) ++offsets[idx[j] + 1];
  for (int64_t e = 0; e < d.E; ++e) offsets[e + 1] += offsets[e];
  std::vector<int32_t> next(offsets, offsets + d.E);
  for (int64_t j = 0; j < d.M; ++j) rows[j] = next[idx[j]]++;
  const size_t row_bytes = static_cast<size_t>(d.C) * dtype_size(a.in(0).dtype);
  const char* x = static_cast<const char*>(a.in(0).data);
  char* xp = static_cast<char*>(a.out(0).data);
  const int64_t K = d.K;
  parallel_for(0, d.M, row_grain(d.C), [&](int64_t lo, int64_t hi) {
    for (int64_t j = lo; j < hi; ++j) std::memcpy(xp + rows[j] * row_bytes, x + (j / K) * row_bytes, row_bytes);
  });
  return Status::OK();
}

template <typename T, typename W>
SG_CPU_CLONES void weighted_sum_row(const T* yp, const int32_t* rows, const W* w, int64_t K, int64_t C, float* acc,
                                    T* y) {
  for (int64_t c = 0; c < C; ++c) acc[c] = 0.0f;
  for (int64_t k = 0; k < K; ++k) {
    const float s = w ? load(w[k]) : 1.0f;
    const T* src = yp + static_cast<int64_t>(rows[k]) * C;
    for (int64_t c = 0; c < C; ++c) acc[c] += s * load(src[c]);
  }
  for (int64_t c = 0; c < C; ++c) y[c] = store<T>(acc[c]);
}

Status moe_unpermute_fwd(const OpArgs& a) {
  const char* op = "moe_unpermute_fwd";
  MoePermuteArgs d;
  SG_RETURN_IF_ERROR(check_moe_unpermute_fwd(a, &d));
  const int32_t* rows = a.in(1).ptr<int32_t>();
  SG_RETURN_IF_ERROR(check_indices(op, "rows", rows, d.N * d.K, d.M));
  const Tensor& yp = a.in(0);
  SG_DISPATCH_FLOAT(op, yp.dtype, T, {
    SG_DISPATCH_FLOAT(op, d.weights ? a.in(2).dtype : yp.dtype, W, {
      const W* w = d.weights ? a.in(2).ptr<W>() : nullptr;
      const T* src = yp.ptr<T>();
      T* y = a.out(0).ptr<T>();
      parallel_for(0, d.N, row_grain(d.C * d.K), [&](int64_t lo, int64_t hi) {
        std::vector<float> acc(d.C);
        for (int64_t n = lo; n < hi; ++n) {
          weighted_sum_row<T, W>(src, rows + n * d.K, w ? w + n * d.K : nullptr, d.K, d.C, acc.data(), y + n * d.C);
        }
      });
    });
  });
  return Status::OK();
}

template <typename T>
SG_CPU_CLONES void scaled_row(const T* dy, float s, int64_t C, T* out) {
  for (int64_t c = 0; c < C; ++c) out[c] = store<T>(s * load(dy[c]));
}

template <typename T>
SG_CPU_CLONES float dot_row(const T* a, const T* b, int64_t C) {
  float s = 0.0f;
  for (int64_t c = 0; c < C; ++c) s += load(a[c]) * load(b[c]);
  return s;
}

Status moe_unpermute_bwd(const OpArgs& a) {
  const char* op = "moe_unpermute_bwd";
  MoePermuteArgs d;
  SG_RETURN_IF_ERROR(check_moe_unpermute_bwd(a, &d));
  const int32_t* rows = a.in(1).ptr<int32_t>();
  SG_RETURN_IF_ERROR(check_indices(op, "rows", rows, d.N * d.K, d.M));
  const Tensor &dy = a.in(0), &w = a.in(3);
  SG_DISPATCH_FLOAT(op, dy.dtype, T, {
    SG_DISPATCH_FLOAT(op, w.dtype, W, {
      const T* g = dy.ptr<T>();
      const T* yp = a.in(2).ptr<T>();
      const W* wp = w.ptr<W>();
      T* dyp = a.out(0).ptr<T>();
      W* dw = d.dweights ? a.out(1).ptr<W>() : nullptr;
      parallel_for(0, d.N, row_grain(d.C * d.K), [&](int64_t lo, int64_t hi) {
        for (int64_t n = lo; n < hi; ++n) {
          for (int64_t k = 0; k < d.K; ++k) {
            const int64_t j = n * d.K + k, r = rows[j];
            if (dw) dw[j] = store<W>(dot_row<T>(g + n * d.C, yp + r * d.C, d.C));
            scaled_row<T>(g + n * d.C, load(wp[j]), d.C, dyp + r * d.C);
          }
        }
      });
    });
  });
  return Status::OK();
}

// ---- grouped GEMM -----------------------------------------------------------------------------

// n contiguous elements of dtype dt as f32: the data itself when it is f32, else widened into buf.
const float* as_f32(const void* src, DType dt, int64_t n, std::vector<float>* buf) {
  if (dt == DType::kF32) return static_cast<const float*>(src);
  buf->resize(static_cast<size_t>(std::max<int64_t>(n, 1)));
  const size_t es = dtype_size(dt);
  float* dst = buf->data();
  parallel_for(0, n, 1 << 15, [&](int64_t lo, int64_t hi) {
    to_f32(static_cast<const char*>(src) + lo * es, dt, dst + lo, hi - lo);
  });
  return dst;
}

void narrow_from_f32(const float* src, void* dst, DType dt, int64_t n) {
  const size_t es = dtype_size(dt);
  parallel_for(0, n, 1 << 15, [&](int64_t lo, int64_t hi) {
    from_f32(src + lo, static_cast<char*>(dst) + lo * es, dt, hi - lo);
  });
}

Status moe_grouped_matmul(const OpArgs& a) {
  const char* op = "moe_grouped_matmul";
  MoeGroupedArgs d;
  SG_RETURN_IF_ERROR(check_moe_grouped_matmul(a, &d));
  const int32_t* off = a.in(2).ptr<int32_t>();
  SG_RETURN_IF_ERROR(check_offset_values(op, off, d.E, d.M));
  const Tensor &x = a.in(0), &W = a.in(1), &y = a.out(0);
  const int64_t wsize = d.Nout * d.Kin;
  std::vector<float> xb, wb, yb;
  for (int64_t e = 0; e < d.E; ++e) {
    const int64_t r0 = off[e], m = off[e + 1] - off[e];
    if (m == 0) continue;
    const float* xe = as_f32(static_cast<const char*>(x.data) + r0 * d.Kin * dtype_size(x.dtype), x.dtype,
                             m * d.Kin, &xb);
    const float* we = as_f32(static_cast<const char*>(W.data) + e * wsize * dtype_size(W.dtype), W.dtype, wsize, &wb);
    float* ye;
    if (y.dtype == DType::kF32) {
      ye = y.ptr<float>() + r0 * d.Nout;
    } else {
      yb.resize(static_cast<size_t>(m * d.Nout));
      ye = yb.data();
    }
    SG_RETURN_IF_ERROR(gemm_f32(op, false, d.trans_b, m, d.Nout, d.Kin, 1.0f, xe, d.Kin, we,
                                d.trans_b ? d.Kin : d.Nout, 0.0f, ye, d.Nout));
    if (y.dtype != DType::kF32) {
      narrow_from_f32(ye, static_cast<char*>(y.data) + r0 * d.Nout * dtype_size(y.dtype), y.dtype, m * d.Nout);
    }
  }
  return Status::OK();
}

Status moe_grouped_matmul_wgrad(const OpArgs& a) {
  const char* op = "moe_grouped_matmul_wgrad";
  MoeGroupedArgs d;
  SG_RETURN_IF_ERROR(check_moe_grouped_matmul_wgrad(a, &d));
  const int32_t* off = a.in(2).ptr<int32_t>();
  SG_RETURN_IF_ERROR(check_offset_values(op, off, d.E, d.M));
  const Tensor &dy = a.in(0), &x = a.in(1), &dW = a.out(0);
  const int64_t wsize = d.Nout * d.Kin;
  const size_t wes = dtype_size(dW.dtype);
  std::vector<float> dyb, xb, wb;
  for (int64_t e = 0; e < d.E; ++e) {
    const int64_t r0 = off[e], m = off[e + 1] - off[e];
    char* dwe = static_cast<char*>(dW.data) + e * wsize * wes;
    if (m == 0) {  // no rows: the gradient is 0 (or unchanged)
      if (!d.accumulate) std::memset(dwe, 0, static_cast<size_t>(wsize) * wes);
      continue;
    }
    const float* ge = as_f32(static_cast<const char*>(dy.data) + r0 * d.Nout * dtype_size(dy.dtype), dy.dtype,
                             m * d.Nout, &dyb);
    const float* xe = as_f32(static_cast<const char*>(x.data) + r0 * d.Kin * dtype_size(x.dtype), x.dtype,
                             m * d.Kin, &xb);
    float* out;
    if (dW.dtype == DType::kF32) {
      out = reinterpret_cast<float*>(dwe);
    } else {
      wb.resize(static_cast<size_t>(wsize));
      out = wb.data();
      if (d.accumulate) {
        std::vector<float> tmp;
        const float* old = as_f32(dwe, dW.dtype, wsize, &tmp);
        std::copy(old, old + wsize, out);
      }
    }
    SG_RETURN_IF_ERROR(gemm_f32(op, true, false, d.Nout, d.Kin, m, 1.0f, ge, d.Nout, xe, d.Kin,
                                d.accumulate ? 1.0f : 0.0f, out, d.Kin));
    if (dW.dtype != DType::kF32) narrow_from_f32(out, dwe, dW.dtype, wsize);
  }
  return Status::OK();
}

// ---- load-balancing loss ----------------------------------------------------------------------

Status moe_aux_loss_fwd(const OpArgs& a) {
  const char* op = "moe_aux_loss_fwd";
  MoeAuxArgs d;
  SG_RETURN_IF_ERROR(check_moe_aux_loss_fwd(a, &d));
  const int64_t E = d.E;
  for (int64_t l = 0; l < d.L; ++l) {
    SG_RETURN_IF_ERROR(check_indices(op, "idx", a.in(2 * l + 1).ptr<int32_t>(), d.N * d.K, E));
  }
  // Per-layer partial sums in parallel, added in layer order: the result does not depend on the
  // thread count.
  std::vector<double> counts(d.L * E, 0.0), psum(d.L * E, 0.0);
  parallel_for(0, d.L, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t l = lo; l < hi; ++l) {
      const float* p = a.in(2 * l).ptr<float>();
      const int32_t* idx = a.in(2 * l + 1).ptr<int32_t>();
      double* c = counts.data() + l * E;
      double* s = psum.data() + l * E;
      for (int64_t j = 0; j < d.N * d.K; ++j) c[idx[j]] += 1.0;
      for (int64_t n = 0; n < d.N; ++n) {
        for (int64_t e = 0; e < E; ++e) s[e] += p[n * E + e];
      }
    }
  });
  float* cout = a.out(1).ptr<float>();
  const double R = static_cast<double>(d.L * d.N);
  double loss = 0.0;
  for (int64_t e = 0; e < E; ++e) {
    double c = 0.0, s = 0.0;
    for (int64_t l = 0; l < d.L; ++l) c += counts[l * E + e], s += psum[l * E + e];
    cout[e] = static_cast<float>(c);
    loss += (c / R) * (s / R);
  }
  a.out(0).ptr<float>()[0] = R > 0 ? static_cast<float>(loss * static_cast<double>(E)) : 0.0f;
  return Status::OK();
}

Status moe_aux_loss_bwd(const OpArgs& a) {
  MoeAuxArgs d;
  SG_RETURN_IF_ERROR(check_moe_aux_loss_bwd(a, &d));
  const int64_t E = d.E;
  const double R = static_cast<double>(d.L * d.N);
  const float dloss = a.in(0).ptr<float>()[0];
  const float* counts = a.in(1).ptr<float>();
  std::vector<float> row(E);
  for (int64_t e = 0; e < E; ++e) {
    row[e] = R > 0 ? static_cast<float>(static_cast<double>(dloss) * E * counts[e] / (R * R)) : 0.0f;
  }
  float* dp = a.out(0).ptr<float>();
  parallel_for(0, d.N, row_grain(E), [&](int64_t lo, int64_t hi) {
    for (int64_t n = lo; n < hi; ++n) std::copy(row.begin(), row.end(), dp + n * E);
  });
  return Status::OK();
}

// ---- router z-loss -----------------------------------------------------------------------------

template <typename T>
float row_logsumexp(const T* l, int64_t E) {
  float mx = -INFINITY;
  for (int64_t e = 0; e < E; ++e) mx = std::max(mx, load(l[e]));
  float s = 0.0f;
  for (int64_t e = 0; e < E; ++e) s += std::exp(load(l[e]) - mx);
  return mx + std::log(s);
}

Status moe_z_loss_fwd(const OpArgs& a) {
  MoeZLossArgs d;
  SG_RETURN_IF_ERROR(check_moe_z_loss_fwd(a, &d));
  // Per-layer partial sums in parallel, added in layer order (independent of the thread count).
  std::vector<double> part(d.L, 0.0);
  SG_DISPATCH_FLOAT("moe_z_loss_fwd", a.in(0).dtype, T, {
    parallel_for(0, d.L, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t l = lo; l < hi; ++l) {
        const T* x = a.in(l).ptr<T>();
        double s = 0.0;
        for (int64_t n = 0; n < d.N; ++n) {
          const double z = row_logsumexp(x + n * d.E, d.E);
          s += z * z;
        }
        part[l] = s;
      }
    });
  });
  double loss = 0.0;
  for (double p : part) loss += p;
  const double R = static_cast<double>(d.L * d.N);
  a.out(0).ptr<float>()[0] = R > 0 ? static_cast<float>(loss / R) : 0.0f;
  return Status::OK();
}

Status moe_z_loss_bwd(const OpArgs& a) {
  MoeZLossArgs d;
  SG_RETURN_IF_ERROR(check_moe_z_loss_bwd(a, &d));
  const double R = static_cast<double>(d.L * d.N);
  const float c = R > 0 ? static_cast<float>(2.0 * a.in(0).ptr<float>()[0] / R) : 0.0f;
  SG_DISPATCH_FLOAT("moe_z_loss_bwd", a.in(1).dtype, T, {
    const T* x = a.in(1).ptr<T>();
    T* dx = a.out(0).ptr<T>();
    parallel_for(0, d.N, row_grain(d.E), [&](int64_t lo, int64_t hi) {
      for (int64_t n = lo; n < hi; ++n) {
        const T* l = x + n * d.E;
        const float z = row_logsumexp(l, d.E);
        for (int64_t e = 0; e < d.E; ++e) dx[n * d.E + e] = store<T>(c * z * std::exp(load(l[e]) - z));
      }
    });
  });
  return Status::OK();
}

}  // namespace

void register_cpu_moe(OpRegistry& reg) {
  add_op(reg, "moe_router_fwd", moe_router_fwd);
  add_op(reg, "moe_router_bwd", moe_router_bwd);
  add_op(reg, "moe_permute", moe_permute);
  add_op(reg, "moe_unpermute_fwd", moe_unpermute_fwd);
  add_op(reg, "moe_unpermute_bwd", moe_unpermute_bwd);
  add_op(reg, "moe_grouped_matmul", moe_grouped_matmul);
  add_op(reg, "moe_grouped_matmul_wgrad", moe_grouped_matmul_wgrad);
  add_op(reg, "moe_aux_loss_fwd", moe_aux_loss_fwd);
  add_op(reg, "moe_aux_loss_bwd", moe_aux_loss_bwd);
  add_op(reg, "moe_z_loss_fwd", moe_z_loss_fwd);
  add_op(reg, "moe_z_loss_bwd", moe_z_loss_bwd);
}

}  // namespace surogate::cpu
