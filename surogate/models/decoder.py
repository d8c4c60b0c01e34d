"""What the dense decoder families share, in Hugging Face's and llama.cpp's vocabulary: the HF
config keys every Llama-like config has, the HF tensor names of the shared blocks (dsl/nn.py),
and llama.cpp's tensor names for them. A family file (llama.py, qwen3.py) composes its own
from these with its choices (qk-norm, llama.cpp's rope row order); a family that differs writes
its own instead.
"""

from __future__ import annotations

import math

from surogate.dsl.nn import ModelSpec
from surogate.errors import ConfigError
from surogate.models.gguf_names import GGUFName, GGUFNameTable
from surogate.models.name_table import Direct, Fuse, NameTable

ACTIVATIONS = ("silu", "gelu_pytorch_tanh")


def rope_from_config(cfg: dict) -> dict:
    """Our rope attributes from either HF config style: v4 (rope_theta + rope_scaling) or v5
    (rope_parameters)."""
    params = dict(cfg.get("rope_parameters") or {})
    scaling = cfg.get("rope_scaling") or {}
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    src = params if params.get("rope_type") else scaling
    attrs = {"theta": float(theta), "rope_type": str(rope_type)}
    if rope_type == "llama3":
        for key, ours in (("factor", "factor"), ("low_freq_factor", "low_freq_factor"),
                          ("high_freq_factor", "high_freq_factor"),
                          ("original_max_position_embeddings", "original_max_position")):
            if key not in src:
                raise ConfigError(f"rope_scaling: llama3 rope needs '{key}'", hint="check config.json")
            attrs[ours] = float(src[key])
    elif rope_type == "linear":
        attrs["factor"] = float(src.get("factor", 1.0))
    elif rope_type == "yarn":
        attrs.update(yarn_attrs(cfg, src, float(theta)))
    elif rope_type != "default":
        raise ConfigError(f"rope type {rope_type!r} is not supported yet",
                          hint="supported: default, linear, llama3, yarn")
    return attrs


