// CPU ops: Muon and NorMuon for the matrix parameters of a training Program's optimizer phase.
// The Newton-Schulz iterations between them are the Program's own matmuls (surogate/train/muon.py
// lowers them as matmul + add nodes), so every backend runs them on its GEMM.
//
// hp (f32 [8], rewritten each step) = [lr, momentum, beta2, eps, weight_decay, step, max_grad_norm,
// unused]; lr is the matrices' learning rate; norm (optional) is global_norm's output: grads are
// clipped by min(1, max_grad_norm / (norm + 1e-6)) as they are read, as adamw does.
//
// muon_momentum (hp, [norm], grad[R,C], m[R,C] f32) -> (x f32 [R,C], or [C,R] with transpose)
//   m  = lerp(m, g, 1 - momentum)                          (m updated in place; torch's lerp)
//   u  = nesterov ? lerp(g, m, momentum) : m               (Keller Jordan's Muon; NorMuon: m)
//   x  = u / (||u||_F + 1e-7)                              Newton-Schulz's start, transposed
//                                                          when R > C so its Gram matrix is small
// muon_update (hp, o, param[R,C], [master f32], [v f32: one per row of param]) -> ()   (o: the orthogonalized x)
//   NorMuon (v given; Li et al. 2025, "NorMuon: Making Muon more efficient and scalable"):
//     v_i  = beta2 v_i + (1 - beta2) mean_j o_ij^2         per neuron (row of W)
//     ô_ij = o_ij / (sqrt(v_i) + eps)
//     step = 0.2 lr sqrt(R C) / ||ô||_F                    (RMS-matched to AdamW's lr)
//   Muon (no v): ô = o, step = lr * scale (attr scale: sqrt(max(1, R / C)))
//   w = master or param;  w *= 1 - lr wd  (attr cautious: only where ô_ij w_ij >= 0, the
//   elements whose update also moves them toward 0: cautious weight decay);  w -= step ô
//   With master, param receives w rounded to nearest even.
// attrs row0 / rows: the op works on those rows of grad, m, param and master only (one part of a
// fused projection: gate and up of gate_up are two Muon matrices, as in the HF model).
// Sums are taken in double, per row then over rows in order: the results depend on the inputs
// only, not on the thread count.
#include <cmath>
#include <vector>

#include "cpu/common.h"
#include "runtime/op_checks_optimizer.h"

