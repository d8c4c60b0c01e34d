#include "core/cpu_features.h"

#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define SG_X86 1
#endif

namespace surogate {

namespace {

CpuFeatures detect() {
  CpuFeatures f;
#ifdef SG_X86
  __builtin_cpu_init();
  f.sse42 = __builtin_cpu_supports("sse4.2");
  f.avx = __builtin_cpu_supports("avx");
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512_vnni = __builtin_cpu_supports("avx512vnni");
  unsigned a, b, c, d;
  if (__get_cpuid(1, &a, &b, &c, &d)) f.f16c = (c >> 29) & 1;
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avx512_bf16 = f.avx512f && ((a >> 5) & 1);
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.amx_bf16 = (d >> 22) & 1;
    f.amx_tile = (d >> 24) & 1;
  }
  char brand[49] = {0};
  unsigned regs[12];
  if (__get_cpuid(0x80000000, &a, &b, &c, &d) && a >= 0x80000004) {
    for (unsigned i = 0; i < 3; ++i) __get_cpuid(0x80000002 + i, &regs[i * 4], &regs[i * 4 + 1], &regs[i * 4 + 2], &regs[i * 4 + 3]);
    std::memcpy(brand, regs, 48);
    f.brand = brand;
    while (!f.brand.empty() && f.brand.back() == ' ') f.brand.pop_back();
    size_t s = f.brand.find_first_not_of(' ');
    f.brand = s == std::string::npos ? "" : f.brand.substr(s);
  }
#endif
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

std::vector<std::pair<std::string, bool>> cpu_feature_list() {
  const CpuFeatures& f = cpu_features();
  return {{"sse4.2", f.sse42},       {"avx", f.avx},           {"avx2", f.avx2},
          {"fma", f.fma},            {"f16c", f.f16c},         {"avx512f", f.avx512f},
          {"avx512bw", f.avx512bw},  {"avx512vl", f.avx512vl}, {"avx512_vnni", f.avx512_vnni},
          {"avx512_bf16", f.avx512_bf16}, {"amx_tile", f.amx_tile}, {"amx_bf16", f.amx_bf16}};
}

}  // namespace surogate
