// The norm CPU ops, forward and backward: RMSNorm, rmsnorm_fwd / rmsnorm_bwd and the fused
// residual add + norm of a pre-norm block, add_rmsnorm_fwd / add_rmsnorm_bwd; LayerNorm with
// weight and optional bias (SigLIP, CLIP: torch's nn.LayerNorm), layer_norm_fwd / layer_norm_bwd.
//
// Shapes: N rows (tokens), C channels. x, y, h, dy, dx, dh: [N, C] in one storage dtype T
// (f32, bf16 or f16); w: [C] in any of those; rstd: [N] f32; dw: [C], f32 or w's dtype.
// Attrs: eps (forward, 1e-6); weight_offset (0; Gemma's `1 + w` is weight_offset = 1; give the
// backward the forward's value); accumulate (backward, dw only).
//
// Forward, one row, in f32 (o = weight_offset):
//   rstd = 1 / sqrt(sum_j x_j^2 / C + eps)
//   o == 0 (Llama, Qwen, Mistral: LlamaRMSNorm):  y_j = T(w_j * float(T(x_j * rstd)))
//   o != 0 (Gemma, Qwen3-Next: GemmaRMSNorm):     y_j = T(x_j * rstd * (w_j + o))
// The two rounding orders are HF's own. LlamaRMSNorm computes `x * rstd` in f32, casts it to
// the input dtype and only then multiplies by the weight (a second rounding); GemmaRMSNorm
// multiplies by `1 + w.float()` in f32 and rounds once. For T = f32 both are the same formula.
// With those orders our bf16 output equals HF's bit for bit except where rstd differs in its
// last f32 bit (a different summation order of sum x^2) and that flips a bf16 rounding.
// Sums run over 16 fixed lanes, so they do not depend on the thread count; the FMA of the
// x86-64-v3/v4 builds may move rstd by one bit against the baseline build.
// (OLMo-2 style, offset 0 with a single rounding, is not offered: the offset picks the order.)
//
// add_rmsnorm_fwd: h_j = T(x_j + residual_j), then the rows of h are normalized as above.
// Outputs may alias inputs (h onto residual, y onto x): every row is read before it is written.
//
// Backward of y = x * rstd * (w + o), one row, in f32 (rounding of the forward ignored):
//   g_j   = dy_j * (w_j + o)
//   dx_j  = rstd * g_j - x_j * rstd^3 * (sum_k g_k x_k) / C          [+ dh_j]
//   dw_j  = sum over rows of dy_j * x_j * rstd                        [+ dw_j when accumulate]
// add_rmsnorm_bwd takes h in place of x and adds dh (the gradient reaching h from the residual
// stream, optional). Since h = x + residual, its dx is the gradient of both x and residual.
// dw is summed over blocks of rows into f32 partials that are then added in a fixed order, so
// the result does not depend on the thread count; dw may be absent (frozen weight).
//
// LayerNorm, one row, in f32 (torch's layer_norm: the biased variance, one rounding):
//   mean = sum_j x_j / C,  rstd = 1 / sqrt(sum_j (x_j - mean)^2 / C + eps),  xh_j = (x_j - mean) rstd
//   y_j  = T(xh_j w_j + b_j)                                          (b = 0 without a bias)
// Backward, g_j = dy_j w_j:
//   dx_j = rstd (g_j - sum_k g_k / C - xh_j sum_k g_k xh_k / C)
//   dw_j = sum over rows of dy_j xh_j,  db_j = sum over rows of dy_j   [+ when accumulate]
// mean and rstd [N] f32 are the forward's outputs that the backward reads; dw and db are summed
// over the same fixed row blocks as RMSNorm's dw; either may be absent.
#include <cmath>
#include <type_traits>
#include <vector>

#include "cpu/common.h"
#include "runtime/op_checks_norm.h"