namespace surogate::cpu {

namespace {

// torch.lerp's formula (the one its CPU kernel uses): exact at both ends.
inline float lerp(float a, float b, float w) { return w < 0.5f ? a + w * (b - a) : b - (b - a) * (1.0f - w); }

float clip_coef(const OpArgs& a, float max_norm) {
  if (!a.has_in(1) || max_norm <= 0.0f) return 1.0f;
  const float coef = max_norm / (*a.in(1).ptr<const float>() + 1e-6f);
  return coef > 1.0f ? 1.0f : coef;
}

Status check_hp_values(const char* op, const float* hp) {
  SG_CHECK_ARG(hp[1] >= 0.0f && hp[1] < 1.0f && hp[2] >= 0.0f && hp[2] < 1.0f,
               str_cat(op, ": momentum ", hp[1], " and beta2 ", hp[2], " must lie in [0, 1)"));
  SG_CHECK_ARG(hp[6] >= 0.0f, str_cat(op, ": max_grad_norm ", hp[6], " must be >= 0 (0: no clipping)"));
  return Status::OK();
}

template <typename G>
void momentum_rows(const G* g, float* m, float* u, int64_t lo, int64_t hi, int64_t C, float clip, float mu,
                   bool nesterov) {
  const float w1 = 1.0f - mu;
  for (int64_t i = lo * C; i < hi * C; ++i) {
    const float gi = load(g[i]) * clip;
    m[i] = lerp(m[i], gi, w1);
    u[i] = nesterov ? lerp(gi, m[i], mu) : m[i];
  }
}

Status muon_momentum(const OpArgs& a) {
  MuonArgs r;
  SG_RETURN_IF_ERROR(check_muon_momentum(a, &r));
  const float* hp = a.in(0).ptr<const float>();
  SG_RETURN_IF_ERROR(check_hp_values("muon_momentum", hp));
  const int64_t R = r.rows, C = r.cols;
  const float clip = clip_coef(a, hp[6]), mu = hp[1];
  const bool nesterov = a.attr().get_bool("nesterov", false);
  const int64_t off = r.row0 * C;  // this part's rows of a fused matrix
  float* m = a.in(3).ptr<float>() + off;
  float* x = a.out(0).ptr<float>();
  // u in x's memory first when x is not transposed; else a scratch copy.
  std::vector<float> scratch(r.transpose ? R * C : 0);
  float* u = r.transpose ? scratch.data() : x;
  std::vector<double> row_sq(R);
  SG_DISPATCH_FLOAT("muon_momentum", a.in(2).dtype, G, {
    const G* g = a.in(2).ptr<const G>() + off;
    parallel_for(0, R, std::max<int64_t>(1, 4096 / std::max<int64_t>(C, 1)), [&](int64_t lo, int64_t hi) {
      momentum_rows(g, m, u, lo, hi, C, clip, mu, nesterov);
      for (int64_t i = lo; i < hi; ++i) {
        double s = 0;
        for (int64_t j = 0; j < C; ++j) s += static_cast<double>(u[i * C + j]) * u[i * C + j];
        row_sq[i] = s;
      }
    });
  });
  double sq = 0;
  for (int64_t i = 0; i < R; ++i) sq += row_sq[i];
  const float inv = 1.0f / (static_cast<float>(std::sqrt(sq)) + 1e-7f);
  parallel_for(0, R, std::max<int64_t>(1, 4096 / std::max<int64_t>(C, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      for (int64_t j = 0; j < C; ++j) {
        const float v = u[i * C + j] * inv;
        if (r.transpose) {
          x[j * R + i] = v;
        } else {
          x[i * C + j] = v;
        }
      }
    }
  });
  return Status::OK();
}

template <typename P>
void apply_rows(P* p, float* master, const float* o, bool transpose, int64_t R, int64_t C, int64_t lo, int64_t hi,
                const std::vector<float>& row_scale, float step, float decay, bool cautious) {
  for (int64_t i = lo; i < hi; ++i) {
    for (int64_t j = 0; j < C; ++j) {
      const float u = (transpose ? o[j * R + i] : o[i * C + j]) * row_scale[i];
      float w = master ? master[i * C + j] : load(p[i * C + j]);
      if (!cautious || u * w >= 0.0f) w = w * decay;
      w = w - step * u;
      if (master) master[i * C + j] = w;
      p[i * C + j] = store<P>(w);
    }
  }
}

Status muon_update(const OpArgs& a) {
  MuonArgs r;
  SG_RETURN_IF_ERROR(check_muon_update(a, &r));
  const float* hp = a.in(0).ptr<const float>();
  SG_RETURN_IF_ERROR(check_hp_values("muon_update", hp));
  const int64_t R = r.rows, C = r.cols;
  const double lr = hp[0], wd = hp[4];
  const float beta2 = hp[2], eps = hp[3];
  const float* o = a.in(1).ptr<const float>();
  const int64_t off = r.row0 * C;  // this part's rows of a fused matrix
  float* master = a.has_in(3) ? a.in(3).ptr<float>() + off : nullptr;
  const bool normuon = a.has_in(4);
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(C, 1));
  std::vector<float> row_scale(R, 1.0f);
  float step = static_cast<float>(lr * a.attr().get_float("scale", 1.0));
  if (normuon) {
    float* v = a.in(4).ptr<float>() + r.row0;
    std::vector<double> row_sq(R);
    parallel_for(0, R, grain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        double s = 0;
        for (int64_t j = 0; j < C; ++j) {
          const double x = r.transpose ? o[j * R + i] : o[i * C + j];
          s += x * x;
        }
        v[i] = beta2 * v[i] + (1.0f - beta2) * static_cast<float>(s / static_cast<double>(C));
        row_scale[i] = 1.0f / (std::sqrt(v[i]) + eps);
        row_sq[i] = s * static_cast<double>(row_scale[i]) * row_scale[i];
      }
    });
    double sq = 0;
    for (int64_t i = 0; i < R; ++i) sq += row_sq[i];
    const double fro = std::sqrt(sq);
    step = fro > 0 ? static_cast<float>(0.2 * lr * std::sqrt(static_cast<double>(R) * C) / fro) : 0.0f;
  }
  const float decay = static_cast<float>(1.0 - lr * wd);
  const bool cautious = a.attr().get_bool("cautious", false);
  SG_DISPATCH_FLOAT("muon_update", a.in(2).dtype, P, {
    P* p = a.in(2).ptr<P>() + off;
    parallel_for(0, R, grain, [&](int64_t lo, int64_t hi) {
      apply_rows(p, master, o, r.transpose, R, C, lo, hi, row_scale, step, decay, cautious);
    });
  });
  return Status::OK();
}

}  // namespace

void register_cpu_muon(OpRegistry& reg) {
  add_op(reg, "muon_momentum", muon_momentum);
  add_op(reg, "muon_update", muon_update);
}

}  // namespace surogate::cpu
