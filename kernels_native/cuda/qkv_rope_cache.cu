// qkv_rope_cache on CUDA, the twin of cpu/qkv_rope_cache.cpp (the contract is written down there):
// RoPE on q and k (after the per-head RMSNorm when the norm weights are given), k and v into the
// paged KV cache at their slots, q returned. One launch for what a serving step did in three
// (qk_norm_rope_fwd or rope_fwd on q and on k, then kv_cache_write).
//
// Kernel. A head task is (token, head) of q, k or v (v's a copy), held by a group of G lanes (a
// power of two, the fewest that cover the head with one 16-byte pack per lane, two for heads
// past 32 packs (f32 D = 512, or D = 512 with a partial rotary dim), four for f32 D = 512 with a
// partial rotary dim, or kScalarUnits single
// elements per lane off the packs). Lane g of a group owns units i = u G + g of V elements:
// dims i V + [0, V), their rotation partners half + i V + [0, V) and the pass-through dims
// R + i V + [0, V), so a pair's rotation needs no other lane; a sum over the group (shuffles
// inside it) gives rstd. A CTA (at most kMaxThreads) runs one group per task, no loops: all the
// tasks of TT tokens when a token's tasks fit (TT > 1 for small heads: fewer, fuller CTAs at large
// N), else one token's tasks split over `chunks` CTAs (at N = 1 the loads spread over several SMs).
// Each thread first issues its loads, none of which waits on anything computed (its head, its
// token's slot, a position, a unit of the norm weights, which wait in shared memory as f32); the
// CTA computes each (token, frequency) pair of its tokens once into shared memory (f64 sincos of
// the f32 angle, rounded like the CPU: cuda/rope.cuh) while the loads are in flight; one barrier,
// then every group ropes its head from there.
// The f64 sincos stays (rather than f32 sin / cos of the angle reduced in f64): done once per pair
// it is ~20 double ops of one thread, ~150 cycles at N = 1, and cos / sin keep the CPU's bits,
// where an f32 sin / cos moves the bf16 / f16 rounding of a few values by an ulp (an output then
// moves by that ulp times |x|, beyond the tests' tolerance when the rotation cancels).
//
// As kv_cache_write on CUDA, the host never reads a device tensor (a decode step is captured in a
// CUDA graph): positions and slots stay on the GPU, a slot outside the cache skips the token's
// k and v like -1 (its q is still computed), duplicate slots leave the writers' rows mixed.
//
// Past 400 lines because the op is one file, as ggml's: the kernel and its launch shape (the
// argument checks and rope attrs are runtime/op_checks.h's, shared with the CPU).
#include <algorithm>
#include <climits>

#include "cuda/backend.h"
#include "cuda/norm_rope_act.cuh"
#include "cuda/rope.cuh"
#include "runtime/op_checks.h"

