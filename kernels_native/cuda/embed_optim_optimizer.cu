// The optimizer step on CUDA, the twin of cpu/optimizer.cpp: global_norm, adamw, adamw8. Read
// cpu/optimizer.cpp's header for the contract; this one says only where the GPU differs.
// (Over 400 lines: the three ops share the multi-tensor machinery and the AdamW scalars.)
//
// Multi-tensor launches. Each op cuts every tensor (group) into fixed chunks and launches ONE
// kernel over all chunks of all tensors; a block finds its tensor by binary search over the
// chunks' prefix sums. The per-tensor descriptors (pointers, sizes, dtypes) travel as the
// kernel's parameter block (a __grid_constant__ struct, up to kMaxItems of them; CUDA >= 12.1
// takes 32 KiB of parameters), not as a device array: no host-to-device copy, no pinned staging
// buffer whose lifetime must outlast the copy, nothing the host waits on, and a CUDA graph
// captures the launch with its descriptors by value. More than kMaxItems tensors take one more
// launch of the same kernel per kMaxItems.
//
// Device-side scalars. hp and norm stay on the device: each block's thread 0 computes the
// step's scalars from them (in double, rounded once to f32, exactly as the CPU's adam_scalars)
// into shared memory. The CPU also rejects bad hyperparameter VALUES (betas outside [0, 1),
// step < 1, max_grad_norm < 0); on the GPU those are not checked, since that would mean
// reading hp on the host. Shapes, dtypes, no_decay and arity are checked as on the CPU.
//
// Bit-exactness. Every per-element f32 operation is written with the _rn intrinsics
// (__fmul_rn, __fadd_rn, __fdiv_rn, __fsqrt_rn) so that nvcc cannot fuse a multiply and an add
// into an FMA: the CPU build (x86-64 baseline, no FMA) rounds each operation, and so do we.
// param, master, m and v (adamw) and the 8-bit codes and scales (adamw8) then match the CPU
// bit for bit, given the same scalars; the scalars' double pow may differ from glibc's in the
// last double ulp, which changes the rounded f32 only in rare ties. global_norm sums squares
// in double per chunk and adds the chunk sums in chunk order: deterministic, within an f32 ulp
// of the CPU's (whose block cut and order differ).
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "cuda/backend.h"
#include "cuda/common.cuh"
#include "cuda/embed_optim.cuh"
#include "runtime/op_checks_optimizer.h"

namespace surogate::cuda {

namespace {

using namespace ::surogate::adam;  // the input layout and kQBlock (runtime/op_checks_optimizer.h)

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxItems = 256;            // descriptors per launch (the parameter block's capacity)
constexpr int64_t kNormChunk = 16384;     // global_norm: elements per chunk (one partial sum each)
constexpr int64_t kAdamChunk = 8192;      // adamw: elements per chunk
constexpr int64_t kQChunk = 16 * kQBlock; // adamw8: elements per chunk, whole quantization blocks

// Blocks that keep every SM busy; persistent blocks loop over the chunks, so that the per-block
// prologue (scalars, code tables) is paid once per block and not once per chunk.
int resident_blocks() {
  int dev = 0, sms = 132;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) !=
                                                cudaSuccess) {
    cudaGetLastError();
    sms = 132;
  }
  return sms * (2048 / kThreads);
}

// The index of the item whose chunks hold chunk c: the last i with first_chunk[i] <= c. Every
// item has at least one chunk (empty tensors are left out), so first_chunk is increasing.
template <typename Item>
__device__ __forceinline__ int find_item(const Item* items, int count, int64_t c) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (items[mid].first_chunk <= c) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// ---- global_norm ------------------------------------------------------------------------

struct NormItem {
  const void* data;
  int64_t n;
  int64_t first_chunk;  // within its launch
  int64_t dtype;        // a DType
};

struct NormBatch {
  NormItem items[kMaxItems];
  int count;
  int64_t chunks;      // chunks in this launch
  int64_t chunk_base;  // index of this launch's first chunk in the partial sums
};

