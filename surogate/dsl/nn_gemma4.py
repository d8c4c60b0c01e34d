"""Gemma 4's text decoder (transformers' Gemma4TextModel), composed of nn.py's parts.

What it adds to Gemma 3's sandwich block (nn.SandwichBlock), as ModelSpec fields say:
- per-layer attention geometry: full-attention layers have their own head dim and kv heads
  (spec.head_dim_of / kv_heads_of), and rotate with their own rope (proportional: only the first
  pairs rotate), attention scores are not scaled (scale 1: q and k are RMS-normed);
- values RMS-normed without a weight (value_norm), and on full-attention layers taken from the
  key projection before its norm (attention_k_eq_v: no v_proj);
- KV sharing: a layer whose spec.kv_source is an earlier layer has no k / v projections and
  attends over that layer's K / V (in serving, its paged cache);
- per-layer inputs (per_layer_input_size P > 0, the E2B / E4B models): from the token ids
  (embed_tokens_per_layer, scaled by sqrt(P)) and the embedded rows (per_layer_model_projection
  times hidden**-0.5, RMS-normed per layer), summed and scaled by 2**-0.5; each layer gates its
  output with them: h + norm(proj(gelu_tanh(gate(h)) * input_i));
- each layer's output times a scalar read from the checkpoint (layer_scalar, a buffer).

HF's two packed per-layer-input tensors ([V, L * P] and [L * P, C]) are held here as one slice per
layer (layers.{i}.embed_tokens_per_layer / per_layer_model_projection, [V, P] and [P, C]): the
same numbers, and each layer reads its own slice with the existing embedding and linear ops
(the name table slices and joins them: name_table.Slice).
"""

from __future__ import annotations

import dataclasses
import math

from surogate.dsl import ops
from surogate.dsl.graph import Graph, Value
from surogate.dsl.nn import MLP, CausalLM, KVCache, LoRAConfig, Linear, ModelSpec, pre_norm, round_to

# A rope that rotates nothing (every inverse frequency 0): qk_norm_rope with it is a per-head
# RMSNorm alone, which is how the values are normed (with a weight of ones).
NO_ROTATION = {"theta": 1.0, "rope_type": "proportional", "rope_angles": 0}


class Gemma4Attention:
    def __init__(self, spec: ModelSpec, layer: int):
        self.spec, self.layer = spec, layer
        C, Hq = spec.hidden_size, spec.num_heads
        self.D, self.Hkv = spec.head_dim_of(layer), spec.kv_heads_of(layer)
        self.shared = spec.kv_source(layer) != layer
        self.k_eq_v = spec.attention_k_eq_v and spec.window(layer) == 0
        bias = spec.attention_bias
        self.q = Linear("self_attn.q_proj", C, [("q_proj", Hq * self.D)], bias)
        self.k = None if self.shared else Linear("self_attn.k_proj", C, [("k_proj", self.Hkv * self.D)], bias)
        self.v = None if self.shared or self.k_eq_v else Linear("self_attn.v_proj", C,
                                                                 [("v_proj", self.Hkv * self.D)], bias)
        self.o = Linear("self_attn.o_proj", Hq * self.D, [("o_proj", C)], bias)

    def _value_norm(self, g: Graph, v: Value, pos: Value, dtype: str) -> Value:
        if not self.spec.value_norm:
            return v
        ones = ops.fill(g, (self.D,), dtype, 1.0, name="v_norm.ones")
        return ops.qk_norm_rope(v, ones, pos, self.spec.rms_norm_eps, {**NO_ROTATION, "rotary_dim": self.D},
                                name="v_norm")

    def __call__(self, g: Graph, x: Value, pos: Value, cu: Value, dtype: str, lora: LoRAConfig | None,
                 kv: KVCache | None, shared_kv: dict[int, tuple[Value, Value]]) -> Value:
        """x: the normed rows [N, C]; shared_kv: the K / V of earlier layers (training graphs)."""
        s, D, Hkv, i = self.spec, self.D, self.Hkv, self.layer
        n = x.shape[0]
        rope = s.rope_attrs(i)
        eps = s.rms_norm_eps
        q = ops.view(self.q(g, x, dtype, lora), (n, s.num_heads, D))
        qn = g.param("self_attn.q_norm.weight", (D,), dtype, trainable=lora is None)
        window = s.window(i)
        if self.shared:
            q = ops.qk_norm_rope(q, qn, pos, eps, rope, name="q_rope")
        else:
            kn = g.param("self_attn.k_norm.weight", (D,), dtype, trainable=lora is None)
            k = ops.view(self.k(g, x, dtype, lora), (n, Hkv, D))
            v = k if self.k_eq_v else ops.view(self.v(g, x, dtype, lora), (n, Hkv, D))
            v = self._value_norm(g, v, pos, dtype)
        if kv is not None:  # serving: this layer's (or its source's) paged cache
            k_cache, v_cache = kv.layer(g, s, dtype, i)
            if not self.shared:
                q = ops.qkv_rope_cache(q, k, v, pos, kv.slots, k_cache, v_cache, rope, q_norm=qn, k_norm=kn, eps=eps,
                                       name="q_rope")
            o = ops.paged_attention(q, k_cache, v_cache, kv.block_tables, kv.cu_q, kv.context_lens, scale=1.0,
                                    window=window, softcap=s.attn_softcap, kv_limit=kv.kv_limit, name="attn")
        else:
            if self.shared:
                k, v = shared_kv[s.kv_source(i)]
            else:
                q = ops.qk_norm_rope(q, qn, pos, eps, rope, name="q_rope")
                k = ops.qk_norm_rope(k, kn, pos, eps, rope, name="k_rope")
                shared_kv[i] = (k, v)
            o = ops.attention(q, k, v, cu, causal=True, scale=1.0, window=window, softcap=s.attn_softcap, name="attn")
        return self.o(g, ops.view(o, (n, s.num_heads * D)), dtype, lora)


