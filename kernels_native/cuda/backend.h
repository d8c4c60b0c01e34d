// The CUDA backend's entry points: device discovery, the allocator / copy hooks it registers
// with core/allocator, and the registration of its op kernels. Compiled only when the CUDA
// toolkit is found (SUROGATE_CUDA=AUTO|ON).
#pragma once

#include <string>
#include <vector>

#include "runtime/op_registry.h"

namespace surogate::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  size_t total_memory = 0;
  int multiprocessors = 0;
  std::string driver_version;
};

// Devices the driver reports; empty (not an error) when there is no GPU or no driver.
std::vector<DeviceInfo> devices();
std::string runtime_version();
// Register device hooks and every CUDA op kernel. Safe to call with no GPU present.
void register_backend();

// Per-group op registration (one per .cu file).
void register_cuda_elementwise(OpRegistry& reg);

}  // namespace surogate::cuda
