// RoPE on CUDA: rope_fwd / rope_bwd and Qwen3's fused per-head RMSNorm + RoPE, qk_norm_rope_fwd /
// qk_norm_rope_bwd. The contract is cpu/rope.cpp's (read its header): N tokens, H heads, D head
// dim, R = rotary_dim, half = R / 2; HF's non-interleaved rotate_half layout (dims i and i + half
// pair up, dims [R, D) pass through); the same rounding order, so bf16 results match the CPU's.
//
// inv_freq is computed on the host by the code the CPU uses (runtime/op_checks_rope.cpp, with the
// argument checks both backends share) and travels to the kernel as a by-value parameter: no copy,
// no host sync, and the launch stays capturable in a CUDA graph. That caps half at kMaxHalf
// (rotary_dim 1024).
// cuda/rope.cuh holds these pieces (qkv_rope_cache uses them too).
// Positions stay on the device: one block per token computes that token's cos / sin into
// shared memory as the CPU does (f32 angle p * f_i, cos / sin of it in f64 rounded to f32, times
// attention_factor, rounded to T) and then serves every head of the token from there.
// rope: the block's threads walk the token's H * half pairs. qk_norm_rope: one warp per head
// (warps loop over the heads), lanes stride over the head dim; a warp sum gives rstd (forward) or
// mean(g w xhat) (backward). Every element is read and written by the same thread, so y may
// alias x (and dx dy or x), as on the CPU.
// qk_norm_rope_bwd's dw: a block walks a fixed range of tokens (set by N alone); each warp
// accumulates into its own [D] f32 row of shared memory (every column has one owner lane), the
// block adds its warps' rows in order into one partial, and reduce_dw_partials sums those.
#include <algorithm>
#include <cmath>
#include <string>

#include "core/allocator.h"
#include "cuda/norm_rope_act.cuh"
#include "cuda/rope.cuh"

namespace surogate::cuda::nra {

namespace {

constexpr int64_t kMaxGrid = 1 << 20;  // tokens per launch before blocks loop
constexpr int64_t kMaxDwBlocks = 1024;
constexpr int64_t kMinTokensPerDwBlock = 4;
constexpr int kMaxWarps = 8;

}  // namespace

Status device_rope(const char* op, const RopeAttrs& r, RopeConfig* cfg) {
  SG_CHECK(r.rotary_dim / 2 <= kMaxHalf, StatusCode::kUnsupported,
           str_cat(op, ": rotary_dim ", r.rotary_dim, " is above the CUDA kernel's limit of ", 2 * kMaxHalf),
           "run this op on the CPU");
  cfg->rotary_dim = r.rotary_dim;
  cfg->attention_factor = r.attention_factor;
  std::copy(r.inv_freq.begin(), r.inv_freq.end(), cfg->inv.f);
  return Status::OK();
}

namespace {

// ---- rope -----------------------------------------------------------------------------------

// sign = +1 forward, -1 backward (rotation by -angle).
template <typename T>
__global__ void rope_kernel(const T* x, const int32_t* pos, T* y, InvFreq inv, float af, float sign, int64_t N,
                            int H, int64_t D, int64_t half, bool copy_pass) {
  extern __shared__ float smem[];
  float* fr = smem;          // [half] inv_freq
  float* cs = smem + half;   // [2 half] cos, sin of the current token
  load_inv_freq(inv, fr, half);
  const int64_t R = 2 * half;
  const int64_t pairs = H * half, rest = H * (D - R);
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    __syncthreads();  // fr is written; the previous token's cs has been read
    fill_cos_sin<T>(fr, pos[n], af, cs, half);
    __syncthreads();
    const int64_t tok = n * H * D;
    for (int64_t e = threadIdx.x; e < pairs; e += blockDim.x) {
      const int64_t h = e / half, i = e - h * half;
      const int64_t off = tok + h * D;
      const float a = ld(x[off + i]), b = ld(x[off + i + half]);
      rotate<T>(a, b, cs[i], sign * cs[half + i], y + off + i, y + off + i + half);
    }
    if (copy_pass) {
      for (int64_t e = threadIdx.x; e < rest; e += blockDim.x) {
        const int64_t h = e / (D - R), j = R + (e - h * (D - R));
        y[tok + h * D + j] = x[tok + h * D + j];
      }
    }
  }
}

// ---- qk_norm_rope ---------------------------------------------------------------------------

// n = T(w T(x rstd)) per head, rstd = 1 / sqrt(sum x^2 / D + eps), then y = rope(n).
template <typename T>
__global__ void qk_norm_rope_fwd_kernel(const T* x, const T* w, const int32_t* pos, T* y, float* rstd, InvFreq inv,
                                        float af, float eps, float offset, int64_t N, int H, int64_t D, int64_t half) {
  // offset 0: T(w T(x r)) (Qwen3RMSNorm); else T(x r (w + offset)), one rounding (Gemma3RMSNorm).
  auto normed = [offset](float xv, float r, float wv) {
    return offset == 0.0f ? rnd<T>(rnd<T>(xv * r) * wv) : rnd<T>(xv * r * (wv + offset));
  };
  extern __shared__ float smem[];
  float* fr = smem;
  float* cs = smem + half;
  load_inv_freq(inv, fr, half);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int64_t R = 2 * half;
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    __syncthreads();
    fill_cos_sin<T>(fr, pos[n], af, cs, half);
    __syncthreads();
    for (int h = warp; h < H; h += nwarps) {
      const int64_t off = (n * H + h) * D;
      float ss = 0.0f;
      for (int64_t j = lane; j < D; j += 32) {
        const float v = ld(x[off + j]);
        ss += v * v;
      }
      const float r = 1.0f / sqrtf(warp_sum(ss) / static_cast<float>(D) + eps);
      if (lane == 0) rstd[n * H + h] = r;
      __syncwarp();  // every lane's reads of this head precede any write (y may alias x)
      for (int64_t i = lane; i < half; i += 32) {
        const float a = normed(ld(x[off + i]), r, ld(w[i]));
        const float b = normed(ld(x[off + i + half]), r, ld(w[i + half]));
        rotate<T>(a, b, cs[i], cs[half + i], y + off + i, y + off + i + half);
      }
      for (int64_t j = R + lane; j < D; j += 32) y[off + j] = st<T>(normed(ld(x[off + j]), r, ld(w[j])));
    }
  }
}