__device__ __forceinline__ double to_double(float v) { return v; }
__device__ __forceinline__ double to_double(double v) { return v; }
__device__ __forceinline__ double to_double(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ double to_double(__half v) { return __half2float(v); }
__device__ __forceinline__ double to_double(__nv_fp8_e4m3 v) { return static_cast<float>(v); }
__device__ __forceinline__ double to_double(__nv_fp8_e5m2 v) { return static_cast<float>(v); }

// Sum of v over the block, in a fixed order (a warp butterfly, then the warps in order). The
// result is valid in thread 0. Ends with a barrier, so `smem` can be reused at once.
__device__ double block_sum(double v, double* smem) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) smem[threadIdx.x / 32] = v;
  __syncthreads();
  double total = 0.0;
  if (threadIdx.x == 0) {
    for (int w = 0; w < kWarps; ++w) total += smem[w];
  }
  __syncthreads();
  return total;
}

template <typename T>
__device__ double thread_sum_squares(const void* data, int64_t lo, int64_t hi) {
  const T* p = static_cast<const T*>(data);
  double acc = 0.0;
  for (int64_t i = lo + threadIdx.x; i < hi; i += kThreads) {
    const double x = to_double(p[i]);  // the square of an f32 (or narrower) is exact in double
    acc += x * x;
  }
  return acc;
}

__global__ void __launch_bounds__(kThreads) norm_partials_kernel(const __grid_constant__ NormBatch b,
                                                                 double* partials) {
  __shared__ double smem[kWarps];
  for (int64_t c = blockIdx.x; c < b.chunks; c += gridDim.x) {
    const NormItem& it = b.items[find_item(b.items, b.count, c)];
    const int64_t lo = (c - it.first_chunk) * kNormChunk, hi = min(it.n, lo + kNormChunk);
    double acc = 0.0;
    switch (static_cast<DType>(it.dtype)) {
      case DType::kF32: acc = thread_sum_squares<float>(it.data, lo, hi); break;
      case DType::kBF16: acc = thread_sum_squares<__nv_bfloat16>(it.data, lo, hi); break;
      case DType::kF16: acc = thread_sum_squares<__half>(it.data, lo, hi); break;
      case DType::kF8E4M3: acc = thread_sum_squares<__nv_fp8_e4m3>(it.data, lo, hi); break;
      case DType::kF8E5M2: acc = thread_sum_squares<__nv_fp8_e5m2>(it.data, lo, hi); break;
      case DType::kF64: acc = thread_sum_squares<double>(it.data, lo, hi); break;
      default: break;  // rejected on the host
    }
    const double total = block_sum(acc, smem);
    if (threadIdx.x == 0) partials[b.chunk_base + c] = total;
  }
}

// One block: the partials in a fixed order, then the root. n may be 0 (no input: norm 0).
__global__ void __launch_bounds__(kThreads) norm_final_kernel(const double* partials, int64_t n, float* out) {
  __shared__ double smem[kWarps];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) acc += partials[i];
  const double total = block_sum(acc, smem);
  if (threadIdx.x == 0) *out = static_cast<float>(sqrt(total));
}

