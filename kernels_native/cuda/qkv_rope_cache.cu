// qkv_rope_cache on CUDA, the twin of cpu/qkv_rope_cache.cpp (the contract is written down there):
// RoPE on q and k (after the per-head RMSNorm when the norm weights are given), k and v into the
// paged KV cache at their slots, q returned. One launch for what a serving step did in three
// (qk_norm_rope_fwd or rope_fwd on q and on k, then kv_cache_write).
//
// Kernel. One CTA per token (a grid-stride loop past kMaxGrid tokens) and one warp per head task:
// tasks [0, Hq) are q's heads, [Hq, Hq + Hkv) k's, [Hq + Hkv, Hq + 2 Hkv) v's (a copy); up to
// kMaxWarps warps take them in turn. A warp holds its head in registers: lane l owns units
// i = u * 32 + l of V elements (16-byte packs when every address and row stride allows, else
// single elements): dims i V + [0, V), their rotation partners half + i V + [0, V) and the
// pass-through dims R + i V + [0, V), so a pair's rotation needs no other lane; a warp sum gives
// rstd. The first task's loads are issued before the token's cos / sin (computed once per CTA
// into shared memory as the rope ops do: f64 sincos of the f32 angle, rounded like the CPU) so
// that their latency overlaps; the norm weights wait in shared memory as f32.
//
// As kv_cache_write on CUDA, the host never reads a device tensor (a decode step is captured in a
// CUDA graph): positions and slots stay on the GPU, a slot outside the cache skips the token's
// k and v like -1 (its q is still computed), duplicate slots leave the writers' rows mixed.
#include <algorithm>

#include "cuda/backend.h"
#include "cuda/norm_rope_act.cuh"
#include "cuda/rope.cuh"