def yarn_attrs(cfg: dict, src: dict, theta: float) -> dict:
    """YaRN as transformers' _compute_yarn_parameters: the native op blends inv_freq / factor and
    inv_freq over the pairs [yarn_low, yarn_high] (the correction range, computed here in Python
    floats as HF does) and scales cos / sin by attention_factor. The rope_scaling keys stay in
    the attrs too (GGUF export writes them)."""
    heads = int(cfg.get("num_attention_heads") or 1)
    head_dim = int(cfg.get("head_dim") or int(cfg.get("hidden_size", 0)) // heads)
    dim = int(head_dim * float(src.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))))
    omp = src.get("original_max_position_embeddings") or cfg.get("max_position_embeddings")
    if not omp:
        raise ConfigError("rope_scaling: yarn rope needs 'original_max_position_embeddings'", hint="check config.json")
    omp = float(omp)
    factor = src.get("factor")
    factor = float(factor) if factor is not None else float(cfg["max_position_embeddings"]) / omp

    def get_mscale(scale: float, mscale: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    attention_factor = src.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = src.get("mscale"), src.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
        else:
            attention_factor = get_mscale(factor)
    beta_fast = float(src.get("beta_fast") or 32)
    beta_slow = float(src.get("beta_slow") or 1)
    truncate = bool(src.get("truncate", True))

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(omp / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return {"factor": factor, "yarn_low": float(max(low, 0)), "yarn_high": float(min(high, dim - 1)),
            "attention_factor": float(attention_factor), "original_max_position": omp,
            "beta_fast": beta_fast, "beta_slow": beta_slow, "truncate": int(truncate)}


def _req(cfg: dict, key: str):
    if key not in cfg:
        raise ConfigError(f"config.json has no '{key}'", hint="is this a complete Hugging Face config?")
    return cfg[key]


def spec_from_config(cfg: dict, family: str, *, qk_norm: bool = False) -> ModelSpec:
    """A ModelSpec from the keys a Llama-style HF config has; ``qk_norm``: per-head RMSNorm on q
    and k before rope (Qwen3)."""
    hidden = int(_req(cfg, "hidden_size"))
    heads = int(_req(cfg, "num_attention_heads"))
    layers = int(_req(cfg, "num_hidden_layers"))
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    act = cfg.get("hidden_act", "silu")
    if act not in ACTIVATIONS:
        raise ConfigError(f"hidden_act {act!r} is not supported", hint="supported: " + ", ".join(ACTIVATIONS))
    windows: list[int] = []
    window = cfg.get("sliding_window")
    layer_types = cfg.get("layer_types")
    if window and cfg.get("use_sliding_window", True) and layer_types:
        windows = [int(window) if t == "sliding_attention" else 0 for t in layer_types]
    partial = float(cfg.get("partial_rotary_factor", 1.0))
    return ModelSpec(
        family=family,
        vocab_size=int(_req(cfg, "vocab_size")),
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        intermediate_size=int(_req(cfg, "intermediate_size")),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope=rope_from_config(cfg),
        rotary_dim=int(head_dim * partial) if partial != 1.0 else None,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qk_norm=qk_norm,
        attention_bias=bool(cfg.get("attention_bias", False)),
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        activation=act,
        sliding_windows=windows,
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_id=cfg.get("eos_token_id"),
    )


# The projections of the shared blocks, as block-FP8 releases quantize them (Family.fp8_linears).
FP8_PROJECTIONS = r"\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.weight"
FP8_LINEARS = r"model" + FP8_PROJECTIONS


def hf_name_table(*, qk_norm: bool = False) -> NameTable:
    """Our parameters (dsl/nn.py's blocks) <- HF's ``model.*`` tensors; gate and up fused."""
    L = "model.layers.{i}."
    e = {
        "embed_tokens.weight": Direct("model.embed_tokens.weight"),
        "norm.weight": Direct("model.norm.weight"),
        "lm_head.weight": Direct("lm_head.weight"),
        "layers.{i}.input_layernorm.weight": Direct(L + "input_layernorm.weight"),
        "layers.{i}.post_attention_layernorm.weight": Direct(L + "post_attention_layernorm.weight"),
        "layers.{i}.mlp.gate_up_proj.weight": Fuse((L + "mlp.gate_proj.weight", L + "mlp.up_proj.weight")),
        "layers.{i}.mlp.gate_up_proj.bias": Fuse((L + "mlp.gate_proj.bias", L + "mlp.up_proj.bias")),
        "layers.{i}.mlp.down_proj.weight": Direct(L + "mlp.down_proj.weight"),
        "layers.{i}.mlp.down_proj.bias": Direct(L + "mlp.down_proj.bias"),
    }
    for p in ("q_proj", "k_proj", "v_proj", "o_proj"):
        e[f"layers.{{i}}.self_attn.{p}.weight"] = Direct(L + f"self_attn.{p}.weight")
        e[f"layers.{{i}}.self_attn.{p}.bias"] = Direct(L + f"self_attn.{p}.bias")
    if qk_norm:
        e["layers.{i}.self_attn.q_norm.weight"] = Direct(L + "self_attn.q_norm.weight")
        e["layers.{i}.self_attn.k_norm.weight"] = Direct(L + "self_attn.k_norm.weight")
    return NameTable(e)


def gguf_tensor_table(*, rope_permuted: bool, qk_norm: bool = False) -> GGUFNameTable:
    """HF tensor names <-> llama.cpp's (convert_hf_to_gguf.py's) for the shared blocks.
    ``rope_permuted``: q_proj / k_proj rows stored in llama.cpp's interleaved rope order (its
    LLAMA rope type; families it runs with NEOX rope keep HF's order)."""
    L, B = "model.layers.{i}.", "blk.{i}."
    e = {
        "model.embed_tokens.weight": GGUFName("token_embd.weight"),
        "model.norm.weight": GGUFName("output_norm.weight"),
        "lm_head.weight": GGUFName("output.weight"),
        L + "input_layernorm.weight": GGUFName(B + "attn_norm.weight"),
        L + "post_attention_layernorm.weight": GGUFName(B + "ffn_norm.weight"),
    }
    for hf, gg in (("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"), ("self_attn.v_proj", "attn_v"),
                   ("self_attn.o_proj", "attn_output"), ("mlp.gate_proj", "ffn_gate"), ("mlp.up_proj", "ffn_up"),
                   ("mlp.down_proj", "ffn_down")):
        rope = gg[-1] if rope_permuted and gg in ("attn_q", "attn_k") else None
        for part in ("weight", "bias"):
            e[f"{L}{hf}.{part}"] = GGUFName(f"{B}{gg}.{part}", rope)
    if qk_norm:
        e[L + "self_attn.q_norm.weight"] = GGUFName(B + "attn_q_norm.weight")
        e[L + "self_attn.k_norm.weight"] = GGUFName(B + "attn_k_norm.weight")
    return GGUFNameTable(e)