namespace surogate::cuda::nra {

namespace {

constexpr const char* kOp = "qkv_rope_cache";
constexpr int kMaxThreads = 256;  // per CTA
constexpr int kMinBlocks = 4;     // CTAs per SM the registers must allow (<= 64 a thread)
constexpr int kScalarUnits = 8;   // units per lane on the single-element path: half, D - R <= 256

struct QkvArgs {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* wq = nullptr;  // nullptr (and wk): rope only
  const void* wk = nullptr;
  const int32_t* pos = nullptr;
  const int32_t* slots = nullptr;
  void* q_out = nullptr;
  void* kc = nullptr;
  void* vc = nullptr;
  int64_t q_row = 0, k_row = 0, v_row = 0;  // token row strides, in elements
  int64_t N = 0, n_slots = 0;
  int Hq = 0, Hkv = 0, D = 0, half = 0;
  int g_shift = 0;  // G = 1 << g_shift lanes per head task
  int TT = 1;       // tokens per CTA
  int TC = 1;       // head tasks per CTA and token (all of them when chunks == 1)
  int chunks = 1;   // CTAs per token (TT == 1 when > 1)
  float eps = 0.0f, af = 1.0f;
  float offset = 0.0f;  // weight_offset: the norms multiply by (w + offset) (Gemma's 1)
};

// A head in registers. Lane g of its group holds units i = u G + g (u < K) of V elements:
// a[u] = dims i V + [0, V), b[u] = their rotation partners half + i V + [0, V), c[u] = R + i V + [0, V).
template <typename T, int V, int K>
struct HeadRegs {
  Pack<T, V> a[K], b[K], c[K];
};

// A row as units of V elements. Indexing units (rather than packs at y + half + e) keeps the
// 16-byte stores: with the element offsets the compiler split some stores into 2- and 4-byte ones.
template <typename T, int V>
__device__ __forceinline__ const Pack<T, V>* units(const T* x) { return reinterpret_cast<const Pack<T, V>*>(x); }
template <typename T, int V>
__device__ __forceinline__ Pack<T, V>* units(T* y) { return reinterpret_cast<Pack<T, V>*>(y); }

// hv, dv: half and D in units (half % V == 0 and D % V == 0 on the pack path).
template <typename T, int V, int K>
__device__ __forceinline__ void load_head(const T* x, int hv, int dv, int g, int G, HeadRegs<T, V, K>& h) {
  const Pack<T, V>* xu = units<T, V>(x);
#pragma unroll
  for (int u = 0; u < K; ++u) {
    const int i = u * G + g;
    if (i < hv) {
      h.a[u] = xu[i];
      h.b[u] = xu[hv + i];
    }
    if (2 * hv + i < dv) h.c[u] = xu[2 * hv + i];
  }
}

template <typename T, int V, int K>
__device__ __forceinline__ void store_head(T* y, int hv, int dv, int g, int G, const HeadRegs<T, V, K>& h) {
  Pack<T, V>* yu = units<T, V>(y);
#pragma unroll
  for (int u = 0; u < K; ++u) {
    const int i = u * G + g;
    if (i < hv) {
      yu[i] = h.a[u];
      yu[hv + i] = h.b[u];
    }
    if (2 * hv + i < dv) yu[2 * hv + i] = h.c[u];
  }
}

// rstd = 1 / sqrt(sum x^2 / D + eps) of the group's head. Every lane of the warp calls it (G is
// the same for all, so the shuffles line up); the xor offsets stay inside a G-lane group.
template <typename T, int V, int K>
__device__ __forceinline__ float head_rstd(const HeadRegs<T, V, K>& h, float eps, int hv, int dv, int g, int G) {
  float ss = 0.0f;
#pragma unroll
  for (int u = 0; u < K; ++u) {
    const int i = u * G + g;
    if (i < hv) {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float xa = ld(h.a[u].v[j]), xb = ld(h.b[u].v[j]);
        ss += xa * xa + xb * xb;
      }
    }
    if (2 * hv + i < dv) {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float xc = ld(h.c[u].v[j]);
        ss += xc * xc;
      }
    }
  }
  for (int o = G >> 1; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  return 1.0f / sqrtf(ss / static_cast<float>(dv * V) + eps);
}

// V floats of shared memory; 16-byte loads when V allows (s is then 16-byte aligned: see the kernel).
template <int V>
__device__ __forceinline__ void load_floats(const float* s, float (&o)[V]) {
  if constexpr (V % 4 == 0) {
#pragma unroll
    for (int j = 0; j < V; j += 4) {
      const float4 t = *reinterpret_cast<const float4*>(s + j);
      o[j] = t.x;
      o[j + 1] = t.y;
      o[j + 2] = t.z;
      o[j + 3] = t.w;
    }
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) o[j] = s[j];
  }
}

