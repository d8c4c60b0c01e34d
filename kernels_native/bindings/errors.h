// Status -> Python exception. A non-OK Status raised from C++ becomes the SurogateError
// subclass that surogate.errors defines for its code, with message, hint, file and line.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "core/status.h"
#include "core/tensor.h"

namespace surogate::bindings {

struct StatusError {
  Status status;
};

[[noreturn]] inline void throw_status(Status st) { throw StatusError{std::move(st)}; }
inline void check(Status st) {
  if (!st.ok()) throw_status(std::move(st));
}

void register_error_translator(pybind11::module_& m);

// "cpu", "cuda" or "cuda:N"; anything else raises InvalidArgumentError.
Device parse_device(const std::string& s);

}  // namespace surogate::bindings