// g = rope_bwd(dy) in f32 with the T-rounded cos / sin, xhat = x rstd, q = g w,
// dx = rstd (q - xhat mean(q xhat)), partial[b, :] = sum of g xhat over the block's tokens and heads.
template <typename T>
__global__ void qk_norm_rope_bwd_kernel(const T* dy, const T* x, const T* w, const float* rstd, const int32_t* pos,
                                        T* dx, float* partial, InvFreq inv, float af, float offset, int64_t N, int H,
                                        int64_t D, int64_t half, int64_t tokens_per_block) {
  extern __shared__ float smem[];
  float* fr = smem;
  float* cs = smem + half;
  float* wacc = smem + 3 * half;  // [nwarps, D] when partial != nullptr
  load_inv_freq(inv, fr, half);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int64_t R = 2 * half;
  const float inv_d = 1.0f / static_cast<float>(D);
  float* acc = wacc + warp * D;
  const int64_t nblocks = (N + tokens_per_block - 1) / tokens_per_block;
  for (int64_t b = blockIdx.x; b < nblocks; b += gridDim.x) {
    if (partial) {
      __syncthreads();  // the previous block range's sums have been read
      for (int64_t j = threadIdx.x; j < nwarps * D; j += blockDim.x) wacc[j] = 0.0f;
    }
    const int64_t n0 = b * tokens_per_block;
    const int64_t n1 = n0 + tokens_per_block < N ? n0 + tokens_per_block : N;
    for (int64_t n = n0; n < n1; ++n) {
      __syncthreads();
      fill_cos_sin<T>(fr, pos[n], af, cs, half);
      __syncthreads();
      for (int h = warp; h < H; h += nwarps) {
        const int64_t off = (n * H + h) * D;
        const float r = rstd[n * H + h];
        float dot = 0.0f;
        for (int64_t i = lane; i < half; i += 32) {
          const float g1 = ld(dy[off + i]), g2 = ld(dy[off + i + half]), c = cs[i], s = cs[half + i];
          const float ga = g1 * c + g2 * s, gb = g2 * c - g1 * s;
          dot += ga * (ld(w[i]) + offset) * (ld(x[off + i]) * r) + gb * (ld(w[i + half]) + offset) * (ld(x[off + i + half]) * r);
        }
        for (int64_t j = R + lane; j < D; j += 32) dot += ld(dy[off + j]) * (ld(w[j]) + offset) * (ld(x[off + j]) * r);
        const float m = warp_sum(dot) * inv_d;
        __syncwarp();  // every lane's reads of this head precede any write (dx may alias dy or x)
        for (int64_t i = lane; i < half; i += 32) {
          const float g1 = ld(dy[off + i]), g2 = ld(dy[off + i + half]), c = cs[i], s = cs[half + i];
          const float ga = g1 * c + g2 * s, gb = g2 * c - g1 * s;
          const float xa = ld(x[off + i]) * r, xb = ld(x[off + i + half]) * r;
          dx[off + i] = st<T>(r * (ga * (ld(w[i]) + offset) - xa * m));
          dx[off + i + half] = st<T>(r * (gb * (ld(w[i + half]) + offset) - xb * m));
          if (partial) {  // columns i and i + half belong to this lane alone
            acc[i] += ga * xa;
            acc[i + half] += gb * xb;
          }
        }
        for (int64_t j = R + lane; j < D; j += 32) {
          const float g = ld(dy[off + j]), xh = ld(x[off + j]) * r;
          dx[off + j] = st<T>(r * (g * (ld(w[j]) + offset) - xh * m));
          if (partial) acc[j] += g * xh;
        }
      }
    }
    if (partial) {
      __syncthreads();
      for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
        float s = 0.0f;
        for (int k = 0; k < nwarps; ++k) s += wacc[k * D + j];
        partial[b * D + j] = s;
      }
    }
  }
}