// y = rope(x), or with NORM y = rope(T(w T(x r))), r = rstd: the rope ops' formulas and roundings
// (cpu/rope.cpp). cs = the token's cos [half] then sin [half]; w = the norm weight [D] in f32 (both
// in shared memory, 16-byte aligned on the pack path), the weight offset already added; one_round
// (a weight offset was given, Gemma3RMSNorm): y = rope(T(x r w)) with one rounding.
template <typename T, int V, int K, bool NORM>
__device__ __forceinline__ void rope_head(const HeadRegs<T, V, K>& h, const float* w, float r, const float* cs,
                                          int hv, int dv, int g, int G, T* y, bool one_round) {
  constexpr int C = V % 4 == 0 ? 4 : 1;
  const int half = hv * V, R = 2 * half;
  Pack<T, V>* yu = units<T, V>(y);
#pragma unroll
  for (int u = 0; u < K; ++u) {
    const int i = u * G + g, e = i * V;
    if (i < hv) {
      Pack<T, V> ya, yb;
#pragma unroll
      for (int j0 = 0; j0 < V; j0 += C) {  // C at a time: fewer live registers than all V
        float c[C], sn[C], wa[C], wb[C];
        load_floats<C>(cs + e + j0, c);
        load_floats<C>(cs + half + e + j0, sn);
        if constexpr (NORM) {
          load_floats<C>(w + e + j0, wa);
          load_floats<C>(w + half + e + j0, wb);
        }
#pragma unroll
        for (int j = 0; j < C; ++j) {
          float xa = ld(h.a[u].v[j0 + j]), xb = ld(h.b[u].v[j0 + j]);
          if constexpr (NORM) {
            xa = one_round ? rnd<T>(xa * r * wa[j]) : rnd<T>(rnd<T>(xa * r) * wa[j]);
            xb = one_round ? rnd<T>(xb * r * wb[j]) : rnd<T>(rnd<T>(xb * r) * wb[j]);
          }
          rotate<T>(xa, xb, c[j], sn[j], &ya.v[j0 + j], &yb.v[j0 + j]);
        }
      }
      yu[i] = ya;
      yu[hv + i] = yb;
    }
    if (2 * hv + i < dv) {
      if constexpr (NORM) {
        Pack<T, V> yc;
#pragma unroll
        for (int j0 = 0; j0 < V; j0 += C) {
          float wc[C];
          load_floats<C>(w + R + e + j0, wc);
#pragma unroll
          for (int j = 0; j < C; ++j) {
            const float xc = ld(h.c[u].v[j0 + j]);
            yc.v[j0 + j] = st<T>(one_round ? xc * r * wc[j] : rnd<T>(xc * r) * wc[j]);
          }
        }
        yu[2 * hv + i] = yc;
      } else {
        yu[2 * hv + i] = h.c[u];
      }
    }
  }
}

template <typename T, int V, int K, bool NORM>
__global__ void __launch_bounds__(kMaxThreads, kMinBlocks) qkv_rope_cache_kernel(const QkvArgs p, const InvFreq inv) {
  extern __shared__ float4 smem4[];
  const int half = p.half, D = p.D, Hq = p.Hq, Hkv = p.Hkv;
  float* cs = reinterpret_cast<float*>(smem4);  // [TT, 2 half]: cos, sin of the CTA's tokens
  float* ws = cs + p.TT * 2 * half;             // [2 D]: q_norm, k_norm in f32 (with the norm)
  const int hv = half / V, dv = D / V;  // in units
  const int G = 1 << p.g_shift, g = threadIdx.x & (G - 1), item = threadIdx.x >> p.g_shift;
  const int64_t tile = blockIdx.x / p.chunks;
  const int chunk = static_cast<int>(blockIdx.x - tile * p.chunks);
  const int tt = item / p.TC, task = chunk * p.TC + (item - tt * p.TC);
  const int64_t n0 = tile * p.TT, n = n0 + tt;
  const bool active = tt < p.TT && n < p.N && task < Hq + 2 * Hkv;

  // Loads first: none waits on anything computed.
  HeadRegs<T, V, K> h{};
  int32_t slot = -1;
  if (active) {
    const T* src = task < Hq         ? static_cast<const T*>(p.q) + n * p.q_row + static_cast<int64_t>(task) * D
                   : task < Hq + Hkv ? static_cast<const T*>(p.k) + n * p.k_row + static_cast<int64_t>(task - Hq) * D
                                     : static_cast<const T*>(p.v) + n * p.v_row +
                                           static_cast<int64_t>(task - Hq - Hkv) * D;
    load_head(src, hv, dv, g, G, h);
    if (task >= Hq) slot = p.slots[n];
  }
  // The thread's first position (the cos / sin below wait on it) before the norm weights, whose
  // store into shared memory waits on their load: both latencies overlap.
  const int pairs = p.TT * half;
  const int t0 = static_cast<int>(threadIdx.x) / half;
  const int32_t pos0 = static_cast<int>(threadIdx.x) < pairs && n0 + t0 < p.N ? p.pos[n0 + t0] : 0;
  if constexpr (NORM) {
    const T* wq = static_cast<const T*>(p.wq);
    const T* wk = static_cast<const T*>(p.wk);
    for (int u = threadIdx.x; u < 2 * dv; u += blockDim.x) {
      const Pack<T, V> x = u < dv ? units<T, V>(wq)[u] : units<T, V>(wk)[u - dv];
#pragma unroll
      for (int j = 0; j < V; ++j) ws[u * V + j] = ld(x.v[j]) + p.offset;
    }
  }
  // Each (token, frequency) pair of the CTA once. inv.f[i] with a per-thread i replays on the
  // constant cache, once per pair, off the critical path (the loads above are slower).
  for (int j = threadIdx.x; j < pairs; j += blockDim.x) {
    const int t = j / half, i = j - t * half;
    if (n0 + t >= p.N) break;  // the last tile's missing tokens (t grows with j)
    const int32_t pn = j == static_cast<int>(threadIdx.x) ? pos0 : p.pos[n0 + t];
    cos_sin<T>(inv.f[i], pn, p.af, cs + t * 2 * half + i, cs + t * 2 * half + half + i);
  }
  __syncthreads();

  float r = 1.0f;
  if constexpr (NORM) r = head_rstd(h, p.eps, hv, dv, g, G);  // the whole warp: before any lane leaves
  if (!active) return;
  // 16-byte aligned on the pack path: 2 half, half and e are multiples of V >= 4 floats.
  const float* c = cs + tt * 2 * half;
  if (task < Hq) {
    rope_head<T, V, K, NORM>(h, ws, r, c, hv, dv, g, G, static_cast<T*>(p.q_out) + (n * Hq + task) * D,
                             p.offset != 0.0f);
    return;
  }
  if (slot < 0 || slot >= p.n_slots) return;  // -1: padding; anything else outside: not ours to write
  const int64_t row = static_cast<int64_t>(slot) * Hkv;
  if (task < Hq + Hkv) {
    rope_head<T, V, K, NORM>(h, ws + D, r, c, hv, dv, g, G, static_cast<T*>(p.kc) + (row + (task - Hq)) * D,
                             p.offset != 0.0f);
  } else {
    store_head(static_cast<T*>(p.vc) + (row + (task - Hq - Hkv)) * D, hv, dv, g, G, h);
  }
}

