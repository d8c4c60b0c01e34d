"""GPT-OSS (openai/gpt-oss-20b, -120b) as transformers' GptOssForCausalLM: attention with q / k / v
/ o biases and a learned sink logit per query head (``self_attn.sinks``, in every softmax's
denominator: the attention ops' sinks input), layers alternating sliding-window and full
attention (``layer_types``), YaRN rope (decoder.yarn_attrs), and on every layer a mixture of
experts: the router ``mlp.router`` (a Linear with bias) takes the top K logits and softmaxes
them (our router's softmax, top K, renormalised: the same function), each expert is
gate_up_proj (+ bias) -> the clamped SwiGLU over interleaved gate / up columns (alpha 1.702,
limit 7.0, (up + 1) * glu) -> down_proj (+ bias).

transformers holds the experts as [E, in, out] (``mlp.experts.gate_up_proj`` [E, C, 2F],
``down_proj`` [E, F, C]); ours are [E, out, in] like Qwen3-MoE's (name_table.Experts transposed),
the 2F rows of gate_up_proj kept in HF's interleaved order (gate 2j, up 2j + 1), so LoRA on the
experts has peft's ParamWrapper layout (peft.py) unchanged: its A [E * r, in], B [out, r * E].
OpenAI's release stores those two as MXFP4 (``*_blocks`` / ``*_scales``, quantization_config
quant_method mxfp4), dequantized at load (io/quantized_checkpoint.py)."""

from __future__ import annotations

import dataclasses

from surogate.dsl import nn
from surogate.errors import ConfigError, UnsupportedError
from surogate.io import gguf_config
from surogate.models import decoder
from surogate.models.family import ChatDefaults, Family, GGUFArchitecture, TinyModel
from surogate.models.gguf_names import GGUFName, GGUFNameTable
from surogate.models.name_table import Direct, Experts, NameTable

# GptOssConfig's default rope (its __post_init__), which the released configs carry too.
YARN = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
        "original_max_position_embeddings": 4096}


def _with_defaults(cfg: dict) -> dict:
    """GptOssConfig's defaults for the keys a config may leave out (layer_types, the yarn rope)."""
    cfg = dict(cfg)
    n = int(cfg["num_hidden_layers"])
    if not cfg.get("layer_types"):
        cfg["layer_types"] = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    if not cfg.get("rope_parameters") and not cfg.get("rope_scaling"):
        cfg["rope_parameters"] = dict(YARN, rope_theta=float(cfg.get("rope_theta", 150000.0)))
    elif cfg.get("rope_parameters") and "rope_theta" not in cfg["rope_parameters"]:
        cfg["rope_parameters"] = dict(cfg["rope_parameters"], rope_theta=float(cfg.get("rope_theta", 150000.0)))
    if "rope_theta" not in cfg and not (cfg.get("rope_parameters") or {}).get("rope_theta"):
        cfg["rope_theta"] = 150000.0
    return cfg


def spec_from_config(cfg: dict) -> nn.ModelSpec:
    cfg = _with_defaults(cfg)
    experts = int(cfg.get("num_local_experts") or cfg.get("num_experts") or 0)
    if experts <= 0:
        raise ConfigError("config.json: num_local_experts must be > 0 for GPT-OSS", hint="check config.json")
    spec = decoder.spec_from_config(cfg, "gpt_oss")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"config.json: GPT-OSS hidden_act {cfg['hidden_act']!r} is not silu")
    windows = [int(cfg["sliding_window"]) if t == "sliding_attention" and cfg.get("sliding_window") else 0
               for t in cfg["layer_types"]]
    coef = float(cfg.get("router_aux_loss_coef", 0.001)) if cfg.get("output_router_logits", False) else 0.0
    bias = bool(cfg.get("attention_bias", True))
    moe = nn.MoESpec(num_experts=experts, top_k=int(cfg.get("num_experts_per_tok", 4)),
                     intermediate_size=int(cfg["intermediate_size"]), layers=tuple(range(spec.num_layers)),
                     norm_topk_prob=True, router_aux_loss_coef=coef, router_name="router", router_bias=True,
                     expert_bias=True, activation="swiglu_oai",
                     swiglu_alpha=float(cfg.get("swiglu_alpha", 1.702)),
                     swiglu_limit=float(cfg.get("swiglu_limit", 7.0)))
    return dataclasses.replace(spec, sliding_windows=windows, attention_bias=bias, attention_out_bias=bias,
                               attention_sinks=True, moe=moe)


def bench_hf_config(spec: nn.ModelSpec) -> dict:
    """GptOssConfig's keys of a bench shape (bench/shapes.py hf_config gives the common ones)."""
    m = spec.moe
    return dict(num_local_experts=m.num_experts, num_experts_per_tok=m.top_k, intermediate_size=m.intermediate_size,
                swiglu_limit=m.swiglu_limit, attention_bias=spec.attention_bias)


