// The op registry: every kernel of every backend, by (op name, device type).
//
// An op is a plain function `Status fn(const OpArgs&)` that reads its inputs and writes into
// its outputs, whose memory the caller (a Program, or a test) has already allocated. Ops never
// allocate their outputs; scratch memory comes from the device's caching allocator. An op's
// arity and doc come from its contract (runtime/op_contracts.h, one for every backend); each
// backend's OpDef adds its kernel and the activation dtypes that kernel runs (supports).
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "runtime/attrs.h"

namespace surogate {

namespace dist {
class Communicator;  // dist/collective.h
class GradReducer;   // dist/grad_reducer.h
}

struct OpArgs {
  const Tensor* inputs = nullptr;
  int num_inputs = 0;
  const Tensor* outputs = nullptr;
  int num_outputs = 0;
  const Attrs* attrs = nullptr;
  // The collectives of the Program's data-parallel rank (Program::set_communicator), for the ops
  // that move data among ranks (weight_gather); null elsewhere.
  dist::Communicator* comm = nullptr;
  // The rank's gradient reductions on a thread of their own (Program::set_grad_reducer), for
  // grad_reduce / grad_wait; null elsewhere.
  dist::GradReducer* reducer = nullptr;

  // An input slot may be absent (an optional bias, a missing LoRA): then data == nullptr.
  const Tensor& in(int i) const { return inputs[i]; }
  const Tensor& out(int i) const { return outputs[i]; }
  bool has_in(int i) const { return i < num_inputs && inputs[i].data != nullptr; }
  // An output slot may be absent when the op allows it (a frozen weight's gradient): skip it.
  bool has_out(int i) const { return i < num_outputs && outputs[i].data != nullptr; }
  const Attrs& attr() const { return *attrs; }
};

using OpFn = Status (*)(const OpArgs&);

struct OpDef {
  std::string name;
  DeviceType backend = DeviceType::kCPU;
  int min_inputs = 0, max_inputs = 0;  // optional inputs sit at the end; max_inputs = kVariadic: any number
  int num_outputs = 0;                 // kVariadic: any number
  OpFn fn = nullptr;
  std::string doc;                     // one line: inputs -> outputs, attributes
  int min_outputs = -1;                // outputs from this index on may be absent (not computed); -1: none
  std::vector<DType> dtypes;           // the activation dtypes this backend's kernel runs
  bool contracted = false;             // arity and doc come from op_contracts()
};

constexpr int kVariadic = -1;

class OpRegistry {
 public:
  static OpRegistry& global();

  void add(OpDef def);
  const OpDef* find(const std::string& name, DeviceType backend) const;
  std::vector<const OpDef*> list(DeviceType backend) const;
  // True when `backend` has a kernel for `name` that runs activations of `dtype`.
  bool supports(const std::string& name, DeviceType backend, DType dtype) const;
  // Run one op directly (tests, eager helpers). Validates arity and that every tensor is on
  // the op's backend.
  Status call(const std::string& name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
              const Attrs& attrs) const;

 private:
  std::vector<OpDef> ops_;
};

Status check_op_args(const OpDef& def, const Tensor* in, int n_in, const Tensor* out, int n_out);

// Called once at module load to register all CPU kernels (cpu/register.cpp).
void register_cpu_ops(OpRegistry& reg);

}  // namespace surogate