// The CTA shape for heads of `units` units (the larger of half and D - R, in units) held K per
// lane: G, then TT tokens of all tasks, or one token's tasks over `chunks` CTAs.
struct Plan {
  int threads = 0;
  unsigned blocks = 0;
  size_t smem = 0;
};

template <int K>
Status plan(int64_t units, QkvArgs* p, Plan* out) {
  p->g_shift = 0;
  while ((static_cast<int64_t>(K) << p->g_shift) < units) ++p->g_shift;  // G <= 32: the callers' checks
  const int64_t G = int64_t{1} << p->g_shift, all_tasks = p->Hq + 2 * static_cast<int64_t>(p->Hkv);
  const int64_t per_token = all_tasks * G;
  if (per_token <= kMaxThreads) {
    p->chunks = 1;
    p->TC = static_cast<int>(all_tasks);
    p->TT = static_cast<int>(std::min<int64_t>(p->N, kMaxThreads / per_token));
  } else {  // balanced chunks: TC <= kMaxThreads / G
    const int64_t chunks = (per_token + kMaxThreads - 1) / kMaxThreads;
    p->chunks = static_cast<int>(chunks);
    p->TC = static_cast<int>((all_tasks + chunks - 1) / chunks);
    p->TT = 1;
  }
  const int64_t blocks = (p->N + p->TT - 1) / p->TT * p->chunks;
  SG_CHECK(blocks <= INT_MAX, StatusCode::kUnsupported,
           str_cat(kOp, ": ", p->N, " tokens of ", all_tasks, " heads need ", blocks, " CTAs, above the grid's limit"),
           "run this op on the CPU or in smaller steps");
  out->threads = static_cast<int>((p->TT * p->TC * G + 31) / 32 * 32);
  out->blocks = static_cast<unsigned>(blocks);
  out->smem = (static_cast<size_t>(p->TT) * 2 * p->half + (p->wq != nullptr ? 2 * p->D : 0)) * sizeof(float);
  return Status::OK();
}