def hf_name_table() -> NameTable:
    L = "model.layers.{i}."
    base = decoder.hf_name_table()
    e = {k: v for k, v in base.entries.items() if ".mlp." not in k}
    e.update({
        "layers.{i}.self_attn.sinks": Direct(L + "self_attn.sinks"),
        "layers.{i}.mlp.router.weight": Direct(L + "mlp.router.weight"),
        "layers.{i}.mlp.router.bias": Direct(L + "mlp.router.bias"),
        "layers.{i}.mlp.experts.gate_up_proj": Experts(L + "mlp.experts.gate_up_proj", (), transposed=True),
        "layers.{i}.mlp.experts.down_proj": Experts(L + "mlp.experts.down_proj", (), transposed=True),
        "layers.{i}.mlp.experts.gate_up_proj_bias": Direct(L + "mlp.experts.gate_up_proj_bias"),
        "layers.{i}.mlp.experts.down_proj_bias": Direct(L + "mlp.experts.down_proj_bias"),
    })
    return NameTable(e)


def gguf_tensor_table() -> GGUFNameTable:
    """llama.cpp's gpt-oss names (gguf-py MODEL_TENSORS[GPT_OSS], convert_hf_to_gguf.py's
    GptOssModel): HF's [E, in, out] experts transposed to [E, out, in], gate_up_proj's even /
    odd columns as ffn_gate_exps / ffn_up_exps (and their biases), the expert weights MXFP4 when
    the checkpoint's are (OpenAI's release), else by the recipe."""
    L, B = "model.layers.{i}.", "blk.{i}."
    table = decoder.gguf_tensor_table(rope_permuted=False)
    e = {k: v for k, v in table.entries.items() if ".mlp." not in k and "post_attention_layernorm" not in k}
    e.update({
        L + "post_attention_layernorm.weight": GGUFName(B + "post_attention_norm.weight"),
        L + "self_attn.sinks": GGUFName(B + "attn_sinks.weight"),
        L + "mlp.router.weight": GGUFName(B + "ffn_gate_inp.weight"),
        L + "mlp.router.bias": GGUFName(B + "ffn_gate_inp.bias"),
        L + "mlp.experts.gate_up_proj": GGUFName(B + "ffn_gate_exps.weight", parts=(B + "ffn_up_exps.weight",), axis=1,
                                                 transposed=True, interleaved=True, keep_mxfp4=True),
        L + "mlp.experts.gate_up_proj_bias": GGUFName(B + "ffn_gate_exps.bias", parts=(B + "ffn_up_exps.bias",), axis=1,
                                                      interleaved=True),
        L + "mlp.experts.down_proj": GGUFName(B + "ffn_down_exps.weight", transposed=True, keep_mxfp4=True),
        L + "mlp.experts.down_proj_bias": GGUFName(B + "ffn_down_exps.bias"),
    })
    return GGUFNameTable(e)


def config_from_gguf(gf) -> dict:
    """llama.cpp's gpt-oss keys -> GptOssConfig's: every other layer (the even ones) slides,
    YaRN from rope.scaling.* with GPT-OSS's beta_fast / beta_slow / truncate."""
    a = gf.architecture
    config = gguf_config.hf_config(gf, "GptOssForCausalLM", "gpt_oss")
    n = int(config["num_hidden_layers"])
    scaling = config.pop("rope_scaling", None) or {}
    rope = {"rope_type": "default", "rope_theta": float(config.pop("rope_theta", 150000.0))}
    if scaling.get("rope_type") == "yarn":
        rope = dict(YARN, rope_theta=rope["rope_theta"], factor=float(scaling["factor"]),
                    original_max_position_embeddings=int(scaling.get("original_max_position_embeddings", 4096)))
    window = int(gf.get(f"{a}.attention.sliding_window") or 0)
    config.update(num_local_experts=int(gf.get(f"{a}.expert_count") or 0),
                  num_experts_per_tok=int(gf.get(f"{a}.expert_used_count") or 0),
                  intermediate_size=int(gf.get(f"{a}.expert_feed_forward_length") or config["intermediate_size"]),
                  sliding_window=window or None, rope_parameters=rope, attention_bias=True,
                  layer_types=["sliding_attention" if window and i % 2 == 0 else "full_attention" for i in range(n)])
    return config


