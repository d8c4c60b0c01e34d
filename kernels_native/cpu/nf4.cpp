// CPU op on weights in bitsandbytes' NF4 layout (QLoRA's base; core/nf4_codes.h):
//
//   nf4_dequantize (q[rows, cols/2] u8, absmax[blocks] f32 | u8, [absmax_scale, absmax_offset])
//                  -> (y[rows, cols] f32/bf16/f16); attr blocksize
//
// The math is bitsandbytes' dequantize_4bit, in f32 and in its order: a double-quantized
// absmax is kDynamic[code] * absmax_scale[b / 256] + offset; each value is kNF4[nibble] * absmax
// (the high nibble first), rounded once to y's dtype.
#include <vector>

#include "core/nf4_codes.h"
#include "cpu/common.h"
#include "runtime/op_checks_gguf.h"

namespace surogate::cpu {

namespace {

Status nf4_dequantize(const OpArgs& a) {
  const Tensor& q = a.in(0);
  const Tensor& absmax = a.in(1);
  const Tensor& y = a.out(0);
  Nf4Args r;
  SG_RETURN_IF_ERROR(check_nf4_dequantize(a, &r));
  std::vector<float> am(r.blocks);
  if (r.double_quant) {
    const uint8_t* c = absmax.ptr<uint8_t>();
    const float* scale = a.in(2).ptr<float>();
    const float offset = a.in(3).ptr<float>()[0];
    for (int64_t b = 0; b < r.blocks; ++b) am[b] = nf4::kDynamic[c[b]] * scale[b / nf4::kAbsmaxBlock] + offset;
  } else {
    const float* f = absmax.ptr<float>();
    for (int64_t b = 0; b < r.blocks; ++b) am[b] = f[b];
  }
  const uint8_t* src = q.ptr<uint8_t>();
  const int64_t bs = r.blocksize, half = bs / 2;
  SG_DISPATCH_FLOAT("nf4_dequantize", y.dtype, T, {
    T* out = y.ptr<T>();
    parallel_for(0, r.blocks, std::max<int64_t>(1, 4096 / bs), [&](int64_t lo, int64_t hi) {
      for (int64_t b = lo; b < hi; ++b) {
        const float s = am[b];
        const uint8_t* qb = src + b * half;
        T* ob = out + b * bs;
        for (int64_t j = 0; j < half; ++j) {
          ob[2 * j] = store<T>(nf4::kNF4[qb[j] >> 4] * s);
          ob[2 * j + 1] = store<T>(nf4::kNF4[qb[j] & 0xF] * s);
        }
      }
    });
  });
  return Status::OK();
}

}  // namespace

void register_cpu_nf4(OpRegistry& reg) { add_op(reg, "nf4_dequantize", nf4_dequantize); }

}  // namespace surogate::cpu
