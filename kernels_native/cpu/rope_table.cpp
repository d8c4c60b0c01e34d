// RoPE from per-token cos / sin tables on the CPU: rope_table_fwd / rope_table_bwd (Qwen3-VL's 2D
// vision rotary, transformers' apply_rotary_pos_emb_vision; argument rules in
// runtime/op_checks_rope_table.h).
//
// N tokens, H heads, D head dim, half = cos.shape[1], R = 2 half <= D; c = cos[n], s = sign * sin[n]
// (sign +1 forward, -1 backward: the transpose of a rotation is the rotation by -angle):
//   y[i]        = x[i] c[i] - x[i + half] s[i]
//   y[i + half] = x[i + half] c[i] + x[i] s[i]            (i < half; dims [R, D) copied)
// HF's vision rotary casts q / k to f32, rotates with f32 cos / sin and casts back: the math here is
// f32 with one rounding to T at the store (for f32, HF's exactly: x c + rotate_half(x) s, the
// products and the sum in that order). With attr round_products (HF's text rope in T, Qwen3-VL's
// MRoPE): c and s rounded to T, each product rounded to T, then the sum.
#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu/common.h"
#include "runtime/op_checks_rope_table.h"

namespace surogate::cpu {

namespace {

template <typename T>
float rnd(float v) {  // v rounded to T (nearest even), as a float
  return load(store<T>(v));
}

template <typename T>
void rotate(const T* x, const float* cos, const float* sin, T* y, const RopeTableArgs& r, float sign) {
  const int64_t H = r.H, D = r.D, half = r.half, R = 2 * half;
  parallel_for(0, r.N, std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(H * D, 1)), [&](int64_t n0, int64_t n1) {
    std::vector<float> a(half), b(half);
    for (int64_t n = n0; n < n1; ++n) {
      const float* c = cos + n * half;
      const float* s = sin + n * half;
      for (int64_t h = 0; h < H; ++h) {
        const T* xr = x + (n * H + h) * D;
        T* yr = y + (n * H + h) * D;
        for (int64_t i = 0; i < half; ++i) {
          a[i] = load(xr[i]);
          b[i] = load(xr[i + half]);
        }
        for (int64_t i = 0; i < half; ++i) {
          const float sn = sign * s[i];
          if (r.round_products) {
            const float ct = rnd<T>(c[i]), st = rnd<T>(sn);
            yr[i] = store<T>(rnd<T>(a[i] * ct) + rnd<T>((-b[i]) * st));
            yr[i + half] = store<T>(rnd<T>(b[i] * ct) + rnd<T>(a[i] * st));
          } else {
            yr[i] = store<T>(a[i] * c[i] + (-b[i]) * sn);
            yr[i + half] = store<T>(b[i] * c[i] + a[i] * sn);
          }
        }
        if (R < D && xr != yr) std::memcpy(yr + R, xr + R, (D - R) * sizeof(T));
      }
    }
  });
}

Status rope_table_apply(const char* op, const OpArgs& a, float sign) {
  RopeTableArgs r;
  SG_RETURN_IF_ERROR(check_rope_table(op, a, &r));
  SG_DISPATCH_FLOAT(op, a.in(0).dtype, T, {
    rotate<T>(a.in(0).ptr<T>(), a.in(1).ptr<float>(), a.in(2).ptr<float>(), a.out(0).ptr<T>(), r, sign);
  });
  return Status::OK();
}

Status rope_table_fwd(const OpArgs& a) { return rope_table_apply("rope_table_fwd", a, 1.0f); }
Status rope_table_bwd(const OpArgs& a) { return rope_table_apply("rope_table_bwd", a, -1.0f); }

}  // namespace

void register_cpu_rope_table(OpRegistry& reg) {
  add_op(reg, "rope_table_fwd", rope_table_fwd);
  add_op(reg, "rope_table_bwd", rope_table_bwd);
}

}  // namespace surogate::cpu
