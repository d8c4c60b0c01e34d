"""Modules: Linear (with LoRA slices), Attention, MLP, MoE, Block, SandwichBlock, CausalLM (Gemma 4's
layer is nn_gemma4.py's).

A module holds configuration; calling it inside a graph declares its parameters (named like
the HF checkpoint's tensors, so that name tables stay short) and adds its nodes. Building a
graph computes nothing. Every use gets the same plain ops (norms, three q / k / v projections,
activations, linears); a serving graph's fusions are a compile pass (surogate/compile/fuse.py).

Past 400 lines because the specs (LoRAConfig, MoESpec, ModelSpec) and the blocks that read them
are one vocabulary every family file imports together.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from surogate.dsl import ops
from surogate.dsl.graph import Dim, Graph, Value
from surogate.errors import UnsupportedError

N = Dim("N")  # tokens in one packed step
LORA_RNG = "lora_rng"  # int32 [2]: the LoRA dropout seed (low, high words), written every step
KV_LIMIT = "kv_limit"  # int32 [N]: the last key (within its sequence) each token may see, where a graph has it
# float32 [N, head_dim / 2]: each token's rope cos / sin, where a graph has them (Qwen3-VL's MRoPE,
# dsl/nn_qwen3_vl.py): rope_table in place of the 1-D rope.
MROPE_COS, MROPE_SIN = "mrope_cos", "mrope_sin"


@dataclass
class LoRAConfig:
    rank: int = 16
    alpha: float = 32.0
    # HF module names: q_proj k_proj v_proj o_proj gate_proj up_proj down_proj.
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    use_rslora: bool = False
    # peft's lora_dropout: the adapters read dropout(x) in training graphs (CausalLM.build mode
    # "train", lowered with a backward pass); the per-step seed is the graph input `lora_rng`.
    dropout: float = 0.0
    # peft's rank_pattern / alpha_pattern for a MoE layer's stacked expert parameters, keyed by the
    # parameter (gate_up_proj, down_proj): the rank and alpha of its adapter where not `rank` / `alpha`.
    rank_pattern: dict[str, int] = field(default_factory=dict)
    alpha_pattern: dict[str, float] = field(default_factory=dict)

    @property
    def scale(self) -> float:
        return self.alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)

    def key(self) -> tuple:
        """What decides the compiled graph (a cache key)."""
        return (self.rank, self.alpha, self.targets, self.dropout, self.use_rslora,
                tuple(sorted(self.rank_pattern.items())), tuple(sorted(self.alpha_pattern.items())))


@dataclass
class MoESpec:
    """A sparse mixture-of-experts MLP (Qwen3-MoE): a router picks ``top_k`` of ``num_experts``
    SwiGLU experts (width ``intermediate_size`` each) per token, on the ``layers`` listed (the
    others keep the dense MLP). ``router_aux_loss_coef`` > 0 adds transformers'
    load_balancing_loss_func times it to the training loss (HF: with output_router_logits)."""

    num_experts: int
    top_k: int
    intermediate_size: int
    layers: tuple[int, ...]
    norm_topk_prob: bool = False
    router_aux_loss_coef: float = 0.0
    # ST-MoE's router z-loss, mean over (layer, token) rows of logsumexp(router logits)^2, times
    # this in the training loss (the config's router_z_loss_coef; 0: off).
    router_z_loss_coef: float = 0.0
    # Whether the router weight (mlp.gate) trains: None follows the run (a full fine-tune trains it,
    # LoRA leaves it frozen); the config's train_router sets it either way.
    train_router: bool | None = None
    # GPT-OSS: the router is ``mlp.router`` with a bias; the experts have biases
    # (``mlp.experts.gate_up_proj_bias`` [E, 2F], ``down_proj_bias`` [E, C]) and the clamped SwiGLU
    # over interleaved gate / up rows (activation "swiglu_oai", swiglu_alpha, swiglu_limit).
    router_name: str = "gate"
    router_bias: bool = False
    expert_bias: bool = False
    activation: str = "swiglu"
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0


@dataclass
class ModelSpec:
    """The architecture facts a CausalLM needs, normalized from an HF config."""

    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-6
    rope: dict = field(default_factory=lambda: {"theta": 10000.0, "rope_type": "default"})
    rotary_dim: int | None = None
    tie_word_embeddings: bool = False
    qk_norm: bool = False
    attention_bias: bool = False  # q / k / v biases
    attention_out_bias: bool = False  # an o_proj bias (GPT-OSS)
    attention_sinks: bool = False  # a learned logit per query head in the softmax denominator (GPT-OSS)
    mlp_bias: bool = False
    activation: str = "silu"  # silu -> swiglu, gelu_pytorch_tanh -> geglu
    sliding_windows: list[int] = field(default_factory=list)  # per layer, 0 = full attention
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    # Gemma: every RMSNorm multiplies by (weight_offset + w), the embedding rows are scaled by
    # sqrt(hidden) (embed_scale), the attention scores by attn_scale (0: 1 / sqrt(head_dim)), and
    # sliding-window layers rotate with their own rope (rope_sliding; None: `rope` everywhere).
    norm_offset: float = 0.0
    embed_scale: bool = False
    attn_scale: float = 0.0
    rope_sliding: dict | None = None
    # Layers that differ in their attention (Gemma 4): each layer's head dim and kv heads (empty:
    # head_dim and num_kv_heads everywhere), and the layer whose K / V each attends over (empty:
    # its own; an earlier layer: a KV-shared layer, without K / V projections or a cache).
    layer_head_dims: list[int] = field(default_factory=list)
    layer_kv_heads: list[int] = field(default_factory=list)
    kv_sources: list[int] = field(default_factory=list)
    # Gemma 4 (nn_gemma4.py): per-layer input embeddings of this width (0: none) over a vocabulary
    # of per_layer_vocab_size, each layer's MLP width (empty: intermediate_size), the full-attention
    # layers' values taken from their key projection (attention_k_eq_v), values RMS-normed, and a
    # scalar (a checkpoint buffer) multiplying each layer's output.
    per_layer_input_size: int = 0
    per_layer_vocab_size: int = 0
    layer_intermediate_sizes: list[int] = field(default_factory=list)
    attention_k_eq_v: bool = False
    value_norm: bool = False
    layer_scalar: bool = False
    # Hybrid layouts (LFM2): each layer's mixer, "attention" or "conv" (a gated short convolution
    # of conv_kernel taps); empty: attention everywhere.
    layer_kinds: list[str] = field(default_factory=list)
    conv_kernel: int = 3
    conv_bias: bool = False
    moe: MoESpec | None = None  # sparse MLP layers (None: every layer dense)
    # False: bidirectional attention (an encoder: EmbeddingGemma), each token seeing its whole
    # document, or on a sliding layer the tokens less than its window away on either side; such a
    # model embeds (build mode "hidden") and has no serving build.
    causal: bool = True
    # Images (Gemma 3's SigLIP tower and projector: dsl/nn_vision.py VisionSpec); None: text only.
    vision: object | None = None

    def window(self, layer: int) -> int:
        return self.sliding_windows[layer] if self.sliding_windows else 0

    def attention_window(self, layer: int) -> int:
        """The attention op's window: causal, keys with i - W < j <= i (HF's sliding window W);
        bidirectional, |i - j| <= W, so HF's |i - j| < W is W - 1."""
        w = self.window(layer)
        return w if self.causal or w == 0 else w - 1

    def head_dim_of(self, layer: int) -> int:
        return self.layer_head_dims[layer] if self.layer_head_dims else self.head_dim

    def kv_heads_of(self, layer: int) -> int:
        return self.layer_kv_heads[layer] if self.layer_kv_heads else self.num_kv_heads

    def kv_source(self, layer: int) -> int:
        return self.kv_sources[layer] if self.kv_sources else layer

    def is_conv(self, layer: int) -> bool:
        """Whether the layer's mixer is a gated short convolution (LFM2) rather than attention."""
        return bool(self.layer_kinds) and self.layer_kinds[layer] == "conv"

    def cache_layers(self) -> list[int]:
        """The layers with a KV cache of their own (serving)."""
        return [i for i in range(self.num_layers)
                if self.kv_source(i) == i and not self.is_conv(i)]

    def rope_attrs(self, layer: int | None = None) -> dict:
        """The rope attributes of ``layer`` (a sliding-window layer's own when rope_sliding is set)."""
        sliding = layer is not None and self.rope_sliding is not None and self.window(layer) > 0
        attrs = dict(self.rope_sliding if sliding else self.rope)
        attrs["rotary_dim"] = self.rotary_dim or (self.head_dim if layer is None else self.head_dim_of(layer))
        return attrs


