// The op contract table: each op's arity, which outputs may be absent and its one-line doc,
// declared once for every backend. A backend registers only its kernel function for a contracted
// op (add_kernel) and says which activation dtypes that kernel runs; the registry then answers
// supports_op(name, device, dtype). The argument checks behind each contract are in op_checks.h.
#pragma once

#include <initializer_list>
#include <span>
#include <string_view>

#include "core/dtype.h"
#include "runtime/op_registry.h"

namespace surogate {

struct OpContract {
  const char* name;
  int min_inputs, max_inputs;  // optional inputs sit at the end; max_inputs = kVariadic: any number
  int num_outputs;             // kVariadic: any number
  int min_outputs;             // outputs from this index on may be absent (not computed); -1: none
  const char* doc;             // inputs -> outputs, attributes (README-dev.md's op table in one line)
};

// Every op of every backend, in the order of README-dev.md's op table.
std::span<const OpContract> op_contracts();
const OpContract* find_op_contract(std::string_view name);

// The dtypes most kernels store their activations in (math in f32).
inline constexpr std::initializer_list<DType> kFloatDTypes = {DType::kF32, DType::kBF16, DType::kF16};

// Register `backend`'s kernel for the contracted op `name`. `dtypes`: the activation dtypes the
// kernel runs (the dtype of the op's float tensors: x, q, h, the parameter for an optimizer).
// A name with no contract is still registered, with open arity and no contract, so that the
// contract test (tests/native/test_op_contracts.py) names it instead of the module failing to load.
void add_kernel(OpRegistry& reg, DeviceType backend, const char* name, OpFn fn,
                std::initializer_list<DType> dtypes = kFloatDTypes);

}  // namespace surogate
