// RoPE on CUDA: rope_fwd / rope_bwd and Qwen3's fused per-head RMSNorm + RoPE, qk_norm_rope_fwd /
// qk_norm_rope_bwd. The contract is cpu/rope.cpp's (read its header): N tokens, H heads, D head
// dim, R = rotary_dim, half = R / 2; HF's non-interleaved rotate_half layout (dims i and i + half
// pair up, dims [R, D) pass through); the same rounding order, so bf16 results match the CPU's.
//
// inv_freq is computed on the host exactly as the CPU does (f32, HF's order of operations, f64
// pow rounded once) and travels to the kernel as a by-value parameter: no copy, no host sync, and
// the launch stays capturable in a CUDA graph. That caps half at kMaxHalf (rotary_dim 1024).
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
#include <numbers>
#include <string>

#include "core/allocator.h"
#include "cuda/norm_rope_act.cuh"
#include "cuda/rope.cuh"

// inv_freq must be HF's f32 value to the bit (at p ~ 1e5 one ulp of f_i is one ulp of the
// angle): no fused multiply-adds in the host code that computes it, as in cpu/rope.cpp.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDA_ARCH__)
#define SG_NO_FP_CONTRACT __attribute__((optimize("fp-contract=off")))
#else
#define SG_NO_FP_CONTRACT
#endif