@dataclass
class KVCache:
    """Serving: the paged KV cache (per layer [num_blocks, block_size, Hkv, D]) and the step's
    cache addressing, all graph inputs; a serving graph keeps it as ``Graph.kv``. ``fuse_qkv``
    asks the serving fusions (surogate.compile.fuse_serving) to make each layer's q, k and v
    projections one matmul over a fused weight, ``self_attn.qkv_proj`` (rows q, then k, then v;
    the caller binds it); layers whose q / k / v are GGML blocks stay unfused. ``embeds``: the
    step also takes per-request embedding rows (``embed_rows`` float32 [E, C] replacing the first
    block's input at token rows ``embed_index`` [E], -1 padding) and each query's last visible key
    (``kv_limit`` [N], bidirectional spans), all graph inputs (kernels_native/serve/model_runner.h)."""

    num_blocks: int
    block_size: int
    fuse_qkv: bool = False
    embeds: bool = False
    kv_limit: Value | None = None
    # The step ends in the sample op (kernels_native/serve/program_runner.h): a `sample_params`
    # input [R, 8] and the outputs `sampled` (token), `sampled.logprob`, `sampled.rank` in place
    # of `argmax` (the token at temperature 0).
    sample: bool = False
    # Per-sequence recurrent state beside the KV blocks (LFM2's conv layers): num_state_slots rows
    # per layer, indexed by the step input state_slots [S] (the engine's slot of each sequence).
    num_state_slots: int = 0
    state_slots: Value | None = None
    slots: Value | None = None
    block_tables: Value | None = None
    cu_q: Value | None = None
    context_lens: Value | None = None

    def conv_state(self, g: Graph, channels: int, taps: int, dtype: str) -> Value:
        """This layer's conv state [num_state_slots, taps - 1, channels] (the last inputs of each
        sequence's convolution), a graph input the op rewrites; the step's state_slots with it."""
        if self.state_slots is None:
            self.state_slots = g.input("state_slots", (Dim("S"),), "int32")
        return g.input(g.scoped("conv_state"), (self.num_state_slots, taps - 1, channels), dtype)

    def layer(self, g: Graph, spec: ModelSpec, dtype: str, layer: int | None = None) -> tuple[Value, Value]:
        """The cache inputs of the layer in scope; with ``layer``, of that layer (its own shape; a
        KV-shared layer gets its source's, declared once)."""
        if layer is None:
            shape = (self.num_blocks, self.block_size, spec.num_kv_heads, spec.head_dim)
            return g.input(g.scoped("k_cache"), shape, dtype), g.input(g.scoped("v_cache"), shape, dtype)
        src = spec.kv_source(layer)
        shape = (self.num_blocks, self.block_size, spec.kv_heads_of(src), spec.head_dim_of(src))
        names = (f"layers.{src}.k_cache", f"layers.{src}.v_cache")
        return tuple(g.values[n] if n in g.values else g.input(n, shape, dtype) for n in names)