namespace surogate::cpu {

namespace {

// Hot row loops are built for x86-64-v4 (AVX-512), v3 (AVX2, FMA, F16C) and the portable
// baseline, picked at load time; v3 / v4 also turn f16 conversions into F16C instructions.
#define SG_HOT __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

// ---- row helpers ----------------------------------------------------------------------------

// A row as f32: the row itself when T is float, else converted into `buf`.
template <typename T>
const float* row_f32(const T* src, float* buf, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    return src;
  } else {
    for (int64_t j = 0; j < n; ++j) buf[j] = load(src[j]);
    return buf;
  }
}

template <typename T> float round_to(float v) { return load(store<T>(v)); }

// Sum of a[j] * b[j] over 16 independent lanes (vectorizable without reassociating floats,
// and the same order on every ISA), lanes added pairwise at the end.
SG_HOT float dot(const float* a, const float* b, int64_t n) {
  constexpr int kLanes = 16;
  float acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += a[j + l] * b[j + l];
  for (int l = 0; j < n; ++j, ++l) acc[l] += a[j] * b[j];
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

// y = x * r * w, rounded as in the file header.
template <typename T>
SG_HOT void scale_row(const float* x, float r, const float* w, bool round_normed, T* y, int64_t n) {
  if (round_normed) {
    for (int64_t j = 0; j < n; ++j) y[j] = store<T>(w[j] * round_to<T>(x[j] * r));
  } else {
    for (int64_t j = 0; j < n; ++j) y[j] = store<T>(x[j] * r * w[j]);
  }
}

// First backward pass of a row, one sweep over dy and x: g = dy * w, dw_part += dy * x * r;
// returns sum g * x (16 lanes, as in dot). dw_part is updated here, before dx is written, so
// that dx may alias dy.
SG_HOT float grad_row(const float* dy, const float* x, const float* w, float r, float* g, float* dw_part,
                      int64_t n) {
  constexpr int kLanes = 16;
  float acc[kLanes] = {};
  int64_t j = 0;
  if (dw_part) {
    for (; j + kLanes <= n; j += kLanes) {
      for (int l = 0; l < kLanes; ++l) {
        g[j + l] = dy[j + l] * w[j + l];
        acc[l] += g[j + l] * x[j + l];
        dw_part[j + l] += dy[j + l] * x[j + l] * r;
      }
    }
  } else {
    for (; j + kLanes <= n; j += kLanes) {
      for (int l = 0; l < kLanes; ++l) {
        g[j + l] = dy[j + l] * w[j + l];
        acc[l] += g[j + l] * x[j + l];
      }
    }
  }
  for (int l = 0; j < n; ++j, ++l) {
    g[j] = dy[j] * w[j];
    acc[l] += g[j] * x[j];
    if (dw_part) dw_part[j] += dy[j] * x[j] * r;
  }
  for (int h = kLanes / 2; h > 0; h /= 2)
    for (int l = 0; l < h; ++l) acc[l] += acc[l + h];
  return acc[0];
}

// dx = r * g - k * x (+ dh).
template <typename T>
SG_HOT void dx_row(const float* g, const float* x, const float* dh, float r, float k, T* dx, int64_t n) {
  if (dh) {
    for (int64_t j = 0; j < n; ++j) dx[j] = store<T>(r * g[j] - k * x[j] + dh[j]);
  } else {
    for (int64_t j = 0; j < n; ++j) dx[j] = store<T>(r * g[j] - k * x[j]);
  }
}

// w + offset as f32.
std::vector<float> weight_f32(const Tensor& w, float offset) {
  std::vector<float> wf(static_cast<size_t>(w.shape[0]));
  convert(w.data, w.dtype, wf.data(), DType::kF32, w.shape[0]);
  if (offset != 0.0f) {
    for (float& v : wf) v += offset;
  }
  return wf;
}

// ---- forward --------------------------------------------------------------------------------

// Normalizes the rows of x, or of h = T(x + residual) when residual is given (h then written).
template <typename T>
void forward(const T* x, const T* residual, const float* w, float eps, bool round_normed, T* y, T* h, float* rstd,
             int64_t N, int64_t C) {
  parallel_for(0, N, std::max<int64_t>(1, 4096 / C), [&](int64_t lo, int64_t hi) {
    std::vector<float> buf(static_cast<size_t>(C));
    for (int64_t i = lo; i < hi; ++i) {
      const T* xi = x + i * C;
      const float* xr;
      if (residual) {
        const T* ri = residual + i * C;
        T* hi_row = h + i * C;
        for (int64_t j = 0; j < C; ++j) buf[j] = round_to<T>(load(xi[j]) + load(ri[j]));
        for (int64_t j = 0; j < C; ++j) hi_row[j] = store<T>(buf[j]);
        xr = buf.data();
      } else {
        xr = row_f32(xi, buf.data(), C);
      }
      const float r = 1.0f / std::sqrt(dot(xr, xr, C) / static_cast<float>(C) + eps);
      rstd[i] = r;
      scale_row<T>(xr, r, w, round_normed, y + i * C, C);
    }
  });
}

Status rmsnorm_fwd(const OpArgs& a) {
  const Tensor &x = a.in(0), &y = a.out(0), &rstd = a.out(1);
  RmsNormArgs r;
  SG_RETURN_IF_ERROR(check_rmsnorm_fwd(a, &r));
  const std::vector<float> wf = weight_f32(a.in(1), r.offset);
  SG_DISPATCH_FLOAT("rmsnorm_fwd", x.dtype, T, {
    forward<T>(x.ptr<T>(), nullptr, wf.data(), r.eps, r.offset == 0.0f, y.ptr<T>(), nullptr, rstd.ptr<float>(), r.N,
               r.C);
  });
  return Status::OK();
}

Status add_rmsnorm_fwd(const OpArgs& a) {
  const Tensor &x = a.in(0), &res = a.in(1), &y = a.out(0), &h = a.out(1), &rstd = a.out(2);
  RmsNormArgs r;
  SG_RETURN_IF_ERROR(check_add_rmsnorm_fwd(a, &r));
  const std::vector<float> wf = weight_f32(a.in(2), r.offset);
  SG_DISPATCH_FLOAT("add_rmsnorm_fwd", x.dtype, T, {
    forward<T>(x.ptr<T>(), res.ptr<T>(), wf.data(), r.eps, r.offset == 0.0f, y.ptr<T>(), h.ptr<T>(),
               rstd.ptr<float>(), r.N, r.C);
  });
  return Status::OK();
}

// ---- backward -------------------------------------------------------------------------------

// Fixed blocks of rows for the parameter gradients, independent of the thread count: each block
// owns one f32 partial per gradient.
int64_t rows_per_grad_block(int64_t N) { return std::max<int64_t>(32, (N + 255) / 256); }

// out[c] = (accumulate ? out[c] : 0) + sum over blocks b of partial[b, c], b in order.
Status reduce_partials(const char* op, const float* partial, int64_t blocks, int64_t C, const Tensor& out_t,
                       bool accumulate) {
  SG_DISPATCH_FLOAT(op, out_t.dtype, W, {
    W* out = out_t.ptr<W>();
    parallel_for(0, C, 1024, [&](int64_t lo, int64_t hi) {
      std::vector<float> acc(static_cast<size_t>(hi - lo), 0.0f);
      if (accumulate) {
        for (int64_t c = lo; c < hi; ++c) acc[c - lo] = load(out[c]);
      }
      for (int64_t b = 0; b < blocks; ++b) {
        const float* pb = partial + b * C;
        for (int64_t c = lo; c < hi; ++c) acc[c - lo] += pb[c];
      }
      for (int64_t c = lo; c < hi; ++c) out[c] = store<W>(acc[c - lo]);
    });
  });
  return Status::OK();
}

// dx (+ dh) for every row and, when dw is given, dw summed over rows (or added to it).
template <typename T>
Status backward(const char* op, const T* dy, const T* dh, const T* x, const float* w, const float* rstd, T* dx,
                const Tensor& dw, bool accumulate, int64_t N, int64_t C) {
  const int64_t rows_per_block = rows_per_grad_block(N);
  const int64_t blocks = (N + rows_per_block - 1) / rows_per_block;
  const bool want_dw = dw.data != nullptr;
  Tensor partial;
  if (want_dw && blocks > 0) SG_RETURN_IF_ERROR(empty({blocks, C}, DType::kF32, Device{}, &partial));

  parallel_for(0, blocks, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> buf(static_cast<size_t>(4 * C));
    float *dyb = buf.data(), *xb = dyb + C, *dhb = xb + C, *g = dhb + C;
    for (int64_t b = lo; b < hi; ++b) {
      float* part = want_dw ? partial.ptr<float>() + b * C : nullptr;
      if (part) std::fill(part, part + C, 0.0f);
      for (int64_t i = b * rows_per_block; i < std::min(N, (b + 1) * rows_per_block); ++i) {
        const float* dyr = row_f32(dy + i * C, dyb, C);
        const float* xr = row_f32(x + i * C, xb, C);
        const float* dhr = dh ? row_f32(dh + i * C, dhb, C) : nullptr;
        const float r = rstd[i];
        const float s = grad_row(dyr, xr, w, r, g, part, C);
        dx_row<T>(g, xr, dhr, r, r * r * r * s / static_cast<float>(C), dx + i * C, C);
      }
    }
  });
  if (!want_dw) return Status::OK();
  return reduce_partials(op, partial.ptr<float>(), blocks, C, dw, accumulate);
}

Status rmsnorm_bwd(const OpArgs& a) {
  const char* op = "rmsnorm_bwd";
  const Tensor &dy = a.in(0), &x = a.in(1), &rstd = a.in(3), &dx = a.out(0);
  RmsNormArgs r;
  SG_RETURN_IF_ERROR(check_rmsnorm_bwd(a, &r));
  const std::vector<float> wf = weight_f32(a.in(2), r.offset);
  SG_DISPATCH_FLOAT(op, x.dtype, T, {
    return backward<T>(op, dy.ptr<T>(), nullptr, x.ptr<T>(), wf.data(), rstd.ptr<float>(), dx.ptr<T>(),
                       r.dw ? *r.dw : Tensor{}, r.accumulate, r.N, r.C);
  });
  return Status::OK();
}

Status add_rmsnorm_bwd(const OpArgs& a) {
  const char* op = "add_rmsnorm_bwd";
  RmsNormArgs r;
  SG_RETURN_IF_ERROR(check_add_rmsnorm_bwd(a, &r));
  const Tensor &dy = a.in(0), &h = a.in(2), &rstd = a.in(4), &dx = a.out(0);
  const std::vector<float> wf = weight_f32(a.in(3), r.offset);
  SG_DISPATCH_FLOAT(op, h.dtype, T, {
    return backward<T>(op, dy.ptr<T>(), r.dh ? r.dh->ptr<T>() : nullptr, h.ptr<T>(), wf.data(), rstd.ptr<float>(),
                       dx.ptr<T>(), r.dw ? *r.dw : Tensor{}, r.accumulate, r.N, r.C);
  });
  return Status::OK();
}

// ---- LayerNorm ------------------------------------------------------------------------------

// Sum of x[j] over 16 lanes (dot's order).
SG_HOT float lane_sum(const float* x, int64_t n) {
  constexpr int kLanes = 16;
  float acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += x[j + l];
  for (int l = 0; j < n; ++j, ++l) acc[l] += x[j];
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

// d[j] = x[j] - m; returns sum d^2 (16 lanes).
SG_HOT float centered(const float* x, float m, float* d, int64_t n) {
  for (int64_t j = 0; j < n; ++j) d[j] = x[j] - m;
  return dot(d, d, n);
}

template <typename T>
SG_HOT void layer_norm_row(const float* d, float r, const float* w, const float* b, T* y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] = store<T>(d[j] * r * w[j] + b[j]);
}

template <typename T>
void layer_norm_forward(const T* x, const float* w, const float* b, float eps, T* y, float* mean, float* rstd,
                        int64_t N, int64_t C) {
  parallel_for(0, N, std::max<int64_t>(1, 4096 / C), [&](int64_t lo, int64_t hi) {
    std::vector<float> buf(static_cast<size_t>(2 * C));
    float *xb = buf.data(), *d = xb + C;
    for (int64_t i = lo; i < hi; ++i) {
      const float* xr = row_f32(x + i * C, xb, C);
      const float m = lane_sum(xr, C) / static_cast<float>(C);
      const float r = 1.0f / std::sqrt(centered(xr, m, d, C) / static_cast<float>(C) + eps);
      mean[i] = m;
      rstd[i] = r;
      layer_norm_row<T>(d, r, w, b, y + i * C, C);
    }
  });
}

Status layer_norm_fwd(const OpArgs& a) {
  const Tensor &x = a.in(0), &y = a.out(0);
  LayerNormArgs r;
  SG_RETURN_IF_ERROR(check_layer_norm_fwd(a, &r));
  const std::vector<float> wf = weight_f32(a.in(1), 0.0f);
  const std::vector<float> bf = r.b ? weight_f32(*r.b, 0.0f) : std::vector<float>(static_cast<size_t>(r.C), 0.0f);
  SG_DISPATCH_FLOAT("layer_norm_fwd", x.dtype, T, {
    layer_norm_forward<T>(x.ptr<T>(), wf.data(), bf.data(), r.eps, y.ptr<T>(), a.out(1).ptr<float>(),
                          a.out(2).ptr<float>(), r.N, r.C);
  });
  return Status::OK();
}

// One row's backward: xh = (x - m) r into xh, g = dy w; dw_part += dy xh, db_part += dy (before
// dx is written, so dx may alias dy); then dx.
template <typename T>
SG_HOT void layer_norm_grad_row(const float* dy, const float* x, const float* w, float m, float r, float* xh,
                                float* g, float* dw_part, float* db_part, T* dx, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    xh[j] = (x[j] - m) * r;
    g[j] = dy[j] * w[j];
  }
  if (dw_part) {
    for (int64_t j = 0; j < n; ++j) dw_part[j] += dy[j] * xh[j];
  }
  if (db_part) {
    for (int64_t j = 0; j < n; ++j) db_part[j] += dy[j];
  }
  const float inv_n = 1.0f / static_cast<float>(n);
  const float mg = lane_sum(g, n) * inv_n, mgx = dot(g, xh, n) * inv_n;
  for (int64_t j = 0; j < n; ++j) dx[j] = store<T>(r * (g[j] - mg - xh[j] * mgx));
}

