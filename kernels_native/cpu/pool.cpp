// Patch-grid pooling CPU ops: mean_pool_2d_fwd / mean_pool_2d_bwd (Gemma 3's multimodal projector,
// nn.AvgPool2d(k, stride k) over each image's H x W grid of vision-tower patches).
//
// Shapes (runtime/op_checks_pool.h): x [B*H*W, C], image b's patch (r, c) at row (b H + r) W + c;
// y [B*Ho*Wo, C], Ho = H / k, Wo = W / k, pooled patch (i, j) of image b at row (b Ho + i) Wo + j.
// That is the order transformers makes: [B, P*P, C] -> transpose -> [B, C, P, P] -> AvgPool2d ->
// flatten(2) -> transpose -> [B, (P/k)^2, C] (tests/native/test_vision_ops.py checks it against
// Gemma3MultiModalProjector).
//   forward:  y[(b, i, j)] = T(sum over a, c < k of x[(b, i k + a, j k + c)] / k^2), summed in f32,
//             rows in (a, c) order, one rounding (as torch's avg_pool2d)
//   backward: dx[(b, r, c)] = T(dy[(b, r / k, c / k)] / k^2)
// Each output row is one work item; its k^2 input rows are contiguous in C, so the inner loop runs
// over channels.
#include <vector>

#include "cpu/common.h"
#include "runtime/op_checks_pool.h"

namespace surogate::cpu {

namespace {

int64_t row_grain(int64_t C) { return std::max<int64_t>(1, 4096 / std::max<int64_t>(C, 1)); }

template <typename T>
void pool_forward(const T* x, T* y, const MeanPool2dArgs& r) {
  const int64_t C = r.C, rows = r.B * r.Ho * r.Wo;
  const float inv = 1.0f / static_cast<float>(r.k * r.k);
  parallel_for(0, rows, row_grain(C), [&](int64_t lo, int64_t hi) {
    std::vector<float> acc(static_cast<size_t>(C));
    for (int64_t o = lo; o < hi; ++o) {
      const int64_t b = o / (r.Ho * r.Wo), i = o / r.Wo % r.Ho, j = o % r.Wo;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t a = 0; a < r.k; ++a) {
        for (int64_t c = 0; c < r.k; ++c) {
          const T* src = x + ((b * r.H + i * r.k + a) * r.W + j * r.k + c) * C;
          for (int64_t ch = 0; ch < C; ++ch) acc[ch] += load(src[ch]);
        }
      }
      T* dst = y + o * C;
      for (int64_t ch = 0; ch < C; ++ch) dst[ch] = store<T>(acc[ch] * inv);
    }
  });
}

template <typename T>
void pool_backward(const T* dy, T* dx, const MeanPool2dArgs& r) {
  const int64_t C = r.C, rows = r.B * r.H * r.W;
  const float inv = 1.0f / static_cast<float>(r.k * r.k);
  parallel_for(0, rows, row_grain(C), [&](int64_t lo, int64_t hi) {
    for (int64_t n = lo; n < hi; ++n) {
      const int64_t b = n / (r.H * r.W), row = n / r.W % r.H, col = n % r.W;
      const T* src = dy + ((b * r.Ho + row / r.k) * r.Wo + col / r.k) * C;
      T* dst = dx + n * C;
      for (int64_t ch = 0; ch < C; ++ch) dst[ch] = store<T>(load(src[ch]) * inv);
    }
  });
}

Status mean_pool_2d_fwd(const OpArgs& a) {
  MeanPool2dArgs r;
  SG_RETURN_IF_ERROR(check_mean_pool_2d_fwd(a, &r));
  SG_DISPATCH_FLOAT("mean_pool_2d_fwd", a.in(0).dtype, T,
                    { pool_forward<T>(a.in(0).ptr<T>(), a.out(0).ptr<T>(), r); });
  return Status::OK();
}

Status mean_pool_2d_bwd(const OpArgs& a) {
  MeanPool2dArgs r;
  SG_RETURN_IF_ERROR(check_mean_pool_2d_bwd(a, &r));
  SG_DISPATCH_FLOAT("mean_pool_2d_bwd", a.in(0).dtype, T,
                    { pool_backward<T>(a.in(0).ptr<T>(), a.out(0).ptr<T>(), r); });
  return Status::OK();
}

}  // namespace

void register_cpu_pool(OpRegistry& reg) {
  add_op(reg, "mean_pool_2d_fwd", mean_pool_2d_fwd);
  add_op(reg, "mean_pool_2d_bwd", mean_pool_2d_bwd);
}

}  // namespace surogate::cpu
