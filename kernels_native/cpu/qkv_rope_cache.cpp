// qkv_rope_cache: what a serving step does between the q / k / v projections and paged attention,
// as one op: RoPE on q and k (after Qwen3's per-head RMSNorm when the norm weights are given),
// k and v written into the paged KV cache, q returned.
//
// (q[N,Hq,D], k[N,Hkv,D], v[N,Hkv,D], pos[N] i32, slot_mapping[N] i32, [q_norm w[D], k_norm w[D]])
//   -> (q_out[N,Hq,D], k_cache, v_cache [num_blocks, block_size, Hkv, D] written in place)
// With the norm weights (both or neither):
//   q_out = qk_norm_rope_fwd(q, q_norm), k_cache[slot] = qk_norm_rope_fwd(k, k_norm), v_cache[slot] = v
// without them:
//   q_out = rope_fwd(q), k_cache[slot] = rope_fwd(k), v_cache[slot] = v
// bit for bit (the same helpers, cpu/rope.h, in the same order); attrs: eps, weight_offset (the
// norms' `w + offset`, qk_norm_rope_fwd's; Gemma's 1) and the rope attrs of
// rope_fwd (cpu/rope.cpp's header has the formulas). Slots are kv_cache_write's (cpu/paged_attention.cpp):
// -1 skips the token's k and v (its q is still computed), anything else outside the cache or a
// slot used twice is an error raised before anything is written.
//
// q, k and v may have token rows further apart than H * D elements (strides [row, D, 1]): column
// slices of one fused [N, (Hq + 2 Hkv) D] projection. q_out and the caches are contiguous.
// Forward only: serving graphs are not differentiated.
#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu/paged_attention.h"
#include "cpu/rope.h"
#include "runtime/op_checks.h"

namespace surogate::cpu {

namespace {

constexpr const char* kOp = "qkv_rope_cache";

Status qkv_rope_cache(const OpArgs& a) {
  const char* op = kOp;
  QkvRopeCacheDims dims;
  SG_RETURN_IF_ERROR(check_qkv_rope_cache(a, &dims));
  const Tensor& q = a.in(0);
  const Tensor& k = a.in(1);
  const Tensor& v = a.in(2);
  const Tensor& sm = a.in(4);
  const Tensor& qo = a.out(0);
  const Tensor& kc = a.out(1);
  const Tensor& vc = a.out(2);
  const int64_t N = dims.N, Hq = dims.Hq, D = dims.D, Hkv = dims.Hkv;
  const int64_t q_row = dims.q_row, k_row = dims.k_row, v_row = dims.v_row;
  const bool norm = dims.norm;
  const RopeConfig& cfg = dims.rope;
  const float eps = dims.eps;
  const float offset = static_cast<float>(a.attr().get_float("weight_offset", 0.0));
  const int32_t* pos = a.in(3).ptr<int32_t>();
  const int32_t* slots = sm.ptr<int32_t>();
  SG_RETURN_IF_ERROR(check_slot_mapping(op, slots, N, kc.shape[0], kc.shape[1]));
  const int64_t R = cfg.rotary_dim, half = R / 2;

  SG_DISPATCH_FLOAT(op, q.dtype, T, {
    CosSinTable table;
    SG_RETURN_IF_ERROR(build_table<T>(cfg, pos, N, &table));
    const float* cs_base = table.buf.ptr<float>();
    std::vector<float> wq(norm ? D : 0), wk(norm ? D : 0);
    if (norm) {
      load_row(a.in(5).ptr<T>(), wq.data(), D);
      load_row(a.in(6).ptr<T>(), wk.data(), D);
    }
    const T* pq = q.ptr<T>();
    const T* pk = k.ptr<T>();
    const T* pv = v.ptr<T>();
    T* pqo = qo.ptr<T>();
    T* pkc = kc.ptr<T>();
    T* pvc = vc.ptr<T>();
    const size_t v_bytes = static_cast<size_t>(Hkv * D) * sizeof(T);
    parallel_for(0, N, std::max<int64_t>(1, kRopeGrainElems / std::max<int64_t>(1, (Hq + 2 * Hkv) * D)),
                 [&](int64_t n0, int64_t n1) {
      std::vector<float> xs(D), nb(D);
      // One head: qk_norm_rope_fwd's (with w) or rope_fwd's (without) per-head steps.
      auto head = [&](const T* x, T* y, const float* w, const float* c) {
        if (norm) {
          load_row(x, xs.data(), D);
          norm_rope_head(xs.data(), w, eps, c, D, R, nb.data(), y, offset);
        } else {
          load_row(x, xs.data(), R);
          rotate_pairs(xs.data(), xs.data() + half, c, c + half, 1.0f, y, y + half, half);
          if (R < D) std::memcpy(y + R, x + R, (D - R) * sizeof(T));
        }
      };
      for (int64_t n = n0; n < n1; ++n) {
        const float* c = table.row(cs_base, n, pos[n], R);
        for (int64_t h = 0; h < Hq; ++h) head(pq + n * q_row + h * D, pqo + (n * Hq + h) * D, wq.data(), c);
        const int64_t slot = slots[n];
        if (slot < 0) continue;
        for (int64_t h = 0; h < Hkv; ++h) head(pk + n * k_row + h * D, pkc + (slot * Hkv + h) * D, wk.data(), c);
        std::memcpy(pvc + slot * Hkv * D, pv + n * v_row, v_bytes);
      }
    });
  });
  return Status::OK();
}

}  // namespace

void register_cpu_qkv_rope_cache(OpRegistry& reg) {
  add_op(reg, "qkv_rope_cache", qkv_rope_cache);
}

}  // namespace surogate::cpu