// Heads index warps and pairs in int arithmetic on the device.
Status check_heads(const char* op, int64_t H) {
  SG_CHECK(H <= (1 << 24), StatusCode::kUnsupported, str_cat(op, ": ", H, " heads is above the CUDA kernel's limit"),
           "run this op on the CPU");
  return Status::OK();
}

int warps_for(int64_t H) { return static_cast<int>(std::clamp<int64_t>(H, 1, kMaxWarps)); }

// ---- ops ------------------------------------------------------------------------------------

Status rope_apply(const OpArgs& a, const char* op, float sign) {
  const Tensor& x = a.in(0);
  const Tensor& y = a.out(0);
  RopeArgs ra;
  SG_RETURN_IF_ERROR(check_rope(op, a, &ra));
  const int64_t N = ra.N, H = ra.H, D = ra.D;
  SG_RETURN_IF_ERROR(check_heads(op, H));
  RopeConfig cfg;
  SG_RETURN_IF_ERROR(device_rope(op, ra.rope, &cfg));
  const int64_t R = cfg.rotary_dim, half = R / 2;
  if (N == 0 || H == 0) return Status::OK();
  const bool copy_pass = R < D && x.data != y.data;
  const int threads = static_cast<int>(std::clamp<int64_t>((H * half + 31) / 32 * 32, 32, 256));
  const size_t smem = static_cast<size_t>(3 * half) * sizeof(float);
  const auto grid = static_cast<unsigned>(std::min(N, kMaxGrid));
  SG_CUDA_DISPATCH_FLOAT(op, x.dtype, T, {
    rope_kernel<T><<<grid, threads, smem, current_stream()>>>(x.ptr<T>(), a.in(1).ptr<int32_t>(), y.ptr<T>(), cfg.inv,
                                            cfg.attention_factor, sign, N, static_cast<int>(H), D, half, copy_pass);
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

Status rope_fwd(const OpArgs& a) { return rope_apply(a, "rope_fwd", 1.0f); }
Status rope_bwd(const OpArgs& a) { return rope_apply(a, "rope_bwd", -1.0f); }

Status qk_norm_rope_fwd(const OpArgs& a) {
  const char* op = "qk_norm_rope_fwd";
  const Tensor& x = a.in(0);
  const Tensor& w = a.in(1);
  const Tensor& y = a.out(0);
  const Tensor& rstd = a.out(1);
  RopeArgs ra;
  SG_RETURN_IF_ERROR(check_qk_norm_rope_fwd(a, &ra));
  const int64_t N = ra.N, H = ra.H, D = ra.D;
  SG_RETURN_IF_ERROR(check_heads(op, H));
  RopeConfig cfg;
  SG_RETURN_IF_ERROR(device_rope(op, ra.rope, &cfg));
  const float eps = ra.eps;
  const int64_t half = cfg.rotary_dim / 2;
  if (N == 0 || H == 0) return Status::OK();
  const size_t smem = static_cast<size_t>(3 * half) * sizeof(float);
  const auto grid = static_cast<unsigned>(std::min(N, kMaxGrid));
  SG_CUDA_DISPATCH_FLOAT(op, x.dtype, T, {
    qk_norm_rope_fwd_kernel<T><<<grid, 32 * warps_for(H), smem, current_stream()>>>(
        x.ptr<T>(), w.ptr<T>(), a.in(2).ptr<int32_t>(), y.ptr<T>(), rstd.ptr<float>(), cfg.inv, cfg.attention_factor,
        eps, static_cast<float>(a.attr().get_float("weight_offset", 0.0)), N, static_cast<int>(H), D, half);
  });
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

Status qk_norm_rope_bwd(const OpArgs& a) {
  const char* op = "qk_norm_rope_bwd";
  const Tensor& dy = a.in(0);
  const Tensor& x = a.in(1);
  const Tensor& w = a.in(2);
  const Tensor& rstd = a.in(3);
  const Tensor& dx = a.out(0);
  RopeArgs ra;
  SG_RETURN_IF_ERROR(check_qk_norm_rope_bwd(a, &ra));
  const int64_t N = ra.N, H = ra.H, D = ra.D;
  SG_RETURN_IF_ERROR(check_heads(op, H));
  const bool want_dw = ra.dw != nullptr;
  const bool accumulate = ra.accumulate;
  RopeConfig cfg;
  SG_RETURN_IF_ERROR(device_rope(op, ra.rope, &cfg));
  const int64_t half = cfg.rotary_dim / 2;
  if (N == 0) {
    // dw is a sum over no tokens: zero unless accumulating, as on the CPU.
    if (want_dw && !accumulate) return fill_zero(a.out(1));
    return Status::OK();
  }
  // With dw the token ranges are fixed by N alone (deterministic sums); without, one token a block.
  const int64_t tokens_per_block =
      want_dw ? std::max(kMinTokensPerDwBlock, (N + kMaxDwBlocks - 1) / kMaxDwBlocks) : 1;
  const int64_t nblocks = (N + tokens_per_block - 1) / tokens_per_block;
  const int warps = warps_for(H);
  std::shared_ptr<void> scratch;
  float* partial = nullptr;
  if (want_dw) {
    SG_RETURN_IF_ERROR(allocate(x.device, static_cast<size_t>(nblocks * D) * sizeof(float), &scratch));
    partial = static_cast<float*>(scratch.get());
  }
  const size_t smem = static_cast<size_t>(3 * half + (want_dw ? warps * D : 0)) * sizeof(float);
  const auto grid = static_cast<unsigned>(std::min(nblocks, kMaxGrid));
  SG_CUDA_DISPATCH_FLOAT(op, x.dtype, T, {
    SG_RETURN_IF_ERROR(allow_dynamic_smem(op, reinterpret_cast<const void*>(qk_norm_rope_bwd_kernel<T>), smem,
                                          x.device.index, "the per-warp dw accumulators"));
    qk_norm_rope_bwd_kernel<T><<<grid, 32 * warps, smem, current_stream()>>>(
        dy.ptr<T>(), x.ptr<T>(), w.ptr<T>(), rstd.ptr<float>(), a.in(4).ptr<int32_t>(), dx.ptr<T>(), partial,
        cfg.inv, cfg.attention_factor, static_cast<float>(a.attr().get_float("weight_offset", 0.0)), N,
        static_cast<int>(H), D, half, tokens_per_block);
  });
  SG_CUDA_CHECK_LAUNCH();
  if (want_dw) SG_RETURN_IF_ERROR(reduce_dw_partials(op, partial, nblocks, D, a.out(1), accumulate));
  return Status::OK();
}

}  // namespace

void register_cuda_rope(OpRegistry& reg) {
  add_op(reg, "rope_fwd", rope_fwd);
  add_op(reg, "rope_bwd", rope_bwd);
  add_op(reg, "qk_norm_rope_fwd", qk_norm_rope_fwd);
  add_op(reg, "qk_norm_rope_bwd", qk_norm_rope_bwd);
}

}  // namespace surogate::cuda::nra