class Gemma4Block:
    """Gemma 4's decoder layer: the sandwich of nn.SandwichBlock (weights used as they are: no
    norm offset), then the per-layer input gate and the layer scalar. Returns (delta, residual)
    like Block when the layer has neither (the add folded into the next norm), else (its output,
    None)."""

    def __init__(self, spec: ModelSpec, layer: int, lm: Gemma4CausalLM):
        self.spec, self.layer, self.lm = spec, layer, lm
        self.attn = Gemma4Attention(spec, layer)
        width = spec.layer_intermediate_sizes[layer] if spec.layer_intermediate_sizes else spec.intermediate_size
        self.mlp = MLP(dataclasses.replace(spec, intermediate_size=width))
        P, C = spec.per_layer_input_size, spec.hidden_size
        if P:
            self.gate = Linear("per_layer_input_gate", C, [("per_layer_input_gate", P)])
            self.proj = Linear("per_layer_projection", P, [("per_layer_projection", C)])

    def __call__(self, g: Graph, x: Value, residual: Value | None, pos: Value, cu: Value, dtype: str,
                 lora: LoRAConfig | None, kv: KVCache | None = None) -> tuple[Value, Value | None]:
        s = self.spec
        eps = s.rms_norm_eps

        def norm_weight(name: str) -> Value:
            return g.param(f"{name}.weight", (s.hidden_size,), dtype, trainable=lora is None)

        y, h = pre_norm(x, residual, norm_weight("input_layernorm"), eps, "ln1")
        a = ops.rmsnorm(self.attn(g, y, pos, cu, dtype, lora, kv, self.lm.shared_kv),
                        norm_weight("post_attention_layernorm"), eps, name="attn_post_norm")
        y, h = pre_norm(a, h, norm_weight("pre_feedforward_layernorm"), eps, "ln2")
        m = ops.rmsnorm(self.mlp(g, y, dtype, lora), norm_weight("post_feedforward_layernorm"), eps,
                        name="mlp_post_norm")
        if not s.per_layer_input_size and not s.layer_scalar:
            return m, h
        h = ops.add(m, h, name="mlp_residual")
        if s.per_layer_input_size:
            gated = ops.act_mul(self.gate(g, h, dtype, lora), self.lm.per_layer_input(g, self.layer, dtype, lora),
                                "gelu_tanh", name="per_layer_gated")
            p = ops.rmsnorm(self.proj(g, gated, dtype, lora), norm_weight("post_per_layer_input_norm"), eps,
                            name="per_layer_post_norm")
            h = ops.add(h, p, name="per_layer_residual")
        if s.layer_scalar:
            scalar = g.param("layer_scalar", (1,), dtype, trainable=False)  # a buffer in HF: never trained
            h = ops.act_mul(h, scalar, name="layer_scaled")
        return h, None


class Gemma4CausalLM(CausalLM):
    """nn.CausalLM over Gemma4Blocks; its embedding step also keeps what the per-layer inputs
    are made of (the token ids and the embedded rows) for the blocks of the graph being built."""

    def __init__(self, spec: ModelSpec):
        self.spec = spec
        self.blocks = [Gemma4Block(spec, i, self) for i in range(spec.num_layers)]
        self.shared_kv: dict[int, tuple[Value, Value]] = {}
        self._ple_source: tuple[Value, Value] | None = None

    def embed(self, g: Graph, ids: Value, table: Value, dtype: str, lora: LoRAConfig | None) -> Value:
        x = super().embed(g, ids, table, dtype, lora)
        self.shared_kv = {}
        self._ple_source = (ids, x)
        if self.spec.per_layer_input_size:
            P = self.spec.per_layer_input_size
            self._ple_norm = g.param("per_layer_projection_norm.weight", (P,), dtype, trainable=lora is None)
        return x

    def per_layer_input(self, g: Graph, layer: int, dtype: str, lora: LoRAConfig | None) -> Value:
        """Layer ``layer``'s per-layer input [N, P], made in its scope from its slices of the two
        tables (HF's get_per_layer_inputs and project_per_layer_inputs)."""
        s = self.spec
        P, C = s.per_layer_input_size, s.hidden_size
        ids, x = self._ple_source
        table = g.param("embed_tokens_per_layer.weight", (s.per_layer_vocab_size, P), dtype, trainable=lora is None)
        tok = ops.scale(ops.embedding(ids, table, name="per_layer_embed"), round_to(math.sqrt(P), dtype),
                        name="per_layer_embed_scaled")
        proj = Linear("per_layer_model_projection", C, [("per_layer_model_projection", P)])
        ctx = ops.scale(proj(g, x, dtype, lora), C ** -0.5, name="per_layer_projected")
        ctx = ops.rmsnorm(ctx, self._ple_norm, s.rms_norm_eps, name="per_layer_projected_norm")
        return ops.scale(ops.add(ctx, tok, name="per_layer_sum"), 2.0 ** -0.5, name="per_layer_input")
