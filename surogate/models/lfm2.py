"""LFM2 / LFM2.5 (Lfm2ForCausalLM, model_type lfm2): Liquid AI's hybrid of gated short
convolutions and GQA attention.

Each layer is a pre-norm block (HF's operator_norm and ffn_norm) whose mixer is either attention
(q / k per-head RMSNorm, HF's q_layernorm / k_layernorm, then NEOX rope; out_proj) or the gated
short convolution (Lfm2ShortConv: in_proj -> [B, C, x] -> C * causal depthwise conv1d(B * x) of
conv_L_cache taps -> out_proj; the conv is the native short_conv op), per layer_types (or
full_attn_idxs, HF's older key); the MLP is SwiGLU (w1 gate, w3 up, w2 down) whose width follows
block_auto_adjust_ff_dim; the last layer's output goes through embedding_norm (HF's name for the
final norm). Embeddings are tied by default.

In GGUF (llama.cpp's convert_hf_to_gguf.py LFM2Model): architecture "lfm2", NEOX rope (HF's row
order), head_count_kv per layer with 0 for a conv layer (how the layer kinds are written), the
conv taps as lfm2.shortconv.l_cache, the conv weight squeezed to [C, L] and kept F32 (ggml's
ssm_conv reads F32), the final norm as token_embd_norm, the block norms as attn_norm / ffn_norm,
the conv's projections as shortconv.in_proj / shortconv.out_proj.
"""

from __future__ import annotations

import dataclasses

from surogate.dsl import nn, ops
from surogate.dsl.graph import Graph, Value
from surogate.errors import ConfigError
from surogate.io import gguf_config
from surogate.models import decoder
from surogate.models.family import ChatDefaults, Family, GGUFArchitecture, TinyModel
from surogate.models.gguf_names import GGUFName, GGUFNameTable
from surogate.models.name_table import Direct, Fuse, NameTable

DEFAULT_THETA = 1_000_000.0  # Lfm2Config.default_theta
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "out_proj", "in_proj", "w1", "w2", "w3")  # peft's module names


def layer_types(cfg: dict) -> list[str]:
    """Each layer's mixer as HF names it ("full_attention" or "conv"): layer_types, else
    full_attn_idxs (every layer attention when neither is given, as Lfm2Config has it)."""
    n = int(decoder._req(cfg, "num_hidden_layers"))
    types = cfg.get("layer_types")
    if types is None:
        idxs = cfg.get("full_attn_idxs")
        idxs = set(range(n) if idxs is None else idxs)
        types = ["full_attention" if i in idxs else "conv" for i in range(n)]
    if len(types) != n or not set(types) <= {"full_attention", "conv"}:
        raise ConfigError(f"config.json: layer_types must give full_attention or conv for each of the {n} layers, "
                          f"got {types}", hint="check config.json")
    return list(types)