namespace surogate::cuda::nra {

namespace {

constexpr int64_t kMaxGrid = 1 << 20;  // tokens per launch before blocks loop
constexpr int64_t kMaxDwBlocks = 1024;
constexpr int64_t kMinTokensPerDwBlock = 4;
constexpr int kMaxWarps = 8;

// ---- host: inv_freq, as cpu/rope.cpp computes it -----------------------------------------------

SG_NO_FP_CONTRACT
void compute_inv_freq(RopeConfig* cfg, const std::string& type, float theta, float factor, double low_freq_factor,
                      double high_freq_factor, double original_max_position) {
  const int64_t half = cfg->rotary_dim / 2;
  const float dim = static_cast<float>(cfg->rotary_dim);
  for (int64_t i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / dim;
    const float p = static_cast<float>(std::pow(static_cast<double>(theta), static_cast<double>(e)));
    float f = 1.0f / p;
    if (type == "linear") {
      f = f / factor;
    } else if (type == "llama3") {
      // HF: wavelen = 2 pi / inv_freq as reciprocal(inv_freq) * f32(2 pi); comparisons in f32.
      const float low_freq_wavelen = static_cast<float>(original_max_position / low_freq_factor);
      const float high_freq_wavelen = static_cast<float>(original_max_position / high_freq_factor);
      const float wavelen = (1.0f / f) * static_cast<float>(2.0 * std::numbers::pi);
      const float llama = wavelen > low_freq_wavelen ? f / factor : f;
      if (!(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen)) {
        const float smooth =
            ((1.0f / wavelen) * static_cast<float>(original_max_position) - static_cast<float>(low_freq_factor)) /
            static_cast<float>(high_freq_factor - low_freq_factor);
        const float a = (1.0f - smooth) * llama / factor;
        const float b = smooth * llama;
        f = a + b;
      } else {
        f = llama;
      }
    }
    cfg->inv.f[i] = f;
  }
}

}  // namespace

Status parse_rope(const char* op, const Attrs& at, int64_t D, RopeConfig* cfg) {
  const int64_t R = at.get_int("rotary_dim", D);
  SG_CHECK_ARG(R > 0 && R % 2 == 0 && R <= D,
               str_cat(op, ": rotary_dim ", R, " must be even and in (0, D = ", D, "]"));
  SG_CHECK(R / 2 <= kMaxHalf, StatusCode::kUnsupported,
           str_cat(op, ": rotary_dim ", R, " is above the CUDA kernel's limit of ", 2 * kMaxHalf),
           "run this op on the CPU");
  cfg->rotary_dim = R;
  const double theta = at.get_float("theta", 10000.0);
  SG_CHECK_ARG(theta > 0, str_cat(op, ": theta must be > 0, got ", theta));
  cfg->attention_factor = static_cast<float>(at.get_float("attention_factor", 1.0));

  const std::string type = at.get_str("rope_type", "default");
  float factor = 1.0f;
  double low = 0.0, high = 0.0, omp = 0.0;
  if (type == "linear" || type == "llama3") {
    SG_CHECK(at.has("factor"), StatusCode::kInvalidArgument, str_cat(op, ": rope_type ", type, " needs attr factor"),
             "pass rope_scaling's factor");
    factor = static_cast<float>(at.get_float("factor", 1.0));
    SG_CHECK_ARG(factor > 0, str_cat(op, ": factor must be > 0, got ", factor));
  }
  if (type == "llama3") {
    SG_CHECK(at.has("low_freq_factor") && at.has("high_freq_factor") && at.has("original_max_position"),
             StatusCode::kInvalidArgument,
             str_cat(op, ": rope_type llama3 needs attrs low_freq_factor, high_freq_factor, original_max_position"),
             "take them from rope_scaling (original_max_position = original_max_position_embeddings)");
    low = at.get_float("low_freq_factor", 0.0);
    high = at.get_float("high_freq_factor", 0.0);
    omp = at.get_float("original_max_position", 0.0);
    SG_CHECK_ARG(low > 0 && high > 0 && high != low && omp > 0,
                 str_cat(op, ": llama3 needs low_freq_factor, high_freq_factor > 0, different, and "
                             "original_max_position > 0 (got ", low, ", ", high, ", ", omp, ")"));
  } else if (type != "default" && type != "linear") {
    return SG_ERROR(StatusCode::kInvalidArgument, str_cat(op, ": unknown rope_type '", type, "'"),
                    "use default, linear or llama3");
  }
  compute_inv_freq(cfg, type, static_cast<float>(theta), factor, low, high, omp);
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

// ---- argument checks (cpu/rope.cpp's, same messages) -----------------------------------------

Status check_pos(const char* op, const Tensor& pos, int64_t N) {
  SG_RETURN_IF_ERROR(check_dtype(op, "pos", pos, {DType::kI32}));
  SG_RETURN_IF_ERROR(check_contiguous(op, "pos", pos));
  SG_CHECK_SHAPE(pos.ndim == 1 && pos.shape[0] == N,
                 str_cat(op, ": pos ", pos.shape_str(), " must be [N] = [", N, "], one position per token"));
  return Status::OK();
}

Status check_x(const char* op, const char* name, const Tensor& x) {
  SG_RETURN_IF_ERROR(check_ndim(op, name, x, 3));
  SG_RETURN_IF_ERROR(check_contiguous(op, name, x));
  return check_dtype(op, name, x, {DType::kF32, DType::kBF16, DType::kF16});
}

Status check_like(const char* op, const char* a_name, const Tensor& a, const char* b_name, const Tensor& b) {
  SG_RETURN_IF_ERROR(check_same_shape(op, a_name, a, b_name, b));
  SG_RETURN_IF_ERROR(check_contiguous(op, b_name, b));
  SG_CHECK(a.dtype == b.dtype, StatusCode::kDTypeUnsupported,
           str_cat(op, ": ", b_name, " is ", dtype_name(b.dtype), " but ", a_name, " is ", dtype_name(a.dtype)),
           "cast first");
  return Status::OK();
}

// dw: w's shape, in w's dtype or float32 (the trainer's gradient accumulators are f32).
Status check_dw(const char* op, const Tensor& w, const Tensor& dw) {
  SG_RETURN_IF_ERROR(check_same_shape(op, "w", w, "dw", dw));
  SG_RETURN_IF_ERROR(check_contiguous(op, "dw", dw));
  SG_CHECK(dw.dtype == w.dtype || dw.dtype == DType::kF32, StatusCode::kDTypeUnsupported,
           str_cat(op, ": dw is ", dtype_name(dw.dtype), "; it must be float32 or w's ", dtype_name(w.dtype)),
           "cast first");
  return Status::OK();
}

Status check_weight(const char* op, const char* name, const Tensor& w, const Tensor& x) {
  SG_CHECK_SHAPE(w.ndim == 1 && w.shape[0] == x.shape[2],
                 str_cat(op, ": ", name, " ", w.shape_str(), " must be [D] = [", x.shape[2], "]"));
  SG_RETURN_IF_ERROR(check_contiguous(op, name, w));
  SG_CHECK(w.dtype == x.dtype, StatusCode::kDTypeUnsupported,
           str_cat(op, ": ", name, " is ", dtype_name(w.dtype), " but x is ", dtype_name(x.dtype)), "cast first");
  return Status::OK();
}

Status check_rstd(const char* op, const Tensor& rstd, int64_t N, int64_t H) {
  SG_RETURN_IF_ERROR(check_dtype(op, "rstd", rstd, {DType::kF32}));
  SG_RETURN_IF_ERROR(check_contiguous(op, "rstd", rstd));
  SG_CHECK_SHAPE(rstd.ndim == 2 && rstd.shape[0] == N && rstd.shape[1] == H,
                 str_cat(op, ": rstd ", rstd.shape_str(), " must be [N, H] = [", N, ", ", H, "]"));
  return Status::OK();
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
  SG_RETURN_IF_ERROR(check_x(op, "x", x));
  SG_RETURN_IF_ERROR(check_like(op, "x", x, "y", y));
  const int64_t N = x.shape[0], H = x.shape[1], D = x.shape[2];
  SG_RETURN_IF_ERROR(check_pos(op, a.in(1), N));
  SG_RETURN_IF_ERROR(check_heads(op, H));
  RopeConfig cfg;
  SG_RETURN_IF_ERROR(parse_rope(op, a.attr(), D, &cfg));
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
  SG_RETURN_IF_ERROR(check_x(op, "x", x));
  SG_RETURN_IF_ERROR(check_like(op, "x", x, "y", y));
  SG_RETURN_IF_ERROR(check_weight(op, "w", w, x));
  const int64_t N = x.shape[0], H = x.shape[1], D = x.shape[2];
  SG_RETURN_IF_ERROR(check_pos(op, a.in(2), N));
  SG_RETURN_IF_ERROR(check_rstd(op, rstd, N, H));
  SG_RETURN_IF_ERROR(check_heads(op, H));
  RopeConfig cfg;
  SG_RETURN_IF_ERROR(parse_rope(op, a.attr(), D, &cfg));
  const float eps = static_cast<float>(a.attr().get_float("eps", 1e-6));
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
  SG_RETURN_IF_ERROR(check_x(op, "x", x));
  SG_RETURN_IF_ERROR(check_like(op, "x", x, "dy", dy));
  SG_RETURN_IF_ERROR(check_like(op, "x", x, "dx", dx));
  SG_RETURN_IF_ERROR(check_weight(op, "w", w, x));
  const int64_t N = x.shape[0], H = x.shape[1], D = x.shape[2];
  SG_RETURN_IF_ERROR(check_pos(op, a.in(4), N));
  SG_RETURN_IF_ERROR(check_rstd(op, rstd, N, H));
  SG_RETURN_IF_ERROR(check_heads(op, H));
  const bool want_dw = a.has_out(1);
  if (want_dw) SG_RETURN_IF_ERROR(check_dw(op, w, a.out(1)));
  const bool accumulate = a.attr().get_bool("accumulate", false);
  RopeConfig cfg;
  SG_RETURN_IF_ERROR(parse_rope(op, a.attr(), D, &cfg));
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
  const std::string attrs = "theta, rotary_dim, rope_type (default|linear|llama3), factor, low_freq_factor, "
                            "high_freq_factor, original_max_position, attention_factor";
  add_op(reg, "rope_fwd", 2, 2, 1, rope_fwd, ("(x[N,H,D], pos[N] i32) -> (y); attrs: " + attrs).c_str());
  add_op(reg, "rope_bwd", 2, 2, 1, rope_bwd,
         ("(dy[N,H,D], pos[N] i32) -> (dx), rotation by -angle; attrs: " + attrs).c_str());
  add_op(reg, "qk_norm_rope_fwd", 3, 3, 2, qk_norm_rope_fwd,
         ("(x[N,H,D], w[D], pos[N]) -> (y, rstd[N,H] f32); attrs: eps, weight_offset, " + attrs).c_str());
  add_op(reg, "qk_norm_rope_bwd", 5, 5, 2, qk_norm_rope_bwd,
         ("(dy, x, w, rstd, pos) -> (dx, [dw]); attrs: eps, weight_offset, accumulate, " + attrs).c_str(), /*min_out=*/1);
}

}  // namespace surogate::cuda::nra