Status global_norm(const OpArgs& a) {
  const Tensor& out = a.out(0);
  SG_RETURN_IF_ERROR(check_global_norm(a));
  std::vector<NormItem> items;
  int64_t chunks = 0;
  for (int i = 0; i < a.num_inputs; ++i) {
    if (!a.has_in(i)) continue;
    const Tensor& g = a.in(i);
    if (g.numel() == 0) continue;
    items.push_back(NormItem{g.data, g.numel(), 0, static_cast<int64_t>(g.dtype)});
    chunks += (g.numel() + kNormChunk - 1) / kNormChunk;
  }
  std::shared_ptr<void> scratch;
  double* partials = nullptr;
  if (chunks > 0) {
    SG_RETURN_IF_ERROR(allocate(out.device, static_cast<size_t>(chunks) * sizeof(double), &scratch));
    partials = static_cast<double*>(scratch.get());
  }
  const int max_blocks = resident_blocks();
  int64_t chunk_base = 0;
  for (size_t start = 0; start < items.size(); start += kMaxItems) {
    NormBatch b{};
    b.count = static_cast<int>(std::min<size_t>(kMaxItems, items.size() - start));
    b.chunk_base = chunk_base;
    for (int k = 0; k < b.count; ++k) {
      b.items[k] = items[start + k];
      b.items[k].first_chunk = b.chunks;
      b.chunks += (b.items[k].n + kNormChunk - 1) / kNormChunk;
    }
    norm_partials_kernel<<<static_cast<unsigned>(std::min<int64_t>(b.chunks, max_blocks)), kThreads, 0, current_stream()>>>(b, partials);
    SG_CUDA_CHECK_LAUNCH();
    chunk_base += b.chunks;
  }
  norm_final_kernel<<<1, kThreads, 0, current_stream()>>>(partials, chunks, out.ptr<float>());
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

// ---- AdamW scalars ----------------------------------------------------------------------

// cpu/optimizer.cpp's AdamScalars, plus the lerp's form and the weight-decay factor.
struct Scalars {
  float decay;          // 1 - lr*wd (1 when wd == 0); no_decay groups use 1
  float coeff;          // torch's lerp: base + coeff*(g - m), base = m when small else g
  bool small;           // |1 - beta1| < 0.5
  float beta2, c2, bc2_sqrt, eps, neg_step_size, clip;
};

// hp = [lr, beta1, beta2, eps, weight_decay, step, max_grad_norm, unused]; norm may be null.
// The same double expressions as the CPU, each rounded once to f32.
__device__ Scalars adam_scalars(const float* hp, const float* norm) {
  const double lr = hp[0], beta1 = hp[1], beta2 = hp[2], eps = hp[3], wd = hp[4], step = hp[5];
  const float max_norm = hp[6];
  Scalars s;
  s.clip = 1.0f;
  if (norm != nullptr && max_norm > 0.0f) {
    const float coef = __fdiv_rn(max_norm, __fadd_rn(*norm, 1e-6f));  // a NaN norm stays NaN
    s.clip = coef > 1.0f ? 1.0f : coef;
  }
  const float w1 = __double2float_rn(__dsub_rn(1.0, beta1));
  s.small = fabsf(w1) < 0.5f;
  s.coeff = s.small ? w1 : w1 - 1.0f;
  s.beta2 = __double2float_rn(beta2);
  s.c2 = __double2float_rn(__dsub_rn(1.0, beta2));
  s.bc2_sqrt = __double2float_rn(__dsqrt_rn(__dsub_rn(1.0, pow(beta2, step))));
  s.eps = __double2float_rn(eps);
  s.neg_step_size = __double2float_rn(-__ddiv_rn(lr, __dsub_rn(1.0, pow(beta1, step))));
  s.decay = wd != 0.0 ? __double2float_rn(__dsub_rn(1.0, __dmul_rn(lr, wd))) : 1.0f;
  return s;
}

// The new moments and weight of one element, in the CPU's operation order. w is the weight
// (master or param) after decay; m_old / v_old the moments before the step.
struct Update {
  float w, m, v, r;  // r = sqrt(v)
};

__device__ __forceinline__ Update adam_update(float g_raw, float w, float m_old, float v_old, const Scalars& s,
                                              float decay) {
  Update u;
  const float g = __fmul_rn(g_raw, s.clip);
  w = __fmul_rn(w, decay);
  u.m = __fadd_rn(s.small ? m_old : g, __fmul_rn(s.coeff, __fsub_rn(g, m_old)));
  u.v = __fadd_rn(__fmul_rn(v_old, s.beta2), __fmul_rn(__fmul_rn(s.c2, g), g));
  u.r = __fsqrt_rn(u.v);
  const float denom = __fadd_rn(__fdiv_rn(u.r, s.bc2_sqrt), s.eps);
  u.w = __fadd_rn(w, __fdiv_rn(__fmul_rn(s.neg_step_size, u.m), denom));
  return u;
}

// ---- adamw ------------------------------------------------------------------------------

struct AdamGroup {
  void* param;
  float* master;  // null: no master
  const void* grad;
  float* m;
  float* v;
  int64_t n;
  int64_t first_chunk;
  int32_t param_dtype, grad_dtype;
  int32_t decay;  // 0 for no_decay groups
};

struct AdamBatch {
  AdamGroup items[kMaxItems];
  int count;
  int64_t chunks;
  const float* hp;
  const float* norm;  // null: no clipping
};

template <typename P, typename G, bool kHasMaster>
__device__ void adamw_range(const AdamGroup& grp, int64_t lo, int64_t hi, const Scalars& s, float decay) {
  P* param = static_cast<P*>(grp.param);
  const G* grad = static_cast<const G*>(grp.grad);
  for (int64_t i = lo + threadIdx.x; i < hi; i += kThreads) {
    const float w = kHasMaster ? grp.master[i] : ld(param[i]);
    const Update u = adam_update(ld(grad[i]), w, grp.m[i], grp.v[i], s, decay);
    grp.m[i] = u.m;
    grp.v[i] = u.v;
    if constexpr (kHasMaster) grp.master[i] = u.w;
    param[i] = st<P>(u.w);
  }
}

// Run F<P, G>(...) for the group's param and grad dtypes (f32, bf16, f16; checked on the host).
#define SG_ADAM_DISPATCH(grp, F, ...)                                                             \
  switch (static_cast<DType>(grp.param_dtype)) {                                                 \
    case DType::kF32: SG_ADAM_DISPATCH_G(grp, float, F, __VA_ARGS__); break;                     \
    case DType::kBF16: SG_ADAM_DISPATCH_G(grp, __nv_bfloat16, F, __VA_ARGS__); break;            \
    case DType::kF16: SG_ADAM_DISPATCH_G(grp, __half, F, __VA_ARGS__); break;                    \
    default: break;                                                                              \
  }
#define SG_ADAM_DISPATCH_G(grp, P, F, ...)                                                        \
  switch (static_cast<DType>(grp.grad_dtype)) {                                                  \
    case DType::kF32: F<P, float>(__VA_ARGS__); break;                                           \
    case DType::kBF16: F<P, __nv_bfloat16>(__VA_ARGS__); break;                                  \
    case DType::kF16: F<P, __half>(__VA_ARGS__); break;                                          \
    default: break;                                                                              \
  }

template <typename P, typename G>
__device__ void adamw_chunk(const AdamGroup& grp, int64_t lo, int64_t hi, const Scalars& s, float decay) {
  if (grp.master != nullptr) {
    adamw_range<P, G, true>(grp, lo, hi, s, decay);
  } else {
    adamw_range<P, G, false>(grp, lo, hi, s, decay);
  }
}

__global__ void __launch_bounds__(kThreads) adamw_kernel(const __grid_constant__ AdamBatch b) {
  __shared__ Scalars sh;
  if (threadIdx.x == 0) sh = adam_scalars(b.hp, b.norm);
  __syncthreads();
  const Scalars s = sh;
  for (int64_t c = blockIdx.x; c < b.chunks; c += gridDim.x) {
    const AdamGroup& grp = b.items[find_item(b.items, b.count, c)];
    const int64_t lo = (c - grp.first_chunk) * kAdamChunk, hi = min(grp.n, lo + kAdamChunk);
    const float decay = grp.decay ? s.decay : 1.0f;
    SG_ADAM_DISPATCH(grp, adamw_chunk, grp, lo, hi, s, decay);
  }
}

// ---- host side shared by adamw and adamw8 -----------------------------------------------

// Launch `kernel` over `groups` in batches of kMaxItems, chunk = elements per chunk.
template <typename Group, typename Batch>
Status launch_batches(const std::vector<Group>& groups, int64_t chunk, const OpArgs& a,
                      void (*kernel)(const Batch)) {
  const int max_blocks = resident_blocks();
  for (size_t start = 0; start < groups.size(); start += kMaxItems) {
    Batch b{};
    b.count = static_cast<int>(std::min<size_t>(kMaxItems, groups.size() - start));
    b.hp = a.in(0).ptr<const float>();
    b.norm = a.has_in(1) ? a.in(1).ptr<const float>() : nullptr;
    for (int k = 0; k < b.count; ++k) {
      b.items[k] = groups[start + k];
      b.items[k].first_chunk = b.chunks;
      b.chunks += (b.items[k].n + chunk - 1) / chunk;
    }
    kernel<<<static_cast<unsigned>(std::min<int64_t>(b.chunks, max_blocks)), kThreads, 0, current_stream()>>>(b);
    SG_CUDA_CHECK_LAUNCH();
  }
  return Status::OK();
}

Status adamw(const OpArgs& a) {
  AdamwArgs r;
  SG_RETURN_IF_ERROR(check_adamw(a, &r));
  const std::vector<char>& decays = r.decay;
  std::vector<AdamGroup> groups;
  for (int g = 0; g < r.n_groups; ++g) {
    const Tensor* t = &a.in(2 + kGroup * g);
    if (t[kParam].numel() == 0) continue;
    groups.push_back(AdamGroup{t[kParam].data, t[kMaster].ptr<float>(), t[kGrad].data, t[kM].ptr<float>(),
                               t[kV].ptr<float>(), t[kParam].numel(), 0, static_cast<int32_t>(t[kParam].dtype),
                               static_cast<int32_t>(t[kGrad].dtype), decays[g]});
  }
  return launch_batches<AdamGroup, AdamBatch>(groups, kAdamChunk, a, adamw_kernel);
}

// ---- adamw8 -----------------------------------------------------------------------------

// The cubic power-law codes of cpu/optimizer.cpp, built per block in shared memory with the
// same double arithmetic (the _rn intrinsics keep nvcc from fusing (a + b) / 2's operands).
struct CodeTables {
  float m_value[256];  // signed: byte s<<7 | k is (-1)^s (k / 127)^3
  float m_mid[127];    // between signed magnitudes k and k + 1
  float v_value[256];  // unsigned: byte k is (k / 255)^3
  float v_mid[255];
};

__device__ __forceinline__ double cube_level(int k, double top) {
  const double q = __ddiv_rn(static_cast<double>(k), top);
  return __dmul_rn(__dmul_rn(q, q), q);
}

__device__ void build_tables(CodeTables* t) {
  for (int b = threadIdx.x; b < 256; b += kThreads) {
    const double m = cube_level(b & 127, 127.0);
    t->m_value[b] = __double2float_rn((b & 128) ? -m : m);
    t->v_value[b] = __double2float_rn(cube_level(b, 255.0));
    if (b < 127) t->m_mid[b] = __double2float_rn(__ddiv_rn(__dadd_rn(m, cube_level(b + 1, 127.0)), 2.0));
    if (b < 255) {
      t->v_mid[b] = __double2float_rn(__ddiv_rn(__dadd_rn(cube_level(b, 255.0), cube_level(b + 1, 255.0)), 2.0));
    }
  }
}

// The nearest magnitude index to a >= 0: the number of midpoints below a (ties to the lower
// index; a NaN gives 0). The CPU's binary search, step for step.
__device__ __forceinline__ int nearest_level(const float* mid, int levels, float a) {
  int lo = 0, hi = levels - 1;
  while (lo < hi) {
    const int m = (lo + hi) >> 1;
    if (mid[m] < a) lo = m + 1; else hi = m;
  }
  return lo;
}

__device__ __forceinline__ float max_keep(float acc, float x) { return acc < x ? x : acc; }  // std::max(acc, x)


struct Adam8Group {
  void* param;
  float* master;
  const void* grad;
  uint8_t* mq;
  float* ms;
  uint8_t* vq;
  float* vs;
  int64_t n;
  int64_t first_chunk;
  int32_t param_dtype, grad_dtype;
  int32_t decay;
};

struct Adam8Batch {
  Adam8Group items[kMaxItems];
  int count;
  int64_t chunks;
  const float* hp;
  const float* norm;
};

constexpr int kPerLane = kQBlock / 32;

// One quantization block [b0, b0 + n), n <= 256, by one warp: lane l takes elements l + 32k.
// Dequantize, update, store the weights, then requantize with the block's new absmax.
template <typename P, typename G, bool kHasMaster>
__device__ void adamw8_qblock(const Adam8Group& grp, int64_t b0, int64_t n, const Scalars& s, float decay,
                              const CodeTables& t) {
  const int lane = threadIdx.x % 32;
  const int64_t qb = b0 / kQBlock;
  P* param = static_cast<P*>(grp.param);
  const G* grad = static_cast<const G*>(grp.grad);
  const float m_scale = grp.ms[qb], v_scale = grp.vs[qb];
  float m[kPerLane], r[kPerLane];
  float m_max = 0.0f, r_max = 0.0f;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int64_t j = lane + 32 * k;
    m[k] = 0.0f;
    r[k] = 0.0f;
    if (j >= n) continue;
    const int64_t i = b0 + j;
    const float m_old = __fmul_rn(t.m_value[grp.mq[i]], m_scale);
    const float r_old = __fmul_rn(t.v_value[grp.vq[i]], v_scale);
    const float w = kHasMaster ? grp.master[i] : ld(param[i]);
    const Update u = adam_update(ld(grad[i]), w, m_old, __fmul_rn(r_old, r_old), s, decay);
    m[k] = u.m;
    r[k] = u.r;
    m_max = max_keep(m_max, fabsf(u.m));  // a NaN is skipped, as std::max skips it on the CPU
    r_max = max_keep(r_max, u.r);
    if constexpr (kHasMaster) grp.master[i] = u.w;
    param[i] = st<P>(u.w);
  }
  // The maxima hold no NaN, so the order of this reduction does not change them.
  for (int o = 16; o > 0; o >>= 1) {
    m_max = max_keep(m_max, __shfl_xor_sync(0xffffffffu, m_max, o));
    r_max = max_keep(r_max, __shfl_xor_sync(0xffffffffu, r_max, o));
  }
  __syncwarp();  // every lane has read the old scales before lane 0 overwrites them
  if (lane == 0) {
    grp.ms[qb] = m_max;
    grp.vs[qb] = r_max;
  }
  const float m_inv = m_max > 0.0f ? __fdiv_rn(1.0f, m_max) : 0.0f;
  const float r_inv = r_max > 0.0f ? __fdiv_rn(1.0f, r_max) : 0.0f;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int64_t j = lane + 32 * k;
    if (j >= n) continue;
    const int64_t i = b0 + j;
    uint8_t mq = 0;
    if (m_max > 0.0f) {
      const float x = __fmul_rn(m[k], m_inv);
      const int lv = nearest_level(t.m_mid, 128, fabsf(x));
      mq = static_cast<uint8_t>(lv == 0 ? 0 : (x < 0.0f ? 128 | lv : lv));
    }
    int vq = r_max > 0.0f ? nearest_level(t.v_mid, 256, __fmul_rn(r[k], r_inv)) : 0;
    if (vq == 0 && r[k] > 0.0f) vq = 1;  // a positive sqrt(v) never rounds to 0
    grp.mq[i] = mq;
    grp.vq[i] = static_cast<uint8_t>(vq);
  }
}

