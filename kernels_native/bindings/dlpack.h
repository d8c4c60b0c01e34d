// DLPack exchange (the legacy, unversioned "dltensor" capsule that numpy, torch, jax and cupy
// all read and write). The struct layout below is the DLPack ABI, v0.8.
#pragma once

#include <pybind11/pybind11.h>

#include "core/tensor.h"

namespace surogate::bindings {

// A capsule named "dltensor" that shares `t`'s memory; the consumer renames it when it takes it.
pybind11::capsule to_dlpack(const Tensor& t);
// Take the memory of any object with __dlpack__ (or a "dltensor" capsule) without copying.
Tensor from_dlpack(const pybind11::object& obj);
// (device_type, device_id) as __dlpack_device__ reports it.
std::pair<int, int> dlpack_device(const Tensor& t);

}  // namespace surogate::bindings
