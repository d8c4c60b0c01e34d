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
  SG_RETURN_IF_ERROR(check_contiguous("dropout_fwd", "x", x));
  SG_RETURN_IF_ERROR(check_contiguous("dropout_fwd", "y", y));
  SG_RETURN_IF_ERROR(check_same_shape("dropout_fwd", "x", x, "y", y));
  SG_CHECK(x.dtype == y.dtype, StatusCode::kDTypeUnsupported, "dropout_fwd: x and y dtypes differ", "cast first");
  const double p = a.attr().get_float("p", 0.0);
  uint64_t seed = static_cast<uint64_t>(a.attr().get_int("seed", 0));
  const uint64_t offset = static_cast<uint64_t>(a.attr().get_int("offset", 0));
  if (a.has_in(1)) {
    const Tensor& r = a.in(1);
    SG_RETURN_IF_ERROR(check_contiguous("dropout_fwd", "rng", r));
    if (r.dtype == DType::kI32) {
      SG_CHECK_SHAPE(r.numel() >= 2, str_cat("dropout_fwd: rng (int32) needs 2 elements, got ", r.shape_str()));
      const uint32_t* q = static_cast<const uint32_t*>(r.data);
      seed ^= static_cast<uint64_t>(q[0]) | (static_cast<uint64_t>(q[1]) << 32);
    } else if (r.dtype == DType::kI64) {
      SG_CHECK_SHAPE(r.numel() >= 1, str_cat("dropout_fwd: rng (int64) needs 1 element, got ", r.shape_str()));
      seed ^= *static_cast<const uint64_t*>(r.data);
    } else {
      SG_CHECK(false, StatusCode::kDTypeUnsupported,
               str_cat("dropout_fwd: rng must be int32 or int64, got ", dtype_name(r.dtype)), "");
    }
  }
  const uint64_t s = splitmix64(seed);
  // keep iff (h >> 40) >= thr, thr = ceil(p * 2^24): exactly u >= p for the 24-bit u.
  const double thr_d = std::ceil(p * 16777216.0);
  const uint64_t thr = p <= 0.0 ? 0 : (p >= 1.0 ? (1ull << 24) : static_cast<uint64_t>(thr_d));
  const float scale = p >= 1.0 ? 0.0f : static_cast<float>(1.0 / (1.0 - p));
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
