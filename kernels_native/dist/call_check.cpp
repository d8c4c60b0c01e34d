#include "dist/call_check.h"

namespace surogate::dist {

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kAllReduce: return "all_reduce";
    case Kind::kReduceScatter: return "reduce_scatter";
    case Kind::kAllGather: return "all_gather";
    case Kind::kBroadcast: return "broadcast";
    case Kind::kReduceToOwners: return "reduce_to_owners";
    case Kind::kGatherFromOwners: return "gather_from_owners";
    case Kind::kBarrier: return "barrier";
  }
  return "?";
}

bool reducible(DType dt) { return dt == DType::kF32 || dt == DType::kBF16 || dt == DType::kF16; }

CallDesc describe_call(Kind kind, const std::vector<Tensor>& bufs, ReduceOp op, int root,
                       const std::vector<int>& owners) {
  CallDesc d;
  d.kind = kind, d.op = op, d.root = root;
  d.owners.assign(owners.begin(), owners.end());
  for (const Tensor& t : bufs) {
    TensorDesc td;
    td.numel = t.numel(), td.dtype = t.dtype, td.cpu = t.device.is_cpu(), td.contiguous = t.is_contiguous();
    td.has_data = t.data != nullptr || t.numel() == 0, td.readonly = t.readonly, td.describe = t.describe();
    d.bufs.push_back(std::move(td));
  }
  return d;
}

namespace {

Status check_tensor(const char* what, int rank, size_t i, const TensorDesc& t, bool written, const char* backend) {
  const std::string where = str_cat(what, ": rank ", rank, " tensor ", i, " (", t.describe, ")");
  SG_CHECK(t.cpu, StatusCode::kUnsupported, str_cat(where, " is not in host memory"),
           str_cat("the ", backend, " backend moves host memory; GPU ranks need the NCCL backend"));
  SG_CHECK(t.contiguous, StatusCode::kInvalidArgument, str_cat(where, " is not contiguous"),
           "pass contiguous tensors (np.ascontiguousarray)");
  SG_CHECK(t.has_data, StatusCode::kInvalidArgument, str_cat(where, " has no memory"), "");
  SG_CHECK(!written || !t.readonly, StatusCode::kInvalidArgument, str_cat(where, " is read-only"),
           "pass writeable arrays: the collective writes them");
  return Status::OK();
}

}  // namespace

Status validate(const std::vector<CallDesc>& calls, const char* backend) {
  const CallDesc& c0 = calls[0];
  const char* name = kind_name(c0.kind);
  const int R = static_cast<int>(calls.size());
  const std::string hint = "every rank must make the same collective calls in the same order, with tensors of "
                           "the same sizes and dtypes";
  for (int r = 0; r < R; ++r) {
    const CallDesc& c = calls[r];
    SG_CHECK(c.kind == c0.kind, StatusCode::kInvalidArgument,
             str_cat("collective mismatch: rank ", r, " called ", kind_name(c.kind), ", rank 0 called ", name), hint);
    SG_CHECK(c.bufs.size() == c0.bufs.size(), StatusCode::kInvalidArgument,
             str_cat(name, ": rank ", r, " passed ", c.bufs.size(), " tensors, rank 0 ", c0.bufs.size()), hint);
    SG_CHECK(c.op == c0.op && c.root == c0.root && c.owners == c0.owners, StatusCode::kInvalidArgument,
             str_cat(name, ": rank ", r, " passed another op, root or owner list than rank 0"), hint);
    for (size_t i = 0; i < c.bufs.size(); ++i) {
      const TensorDesc &t = c.bufs[i], &t0 = c0.bufs[i];
      SG_CHECK(t.numel == t0.numel && t.dtype == t0.dtype, StatusCode::kShapeMismatch,
               str_cat(name, ": rank ", r, " tensor ", i, " is ", t.describe, ", rank 0's ", t0.describe), hint);
      const bool written = !(c.kind == Kind::kReduceScatter || c.kind == Kind::kAllGather) || i == 1;
      SG_RETURN_IF_ERROR(check_tensor(name, r, i, t, written, backend));
    }
  }
  switch (c0.kind) {
    case Kind::kAllReduce:
    case Kind::kReduceToOwners:
      for (const TensorDesc& t : c0.bufs) {
        SG_CHECK(reducible(t.dtype), StatusCode::kDTypeUnsupported,
                 str_cat(name, ": cannot reduce ", dtype_name(t.dtype)), "reduce float32, bfloat16 or float16");
      }
      break;
    case Kind::kReduceScatter:
    case Kind::kAllGather: {
      SG_CHECK(c0.bufs.size() == 2, StatusCode::kInternal, str_cat(name, ": expected (in, out)"), "");
      const TensorDesc &in = c0.bufs[0], &out = c0.bufs[1];
      SG_CHECK(in.dtype == out.dtype, StatusCode::kDTypeUnsupported,
               str_cat(name, ": in is ", dtype_name(in.dtype), ", out ", dtype_name(out.dtype)), "use one dtype");
      const bool scatter = c0.kind == Kind::kReduceScatter;
      const int64_t whole = scatter ? in.numel : out.numel, part = scatter ? out.numel : in.numel;
      SG_CHECK(whole == part * R, StatusCode::kShapeMismatch,
               str_cat(name, ": ", scatter ? "in" : "out", " has ", whole, " elements, not ", R, " x the ",
                       part, " of ", scatter ? "out" : "in"),
               "the whole buffer holds one equal chunk per rank");
      SG_CHECK(!scatter || reducible(in.dtype), StatusCode::kDTypeUnsupported,
               str_cat(name, ": cannot reduce ", dtype_name(in.dtype)), "reduce float32, bfloat16 or float16");
      break;
    }
    case Kind::kBroadcast:
      SG_CHECK(c0.root >= 0 && c0.root < R, StatusCode::kInvalidArgument,
               str_cat("broadcast: root ", c0.root, " is not a rank of a group of ", R), "");
      break;
    case Kind::kGatherFromOwners:
    case Kind::kBarrier:
      break;
  }
  if (c0.kind == Kind::kReduceToOwners || c0.kind == Kind::kGatherFromOwners) {
    SG_CHECK(c0.owners.size() == c0.bufs.size(), StatusCode::kInvalidArgument,
             str_cat(name, ": ", c0.bufs.size(), " tensors but ", c0.owners.size(), " owners"), "one owner per tensor");
    for (int o : c0.owners) {
      SG_CHECK(o >= 0 && o < R, StatusCode::kInvalidArgument,
               str_cat(name, ": owner ", o, " is not a rank of a group of ", R), "");
    }
  }
  return Status::OK();
}

}  // namespace surogate::dist
