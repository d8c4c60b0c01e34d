#include "runtime/op_checks_optimizer.h"

namespace surogate {

using namespace adam;

namespace {

const char* const kSlotName[kGroup] = {"param", "master", "grad", "m", "v"};
const char* const kSlot8Name[kGroup8] = {"param", "master", "grad", "m_q", "m_scale", "v_q", "v_scale"};

// One group's tensors: present where required, of the right dtypes and sizes, writeable.
Status check_group(const OpArgs& a, int group) {
  const int base = 2 + kGroup * group;
  const auto where = [&](int slot) {
    return str_cat("adamw: group ", group, " (input ", base + slot, ", ", kSlotName[slot], ")");
  };
  for (int slot = 0; slot < kGroup; ++slot) {
    if (!a.has_in(base + slot)) {
      SG_CHECK_ARG(slot == kMaster, str_cat(where(slot), " is missing; only master is optional"));
      continue;
    }
    const Tensor& t = a.in(base + slot);
    SG_CHECK_ARG(t.is_contiguous(), str_cat(where(slot), " ", t.describe(), " must be contiguous"));
    SG_CHECK_SHAPE(t.numel() == a.in(base + kParam).numel(),
                   str_cat(where(slot), " ", t.describe(), " has ", t.numel(), " elements but param has ",
                           a.in(base + kParam).numel()));
    const bool f32_only = slot == kMaster || slot == kM || slot == kV;
    SG_CHECK(f32_only ? t.dtype == DType::kF32
                      : (t.dtype == DType::kF32 || t.dtype == DType::kBF16 || t.dtype == DType::kF16),
             StatusCode::kDTypeUnsupported,
             str_cat(where(slot), " has dtype ", dtype_name(t.dtype), ", expected ",
                     f32_only ? "float32" : "float32, bfloat16 or float16"),
             slot == kMaster ? "master weights are float32" : "");
    SG_CHECK_ARG(slot == kGrad || !t.readonly,
                 str_cat(where(slot), " is read-only, but adamw updates it in place"));
  }
  return Status::OK();
}

Status check_group8(const OpArgs& a, int group) {
  const int base = 2 + kGroup8 * group;
  const auto where = [&](int slot) {
    return str_cat("adamw8: group ", group, " (input ", base + slot, ", ", kSlot8Name[slot], ")");
  };
  SG_CHECK_ARG(a.has_in(base + kP8), str_cat(where(kP8), " is missing; only master is optional"));
  const int64_t n = a.in(base + kP8).numel();
  for (int slot = 0; slot < kGroup8; ++slot) {
    if (!a.has_in(base + slot)) {
      SG_CHECK_ARG(slot == kMaster8, str_cat(where(slot), " is missing; only master is optional"));
      continue;
    }
    const Tensor& t = a.in(base + slot);
    SG_CHECK_ARG(t.is_contiguous(), str_cat(where(slot), " ", t.describe(), " must be contiguous"));
    const bool is_scale = slot == kMScale || slot == kVScale;
    const int64_t want = is_scale ? num_qblocks(n) : n;
    SG_CHECK_SHAPE(t.numel() == want, str_cat(where(slot), " ", t.describe(), " has ", t.numel(),
                                              " elements, expected ", want, is_scale ? " (ceil(n / 256))" : "",
                                              " for a param of ", n, " elements"));
    const char* want_dtype = nullptr;
    bool ok = false;
    if (slot == kMQ || slot == kVQ) {
      ok = t.dtype == DType::kU8;
      want_dtype = "uint8";
    } else if (slot == kMaster8 || is_scale) {
      ok = t.dtype == DType::kF32;
      want_dtype = "float32";
    } else {
      ok = t.dtype == DType::kF32 || t.dtype == DType::kBF16 || t.dtype == DType::kF16;
      want_dtype = "float32, bfloat16 or float16";
    }
    SG_CHECK(ok, StatusCode::kDTypeUnsupported,
             str_cat(where(slot), " has dtype ", dtype_name(t.dtype), ", expected ", want_dtype), "");
    SG_CHECK_ARG(slot == kGrad8 || !t.readonly,
                 str_cat(where(slot), " is read-only, but adamw8 updates it in place"));
  }
  return Status::OK();
}

// hp and norm (inputs 0 and 1): their shapes and dtypes (the values stay on the device).
Status check_hp_norm(const OpArgs& a, const char* op) {
  const Tensor& hp = a.in(0);
  SG_CHECK(hp.dtype == DType::kF32 && hp.numel() == 8 && hp.is_contiguous(), StatusCode::kShapeMismatch,
           str_cat(op, ": hp must be a contiguous float32[8], got ", hp.describe()),
           "hp = [lr, beta1, beta2, eps, weight_decay, step, max_grad_norm, 0]");
  if (a.has_in(1)) {
    const Tensor& n = a.in(1);
    SG_CHECK(n.dtype == DType::kF32 && n.numel() == 1, StatusCode::kShapeMismatch,
             str_cat(op, ": norm must be float32[1], got ", n.describe()), "pass global_norm's output");
  }
  return Status::OK();
}

// Per group: 1 when it takes weight decay (the factor 1 - lr wd is 1 when wd == 0), 0 for no_decay.
Status decay_groups(const OpArgs& a, const char* op, int n_groups, std::vector<char>* out) {
  out->assign(n_groups, 1);
  for (int64_t g : a.attr().get_ints("no_decay")) {
    SG_CHECK_ARG(g >= 0 && g < n_groups,
                 str_cat(op, ": no_decay names group ", g, ", but there are ", n_groups, " groups"));
    (*out)[g] = 0;
  }
  return Status::OK();
}

}  // namespace

Status check_global_norm(const OpArgs& a) {
  const Tensor& out = a.out(0);
  SG_CHECK(out.dtype == DType::kF32 && out.numel() == 1, StatusCode::kShapeMismatch,
           str_cat("global_norm: output norm must be float32[1], got ", out.describe()),
           "allocate the norm as a float32 tensor of shape [1]");
  for (int i = 0; i < a.num_inputs; ++i) {
    if (!a.has_in(i)) continue;
    const Tensor& g = a.in(i);
    SG_CHECK(dtype_is_float(g.dtype), StatusCode::kDTypeUnsupported,
             str_cat("global_norm: input ", i, " has dtype ", dtype_name(g.dtype), ", expected a float type"), "");
    SG_CHECK_ARG(g.is_contiguous(), str_cat("global_norm: input ", i, " ", g.describe(), " must be contiguous"));
  }
  return Status::OK();
}

namespace {

// hp, norm, then groups of `group` inputs (`layout` names them for the arity error), each
// checked by check_one; the attr no_decay names groups.
Status check_adam(const OpArgs& a, const char* op, int group, const char* layout,
                  Status (*check_one)(const OpArgs&, int), AdamwArgs* r) {
  SG_CHECK_ARG(a.num_inputs >= 2 && (a.num_inputs - 2) % group == 0,
               str_cat(op, ": got ", a.num_inputs, " inputs, expected 2 + ", group, "*k: hp, norm (or None), then (",
                       layout, ") per parameter"));
  r->n_groups = (a.num_inputs - 2) / group;
  SG_RETURN_IF_ERROR(check_hp_norm(a, op));
  SG_RETURN_IF_ERROR(decay_groups(a, op, r->n_groups, &r->decay));
  for (int g = 0; g < r->n_groups; ++g) SG_RETURN_IF_ERROR(check_one(a, g));
  return Status::OK();
}

}  // namespace

Status check_adamw(const OpArgs& a, AdamwArgs* r) {
  return check_adam(a, "adamw", kGroup, "param, master or None, grad, m, v", check_group, r);
}

Status check_adamw8(const OpArgs& a, AdamwArgs* r) {
  return check_adam(a, "adamw8", kGroup8, "param, master or None, grad, m_q, m_scale, v_q, v_scale", check_group8, r);
}

namespace {

Status check_hp(const char* op, const OpArgs& a) {
  const Tensor& hp = a.in(0);
  SG_CHECK_ARG(hp.dtype == DType::kF32 && hp.numel() == 8 && hp.is_contiguous(),
               str_cat(op, ": hp ", hp.describe(), " must be a contiguous float32 [8]"));
  return Status::OK();
}

Status check_f32_writable(const char* op, const char* what, const Tensor& t, int64_t numel) {
  SG_CHECK(t.dtype == DType::kF32, StatusCode::kDTypeUnsupported,
           str_cat(op, ": ", what, " ", t.describe(), " must be float32"), "");
  SG_CHECK_ARG(t.is_contiguous(), str_cat(op, ": ", what, " ", t.describe(), " must be contiguous"));
  SG_CHECK_SHAPE(t.numel() == numel, str_cat(op, ": ", what, " ", t.describe(), " should have ", numel, " elements"));
  SG_CHECK_ARG(!t.readonly, str_cat(op, ": ", what, " is read-only, but ", op, " updates it in place"));
  return Status::OK();
}

// o (or x): [R, C], or [C, R] with transpose.
Status check_oriented(const char* op, const char* what, const Tensor& t, const MuonArgs& r) {
  const int64_t want0 = r.transpose ? r.cols : r.rows, want1 = r.transpose ? r.rows : r.cols;
  SG_CHECK_SHAPE(t.ndim == 2 && t.size(0) == want0 && t.size(1) == want1,
                 str_cat(op, ": ", what, " ", t.describe(), " should be [", want0, ", ", want1, "]",
                         r.transpose ? " (transpose)" : ""));
  SG_CHECK(t.dtype == DType::kF32 && t.is_contiguous(), StatusCode::kDTypeUnsupported,
           str_cat(op, ": ", what, " ", t.describe(), " must be a contiguous float32 matrix"), "");
  return Status::OK();
}

// attrs row0, rows: the rows of the matrix t that form this Muon matrix (one part of a fused
// projection, e.g. gate of gate_up); default all of them. transpose: as the header says.
Status row_range(const char* op, const OpArgs& a, const Tensor& t, MuonArgs* r) {
  r->row0 = a.attr().get_int("row0", 0);
  r->rows = a.attr().get_int("rows", t.size(0) - r->row0);
  r->cols = t.size(1);
  r->transpose = a.attr().get_bool("transpose", false);
  SG_CHECK_ARG(r->row0 >= 0 && r->rows > 0 && r->row0 + r->rows <= t.size(0),
               str_cat(op, ": rows [", r->row0, ", ", r->row0 + r->rows, ") are not inside ", t.describe()));
  return Status::OK();
}

}  // namespace

Status check_muon_momentum(const OpArgs& a, MuonArgs* r) {
  SG_RETURN_IF_ERROR(check_hp("muon_momentum", a));
  const Tensor& g = a.in(2);
  SG_CHECK_SHAPE(g.ndim == 2, str_cat("muon_momentum: grad ", g.describe(), " must be a matrix"));
  SG_CHECK_ARG(g.is_contiguous(), str_cat("muon_momentum: grad ", g.describe(), " must be contiguous"));
  SG_CHECK(g.dtype == DType::kF32 || g.dtype == DType::kBF16 || g.dtype == DType::kF16,
           StatusCode::kDTypeUnsupported, str_cat("muon_momentum: grad ", g.describe(), " must be a float tensor"), "");
  SG_RETURN_IF_ERROR(row_range("muon_momentum", a, g, r));
  SG_RETURN_IF_ERROR(check_f32_writable("muon_momentum", "m", a.in(3), g.numel()));
  return check_oriented("muon_momentum", "x", a.out(0), *r);
}

Status check_muon_update(const OpArgs& a, MuonArgs* r) {
  SG_RETURN_IF_ERROR(check_hp("muon_update", a));
  const Tensor& p = a.in(2);
  SG_CHECK_SHAPE(p.ndim == 2, str_cat("muon_update: param ", p.describe(), " must be a matrix"));
  SG_CHECK_ARG(p.is_contiguous() && !p.readonly, str_cat("muon_update: param ", p.describe(),
                                                         " must be contiguous and writable"));
  SG_CHECK(p.dtype == DType::kF32 || p.dtype == DType::kBF16 || p.dtype == DType::kF16,
           StatusCode::kDTypeUnsupported, str_cat("muon_update: param ", p.describe(), " must be a float tensor"), "");
  SG_RETURN_IF_ERROR(row_range("muon_update", a, p, r));
  SG_RETURN_IF_ERROR(check_oriented("muon_update", "o", a.in(1), *r));
  if (a.has_in(3)) SG_RETURN_IF_ERROR(check_f32_writable("muon_update", "master", a.in(3), p.numel()));
  if (a.has_in(4)) SG_RETURN_IF_ERROR(check_f32_writable("muon_update", "v", a.in(4), p.size(0)));
  return Status::OK();
}

}  // namespace surogate
