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

}  // namespace surogate