template <typename T>
Status layer_norm_backward(const T* dy, const T* x, const float* w, const float* mean, const float* rstd, T* dx,
                           const LayerNormArgs& r) {
  const char* op = "layer_norm_bwd";
  const int64_t N = r.N, C = r.C;
  const int64_t rows_per_block = rows_per_grad_block(N);
  const int64_t blocks = (N + rows_per_block - 1) / rows_per_block;
  const int64_t nparts = (r.dw ? 1 : 0) + (r.db ? 1 : 0);
  Tensor partial;  // [dw blocks][db blocks], each [blocks, C]
  if (nparts > 0 && blocks > 0) SG_RETURN_IF_ERROR(empty({nparts * blocks, C}, DType::kF32, Device{}, &partial));
  // No rows (blocks 0): no partials, and the sums over nothing below write zeros.
  float* dw_parts = r.dw && blocks > 0 ? partial.ptr<float>() : nullptr;
  float* db_parts = r.db && blocks > 0 ? partial.ptr<float>() + (r.dw ? blocks * C : 0) : nullptr;

  parallel_for(0, blocks, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> buf(static_cast<size_t>(4 * C));
    float *dyb = buf.data(), *xb = dyb + C, *xh = xb + C, *g = xh + C;
    for (int64_t b = lo; b < hi; ++b) {
      float* dwp = dw_parts ? dw_parts + b * C : nullptr;
      float* dbp = db_parts ? db_parts + b * C : nullptr;
      if (dwp) std::fill(dwp, dwp + C, 0.0f);
      if (dbp) std::fill(dbp, dbp + C, 0.0f);
      for (int64_t i = b * rows_per_block; i < std::min(N, (b + 1) * rows_per_block); ++i) {
        const float* dyr = row_f32(dy + i * C, dyb, C);
        const float* xr = row_f32(x + i * C, xb, C);
        layer_norm_grad_row<T>(dyr, xr, w, mean[i], rstd[i], xh, g, dwp, dbp, dx + i * C, C);
      }
    }
  });
  if (r.dw) SG_RETURN_IF_ERROR(reduce_partials(op, dw_parts, blocks, C, *r.dw, r.accumulate));
  if (r.db) SG_RETURN_IF_ERROR(reduce_partials(op, db_parts, blocks, C, *r.db, r.accumulate));
  return Status::OK();
}