template <typename P, typename G>
__device__ void adamw8_chunk(const Adam8Group& grp, int64_t lo, int64_t hi, const Scalars& s, float decay,
                             const CodeTables& t) {
  for (int64_t b0 = lo + int64_t(threadIdx.x / 32) * kQBlock; b0 < hi; b0 += kWarps * kQBlock) {
    const int64_t n = min(kQBlock, hi - b0);
    if (grp.master != nullptr) {
      adamw8_qblock<P, G, true>(grp, b0, n, s, decay, t);
    } else {
      adamw8_qblock<P, G, false>(grp, b0, n, s, decay, t);
    }
  }
}

__global__ void __launch_bounds__(kThreads) adamw8_kernel(const __grid_constant__ Adam8Batch b) {
  __shared__ Scalars sh;
  __shared__ CodeTables tables;
  if (threadIdx.x == 0) sh = adam_scalars(b.hp, b.norm);
  build_tables(&tables);
  __syncthreads();
  const Scalars s = sh;
  for (int64_t c = blockIdx.x; c < b.chunks; c += gridDim.x) {
    const Adam8Group& grp = b.items[find_item(b.items, b.count, c)];
    const int64_t lo = (c - grp.first_chunk) * kQChunk, hi = min(grp.n, lo + kQChunk);
    const float decay = grp.decay ? s.decay : 1.0f;
    SG_ADAM_DISPATCH(grp, adamw8_chunk, grp, lo, hi, s, decay, tables);
  }
}