template <typename T, int V, int K>
Status launch(QkvArgs p, const InvFreq& inv) {
  Plan pl;
  SG_RETURN_IF_ERROR(plan<K>(std::max(p.half / V, p.D / V - 2 * (p.half / V)), &p, &pl));
  if (p.wq != nullptr) {
    qkv_rope_cache_kernel<T, V, K, true><<<pl.blocks, pl.threads, pl.smem, current_stream()>>>(p, inv);
  } else {
    qkv_rope_cache_kernel<T, V, K, false><<<pl.blocks, pl.threads, pl.smem, current_stream()>>>(p, inv);
  }
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

Status qkv_rope_cache(const OpArgs& a) {
  const char* op = kOp;
  QkvRopeCacheDims dims;
  SG_RETURN_IF_ERROR(check_qkv_rope_cache(a, &dims));
  const Tensor& q = a.in(0);
  const Tensor& k = a.in(1);
  const Tensor& v = a.in(2);
  const Tensor& pos = a.in(3);
  const Tensor& sm = a.in(4);
  const Tensor& qo = a.out(0);
  const Tensor& kc = a.out(1);
  const Tensor& vc = a.out(2);
  const int64_t N = dims.N, Hq = dims.Hq, D = dims.D, Hkv = dims.Hkv;
  const int64_t q_row = dims.q_row, k_row = dims.k_row, v_row = dims.v_row;
  const bool norm = dims.norm;
  RopeConfig cfg;
  SG_RETURN_IF_ERROR(device_rope(op, dims.rope, &cfg));
  SG_CHECK(Hq + 2 * Hkv <= (1 << 24), StatusCode::kUnsupported,
           str_cat(op, ": ", Hq, " + 2 x ", Hkv, " heads is above the CUDA kernel's limit"), "run this op on the CPU");
  const int64_t R = cfg.rotary_dim, half = R / 2;
  const int64_t all_tasks = Hq + 2 * Hkv;
  if (N == 0 || all_tasks == 0) return Status::OK();

  QkvArgs p;
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.wq = norm ? a.in(5).data : nullptr;
  p.wk = norm ? a.in(6).data : nullptr;
  p.pos = pos.ptr<int32_t>();
  p.slots = sm.ptr<int32_t>();
  p.q_out = qo.data;
  p.kc = kc.data;
  p.vc = vc.data;
  p.q_row = q_row;
  p.k_row = k_row;
  p.v_row = v_row;
  p.N = N;
  p.n_slots = kc.shape[0] * kc.shape[1];
  p.Hq = static_cast<int>(Hq);
  p.Hkv = static_cast<int>(Hkv);
  p.D = static_cast<int>(D);
  p.half = static_cast<int>(half);
  p.eps = dims.eps;
  p.offset = static_cast<float>(a.attr().get_float("weight_offset", 0.0));
  p.af = cfg.attention_factor;
  bool aligned = true;
  for (const void* ptr : {p.q, p.k, p.v, p.wq, p.wk, static_cast<const void*>(p.q_out),
                          static_cast<const void*>(p.kc), static_cast<const void*>(p.vc)}) {
    aligned = aligned && aligned16(ptr);
  }
  SG_CUDA_DISPATCH_FLOAT(op, q.dtype, T, {
    constexpr int V = static_cast<int>(16 / sizeof(T));
    const bool packs = aligned && q_row % V == 0 && k_row % V == 0 && v_row % V == 0 && D % V == 0 &&
                       half % V == 0;
    if (packs && half <= 32 * V && D - R <= 32 * V) return launch<T, V, 1>(p, cfg.inv);
    // Two packs a lane: f32 heads of 512 (half 256), a partial rotary dim of a 512-wide head.
    if (packs && half <= 64 * V && D - R <= 64 * V) return launch<T, V, 2>(p, cfg.inv);
    // Four: an f32 head of 512 with a partial rotary dim (D - R up to 512 floats = 128 packs).
    if constexpr (V == 4) {
      if (packs && half <= 128 * V && D - R <= 128 * V) return launch<T, V, 4>(p, cfg.inv);
    }
    SG_CHECK(half <= 32 * kScalarUnits && D - R <= 32 * kScalarUnits, StatusCode::kUnsupported,
             str_cat(op, ": head dim ", D, " (rotary_dim ", R, ") is above what the CUDA kernel holds in registers "
                     "without 16-byte packs (", 64 * kScalarUnits, ")"),
             "run this op on the CPU");
    return launch<T, 1, kScalarUnits>(p, cfg.inv);
  });
  return Status::OK();
}

}  // namespace

}  // namespace surogate::cuda::nra

namespace surogate::cuda {

void register_cuda_qkv_rope_cache(OpRegistry& reg) {
  add_op(reg, "qkv_rope_cache", nra::qkv_rope_cache);
}

}  // namespace surogate::cuda