Status layer_norm_bwd(const OpArgs& a) {
  const Tensor &dy = a.in(0), &x = a.in(1), &dx = a.out(0);
  LayerNormArgs r;
  SG_RETURN_IF_ERROR(check_layer_norm_bwd(a, &r));
  const std::vector<float> wf = weight_f32(a.in(2), 0.0f);
  SG_DISPATCH_FLOAT("layer_norm_bwd", x.dtype, T, {
    return layer_norm_backward<T>(dy.ptr<T>(), x.ptr<T>(), wf.data(), a.in(3).ptr<float>(), a.in(4).ptr<float>(),
                                  dx.ptr<T>(), r);
  });
  return Status::OK();
}

}  // namespace

void register_cpu_norm(OpRegistry& reg) {
  add_op(reg, "rmsnorm_fwd", rmsnorm_fwd);
  add_op(reg, "rmsnorm_bwd", rmsnorm_bwd);
  add_op(reg, "add_rmsnorm_fwd", add_rmsnorm_fwd);
  add_op(reg, "add_rmsnorm_bwd", add_rmsnorm_bwd);
  add_op(reg, "layer_norm_fwd", layer_norm_fwd);
  add_op(reg, "layer_norm_bwd", layer_norm_bwd);
}

}  // namespace surogate::cpu