namespace surogate::cuda::nra {

namespace {

constexpr const char* kOp = "qkv_rope_cache";
constexpr int kMaxWarps = 32;
constexpr int kMaxThreads = 32 * kMaxWarps;
constexpr int64_t kMaxGrid = 1 << 20;  // tokens per launch before CTAs loop
constexpr int kScalarUnits = 8;        // units per lane on the single-element path: half, D - R <= 256

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
  float eps = 0.0f, af = 1.0f;
};

// A head in registers. Lane l holds units i = u * 32 + l (u < K) of V elements: a[u] = dims
// i V + [0, V), b[u] = their rotation partners half + i V + [0, V), c[u] = R + i V + [0, V).
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
__device__ __forceinline__ void load_head(const T* x, int hv, int dv, int lane, HeadRegs<T, V, K>& h) {
  const Pack<T, V>* xu = units<T, V>(x);
#pragma unroll
  for (int u = 0; u < K; ++u) {
    const int i = u * 32 + lane;
    if (i < hv) {
      h.a[u] = xu[i];
      h.b[u] = xu[hv + i];
    }
    if (2 * hv + i < dv) h.c[u] = xu[2 * hv + i];
  }
}

template <typename T, int V, int K>
__device__ __forceinline__ void store_head(T* y, int hv, int dv, int lane, const HeadRegs<T, V, K>& h) {
  Pack<T, V>* yu = units<T, V>(y);
#pragma unroll
  for (int u = 0; u < K; ++u) {
    const int i = u * 32 + lane;
    if (i < hv) {
      yu[i] = h.a[u];
      yu[hv + i] = h.b[u];
    }
    if (2 * hv + i < dv) yu[2 * hv + i] = h.c[u];
  }
}

// y = rope(x), or with NORM y = rope(T(w T(x rstd))), rstd = 1 / sqrt(sum x^2 / D + eps), w in f32
// (shared memory): the rope ops' formulas and roundings (cpu/rope.cpp). The whole warp calls it.
template <typename T, int V, int K, bool NORM>
__device__ __forceinline__ void rope_head(const HeadRegs<T, V, K>& h, const float* w, float eps, const float* cs,
                                          int hv, int dv, int lane, T* y) {
  const int half = hv * V, R = 2 * half;
  Pack<T, V>* yu = units<T, V>(y);
  float r = 1.0f;
  if constexpr (NORM) {
    float ss = 0.0f;
#pragma unroll
    for (int u = 0; u < K; ++u) {
      const int i = u * 32 + lane;
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
    r = 1.0f / sqrtf(warp_sum(ss) / static_cast<float>(dv * V) + eps);
  }
#pragma unroll
  for (int u = 0; u < K; ++u) {
    const int i = u * 32 + lane, e = i * V;
    if (i < hv) {
      Pack<T, V> ya, yb;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        float xa = ld(h.a[u].v[j]), xb = ld(h.b[u].v[j]);
        if constexpr (NORM) {
          xa = rnd<T>(rnd<T>(xa * r) * w[e + j]);
          xb = rnd<T>(rnd<T>(xb * r) * w[half + e + j]);
        }
        T o1, o2;
        rotate<T>(xa, xb, cs[e + j], cs[half + e + j], &o1, &o2);
        ya.v[j] = o1;
        yb.v[j] = o2;
      }
      yu[i] = ya;
      yu[hv + i] = yb;
    }
    if (2 * hv + i < dv) {
      if constexpr (NORM) {
        Pack<T, V> yc;
#pragma unroll
        for (int j = 0; j < V; ++j) yc.v[j] = st<T>(rnd<T>(ld(h.c[u].v[j]) * r) * w[R + e + j]);
        yu[2 * hv + i] = yc;
      } else {
        yu[2 * hv + i] = h.c[u];
      }
    }
  }
}

template <typename T, int V, int K, bool NORM>
__global__ void __launch_bounds__(kMaxThreads) qkv_rope_cache_kernel(const QkvArgs p, const InvFreq inv) {
  extern __shared__ float smem[];
  const int half = p.half, D = p.D, Hq = p.Hq, Hkv = p.Hkv;
  const int hv = half / V, dv = D / V;  // in units
  float* fr = smem;             // [half] inv_freq
  float* cs = smem + half;      // [2 half] cos, sin of the current token
  float* wq = smem + 3 * half;  // [D] q_norm in f32 (with the norm)
  float* wk = wq + D;           // [D] k_norm
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  T* q_out = static_cast<T*>(p.q_out);
  T* kc = static_cast<T*>(p.kc);
  T* vc = static_cast<T*>(p.vc);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int all_tasks = Hq + 2 * Hkv;
  load_inv_freq(inv, fr, half);
  bool first = true;
  for (int64_t n = blockIdx.x; n < p.N; n += gridDim.x) {
    const int32_t pn = p.pos[n];
    const int64_t slot = p.slots[n];
    auto source = [&](int t) -> const T* {
      if (t < Hq) return q + n * p.q_row + static_cast<int64_t>(t) * D;
      if (t < Hq + Hkv) return k + n * p.k_row + static_cast<int64_t>(t - Hq) * D;
      return v + n * p.v_row + static_cast<int64_t>(t - Hq - Hkv) * D;
    };
    HeadRegs<T, V, K> h;
    if (warp < all_tasks) load_head(source(warp), hv, dv, lane, h);  // in flight across the barriers
    if (NORM && first) {
      for (int j = threadIdx.x; j < D; j += blockDim.x) {
        wq[j] = ld(static_cast<const T*>(p.wq)[j]);
        wk[j] = ld(static_cast<const T*>(p.wk)[j]);
      }
    }
    first = false;
    __syncthreads();  // fr and the weights are written; the previous token's cs has been read
    fill_cos_sin<T>(fr, pn, p.af, cs, half);
    __syncthreads();
    const bool kv = slot >= 0 && slot < p.n_slots;  // -1: padding; anything else outside: not ours to write
    const int tasks = kv ? all_tasks : Hq;
    for (int t = warp; t < tasks; t += nwarps) {
      if (t != warp) load_head(source(t), hv, dv, lane, h);
      if (t < Hq) {
        rope_head<T, V, K, NORM>(h, wq, p.eps, cs, hv, dv, lane, q_out + (n * Hq + t) * D);
      } else if (t < Hq + Hkv) {
        rope_head<T, V, K, NORM>(h, wk, p.eps, cs, hv, dv, lane, kc + (slot * Hkv + (t - Hq)) * D);
      } else {
        store_head(vc + (slot * Hkv + (t - Hq - Hkv)) * D, hv, dv, lane, h);
      }
    }
  }
}

template <typename T, int V, int K>
Status launch(const QkvArgs& p, const InvFreq& inv, unsigned grid, int threads, size_t smem) {
  if (p.wq != nullptr) {
    qkv_rope_cache_kernel<T, V, K, true><<<grid, threads, smem, current_stream()>>>(p, inv);
  } else {
    qkv_rope_cache_kernel<T, V, K, false><<<grid, threads, smem, current_stream()>>>(p, inv);
  }
  SG_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

// ---- argument checks (cpu/qkv_rope_cache.cpp's, same messages) -------------------------------

Status check_rows(const char* name, const Tensor& t, int64_t* row) {
  SG_RETURN_IF_ERROR(check_ndim(kOp, name, t, 3));
  SG_RETURN_IF_ERROR(check_dtype(kOp, name, t, {DType::kF32, DType::kBF16, DType::kF16}));
  const int64_t N = t.shape[0], H = t.shape[1], D = t.shape[2];
  const bool packed = (D <= 1 || t.strides[2] == 1) && (H <= 1 || t.strides[1] == D);
  *row = N <= 1 ? H * D : t.strides[0];
  SG_CHECK(t.numel() == 0 || (packed && *row >= H * D), StatusCode::kInvalidArgument,
           str_cat(kOp, ": ", name, " ", t.shape_str(), " has strides [", t.strides[0], ", ", t.strides[1], ", ",
                   t.strides[2], "]; it must be [row >= ", H * D, ", ", D, ", 1] (each token's heads contiguous)"),
           "pass a contiguous tensor or a column slice of one");
  return Status::OK();
}

Status check_same_dtype(const char* name, const Tensor& t, const Tensor& q) {
  SG_CHECK(t.dtype == q.dtype, StatusCode::kDTypeUnsupported,
           str_cat(kOp, ": ", name, " is ", dtype_name(t.dtype), " but q is ", dtype_name(q.dtype)),
           "keep q, k, v, the norm weights and the cache in the model's activation dtype");
  return Status::OK();
}

Status qkv_rope_cache(const OpArgs& a) {
  const char* op = kOp;
  const Tensor& q = a.in(0);
  const Tensor& k = a.in(1);
  const Tensor& v = a.in(2);
  const Tensor& sm = a.in(4);
  const Tensor& qo = a.out(0);
  const Tensor& kc = a.out(1);
  const Tensor& vc = a.out(2);
  int64_t q_row = 0, k_row = 0, v_row = 0;
  SG_RETURN_IF_ERROR(check_rows("q", q, &q_row));
  SG_RETURN_IF_ERROR(check_rows("k", k, &k_row));
  SG_RETURN_IF_ERROR(check_rows("v", v, &v_row));
  const int64_t N = q.shape[0], Hq = q.shape[1], D = q.shape[2], Hkv = k.shape[1];
  SG_RETURN_IF_ERROR(check_same_shape(op, "k", k, "v", v));
  SG_CHECK_SHAPE(k.shape[0] == N && k.shape[2] == D,
                 str_cat(op, ": k ", k.shape_str(), " must be [N, Hkv, D] with q's N and D (q ", q.shape_str(), ")"));
  SG_RETURN_IF_ERROR(check_same_shape(op, "q", q, "q_out", qo));
  SG_RETURN_IF_ERROR(check_ndim(op, "k_cache", kc, 4));
  SG_RETURN_IF_ERROR(check_same_shape(op, "k_cache", kc, "v_cache", vc));
  SG_CHECK_SHAPE(kc.shape[2] == Hkv && kc.shape[3] == D,
                 str_cat(op, ": k_cache ", kc.shape_str(), " must be [num_blocks, block_size, ", Hkv, ", ", D,
                         "] for k ", k.shape_str()));
  const char* names[] = {"k", "v", "q_out", "k_cache", "v_cache"};
  const Tensor* ts[] = {&k, &v, &qo, &kc, &vc};
  for (int i = 0; i < 5; ++i) SG_RETURN_IF_ERROR(check_same_dtype(names[i], *ts[i], q));
  for (int i = 2; i < 5; ++i) SG_RETURN_IF_ERROR(check_contiguous(op, names[i], *ts[i]));
  const Tensor& pos = a.in(3);
  SG_RETURN_IF_ERROR(check_dtype(op, "pos", pos, {DType::kI32}));
  SG_RETURN_IF_ERROR(check_contiguous(op, "pos", pos));
  SG_CHECK_SHAPE(pos.ndim == 1 && pos.shape[0] == N,
                 str_cat(op, ": pos ", pos.shape_str(), " must be [N] = [", N, "], one position per token"));
  SG_RETURN_IF_ERROR(check_dtype(op, "slot_mapping", sm, {DType::kI32}));
  SG_RETURN_IF_ERROR(check_contiguous(op, "slot_mapping", sm));
  SG_CHECK_SHAPE(sm.ndim == 1 && sm.shape[0] == N,
                 str_cat(op, ": slot_mapping ", sm.shape_str(), " must be [N] = [", N, "], one slot per token"));
  const bool norm = a.has_in(5);
  SG_CHECK_ARG(norm == a.has_in(6), str_cat(op, ": pass both norm weights (q_norm, k_norm) or neither"));
  if (norm) {
    const char* wn[] = {"q_norm", "k_norm"};
    for (int i = 0; i < 2; ++i) {
      const Tensor& w = a.in(5 + i);
      SG_CHECK_SHAPE(w.ndim == 1 && w.shape[0] == D, str_cat(op, ": ", wn[i], " ", w.shape_str(), " must be [D] = [", D, "]"));
      SG_RETURN_IF_ERROR(check_contiguous(op, wn[i], w));
      SG_RETURN_IF_ERROR(check_same_dtype(wn[i], w, q));
    }
  }
  RopeConfig cfg;
  SG_RETURN_IF_ERROR(parse_rope(op, a.attr(), D, &cfg));
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
  p.eps = static_cast<float>(a.attr().get_float("eps", 1e-6));
  p.af = cfg.attention_factor;
  const int threads = 32 * static_cast<int>(std::min<int64_t>(all_tasks, kMaxWarps));
  const auto grid = static_cast<unsigned>(std::min(N, kMaxGrid));
  const size_t smem = static_cast<size_t>(3 * half + (norm ? 2 * D : 0)) * sizeof(float);
  bool aligned = true;
  for (const void* ptr : {p.q, p.k, p.v, p.wq, p.wk, static_cast<const void*>(p.q_out),
                          static_cast<const void*>(p.kc), static_cast<const void*>(p.vc)}) {
    aligned = aligned && aligned16(ptr);
  }
  SG_CUDA_DISPATCH_FLOAT(op, q.dtype, T, {
    constexpr int V = static_cast<int>(16 / sizeof(T));
    const bool packs = aligned && q_row % V == 0 && k_row % V == 0 && v_row % V == 0 && D % V == 0 &&
                       half % V == 0 && half <= 32 * V && D - R <= 32 * V;
    if (packs) return launch<T, V, 1>(p, cfg.inv, grid, threads, smem);
    SG_CHECK(half <= 32 * kScalarUnits && D - R <= 32 * kScalarUnits, StatusCode::kUnsupported,
             str_cat(op, ": head dim ", D, " (rotary_dim ", R, ") is above what the CUDA kernel holds in registers "
                     "without 16-byte packs (", 64 * kScalarUnits, ")"),
             "run this op on the CPU");
    return launch<T, 1, kScalarUnits>(p, cfg.inv, grid, threads, smem);
  });
  return Status::OK();
}

}  // namespace

}  // namespace surogate::cuda::nra

namespace surogate::cuda {

void register_cuda_qkv_rope_cache(OpRegistry& reg) {
  add_op(reg, "qkv_rope_cache", 5, 7, 3, nra::qkv_rope_cache,
         "(q[N,Hq,D], k[N,Hkv,D], v[N,Hkv,D], pos[N] i32, slot_mapping[N] i32, [q_norm[D], k_norm[D]]) -> "
         "(q_out[N,Hq,D], k_cache, v_cache [num_blocks, block_size, Hkv, D], written in place; slot -1 skips); "
         "attrs: eps, theta, rotary_dim, rope_type (default|linear|llama3), factor, low_freq_factor, "
         "high_freq_factor, original_max_position, attention_factor");
}

}  // namespace surogate::cuda