Status adamw8(const OpArgs& a) {
  AdamwArgs r;
  SG_RETURN_IF_ERROR(check_adamw8(a, &r));
  const std::vector<char>& decays = r.decay;
  std::vector<Adam8Group> groups;
  for (int g = 0; g < r.n_groups; ++g) {
    const Tensor* t = &a.in(2 + kGroup8 * g);
    if (t[kP8].numel() == 0) continue;
    groups.push_back(Adam8Group{t[kP8].data, t[kMaster8].ptr<float>(), t[kGrad8].data, t[kMQ].ptr<uint8_t>(),
                                t[kMScale].ptr<float>(), t[kVQ].ptr<uint8_t>(), t[kVScale].ptr<float>(),
                                t[kP8].numel(), 0, static_cast<int32_t>(t[kP8].dtype),
                                static_cast<int32_t>(t[kGrad8].dtype), decays[g]});
  }
  return launch_batches<Adam8Group, Adam8Batch>(groups, kQChunk, a, adamw8_kernel);
}

}  // namespace

void register_cuda_optimizer(OpRegistry& reg) {
  // Deterministic; one multi-tensor kernel per optimizer, hp and norm read on the device (values not
  // validated); the 8-bit states are the CPU's bit for bit.
  add_op(reg, "global_norm", global_norm);
  add_op(reg, "adamw", adamw);
  add_op(reg, "adamw8", adamw8);
}

}  // namespace surogate::cuda
