// Dropout with a mask that is a pure function of (seed, offset + element index), so it is
// never stored: backward runs the same op on dy (the same mask, the same 1/(1-p) scale).
//
// dropout_fwd: (x, [rng]) -> (y); attrs: p (drop probability), seed (int), offset (int).
//   seed64 = seed ^ (rng[0] | rng[1] << 32)   (rng: optional int32 [>=2] or int64 [>=1] tensor,
//            so the seed can change every step without rebuilding the Program)
//   h_i    = splitmix64(splitmix64(seed64) ^ (offset + i))     (uint64 arithmetic, wraps)
//   u_i    = (h_i >> 40) * 2^-24                               (uniform on [0, 1), 24 bits)
//   y_i    = u_i >= p ? x_i / (1 - p) : 0                      (p >= 1: y = 0; p <= 0: y = x)
// i is the flat index into contiguous x. y may alias x.
#include <cmath>

#include "cpu/common.h"
#include "runtime/op_checks_pointwise.h"

namespace surogate::cpu {

namespace {

constexpr int64_t kGrain = 1 << 14;

inline uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

Status dropout_fwd(const OpArgs& a) {
  const Tensor& x = a.in(0);
  const Tensor& y = a.out(0);
  DropoutArgs d;
  SG_RETURN_IF_ERROR(check_dropout_fwd(a, &d));
  uint64_t seed = d.seed;
  const uint64_t offset = d.offset, thr = d.thr;
  const float scale = d.scale;
  if (d.rng == DropoutArgs::kI32) {
    const uint32_t* q = static_cast<const uint32_t*>(a.in(1).data);
    seed ^= static_cast<uint64_t>(q[0]) | (static_cast<uint64_t>(q[1]) << 32);
  } else if (d.rng == DropoutArgs::kI64) {
    seed ^= *static_cast<const uint64_t*>(a.in(1).data);
  }
  const uint64_t s = splitmix64(seed);
  SG_DISPATCH_FLOAT("dropout_fwd", x.dtype, T, {
    const T* px = x.ptr<T>();
    T* py = y.ptr<T>();
    parallel_for(0, x.numel(), kGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        const uint64_t h = splitmix64(s ^ (offset + static_cast<uint64_t>(i)));
        py[i] = store<T>((h >> 40) >= thr ? load(px[i]) * scale : 0.0f);
      }
    });
  });
  return Status::OK();
}

}  // namespace

void register_cpu_dropout(OpRegistry& reg) {
  add_op(reg, "dropout_fwd", dropout_fwd);
}

}  // namespace surogate::cpu
