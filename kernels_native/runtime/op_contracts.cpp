#include "runtime/op_contracts.h"

namespace surogate {

namespace {

#define SG_ROPE_ATTRS                                                                                  \
  "theta, rotary_dim, rope_type (default|linear|llama3|yarn|proportional), factor, rope_angles, low_freq_factor, high_freq_factor, " \
  "original_max_position, yarn_low, yarn_high, attention_factor"

constexpr int V = kVariadic;

// name, min_inputs, max_inputs, num_outputs, min_outputs, doc
constexpr OpContract kContracts[] = {
    {"fill", 0, 0, 1, -1, "() -> (y); attrs: value"},
    {"cast", 1, 1, 1, -1, "(x) -> (y) any float dtypes"},
    {"copy", 1, 1, 1, -1, "(x) -> (y) same dtype"},
    {"add", 2, 2, 1, -1, "(a, b) -> (y = alpha*a + beta*b); attrs: alpha, beta"},
    {"scale", 1, 1, 1, -1, "(x) -> (y = alpha*x); attrs: alpha"},
    {"argmax", 1, 1, 1, -1, "(x [R, V]) -> (y int32 [R]): lowest index of the row max, -1 on NaN / +inf"},
    {"sample", 2, 3, 3, 2,
     "(logits [R, V], params f32 [R, 8] = temperature, top_k, top_p, min_p, seed_lo, seed_hi, step, -, [mask int32 "
     "[R, ceil(V/32)]: allowed-token bits]) -> (token int32 [R] (-2: the mask allows nothing), logprob f32 [R] (raw), "
     "[rank int32 [R]]): argmax below temperature 1e-5, else one Philox draw"},
    {"matmul", 2, 3, 1, -1,
     "(A, B, [bias]) -> (C = alpha*op(A)@op(B) + beta*C + bias); attrs: trans_a, trans_b, alpha, beta"},
    {"quantize_fp8", 1, 1, 3, 2,
     "(x[R,C], rows may be strided) -> (q[R,C] or [C,R] with transpose, float8_e4m3fn|float8_e5m2 = "
     "satfinite(x * scale), scale = FP8_MAX / amax; scale_inv f32[1]; [amax_history f32[H], read and rewritten: "
     "delayed scaling]); attrs: transpose"},
    {"matmul_fp8", 4, 5, 1, -1,
     "(a[M,K] fp8, a_scale_inv f32[1], b[N,K] fp8, b_scale_inv f32[1], [bias[N]]) -> (c[M,N] = alpha*a_scale_inv*"
     "b_scale_inv*(a@b^T) + beta*c + bias), not e5m2 x e5m2; attrs: alpha, beta"},
    {"embedding_fwd", 2, 2, 1, -1, "(ids[N] int32, table[V,C]) -> (y[N,C])"},
    {"embedding_bwd", 2, 2, 1, -1, "(ids[N] int32, dy[N,C]) -> (dtable[V,C], f32 or dy's dtype); attrs: accumulate"},
    {"embed_rows", 3, 3, 1, -1,
     "(x[N,C], index[E] int32, rows[E,C] f32) -> (y[N,C] = x with y[index[e]] = rows[e]; index -1 skips)"},
    {"rmsnorm_fwd", 2, 2, 2, -1, "(x[N,C], w[C]) -> (y[N,C], rstd[N] f32); attrs: eps, weight_offset"},
    {"rmsnorm_bwd", 4, 4, 2, 1, "(dy, x, w, rstd) -> (dx, [dw]); attrs: weight_offset, accumulate"},
    {"add_rmsnorm_fwd", 3, 3, 3, -1,
     "(x[N,C], residual[N,C], w[C]) -> (y, h = x + residual, rstd[N] f32); attrs: eps, weight_offset"},
    // dh sits in the middle of (dy, [dh], h, w, rstd): inputs 1..4 look optional to the registry and
    // check_add_rmsnorm_bwd requires h, w and rstd.
    {"add_rmsnorm_bwd", 1, 5, 2, 1,
     "(dy, [dh], h, w, rstd) -> (dx = d residual, [dw]); attrs: weight_offset, accumulate"},
    {"layer_norm_fwd", 2, 3, 3, -1,
     "(x[N,C], w[C], [b[C]]) -> (y[N,C] = (x - mean) rstd w + b, mean[N] f32, rstd[N] f32); attrs: eps"},
    {"layer_norm_bwd", 5, 5, 3, 1, "(dy, x, w, mean, rstd) -> (dx, [dw], [db]); attrs: accumulate"},
    {"rope_fwd", 2, 2, 1, -1, "(x[N,H,D], pos[N] i32) -> (y); attrs: " SG_ROPE_ATTRS},
    {"rope_bwd", 2, 2, 1, -1, "(dy[N,H,D], pos[N] i32) -> (dx), rotation by -angle; attrs: " SG_ROPE_ATTRS},
    {"qk_norm_rope_fwd", 3, 3, 2, -1, "(x[N,H,D], w[D], pos[N]) -> (y, rstd[N,H] f32); attrs: eps, weight_offset, " SG_ROPE_ATTRS},
    {"qk_norm_rope_bwd", 5, 5, 2, 1, "(dy, x, w, rstd, pos) -> (dx, [dw]); attrs: eps, weight_offset, accumulate, " SG_ROPE_ATTRS},
    {"swiglu_fwd", 1, 1, 1, -1, "(gu[N,2F] = [gate, up]) -> (y[N,F] = silu(gate) * up)"},
    {"swiglu_bwd", 2, 2, 1, -1, "(dy[N,F], gu[N,2F]) -> (dgu[N,2F])"},
    {"geglu_fwd", 1, 1, 1, -1, "(gu[N,2F] = [gate, up]) -> (y[N,F] = gelu_tanh(gate) * up)"},
    {"geglu_bwd", 2, 2, 1, -1, "(dy[N,F], gu[N,2F]) -> (dgu[N,2F])"},
    {"act_mul_fwd", 1, 2, 1, -1,
     "(a, [b: a's shape or one value]) -> (y = act(a) * b, act(a) without b); attrs: act (none|gelu_tanh|gelu)"},
    {"act_mul_bwd", 2, 3, 2, 1, "(dy, a, [b]) -> (da, [db], not for a broadcast or absent b); attrs: act"},
    {"softcap_fwd", 1, 1, 1, -1, "(x) -> (y = cap * tanh(x / cap)); attrs: cap"},
    {"attention_fwd", 4, 6, 2, -1,
     "(q[N,Hq,D], k[N,Hkv,D], v[N,Hkv,D], cu_seqlens[S+1], [sinks[Hq]], [kv_limit[N] i32]) -> (out[N,Hq,D], "
     "lse[N,Hq] f32); attrs: causal, scale, window, softcap"},
    {"attention_bwd", 7, 8, 3, -1,
     "(dout, q, k, v, out, lse, cu_seqlens, [kv_limit]) -> (dq, dk, dv); attrs: causal, scale, window, softcap"},
    {"attention_sinks_bwd", 4, 4, 1, -1,
     "(dout[N,Hq,D], out[N,Hq,D], lse[N,Hq] f32, sinks[Hq]) -> (dsinks[Hq] f32 or sinks' dtype = -sum_i "
     "exp(z - lse_i) dout_i . out_i); attrs: accumulate"},
    {"lm_head_ce_fwd", 3, 3, 2, -1,
     "(h[N,C], W[V,C], targets[N] i32) -> (loss[N] f32, lse[N] f32); attrs: ignore_index, label_smoothing, "
     "chunk, softcap"},
    {"lm_head_ce_bwd", 5, 5, 2, 1,
     "(h, W, targets, lse, dloss[N] f32) -> (dh[N,C], [dW[V,C]]); attrs: ignore_index, label_smoothing, chunk, "
     "softcap, accumulate"},
    {"kv_cache_write", 3, 3, 2, -1,
     "(k[T,Hkv,D], v[T,Hkv,D], slot_mapping[T] i32) -> (k_cache, v_cache [num_blocks, block_size, Hkv, D], "
     "written in place; slot -1 skips)"},
    {"qkv_rope_cache", 5, 7, 3, -1,
     "(q[N,Hq,D], k[N,Hkv,D], v[N,Hkv,D], pos[N] i32, slot_mapping[N] i32, [q_norm[D], k_norm[D]]) -> "
     "(q_out[N,Hq,D], k_cache, v_cache [num_blocks, block_size, Hkv, D], written in place; slot -1 skips); "
     "attrs: eps, weight_offset, " SG_ROPE_ATTRS},
    {"paged_attention", 6, 8, 2, 1,
     "(q[T,Hq,D], k_cache, v_cache, block_tables[S,max_blocks] i32, cu_q[S+1] i32, context_lens[S] i32, "
     "[sinks[Hq]], [kv_limit[T] i32]) -> (out[T,Hq,D], [lse[T,Hq] f32]); attrs: scale, window, softcap"},
    {"weight_fetch", 1, 1, 1, -1,
     "(src [n] in host memory) -> (dst [n] on the op's device, same bytes): one layer's packed weights copied up; "
     "CUDA: on a copy stream, after the work queued so far, overlapping what follows until weight_wait(dst)"},
    {"weight_wait", 1, 1, 0, -1, "(dst [n]) -> (): the work after it waits for the weight_fetch into dst"},
    {"weight_gather", 0, V, 1, -1,
     "(this rank's pieces, in order) -> (dst [n]: every rank's pieces, the whole layer); attrs: offsets, sizes, "
     "owners (per piece: its bytes in dst and its rank); ZeRO-3, needs the Program's communicator"},
    {"grad_reduce", 0, V, 0, -1,
     "(a layer's gradient accumulators) -> (); attrs: owners (one rank per input: reduced to it; none: all-reduced), "
     "tag, every (staged: acts unarmed too, zeroes the others' tensors after); armed, starts their sum over the ranks "
     "on the Program's GradReducer thread and returns"},
    {"grad_wait", 0, 0, 0, -1,
     "() -> (): waits for every grad_reduce started (armed: then disarms the reducer); attrs: tag (only that tag's "
     "last)"},
    {"gated_matmul", 2, 3, 1, -1,
     "(gu[M,2F] = [gate, up], W[N,F], [bias[N]]) -> (y[M,N] = act(gate) * up @ W^T + bias); attrs: act "
     "(silu | gelu_tanh)"},
    // residual sits in the middle of (x, [residual], w, W, [bias]): as add_rmsnorm_bwd.
    {"add_rmsnorm_matmul", 1, 5, 2, 1,
     "(x[M,K], [residual[M,K]], w[K], W[N,K], [bias[N]]) -> (y[M,N] = rmsnorm(x + residual) w @ W^T + bias, "
     "[h = x + residual]); attrs: eps, weight_offset"},
    {"short_conv_fwd", 3, 4, 1, -1,
     "(bcx[N,3C] = [B, C, x], w[C,L] | [C,1,L], cu_seqlens[S+1] i32, [bias[C]]) -> (y[N,C] = C * causal "
     "depthwise conv1d(B * x) per document)"},
    {"short_conv_bwd", 4, 5, 3, 1,
     "(dy[N,C], bcx, w, cu_seqlens, [bias]) -> (dbcx[N,3C], [dw], [dbias]); attrs: accumulate"},
    {"short_conv_cache", 5, 6, 2, -1,
     "(bcx[T,3C], w, state_slots[S] i32, cu_q[S+1] i32, context_lens[S] i32, [bias]) -> (y[T,C], "
     "conv_state[P, L-1, C] read and rewritten in place; a span at position 0 starts from zeros)"},
    {"mean_pool_2d_fwd", 1, 1, 1, -1,
     "(x[B*H*W, C], B row-major H x W patch grids) -> (y[B*(H/k)*(W/k), C], the mean of each k x k block, "
     "row-major); attrs: height, width, kernel"},
    {"mean_pool_2d_bwd", 1, 1, 1, -1,
     "(dy[B*(H/k)*(W/k), C]) -> (dx[B*H*W, C] = dy of its block / k^2); attrs: height, width, kernel"},
    {"rope_table_fwd", 3, 3, 1, -1,
     "(x[N,H,D], cos[N,half] f32, sin[N,half] f32) -> (y[N,H,D]): rotate_half rope of dims [0, 2 half) by the "
     "given per-token angles, dims beyond passed through; attrs: round_products (HF's text rope rounding)"},
    {"rope_table_bwd", 3, 3, 1, -1, "(dy[N,H,D], cos, sin) -> (dx), rotation by -angle; attrs: round_products"},
    {"embedding_bag_fwd", 3, 3, 1, -1,
     "(ids[N,K] i32, weights[N,K] f32, table[V,C]) -> (y[N,C] = sum_k weights[n,k] table[ids[n,k]]); forward only"},
    {"gguf_dequantize", 1, 1, 1, -1,
     "(q[rows, bytes_per_row] u8) -> (y[rows, cols] f32/bf16/f16); attrs: type (ggml id), cols"},
    {"gguf_quantize", 1, 1, 1, -1,
     "(x[rows, cols] f32/bf16/f16) -> (q[rows, bytes_per_row] u8); attrs: type (ggml id)"},
    {"gguf_matmul", 2, 2, 1, -1,
     "(x[N, K] f32/bf16/f16, Wq[M, bytes_per_row(K)] u8) -> (y[N, M] = x @ dequant(Wq)^T); attrs: type"},
    {"nf4_dequantize", 2, 4, 1, -1,
     "(q[rows, cols/2] u8, absmax[blocks] f32 | u8, [absmax_scale f32, absmax_offset[1] f32]) -> "
     "(y[rows, cols] f32/bf16/f16): bitsandbytes' NF4 (double-quantized with a u8 absmax); attr blocksize"},
    {"dropout_fwd", 1, 2, 1, -1,
     "(x, [rng int32[2] | int64[1]]) -> (y = mask * x / (1-p)); mask a hash of (seed ^ rng, offset + i); "
     "attrs: p, seed, offset. Backward: the same op on dy"},
    {"moe_router_fwd", 1, 1, 3, -1,
     "(logits[N,E]) -> (weights[N,K] logits' dtype, idx[N,K] i32, probs[N,E] f32): softmax, top-k; attrs: "
     "norm_topk_prob"},
    {"moe_router_bwd", 3, 4, 1, -1,
     "(dweights[N,K], probs[N,E] f32, idx[N,K] i32, [dprobs[N,E] f32]) -> (dlogits[N,E]); attrs: norm_topk_prob"},
    {"moe_permute", 2, 2, 3, -1,
     "(x[N,C], idx[N,K] i32) -> (xp[N*K,C] expert-contiguous, rows[N,K] i32, offsets[E+1] i32)"},
    {"moe_unpermute_fwd", 2, 3, 1, -1, "(yp[M,C], rows[N,K] i32, [weights[N,K]]) -> (y[N,C] = sum_k w yp[rows])"},
    {"moe_unpermute_bwd", 4, 4, 2, 1,
     "(dy[N,C], rows[N,K] i32, yp[M,C], weights[N,K]) -> (dyp[M,C], [dweights[N,K]])"},
    {"moe_grouped_matmul", 3, 3, 1, -1,
     "(x[M,K], W[E,N,K] (trans_b) or [E,K,N], offsets[E+1] i32) -> (y[M,N], rows of expert e times W[e]); "
     "attrs: trans_b"},
    {"moe_grouped_matmul_wgrad", 3, 3, 1, -1,
     "(dy[M,N], x[M,K], offsets[E+1] i32) -> (dW[E,N,K] = dy_e^T x_e); attrs: accumulate"},
    {"moe_aux_loss_fwd", 2, V, 2, -1,
     "(probs_0 f32, idx_0 i32, probs_1, idx_1, ...) -> (loss[1] f32, counts[E] f32): load_balancing_loss_func"},
    {"moe_aux_loss_bwd", 2, 2, 1, -1, "(dloss[1] f32, counts[E] f32) -> (dprobs[N,E] f32); attrs: num_layers"},
    {"moe_z_loss_fwd", 1, V, 1, -1, "(logits_0[N,E], logits_1, ...) -> (loss[1] f32): mean of logsumexp(logits)^2"},
    {"moe_z_loss_bwd", 2, 2, 1, -1,
     "(dloss[1] f32, logits[N,E]) -> (dlogits[N,E] = dloss 2 lse softmax / (L N)); attrs: num_layers"},
    {"swiglu_oai_fwd", 1, 1, 1, -1,
     "(gu[M,2F], gate at even columns, up at odd) -> (y[M,F] = (clamp(up) + 1) * g sigmoid(alpha g), g = "
     "min(gate, limit)); attrs: alpha, limit"},
    {"swiglu_oai_bwd", 2, 2, 1, -1, "(dy[M,F], gu[M,2F]) -> (dgu[M,2F]); attrs: alpha, limit"},
    {"moe_bias_add", 3, 3, 1, -1, "(x[M,C], b[E,C], offsets[E+1] i32) -> (y[M,C] = x + b[e] on expert e's rows)"},
    {"moe_bias_grad", 2, 2, 1, -1,
     "(dy[M,C], offsets[E+1] i32) -> (db[E,C] = the sum of expert e's rows of dy); attrs: accumulate"},
    {"global_norm", 0, V, 1, -1, "(g0, g1, ...) -> (norm[1] float32) = sqrt(sum of squares), absent inputs skipped"},
    {"adamw", 1, V, 0, -1,
     "(hp[8], [norm[1]], then (param, [master], grad, m, v) per group) -> () updates in place; attrs: no_decay"},
    {"adamw8", 1, V, 0, -1,
     "(hp[8], [norm[1]], then (param, [master], grad, m_q u8, m_scale f32, v_q u8, v_scale f32) per group) "
     "-> () updates in place; 8-bit blockwise (256) cubic-code states; attrs: no_decay"},
    {"muon_momentum", 4, 4, 1, -1,
     "(hp[8], [norm[1]], grad[R,C], m[R,C] f32) -> (x f32 [R,C] | [C,R]: the (Nesterov) momentum over its "
     "Frobenius norm, Newton-Schulz's input); m updated in place; attrs: nesterov, transpose"},
    {"muon_update", 3, 5, 0, -1,
     "(hp[8], o f32 [R,C] | [C,R], param[R,C], [master f32], [v[R] f32]) -> () updates in place: Muon, or "
     "NorMuon's neuron-wise normalized step with v; attrs: transpose, cautious, scale"},
};

#undef SG_ROPE_ATTRS

}  // namespace

std::span<const OpContract> op_contracts() { return kContracts; }

const OpContract* find_op_contract(std::string_view name) {
  for (const OpContract& c : kContracts) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

void add_kernel(OpRegistry& reg, DeviceType backend, const char* name, OpFn fn, std::initializer_list<DType> dtypes) {
  OpDef def;
  def.name = name;
  def.backend = backend;
  def.fn = fn;
  def.dtypes.assign(dtypes.begin(), dtypes.end());
  if (const OpContract* c = find_op_contract(name)) {
    def.min_inputs = c->min_inputs;
    def.max_inputs = c->max_inputs;
    def.num_outputs = c->num_outputs;
    def.min_outputs = c->min_outputs;
    def.doc = c->doc;
    def.contracted = true;
  } else {
    def.max_inputs = kVariadic;
    def.num_outputs = kVariadic;
    def.doc = "no contract: add one to runtime/op_contracts.cpp";
  }
  reg.add(std::move(def));
}

}  // namespace surogate
