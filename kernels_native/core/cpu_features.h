// What the CPU we run on can do, read from CPUID at run time. Binaries are built portable;
// kernels that have SIMD variants pick one from these flags (or through GCC target_clones).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace surogate {

struct CpuFeatures {
  bool sse42 = false, avx = false, avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512_vnni = false, avx512_bf16 = false;
  bool amx_tile = false, amx_bf16 = false;
  std::string brand;
};

const CpuFeatures& cpu_features();
std::vector<std::pair<std::string, bool>> cpu_feature_list();

}  // namespace surogate