def pre_norm(x: Value, residual: Value | None, w: Value, eps: float, name: str,
             weight_offset: float = 0.0) -> tuple[Value, Value]:
    """(rmsnorm(x + residual) * w, x + residual): the input of a block's attention or MLP, with
    the residual add folded in, and the residual stream after this point. residual None (a
    model's first layer): rmsnorm(x) * w, and the stream is x itself. ``weight_offset``: the
    norm multiplies by (weight_offset + w) (Gemma's 1)."""
    if residual is None:
        return ops.rmsnorm(x, w, eps, name=name, weight_offset=weight_offset), x
    return ops.add_rmsnorm(x, residual, w, eps, name=name, weight_offset=weight_offset)


def round_to(value: float, dtype: str) -> float:
    """``value`` rounded to ``dtype`` (nearest, ties to even), as torch's ``tensor(value).to(dtype)``."""
    import numpy as np

    if dtype == "bfloat16":
        bits = int(np.array(value, np.float32).view(np.uint32))
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return float(np.array(bits, np.uint32).view(np.float32))
    return float(np.float16(value)) if dtype == "float16" else float(np.float32(value))


class Linear:
    """y = x @ W.T (+ b). `parts` names the HF projections fused into W, in order, with their
    output widths (one part for an unfused projection); a LoRA slice goes on each targeted part."""

    def __init__(self, name: str, in_features: int, parts: list[tuple[str, int]], bias: bool = False):
        self.name, self.in_features, self.parts, self.bias = name, in_features, parts, bias
        self.out_features = sum(size for _, size in parts)

    def __call__(self, g: Graph, x: Value, dtype: str, lora: LoRAConfig | None,
                 trainable: bool | None = None) -> Value:
        """``trainable``: whether W (and b) train; None: exactly when there is no LoRA."""
        trainable = lora is None if trainable is None else trainable
        qtype = g.quant.get(g.scoped(f"{self.name}.weight"))
        if hasattr(qtype, "blocksize"):  # bitsandbytes NF4 (surogate/io/nf4.py): codes + absmax state
            full = g.scoped(f"{self.name}.weight")
            state = [g.param(n[len(g.scoped("")):], shape, dt, trainable=False).name
                     for n, shape, dt in qtype.state(full, self.out_features, self.in_features)]
            w = g.param(f"{self.name}.weight", (self.out_features, self.in_features // 2), "uint8",
                        trainable=False, nf4=qtype, nf4_state=state)
        elif qtype is not None:  # GGML blocks, multiplied as they are (forward graphs only)
            from surogate.io.gguf import row_bytes

            w = g.param(f"{self.name}.weight", (self.out_features, row_bytes(qtype, self.in_features)), "uint8",
                        trainable=False, ggml_type=qtype)
        else:
            w = g.param(f"{self.name}.weight", (self.out_features, self.in_features), dtype, trainable=trainable)
        b = g.param(f"{self.name}.bias", (self.out_features,), dtype, trainable=trainable) if self.bias else None
        slices = []
        offset = 0
        for part, size in self.parts:
            if lora is not None and part in lora.targets:
                prefix = self.name.rsplit(".", 1)[0] + "." + part if len(self.parts) > 1 else self.name
                A = g.param(f"{prefix}.lora_A", (lora.rank, self.in_features), dtype, lora="A", init="kaiming")
                B = g.param(f"{prefix}.lora_B", (size, lora.rank), dtype, lora="B", init="zeros")
                slices.append(ops.LoRASlice(part, A, B, lora.scale, offset, size))
            offset += size
        if slices and lora.dropout > 0:
            rng = g.values.get(LORA_RNG) or g.input(LORA_RNG, (2,), "int32")
            return ops.linear(x, w, b, slices, name=self.name, dropout=lora.dropout, rng=rng)
        return ops.linear(x, w, b, slices, name=self.name)


class Attention:
    def __init__(self, spec: ModelSpec, layer: int):
        self.spec, self.layer = spec, layer
        C, Hq, Hkv, D = spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.q = Linear("self_attn.q_proj", C, [("q_proj", Hq * D)], spec.attention_bias)
        self.k = Linear("self_attn.k_proj", C, [("k_proj", Hkv * D)], spec.attention_bias)
        self.v = Linear("self_attn.v_proj", C, [("v_proj", Hkv * D)], spec.attention_bias)
        self.o = Linear("self_attn.o_proj", Hq * D, [("o_proj", C)], spec.attention_out_bias)

    def __call__(self, g: Graph, x: Value, pos: Value, cu: Value, dtype: str, lora: LoRAConfig | None,
                 kv: KVCache | None = None) -> Value:
        """x: the normed rows [N, C]."""
        s = self.spec
        Hq, Hkv, D = s.num_heads, s.num_kv_heads, s.head_dim
        n = x.shape[0]
        q = ops.view(self.q(g, x, dtype, lora), (n, Hq, D))
        k = ops.view(self.k(g, x, dtype, lora), (n, Hkv, D))
        v = ops.view(self.v(g, x, dtype, lora), (n, Hkv, D))
        rope = s.rope_attrs(self.layer)
        qn = kn = None
        if s.qk_norm:
            qn = g.param("self_attn.q_norm.weight", (D,), dtype, trainable=lora is None)
            kn = g.param("self_attn.k_norm.weight", (D,), dtype, trainable=lora is None)
        sinks = g.param("self_attn.sinks", (Hq,), dtype, trainable=lora is None) if s.attention_sinks else None
        if kv is not None:  # serving: rope, the cache write and attention over the cache
            k_cache, v_cache = kv.layer(g, s, dtype)
            if MROPE_COS in g.values:  # per-token cos / sin (Qwen3-VL's steps with image rows)
                q, k = _table_rope(g, q, k, qn, kn, s)
                ops.kv_cache_write(k, v, kv.slots, k_cache, v_cache)
            else:
                q = ops.qkv_rope_cache(q, k, v, pos, kv.slots, k_cache, v_cache, rope, q_norm=qn, k_norm=kn,
                                       eps=s.rms_norm_eps, weight_offset=s.norm_offset, name="q_rope")
            o = ops.paged_attention(q, k_cache, v_cache, kv.block_tables, kv.cu_q, kv.context_lens,
                                    scale=s.attn_scale, window=s.window(self.layer), softcap=s.attn_softcap,
                                    sinks=sinks, kv_limit=kv.kv_limit, name="attn")
        else:
            if MROPE_COS in g.values:  # per-token cos / sin tables (Qwen3-VL with images)
                q, k = _table_rope(g, q, k, qn, kn, s)
            elif s.qk_norm:
                q = ops.qk_norm_rope(q, qn, pos, s.rms_norm_eps, rope, name="q_rope", weight_offset=s.norm_offset)
                k = ops.qk_norm_rope(k, kn, pos, s.rms_norm_eps, rope, name="k_rope", weight_offset=s.norm_offset)
            else:
                q = ops.rope(q, pos, rope, name="q_rope")
                k = ops.rope(k, pos, rope, name="k_rope")
            # A graph input kv_limit (Gemma 3 with images: dsl/nn_vision.py) lets a token see later keys.
            limit = {"kv_limit": g.values[KV_LIMIT]} if KV_LIMIT in g.values else {}
            o = ops.attention(q, k, v, cu, causal=s.causal, scale=s.attn_scale,
                              window=s.attention_window(self.layer), softcap=s.attn_softcap, sinks=sinks,
                              name="attn", **limit)
        o = ops.view(o, (n, Hq * D))
        return self.o(g, o, dtype, lora)


def _table_rope(g: Graph, q: Value, k: Value, qn: Value | None, kn: Value | None, s: ModelSpec) -> tuple[Value, Value]:
    """q and k (each head RMS-normed first with qk-norm) rotated by the graph's MROPE_COS / MROPE_SIN."""
    if s.qk_norm:
        q = _head_norm(q, qn, s, "q_norm")
        k = _head_norm(k, kn, s, "k_norm")
    cos, sin = g.values[MROPE_COS], g.values[MROPE_SIN]
    return (ops.rope_table(q, cos, sin, name="q_rope", round_products=True),  # HF's text rope rounding
            ops.rope_table(k, cos, sin, name="k_rope", round_products=True))


def _head_norm(x: Value, w: Value, s: ModelSpec, name: str) -> Value:
    """Per-head RMSNorm of [N, H, D] (qk-norm without the rope)."""
    n, H, D = x.shape
    y = ops.rmsnorm(ops.view(x, (n * H, D), name=f"{name}.rows"), w, s.rms_norm_eps, name=name,
                    weight_offset=s.norm_offset)
    return ops.view(y, (n, H, D), name=f"{name}.heads")


class MLP:
    def __init__(self, spec: ModelSpec):
        self.spec = spec
        C, F = spec.hidden_size, spec.intermediate_size
        self.gate_up = Linear("mlp.gate_up_proj", C, [("gate_proj", F), ("up_proj", F)], spec.mlp_bias)
        self.down = Linear("mlp.down_proj", F, [("down_proj", C)], spec.mlp_bias)

    def __call__(self, g: Graph, x: Value, dtype: str, lora: LoRAConfig | None) -> Value:
        """x: the normed rows [N, C]."""
        if lora is not None and self.spec.moe is not None:
            # A dense layer of a MoE model: peft (on transformers 5) turns gate / up / down_proj into
            # the experts' target_parameters, so these Linear layers get no adapter there; nor here.
            lora = dataclasses.replace(lora, targets=tuple(t for t in lora.targets if t not in EXPERT_PROJECTIONS))
        gu = self.gate_up(g, x, dtype, lora)
        a = ops.swiglu(gu, name="mlp.act") if self.spec.activation == "silu" else ops.geglu(gu, name="mlp.act")
        return self.down(g, a, dtype, lora)


EXPERT_PROJECTIONS = frozenset({"gate_proj", "up_proj", "down_proj"})  # HF / peft names in an MoE layer
EXPERT_PARAMETERS = ("gate_up_proj", "down_proj")  # the stacked expert weights, in their module's order


def expert_lora(lora: LoRAConfig | None) -> dict[str, tuple[int, float, float]]:
    """The adapted expert parameters of a MoE layer -> (rank, alpha, scale), as peft 0.21 builds
    them on transformers 5: target_modules gate_proj + up_proj become target_parameters
    gate_up_proj with rank 2r and alpha 2 alpha (rank_pattern / alpha_pattern; one adapter over
    the fused weight), down_proj stays rank r. The names gate_up_proj / down_proj themselves (an
    adapter's target_parameters) mean rank r unless the patterns say otherwise."""
    if lora is None:
        return {}
    t = set(lora.targets)
    halves = t & {"gate_proj", "up_proj"}
    if len(halves) == 1:
        from surogate.errors import UnsupportedError

        (have,) = halves
        raise UnsupportedError(f"LoRA target {have} of a mixture-of-experts layer without "
                               f"{({'gate_proj', 'up_proj'} - halves).pop()}: the experts' gate and up projections "
                               "are one stacked weight (gate_up_proj), adapted together",
                               hint="target both gate_proj and up_proj (peft refuses the same)")
    out = {}
    for p in EXPERT_PARAMETERS:
        fused = p == "gate_up_proj" and len(halves) == 2
        if not (p in t or fused):
            continue
        n = 2 if fused and p not in t else 1
        r = int(lora.rank_pattern.get(p, n * lora.rank))
        a = float(lora.alpha_pattern.get(p, n * lora.alpha))
        out[p] = (r, a, a / (math.sqrt(r) if lora.use_rslora else r))
    if out and lora.dropout > 0:
        from surogate.errors import UnsupportedError

        raise UnsupportedError("lora_dropout with LoRA on a mixture-of-experts layer's experts: peft's adapters "
                               "of stacked expert weights (ParamWrapper) have no dropout",
                               hint="set lora_dropout: 0, or target only the attention projections")
    return out


class MoE:
    """The sparse MLP of a mixture-of-experts layer, as vLLM's fused_moe runs it: the router
    (``mlp.gate``, a Linear to E logits) picks K experts per token, the token rows are permuted
    into expert-contiguous order, each projection is one grouped GEMM over all experts (weights
    [E, out, in], transformers 5's ``mlp.experts.gate_up_proj`` / ``down_proj``), and the rows
    come back weighted by the router. The router's (probs, idx) are kept in ``Graph.moe_routers``
    for the load-balancing loss, its logits in ``Graph.moe_logits`` for the z-loss.

    LoRA on the experts (``expert_lora``): each expert e has its own A[e] [r, in] and B[e]
    [out, r] (``mlp.experts.gate_up_proj.lora_A`` [E, r, C] ...), run as two more grouped GEMMs
    over the same permuted rows: y = x W[e].T + scale (x A[e].T) B[e].T, which is what peft's
    ParamWrapper computes with W[e] + scale B[e] A[e]."""

    def __init__(self, spec: ModelSpec):
        self.spec = spec
        m = spec.moe
        self.gate = Linear(f"mlp.{m.router_name}", spec.hidden_size, [(m.router_name, m.num_experts)], m.router_bias)

    def __call__(self, g: Graph, x: Value, dtype: str, lora: LoRAConfig | None) -> Value:
        m, C = self.spec.moe, self.spec.hidden_size
        E, F = m.num_experts, m.intermediate_size
        adapted = expert_lora(lora)
        train_router = (lora is None) if m.train_router is None else m.train_router
        if lora is not None and train_router and m.router_name != "gate":
            raise UnsupportedError(f"train_router with LoRA on {self.spec.family}: its router (mlp.{m.router_name}, "
                                   "with a bias) has no place in the adapter files yet (peft's modules_to_save "
                                   "there is mlp.gate)", hint="leave train_router off, or fine-tune fully")
        logits = self.gate(g, x, dtype, lora, trainable=train_router)
        g.moe_logits.append(logits)
        w, idx, probs = ops.moe_router(logits, m.top_k, m.norm_topk_prob, name="mlp.router")
        g.moe_routers.append((probs, idx))
        w_gu = g.param("mlp.experts.gate_up_proj", (E, 2 * F, C), dtype, trainable=lora is None)
        w_down = g.param("mlp.experts.down_proj", (E, C, F), dtype, trainable=lora is None)
        xp, rows, offsets = ops.moe_permute(x, idx, E, name="mlp.permute")
        g.moe_offsets.append(offsets)
        gu = self._experts(g, xp, w_gu, offsets, "gate_up_proj", adapted, dtype)
        if m.expert_bias:
            b = g.param("mlp.experts.gate_up_proj_bias", (E, 2 * F), dtype, trainable=lora is None)
            gu = ops.moe_bias_add(gu, b, offsets, name="mlp.experts.gate_up_bias")
        if m.activation == "swiglu_oai":
            a = ops.swiglu_oai(gu, m.swiglu_alpha, m.swiglu_limit, name="mlp.experts.act")
        else:
            a = ops.swiglu(gu, name="mlp.experts.act")
        yp = self._experts(g, a, w_down, offsets, "down_proj", adapted, dtype)
        if m.expert_bias:
            b = g.param("mlp.experts.down_proj_bias", (E, C), dtype, trainable=lora is None)
            yp = ops.moe_bias_add(yp, b, offsets, name="mlp.experts.down_bias")
        return ops.moe_unpermute(yp, rows, w, name="mlp.unpermute")

    def _experts(self, g: Graph, xp: Value, w: Value, offsets: Value, param: str,
                 adapted: dict[str, tuple[int, float, float]], dtype: str) -> Value:
        """One stacked projection over the permuted rows, plus its experts' LoRA where adapted."""
        op = "gate_up" if param == "gate_up_proj" else "down"
        y = ops.moe_grouped_matmul(xp, w, offsets, name=f"mlp.experts.{op}")
        if param not in adapted:
            return y
        r, _, s = adapted[param]
        E, out, inp = w.shape
        A = g.param(f"mlp.experts.{param}.lora_A", (E, r, inp), dtype, lora="A", init="kaiming")
        B = g.param(f"mlp.experts.{param}.lora_B", (E, out, r), dtype, lora="B", init="zeros")
        t = ops.moe_grouped_matmul(xp, A, offsets, name=f"mlp.experts.{op}.lora_a")
        d = ops.moe_grouped_matmul(t, B, offsets, name=f"mlp.experts.{op}.lora_b")
        return ops.add(y, ops.scale(d, s, name=f"mlp.experts.{op}.lora_scaled"), name=f"mlp.experts.{op}.lora")


def mlp_for(spec: ModelSpec, layer: int) -> MLP | MoE:
    """The MLP of ``layer``: sparse where spec.moe lists the layer, dense otherwise."""
    return MoE(spec) if spec.moe is not None and layer in spec.moe.layers else MLP(spec)


class Block:
    """Pre-norm decoder block. Returns (delta, residual): the residual add is folded into the
    next norm (add_rmsnorm), as the fused kernels want."""

    def __init__(self, spec: ModelSpec, layer: int):
        self.spec, self.layer = spec, layer
        self.attn = Attention(spec, layer)
        self.mlp = mlp_for(spec, layer)

    def __call__(self, g: Graph, x: Value, residual: Value | None, pos: Value, cu: Value, dtype: str,
                 lora: LoRAConfig | None, kv: KVCache | None = None) -> tuple[Value, Value]:
        eps = self.spec.rms_norm_eps
        ln1 = g.param("input_layernorm.weight", (self.spec.hidden_size,), dtype, trainable=lora is None)
        ln2 = g.param("post_attention_layernorm.weight", (self.spec.hidden_size,), dtype, trainable=lora is None)
        y, h = pre_norm(x, residual, ln1, eps, "ln1")
        a = self.attn(g, y, pos, cu, dtype, lora, kv)
        y, h = pre_norm(a, h, ln2, eps, "ln2")
        return self.mlp(g, y, dtype, lora), h


class SandwichBlock:
    """Gemma's decoder block: each of attention and MLP between a pre-norm and a post-norm (its
    output normed before it joins the residual stream), HF's input_layernorm /
    post_attention_layernorm around attention and pre_feedforward_layernorm /
    post_feedforward_layernorm around the MLP, each times (spec.norm_offset + w). Returns
    (delta, residual) like Block: the normed MLP output is added by the next block's first norm."""

    def __init__(self, spec: ModelSpec, layer: int):
        self.spec, self.layer = spec, layer
        self.attn = Attention(spec, layer)
        self.mlp = MLP(spec)

    def __call__(self, g: Graph, x: Value, residual: Value | None, pos: Value, cu: Value, dtype: str,
                 lora: LoRAConfig | None, kv: KVCache | None = None) -> tuple[Value, Value]:
        s = self.spec
        eps, off = s.rms_norm_eps, s.norm_offset

        def norm_weight(name: str) -> Value:
            return g.param(f"{name}.weight", (s.hidden_size,), dtype, trainable=lora is None)

        y, h = pre_norm(x, residual, norm_weight("input_layernorm"), eps, "ln1", off)
        a = ops.rmsnorm(self.attn(g, y, pos, cu, dtype, lora, kv), norm_weight("post_attention_layernorm"), eps,
                        name="attn_post_norm", weight_offset=off)
        y, h = pre_norm(a, h, norm_weight("pre_feedforward_layernorm"), eps, "ln2", off)
        m = ops.rmsnorm(self.mlp(g, y, dtype, lora), norm_weight("post_feedforward_layernorm"), eps,
                        name="mlp_post_norm", weight_offset=off)
        return m, h


class CausalLM:
    """Embedding, blocks, final norm and head. `build` traces a graph for training (per-token
    loss, fused with the head) or for logits (inference and tests). ``block``: the decoder block
    class (Block; Gemma's SandwichBlock)."""

    def __init__(self, spec: ModelSpec, block: type = Block):
        self.spec = spec
        self.blocks = [block(spec, i) for i in range(spec.num_layers)]

    def build(self, *, mode: str = "train", dtype: str = "float32", lora: LoRAConfig | None = None,
              ce_chunk: int = 4096, kv: KVCache | None = None, quant: dict[str, int] | None = None,
              temperature: float = 1.0) -> Graph:
        """mode: "train" (per-token loss fused with the head), "logits" (every row's logits),
        "hidden" (every row's final hidden state, after the final norm, no head: HF's
        last_hidden_state, what embeddings pool) or "serve" (over the paged KV cache `kv`;
        logits only for the rows in `logits_rows`). `quant` names the projection weights kept as
        GGML blocks (parameter -> ggml type). ``temperature`` (train mode): the loss is over
        logits / temperature (GRPO's log-probs of a sampling temperature, as TRL computes them)."""
        if mode not in ("train", "logits", "hidden", "serve"):
            raise ValueError(f"mode must be 'train', 'logits', 'hidden' or 'serve', got {mode!r}")
        if (mode == "serve") != (kv is not None):
            raise ValueError("mode 'serve' and a KV cache go together")
        s = self.spec
        if mode == "serve" and not s.causal:
            raise UnsupportedError(f"{s.family}: a model with bidirectional attention (an encoder) does not generate",
                                   hint="serve it for /v1/embeddings only (surogate serve starts no engine for it)")
        if lora is not None and lora.dropout > 0 and mode != "train":
            lora = dataclasses.replace(lora, dropout=0.0)  # dropout only in training graphs
        g = Graph(f"{s.family}-{mode}")
        g.quant = dict(quant or {})
        g.kv = kv
        ids = g.input("input_ids", (N,), "int32")
        pos = g.input("position_ids", (N,), "int32")
        if kv is not None:
            kv.slots = g.input("slot_mapping", (N,), "int32")
            kv.block_tables = g.input("block_tables", (Dim("S"), Dim("B")), "int32")
            kv.cu_q = g.input("cu_q", (Dim("S1"),), "int32")
            kv.context_lens = g.input("context_lens", (Dim("S"),), "int32")
            if kv.embeds:
                kv.kv_limit = g.input("kv_limit", (N,), "int32")
            cu = kv.cu_q
        else:
            cu = g.input("cu_seqlens", (Dim("S1"),), "int32")
        emb = g.param("embed_tokens.weight", (s.vocab_size, s.hidden_size), dtype, trainable=lora is None)
        x = self.embed(g, ids, emb, dtype, lora)
        if kv is not None and kv.embeds:  # the request's rows replace the embeddings they cover
            x = self.embed_request_rows(g, x, pos, kv)
        residual = None
        for i, block in enumerate(self.blocks):
            with g.scope(f"layers.{i}"):
                x, residual = block(g, x, residual, pos, cu, dtype, lora, kv)
            x = self.after_block(g, i, x)
        fn = g.param("norm.weight", (s.hidden_size,), dtype, trainable=lora is None)
        if mode == "serve":  # only the rows that need logits go through the final norm and head
            rows = g.input("logits_rows", (Dim("R"),), "int32")
            x = ops.embedding(rows, x, name="x_rows")
            residual = None if residual is None else ops.embedding(rows, residual, name="residual_rows")
        y, _ = pre_norm(x, residual, fn, s.rms_norm_eps, "final_norm", s.norm_offset)
        if mode == "hidden":
            g.mark_output("hidden", y)
            return g
        head = emb if s.tie_word_embeddings else g.param("lm_head.weight", (s.vocab_size, s.hidden_size), dtype,
                                                         trainable=lora is None)
        if mode == "train":
            targets = g.input("targets", (N,), "int32")
            if temperature != 1.0:  # (h / T) W^T = logits / T; a soft cap is not linear in h
                if s.final_softcap:
                    raise ValueError("a temperature on a model with a final logit soft cap is not supported")
                y = ops.scale(y, 1.0 / temperature, name="final_norm_tempered")
            loss = ops.lm_head_ce(y, head, targets, softcap=s.final_softcap, chunk=ce_chunk, name="loss")
            g.mark_output("loss", loss)
            if s.moe is not None and s.moe.router_aux_loss_coef > 0 and g.moe_routers:
                # Seeded with the coefficient (graph input daux_loss) by whoever runs the backward.
                g.mark_output("aux_loss", ops.moe_aux_loss(g.moe_routers))
            if s.moe is not None and s.moe.router_z_loss_coef > 0 and g.moe_logits:
                # Seeded with its coefficient (graph input dz_loss), as aux_loss.
                g.mark_output("z_loss", ops.moe_z_loss(g.moe_logits))
        else:
            if s.final_softcap:  # the capped value is the one named "logits" (what callers read)
                logits = ops.softcap(ops.linear(y, head, name="logits_uncapped"), s.final_softcap, name="logits")
            else:
                logits = ops.linear(y, head, name="logits")
            g.mark_output("logits", logits)
            if mode == "serve" and kv.sample:
                params = g.input("sample_params", (Dim("R"), 8), "float32")
                token, logprob, rank = ops.sample(logits, params)
                g.mark_output("sampled", token)
                g.mark_output("sampled.logprob", logprob)
                g.mark_output("sampled.rank", rank)
            elif mode == "serve":
                g.mark_output("argmax", ops.argmax(logits))
        return g

    def after_block(self, g: Graph, layer: int, x: Value) -> Value:
        """The block's output delta as the next block reads it (Qwen3-VL adds DeepStack rows)."""
        return x

    @property
    def embed_width(self) -> int:
        """The width of a serving step's ``embed_rows`` (the engine's EmbedSpan rows): the hidden size."""
        return self.spec.hidden_size

    def serve_tables(self, kv: KVCache) -> dict:
        """Constant inputs of the serving graphs beside the weights (name -> array), bound once per Program."""
        return {}

    def embed_request_rows(self, g: Graph, x: Value, pos: Value, kv: KVCache) -> Value:
        """A serving step's request rows (``embed_rows`` [E, embed_width] at token rows ``embed_index``)
        in place of the embeddings they cover."""
        index = g.input("embed_index", (Dim("E"),), "int32")
        return ops.embed_rows(x, index, g.input("embed_rows", (Dim("E"), self.embed_width), "float32"))

    def embed(self, g: Graph, ids: Value, table: Value, dtype: str, lora: LoRAConfig | None) -> Value:
        """The rows the first block reads: the token embeddings (Gemma: scaled)."""
        x = ops.embedding(ids, table, name="embed")
        if self.spec.embed_scale:  # HF multiplies by sqrt(hidden) rounded to the embedding's dtype
            x = ops.scale(x, round_to(math.sqrt(self.spec.hidden_size), dtype), name="embed_scaled")
        return x
