#include "runtime/op_checks_rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

// inv_freq must be HF's float32 value to the bit: at p ~ 1e5 an ulp of f_i moves the angle by an
// ulp of the angle (~1e-2). Fused multiply-adds would change the llama3 smoothing's rounding.
#if defined(__clang__)
#define SG_NO_FP_CONTRACT
#define SG_FP_CONTRACT_OFF_BODY _Pragma("clang fp contract(off)")
#elif defined(__GNUC__)
#define SG_NO_FP_CONTRACT __attribute__((optimize("fp-contract=off")))
#define SG_FP_CONTRACT_OFF_BODY
#else
#define SG_NO_FP_CONTRACT
#define SG_FP_CONTRACT_OFF_BODY
#endif

namespace surogate {

namespace {

SG_NO_FP_CONTRACT
void compute_inv_freq(RopeAttrs* cfg, const std::string& type, float theta, float factor, double low_freq_factor,
                      double high_freq_factor, double original_max_position, int64_t rope_angles,
                      double yarn_low = 0.0, double yarn_high = 0.0) {
  SG_FP_CONTRACT_OFF_BODY
  const int64_t half = cfg->rotary_dim / 2;
  const float dim = static_cast<float>(cfg->rotary_dim);
  cfg->inv_freq.resize(half);
  for (int64_t i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / dim;
    const float p = static_cast<float>(std::pow(static_cast<double>(theta), static_cast<double>(e)));
    float f = 1.0f / p;
    if (type == "proportional") {
      // HF's _compute_proportional_rope_parameters: the first rope_angles pairs rotate at
      // theta^(-2i / R), the rest not at all (inv_freq 0: cos 1, sin 0), all divided by factor.
      f = i < rope_angles ? f / factor : 0.0f / factor;
    } else if (type == "linear") {
      f = f / factor;
    } else if (type == "yarn") {
      // HF's _compute_yarn_parameters: interpolation 1 / (factor theta^e), extrapolation 1 / theta^e,
      // blended by 1 - ramp, ramp = clamp((i - low) / (high - low), 0, 1) over [low, high] (the
      // correction range, computed in Python: surogate/models/decoder.py yarn_attrs), in f32.
      const float interp = 1.0f / (factor * p);
      double hi = yarn_high;
      if (hi == yarn_low) hi += 0.001;  // HF: prevent the singularity
      const float ramp = std::clamp((static_cast<float>(i) - static_cast<float>(yarn_low)) /
                                        static_cast<float>(hi - yarn_low), 0.0f, 1.0f);
      const float extra = 1.0f - ramp;
      f = interp * (1.0f - extra) + f * extra;
    } else if (type == "llama3") {
      // HF: wavelen = 2*pi / inv_freq is reciprocal(inv_freq) * f32(2 pi); comparisons against
      // python floats happen in f32.
      const float low_freq_wavelen = static_cast<float>(original_max_position / low_freq_factor);
      const float high_freq_wavelen = static_cast<float>(original_max_position / high_freq_factor);
      const float wavelen = (1.0f / f) * static_cast<float>(2.0 * std::numbers::pi);
      const float llama = wavelen > low_freq_wavelen ? f / factor : f;
      if (!(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen)) {
        const float smooth =
            ((1.0f / wavelen) * static_cast<float>(original_max_position) - static_cast<float>(low_freq_factor)) /
            static_cast<float>(high_freq_factor - low_freq_factor);
        const float a = (1.0f - smooth) * llama / factor;
        const float b = smooth * llama;
        f = a + b;
      } else {
        f = llama;
      }
    }
    cfg->inv_freq[i] = f;
  }
}

}  // namespace

Status parse_rope(const char* op, const Attrs& at, int64_t D, RopeAttrs* cfg) {
  const int64_t R = at.get_int("rotary_dim", D);
  SG_CHECK_ARG(R > 0 && R % 2 == 0 && R <= D,
               str_cat(op, ": rotary_dim ", R, " must be even and in (0, D = ", D, "]"));
  cfg->rotary_dim = R;
  const double theta = at.get_float("theta", 10000.0);
  SG_CHECK_ARG(theta > 0, str_cat(op, ": theta must be > 0, got ", theta));
  cfg->attention_factor = static_cast<float>(at.get_float("attention_factor", 1.0));

  const std::string type = at.get_str("rope_type", "default");
  float factor = 1.0f;
  double low = 0.0, high = 0.0, omp = 0.0;
  int64_t angles = R / 2;
  if (type == "proportional") {
    factor = static_cast<float>(at.get_float("factor", 1.0));
    SG_CHECK_ARG(factor > 0, str_cat(op, ": factor must be > 0, got ", factor));
    angles = at.get_int("rope_angles", R / 2);
    SG_CHECK_ARG(angles >= 0 && angles <= R / 2,
                 str_cat(op, ": rope_angles ", angles, " must be in [0, rotary_dim / 2 = ", R / 2, "]"));
  }
  if (type == "linear" || type == "llama3") {
    SG_CHECK(at.has("factor"), StatusCode::kInvalidArgument, str_cat(op, ": rope_type ", type, " needs attr factor"),
             "pass rope_scaling's factor");
    factor = static_cast<float>(at.get_float("factor", 1.0));
    SG_CHECK_ARG(factor > 0, str_cat(op, ": factor must be > 0, got ", factor));
  }
  if (type == "llama3") {
    SG_CHECK(at.has("low_freq_factor") && at.has("high_freq_factor") && at.has("original_max_position"),
             StatusCode::kInvalidArgument,
             str_cat(op, ": rope_type llama3 needs attrs low_freq_factor, high_freq_factor, original_max_position"),
             "take them from rope_scaling (original_max_position = original_max_position_embeddings)");
    low = at.get_float("low_freq_factor", 0.0);
    high = at.get_float("high_freq_factor", 0.0);
    omp = at.get_float("original_max_position", 0.0);
    SG_CHECK_ARG(low > 0 && high > 0 && high != low && omp > 0,
                 str_cat(op, ": llama3 needs low_freq_factor, high_freq_factor > 0, different, and "
                             "original_max_position > 0 (got ", low, ", ", high, ", ", omp, ")"));
  } else if (type == "yarn") {
    SG_CHECK(at.has("factor") && at.has("yarn_low") && at.has("yarn_high"), StatusCode::kInvalidArgument,
             str_cat(op, ": rope_type yarn needs attrs factor, yarn_low, yarn_high"),
             "surogate.models.decoder.rope_from_config computes them from rope_scaling");
    factor = static_cast<float>(at.get_float("factor", 1.0));
    SG_CHECK_ARG(factor > 0, str_cat(op, ": factor must be > 0, got ", factor));
    low = at.get_float("yarn_low", 0.0);
    high = at.get_float("yarn_high", 0.0);
  } else if (type != "default" && type != "linear" && type != "proportional") {
    return SG_ERROR(StatusCode::kInvalidArgument, str_cat(op, ": unknown rope_type '", type, "'"),
                    "use default, linear, llama3, yarn or proportional");
  }
  if (type == "yarn") {
    compute_inv_freq(cfg, type, static_cast<float>(theta), factor, 0.0, 0.0, 0.0, angles, low, high);
    return Status::OK();
  }
  compute_inv_freq(cfg, type, static_cast<float>(theta), factor, low, high, omp, angles);
  return Status::OK();
}

Status check_pos(const char* op, const Tensor& pos, int64_t N) {
  SG_RETURN_IF_ERROR(check_dtype(op, "pos", pos, {DType::kI32}));
  SG_RETURN_IF_ERROR(check_contiguous(op, "pos", pos));
  SG_CHECK_SHAPE(pos.ndim == 1 && pos.shape[0] == N,
                 str_cat(op, ": pos ", pos.shape_str(), " must be [N] = [", N, "], one position per token"));
  return Status::OK();
}

namespace {

Status check_x(const char* op, const char* name, const Tensor& x) {
  SG_RETURN_IF_ERROR(check_ndim(op, name, x, 3));
  SG_RETURN_IF_ERROR(check_contiguous(op, name, x));
  return check_dtype(op, name, x, {DType::kF32, DType::kBF16, DType::kF16});
}

Status check_like(const char* op, const char* a_name, const Tensor& a, const char* b_name, const Tensor& b) {
  SG_RETURN_IF_ERROR(check_same_shape(op, a_name, a, b_name, b));
  SG_RETURN_IF_ERROR(check_contiguous(op, b_name, b));
  SG_CHECK(a.dtype == b.dtype, StatusCode::kDTypeUnsupported,
           str_cat(op, ": ", b_name, " is ", dtype_name(b.dtype), " but ", a_name, " is ", dtype_name(a.dtype)),
           "cast first");
  return Status::OK();
}

// dw: w's shape, in w's dtype or float32 (the trainer's gradient accumulators are f32).
Status check_dw(const char* op, const Tensor& w, const Tensor& dw) {
  SG_RETURN_IF_ERROR(check_same_shape(op, "w", w, "dw", dw));
  SG_RETURN_IF_ERROR(check_contiguous(op, "dw", dw));
  SG_CHECK(dw.dtype == w.dtype || dw.dtype == DType::kF32, StatusCode::kDTypeUnsupported,
           str_cat(op, ": dw is ", dtype_name(dw.dtype), "; it must be float32 or w's ", dtype_name(w.dtype)),
           "cast first");
  return Status::OK();
}

Status check_weight(const char* op, const char* name, const Tensor& w, const Tensor& x) {
  SG_CHECK_SHAPE(w.ndim == 1 && w.shape[0] == x.shape[2],
                 str_cat(op, ": ", name, " ", w.shape_str(), " must be [D] = [", x.shape[2], "]"));
  SG_RETURN_IF_ERROR(check_contiguous(op, name, w));
  SG_CHECK(w.dtype == x.dtype, StatusCode::kDTypeUnsupported,
           str_cat(op, ": ", name, " is ", dtype_name(w.dtype), " but x is ", dtype_name(x.dtype)), "cast first");
  return Status::OK();
}

Status check_rstd(const char* op, const Tensor& rstd, int64_t N, int64_t H) {
  SG_RETURN_IF_ERROR(check_dtype(op, "rstd", rstd, {DType::kF32}));
  SG_RETURN_IF_ERROR(check_contiguous(op, "rstd", rstd));
  SG_CHECK_SHAPE(rstd.ndim == 2 && rstd.shape[0] == N && rstd.shape[1] == H,
                 str_cat(op, ": rstd ", rstd.shape_str(), " must be [N, H] = [", N, ", ", H, "]"));
  return Status::OK();
}

void set_dims(const Tensor& x, RopeArgs* r) {
  r->N = x.shape[0];
  r->H = x.shape[1];
  r->D = x.shape[2];
}

}  // namespace

Status check_rope(const char* op, const OpArgs& a, RopeArgs* r) {
  const Tensor& x = a.in(0);
  SG_RETURN_IF_ERROR(check_x(op, "x", x));
  SG_RETURN_IF_ERROR(check_like(op, "x", x, "y", a.out(0)));
  set_dims(x, r);
  SG_RETURN_IF_ERROR(check_pos(op, a.in(1), r->N));
  return parse_rope(op, a.attr(), r->D, &r->rope);
}

Status check_qk_norm_rope_fwd(const OpArgs& a, RopeArgs* r) {
  const char* op = "qk_norm_rope_fwd";
  const Tensor& x = a.in(0);
  SG_RETURN_IF_ERROR(check_x(op, "x", x));
  SG_RETURN_IF_ERROR(check_like(op, "x", x, "y", a.out(0)));
  SG_RETURN_IF_ERROR(check_weight(op, "w", a.in(1), x));
  set_dims(x, r);
  SG_RETURN_IF_ERROR(check_pos(op, a.in(2), r->N));
  SG_RETURN_IF_ERROR(check_rstd(op, a.out(1), r->N, r->H));
  SG_RETURN_IF_ERROR(parse_rope(op, a.attr(), r->D, &r->rope));
  r->eps = static_cast<float>(a.attr().get_float("eps", 1e-6));
  return Status::OK();
}

Status check_qk_norm_rope_bwd(const OpArgs& a, RopeArgs* r) {
  const char* op = "qk_norm_rope_bwd";
  const Tensor& x = a.in(1);
  const Tensor& w = a.in(2);
  SG_RETURN_IF_ERROR(check_x(op, "x", x));
  SG_RETURN_IF_ERROR(check_like(op, "x", x, "dy", a.in(0)));
  SG_RETURN_IF_ERROR(check_like(op, "x", x, "dx", a.out(0)));
  SG_RETURN_IF_ERROR(check_weight(op, "w", w, x));
  set_dims(x, r);
  SG_RETURN_IF_ERROR(check_pos(op, a.in(4), r->N));
  SG_RETURN_IF_ERROR(check_rstd(op, a.in(3), r->N, r->H));
  if (a.has_out(1)) {
    SG_RETURN_IF_ERROR(check_dw(op, w, a.out(1)));
    r->dw = &a.out(1);
  }
  r->accumulate = a.attr().get_bool("accumulate", false);
  return parse_rope(op, a.attr(), r->D, &r->rope);
}

}  // namespace surogate