def gguf_metadata(config: dict, rope: dict) -> dict:
    config = _with_defaults(config)
    a = "gpt-oss"
    meta = gguf_config.hyperparameters(a, config, rope)
    types = config["layer_types"]
    if any(t != ("sliding_attention" if i % 2 == 0 else "full_attention") for i, t in enumerate(types)):
        raise UnsupportedError(f"gpt-oss GGUF: layer_types {types} do not alternate sliding / full from layer 0, "
                               "the only pattern llama.cpp's gpt-oss runs", hint="keep the model as a Hugging Face folder")
    meta.update({f"{a}.expert_count": int(config.get("num_local_experts") or config.get("num_experts")),
                 f"{a}.expert_used_count": int(config.get("num_experts_per_tok", 4)),
                 f"{a}.expert_feed_forward_length": int(config["intermediate_size"]),
                 f"{a}.attention.sliding_window": int(config.get("sliding_window") or 0)})
    if rope["rope_type"] == "yarn":
        meta.update({f"{a}.rope.scaling.type": "yarn", f"{a}.rope.scaling.factor": float(rope["factor"]),
                     f"{a}.rope.scaling.original_context_length": int(rope["original_max_position"])})
    elif rope["rope_type"] != "default":
        raise UnsupportedError(f"gpt-oss GGUF: rope type {rope['rope_type']!r}", hint="llama.cpp's gpt-oss runs yarn")
    return meta


def _tiny(**kw) -> dict:
    base = {"num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 32, "sliding_window": 8,
            "layer_types": ["sliding_attention", "full_attention"], "output_router_logits": False,
            "rope_parameters": dict(YARN, rope_theta=150000.0, original_max_position_embeddings=64, factor=4.0)}
    return base | kw


FAMILY = Family(
    name="gpt_oss",
    hf_architectures=("GptOssForCausalLM",),
    model_types=("gpt_oss",),
    spec_from_config=spec_from_config,
    architecture=nn.CausalLM,
    # Attention by module name; the experts by their stacked parameters (peft's target_parameters,
    # there are no gate_proj / up_proj modules to name).
    lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"),
    bench_hf_config=bench_hf_config,
    name_table=hf_name_table,
    gguf=GGUFArchitecture(
        name="gpt-oss",
        tensors=gguf_tensor_table,
        config_from_gguf=config_from_gguf,
        metadata=gguf_metadata,
    ),
    chat=ChatDefaults(model_types=("gpt_oss",)),
    bench_shapes={
        # openai/gpt-oss-20b's config.json: 24 layers, 32 experts, 4 per token, alternating windows.
        "gpt-oss-20b": dict(vocab_size=201088, hidden_size=2880, num_layers=24, num_heads=64, num_kv_heads=8,
                            head_dim=64, intermediate_size=2880, rms_norm_eps=1e-5, tie_word_embeddings=False,
                            attention_bias=True, attention_out_bias=True, attention_sinks=True,
                            sliding_windows=[128 if i % 2 == 0 else 0 for i in range(24)],
                            rope=decoder.rope_from_config({"rope_parameters": dict(YARN, rope_theta=150000.0),
                                                           "num_attention_heads": 64, "head_dim": 64}),
                            moe=nn.MoESpec(num_experts=32, top_k=4, intermediate_size=2880, layers=tuple(range(24)),
                                           norm_topk_prob=True, router_name="router", router_bias=True,
                                           expert_bias=True, activation="swiglu_oai")),
    },
    # Two layers (sliding window 8, then full), 4 experts of width 32, top 2, yarn over a short
    # original context (64) so that its ramp falls inside the 8 pairs of head 16.
    tiny=TinyModel(
        tokenizer="chatml",
        config={"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 16, "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
                **_tiny()},
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        vocab_multiple=64,
        variants={
            "e8-top1-aux": _tiny(num_local_experts=8, num_experts_per_tok=1, output_router_logits=True,
                                 router_aux_loss_coef=0.05),
            "e3-top3-yarn-truncate": _tiny(num_local_experts=3, num_experts_per_tok=3,
                                           rope_parameters=dict(YARN, rope_theta=10000.0, truncate=True,
                                                                original_max_position_embeddings=32, factor=8.0)),
            "full-sliding-full-default-rope": _tiny(layer_types=["full_attention", "sliding_attention"],
                                                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        },
        # Every token to all 4 experts: a random tiny router's top-k is full of near ties that any
        # rounding of the weights flips (qwen3_moe.py says the same), so the GGUF bounds measure the
        # rounding alone. Window 16: the smallest top-2 gap on the blocks test's greedy paths is 0.0067
        # (window 8 had one of 0.0031, which Q8_0 blocks flipped).
        gguf={"hidden_size": 256, "head_dim": 64, "intermediate_size": 512, "num_local_experts": 4, "num_experts_per_tok": 4,
              "sliding_window": 16},
    ),
)