def ff_dim(cfg: dict) -> int:
    """The MLP width Lfm2MLP builds: with block_auto_adjust_ff_dim, 2/3 of intermediate_size
    (block_ff_dim), times block_ffn_dim_multiplier rounded up to block_multiple_of when the
    multiplier is set (transformers rounds only then; llama.cpp's converter always rounds, and
    writes the width it computed, so a file carries the size either way)."""
    ff = int(cfg.get("block_ff_dim") or decoder._req(cfg, "intermediate_size"))
    if cfg.get("block_auto_adjust_ff_dim", True):
        ff = int(2 * ff / 3)
        mult = cfg.get("block_ffn_dim_multiplier", 1.0)
        if mult is not None:
            multiple = int(cfg.get("block_multiple_of", 256))
            ff = int(mult * ff)
            ff = multiple * ((ff + multiple - 1) // multiple)
    return ff


def spec_from_config(cfg: dict) -> nn.ModelSpec:
    rope = dict(cfg.get("rope_parameters") or {})
    rope.setdefault("rope_theta", cfg.get("rope_theta", DEFAULT_THETA))
    tie = cfg.get("tie_word_embeddings", cfg.get("tie_embedding", True))
    base = {**cfg, "intermediate_size": ff_dim(cfg), "rms_norm_eps": cfg.get("norm_eps", 1e-5), "hidden_act": "silu",
            "rope_parameters": rope, "tie_word_embeddings": tie, "sliding_window": None}
    spec = decoder.spec_from_config(base, "lfm2", qk_norm=True)
    kinds = ["attention" if t == "full_attention" else "conv" for t in layer_types(cfg)]
    return dataclasses.replace(spec, layer_kinds=kinds, conv_kernel=int(cfg.get("conv_L_cache", 3)),
                               conv_bias=bool(cfg.get("conv_bias", False)))


# ---- the module tree ------------------------------------------------------------------------
class Attention(nn.Attention):
    """nn.Attention with qk-norm, its output projection under HF's name out_proj."""

    def __init__(self, spec: nn.ModelSpec, layer: int):
        super().__init__(spec, layer)
        self.o = nn.Linear("self_attn.out_proj", spec.num_heads * spec.head_dim, [("out_proj", spec.hidden_size)])


class ShortConv:
    """Lfm2ShortConv: out_proj(C * conv(B * x)), [B, C, x] = in_proj(x)."""

    def __init__(self, spec: nn.ModelSpec, layer: int):
        self.spec, self.layer = spec, layer
        C = spec.hidden_size
        self.in_proj = nn.Linear("conv.in_proj", C, [("in_proj", 3 * C)], spec.conv_bias)
        self.out_proj = nn.Linear("conv.out_proj", C, [("out_proj", C)], spec.conv_bias)

    def __call__(self, g: Graph, x: Value, pos: Value, cu: Value, dtype: str, lora: nn.LoRAConfig | None,
                 kv: nn.KVCache | None = None) -> Value:
        s = self.spec
        C, L = s.hidden_size, s.conv_kernel
        bcx = self.in_proj(g, x, dtype, lora)
        w = g.param("conv.conv.weight", (C, 1, L), dtype, trainable=lora is None)
        b = g.param("conv.conv.bias", (C,), dtype, trainable=lora is None) if s.conv_bias else None
        if kv is not None:  # serving: the window continues from each sequence's conv state
            state = kv.conv_state(g, C, L, dtype)
            y = ops.short_conv_cache(bcx, w, kv.state_slots, kv.cu_q, kv.context_lens, state, bias=b, name="conv")
        else:
            y = ops.short_conv(bcx, w, cu, bias=b, name="conv")
        return self.out_proj(g, y, dtype, lora)


class MLP(nn.MLP):
    """SwiGLU under HF's names: w1 (gate) and w3 (up) fused, w2 down."""

    def __init__(self, spec: nn.ModelSpec):
        super().__init__(spec)
        C, F = spec.hidden_size, spec.intermediate_size
        self.gate_up = nn.Linear("feed_forward.w13", C, [("w1", F), ("w3", F)])
        self.down = nn.Linear("feed_forward.w2", F, [("w2", C)])


class Block(nn.Block):
    """A pre-norm block whose mixer is attention or the short convolution, per spec.layer_kinds
    (its norms are nn.Block's input_layernorm / post_attention_layernorm: HF's operator_norm /
    ffn_norm in the name table)."""

    def __init__(self, spec: nn.ModelSpec, layer: int):
        self.spec, self.layer = spec, layer
        self.attn = ShortConv(spec, layer) if spec.is_conv(layer) else Attention(spec, layer)
        self.mlp = MLP(spec)


def architecture(spec: nn.ModelSpec) -> nn.CausalLM:
    return nn.CausalLM(spec, block=Block)


# ---- names ----------------------------------------------------------------------------------
def hf_name_table() -> NameTable:
    L = "model.layers.{i}."
    e = {
        "embed_tokens.weight": Direct("model.embed_tokens.weight"),
        "norm.weight": Direct("model.embedding_norm.weight"),
        "lm_head.weight": Direct("lm_head.weight"),
        "layers.{i}.input_layernorm.weight": Direct(L + "operator_norm.weight"),
        "layers.{i}.post_attention_layernorm.weight": Direct(L + "ffn_norm.weight"),
        "layers.{i}.feed_forward.w13.weight": Fuse((L + "feed_forward.w1.weight", L + "feed_forward.w3.weight")),
        "layers.{i}.feed_forward.w2.weight": Direct(L + "feed_forward.w2.weight"),
        "layers.{i}.self_attn.q_norm.weight": Direct(L + "self_attn.q_layernorm.weight"),
        "layers.{i}.self_attn.k_norm.weight": Direct(L + "self_attn.k_layernorm.weight"),
    }
    for p in ("q_proj", "k_proj", "v_proj", "out_proj"):
        e[f"layers.{{i}}.self_attn.{p}.weight"] = Direct(L + f"self_attn.{p}.weight")
    for p in ("in_proj", "out_proj", "conv"):
        for part in ("weight", "bias"):
            e[f"layers.{{i}}.conv.{p}.{part}"] = Direct(f"{L}conv.{p}.{part}")
    return NameTable(e)


def gguf_tensor_table() -> GGUFNameTable:
    L, B = "model.layers.{i}.", "blk.{i}."
    e = {
        "model.embed_tokens.weight": GGUFName("token_embd.weight"),
        "model.embedding_norm.weight": GGUFName("token_embd_norm.weight"),
        "lm_head.weight": GGUFName("output.weight"),
        L + "operator_norm.weight": GGUFName(B + "attn_norm.weight"),
        L + "ffn_norm.weight": GGUFName(B + "ffn_norm.weight"),
        L + "self_attn.q_layernorm.weight": GGUFName(B + "attn_q_norm.weight"),
        L + "self_attn.k_layernorm.weight": GGUFName(B + "attn_k_norm.weight"),
        L + "conv.conv.weight": GGUFName(B + "shortconv.conv.weight", squeeze=1, f32=True),
        L + "conv.conv.bias": GGUFName(B + "shortconv.conv.bias"),
    }
    for hf, gg in (("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"), ("self_attn.v_proj", "attn_v"),
                   ("self_attn.out_proj", "attn_output"), ("feed_forward.w1", "ffn_gate"),
                   ("feed_forward.w3", "ffn_up"), ("feed_forward.w2", "ffn_down"),
                   ("conv.in_proj", "shortconv.in_proj"), ("conv.out_proj", "shortconv.out_proj")):
        for part in ("weight", "bias"):
            e[f"{L}{hf}.{part}"] = GGUFName(f"{B}{gg}.{part}")
    return GGUFNameTable(e)


class _OneKVCount:
    """A GGUF file whose per-layer head_count_kv reads as the attention layers' count, for the
    common reader (which takes one value for every layer)."""

    def __init__(self, gf, kv_heads: int):
        self._gf, self._kv = gf, kv_heads

    def get(self, key: str, default=None):
        return self._kv if key == "lfm2.attention.head_count_kv" else self._gf.get(key, default)

    def __getattr__(self, name: str):
        return getattr(self._gf, name)


def config_from_gguf(gf) -> dict:
    kv = gf.get("lfm2.attention.head_count_kv")
    per_layer = [int(v) for v in kv] if isinstance(kv, list) else None
    cfg = gguf_config.hf_config(_OneKVCount(gf, max(per_layer)) if per_layer else gf, "Lfm2ForCausalLM", "lfm2")
    n = cfg["num_hidden_layers"]
    kinds = ["full_attention" if v else "conv" for v in per_layer] if per_layer else ["full_attention"] * n
    if len(kinds) != n:
        raise ConfigError(f"{gf.path}: lfm2.attention.head_count_kv has {len(kinds)} entries for {n} layers",
                          hint="the file is damaged")
    cfg.update(layer_types=kinds, full_attn_idxs=[i for i, t in enumerate(kinds) if t == "full_attention"],
               conv_L_cache=int(gf.get("lfm2.shortconv.l_cache") or 3), norm_eps=cfg["rms_norm_eps"],
               rope_parameters={"rope_type": "default", "rope_theta": cfg["rope_theta"]},
               block_auto_adjust_ff_dim=False, conv_bias=any(f"blk.{i}.shortconv.in_proj.bias" in gf.tensors
                                                             for i in range(n)))
    return cfg


def gguf_metadata(config: dict, rope: dict) -> dict:
    spec = spec_from_config(config)
    hf = {**config, "intermediate_size": spec.intermediate_size, "rms_norm_eps": spec.rms_norm_eps,
          "tie_word_embeddings": spec.tie_word_embeddings}
    meta = gguf_config.hyperparameters("lfm2", hf, rope)
    meta["lfm2.attention.head_count_kv"] = [spec.num_kv_heads if k == "attention" else 0 for k in spec.layer_kinds]
    meta["lfm2.shortconv.l_cache"] = spec.conv_kernel
    meta["lfm2.vocab_size"] = spec.vocab_size
    return meta


def bench_hf_config(spec: nn.ModelSpec) -> dict:
    """The HF config keys a bench shape needs beyond the common ones (bench/shapes.py hf_config)."""
    return {"layer_types": ["full_attention" if k == "attention" else "conv" for k in spec.layer_kinds],
            "conv_L_cache": spec.conv_kernel, "conv_bias": spec.conv_bias, "block_auto_adjust_ff_dim": False,
            "norm_eps": spec.rms_norm_eps}


_ATTN_1_2B = (2, 5, 8, 10, 12, 14)  # LFM2-350M / 1.2B: 10 conv and 6 attention layers

FAMILY = Family(
    name="lfm2",
    hf_architectures=("Lfm2ForCausalLM",),
    model_types=("lfm2",),
    spec_from_config=spec_from_config,
    architecture=architecture,
    lora_targets=LORA_TARGETS,
    bench_hf_config=bench_hf_config,
    name_table=hf_name_table,
    gguf=GGUFArchitecture(
        name="lfm2",
        tensors=gguf_tensor_table,
        config_from_gguf=config_from_gguf,
        metadata=gguf_metadata,
    ),
    # LFM2's template writes its call tokens (<|tool_call_start|>): serve/parsers/registry.py
    # finds the pythonic parser from the template; this covers templates that do not show it.
    chat=ChatDefaults(tool_parser="lfm2", model_types=("lfm2",)),
    bench_shapes={
        # LiquidAI/LFM2-1.2B's config.json: block_ff_dim 12288 auto-adjusted to 8192.
        "lfm2-1.2b": dict(vocab_size=65536, hidden_size=2048, num_layers=16, num_heads=32, num_kv_heads=8,
                          head_dim=64, intermediate_size=8192, rms_norm_eps=1e-5, qk_norm=True,
                          tie_word_embeddings=True, rope={"theta": DEFAULT_THETA, "rope_type": "default"},
                          layer_kinds=["attention" if i in _ATTN_1_2B else "conv" for i in range(16)],
                          conv_kernel=3),
    },
    # Four layers (conv, attention, conv, conv), GQA 4/2, head 16, tied, the 2/3 MLP rule with
    # rounding to 32; variants: untied with conv biases and 4 taps, attention first and last with
    # MHA and odd widths, two layers of 2 taps with GQA 4/1.
    tiny=TinyModel(
        tokenizer="chatml",
        config={"hidden_size": 64, "intermediate_size": 144, "num_hidden_layers": 4, "num_attention_heads": 4,
                "num_key_value_heads": 2, "max_position_embeddings": 256, "norm_eps": 1e-5,
                "layer_types": ["conv", "full_attention", "conv", "conv"], "conv_L_cache": 3,
                "block_multiple_of": 32, "block_ffn_dim_multiplier": 1.0, "block_auto_adjust_ff_dim": True,
                "tie_word_embeddings": True, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
                "pad_token_id": None},
        bos_token=None,
        eos_token="<|im_end|>",
        variants={
            "untied-bias-l4": {"tie_word_embeddings": False, "conv_bias": True, "conv_L_cache": 4,
                               "num_hidden_layers": 3, "layer_types": ["conv", "conv", "full_attention"],
                               "block_auto_adjust_ff_dim": False, "intermediate_size": 96},
            "mha-attn-ends": {"num_key_value_heads": 3, "hidden_size": 48, "num_attention_heads": 3,
                              "intermediate_size": 100, "block_multiple_of": 16,
                              "layer_types": ["full_attention", "conv", "full_attention"], "num_hidden_layers": 3},
            "l2-taps2": {"num_hidden_layers": 2, "layer_types": ["full_attention", "conv"], "conv_L_cache": 2,
                         "num_key_value_heads": 1},
        },
        gguf={"hidden_size": 256, "intermediate_size": 512, "block_auto_adjust_ff_dim": False,
              "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
              "layer_types": ["conv", "full_attention"]},
    ),
)
