#include "runtime/op_registry.h"

#include <algorithm>

namespace surogate {

OpRegistry& OpRegistry::global() {
  static OpRegistry* reg = [] {
    auto* r = new OpRegistry();
    register_cpu_ops(*r);
    return r;
  }();
  return *reg;
}

void OpRegistry::add(OpDef def) {
  for (auto& d : ops_) {
    if (d.name == def.name && d.backend == def.backend) {
      d = std::move(def);
      return;
    }
  }
  ops_.push_back(std::move(def));
}

const OpDef* OpRegistry::find(const std::string& name, DeviceType backend) const {
  for (const auto& d : ops_) {
    if (d.name == name && d.backend == backend) return &d;
  }
  return nullptr;
}

std::vector<const OpDef*> OpRegistry::list(DeviceType backend) const {
  std::vector<const OpDef*> out;
  for (const auto& d : ops_) {
    if (d.backend == backend) out.push_back(&d);
  }
  return out;
}

bool OpRegistry::supports(const std::string& name, DeviceType backend, DType dtype) const {
  const OpDef* d = find(name, backend);
  return d != nullptr && std::find(d->dtypes.begin(), d->dtypes.end(), dtype) != d->dtypes.end();
}

Status check_op_args(const OpDef& def, const Tensor* in, int n_in, const Tensor* out, int n_out) {
  const int max_in = def.max_inputs == kVariadic ? n_in : def.max_inputs;
  SG_CHECK_ARG(n_in >= def.min_inputs && n_in <= max_in,
               str_cat(def.name, ": takes ", def.min_inputs == max_in ? "" : "between ", def.min_inputs,
                       def.min_inputs == max_in ? "" : str_cat(" and ", max_in), " inputs, got ", n_in, " (",
                       def.doc, ")"));
  SG_CHECK_ARG(def.num_outputs == kVariadic || n_out == def.num_outputs,
               str_cat(def.name, ": produces ", def.num_outputs, " outputs, got ", n_out, " (", def.doc, ")"));
  for (int i = 0; i < n_in + n_out; ++i) {
    const bool is_in = i < n_in;
    const int k = is_in ? i : i - n_in;
    const Tensor& t = is_in ? in[k] : out[k];
    if (t.data == nullptr) {
      const bool optional = is_in ? k >= def.min_inputs : (def.min_outputs >= 0 && k >= def.min_outputs);
      SG_CHECK_ARG(optional,
                   str_cat(def.name, ": ", is_in ? "input " : "output ", k, " is required but missing (", def.doc,
                           ")"));
      continue;
    }
    SG_CHECK(t.device.type == def.backend, StatusCode::kInvalidArgument,
             str_cat(def.name, ": ", is_in ? "input " : "output ", k, " is on ", t.device.to_string(),
                     " but this kernel runs on ", Device{def.backend, 0}.to_string()),
             "move the tensor to the op's device first");
  }
  return Status::OK();
}

Status OpRegistry::call(const std::string& name, const std::vector<Tensor>& inputs,
                        const std::vector<Tensor>& outputs, const Attrs& attrs) const {
  // The op runs where its tensors are: the first present input, else the first output.
  DeviceType backend = DeviceType::kCPU;
  bool found = false;
  for (const auto& t : inputs) {
    if (t.data) { backend = t.device.type; found = true; break; }
  }
  for (size_t i = 0; !found && i < outputs.size(); ++i) {
    if (outputs[i].data) { backend = outputs[i].device.type; found = true; }
  }
  const OpDef* def = find(name, backend);
  SG_CHECK(def, StatusCode::kNotFound, str_cat("no op '", name, "' for ", Device{backend, 0}.to_string()),
           "surogate._native.list_ops() lists the registered ops");
  SG_RETURN_IF_ERROR(check_op_args(*def, inputs.data(), static_cast<int>(inputs.size()), outputs.data(),
                                   static_cast<int>(outputs.size())));
  OpArgs args{inputs.data(), static_cast<int>(inputs.size()), outputs.data(), static_cast<int>(outputs.size()),
              &attrs};
  return def->fn(args);
}

}  // namespace surogate
