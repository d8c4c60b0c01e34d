"""Gemma 3 (text: Gemma3ForCausalLM, model_type gemma3_text; the language model of the 4B and
larger checkpoints has the same layout).

What Gemma adds to the dense decoder: the sandwich block (dsl/nn.py SandwichBlock: a pre- and a
post-norm around attention and around the MLP), every RMSNorm times (1 + w) (qk-norm too), the
embedding rows scaled by sqrt(hidden) in the embedding's dtype, attention scores scaled by
query_pre_attn_scalar**-0.5, GeGLU, sliding-window layers interleaved with global ones
(layer_types, else every sliding_window_pattern-th layer global), each kind with its own rope
(rope_local_base_freq on sliding layers; rope_theta and rope_scaling on global ones), and
the final logits soft-capped where the config sets it (in training; Gemma 3 does not set it).
EmbeddingGemma (Gemma3TextModel, use_bidirectional_attention) is the same stack as an encoder:
every token sees its whole input on global layers, the tokens less than sliding_window away on
either side on sliding ones (ModelSpec.causal False); surogate.serve.embedder adds its pooling and
dense projections.
attn_logit_softcapping is refused: transformers' Gemma 3 ignores it and llama.cpp refuses it.

In GGUF (llama.cpp's convert_hf_to_gguf.py Gemma3Model): architecture "gemma3", NEOX rope (q/k
rows in HF's order), every norm weight stored with the 1 already added (GGUFName.shift), the
four block norms as attn_norm / post_attention_norm / ffn_norm / post_ffw_norm (gguf-py's names). llama.cpp keeps only
the global rope base and the window; it fixes the rest for the architecture (every 6th layer
global, local rope base 10000, attention scale head_dim**-0.5 but for the 27B's 62 layers,
(hidden / heads)**-0.5), so a file is read with those and a config that differs is refused at
write time rather than written as a file llama.cpp would run differently.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from surogate.dsl import nn
from surogate.dsl.nn_vision import (PROJECTOR_PREFIX, VISION_PREFIX, Gemma3VisionLM, VisionSpec, image_inputs,
                                    patchify, projector_inputs)
from surogate.errors import ConfigError, FileFormatError, InvalidArgumentError, UnsupportedError
from surogate.io import gguf_config
from surogate.models import decoder
from surogate.models.family import (ChatDefaults, Family, GGUFArchitecture, ImagePrompt, MmprojArchitecture, TinyModel,
                                    VisionHooks)
from surogate.models.gguf_names import GGUFName, GGUFNameTable
from surogate.models.name_table import Direct, NameTable, Transposed

NORM_OFFSET = 1.0  # Gemma3RMSNorm: x * rstd * (1 + w)
PATTERN = 6  # transformers' default sliding_window_pattern, and llama.cpp's fixed one
LOCAL_THETA = 10000.0  # rope_local_base_freq's default, and llama.cpp's fixed one


def layer_types(cfg: dict) -> list[str]:
    """Each layer's attention kind: the config's layer_types, else every sliding_window_pattern-th
    layer full attention (HF's rule)."""
    n = int(cfg["num_hidden_layers"])
    types = cfg.get("layer_types")
    if types is None:
        pattern = int(cfg.get("sliding_window_pattern") or PATTERN)
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    if len(types) != n or not set(types) <= {"sliding_attention", "full_attention"}:
        raise ConfigError(f"config.json: layer_types must give sliding_attention or full_attention for each of the "
                          f"{n} layers, got {types}", hint="check config.json")
    return list(types)


def _ropes(cfg: dict) -> tuple[dict, dict]:
    """(global rope, sliding rope) in our attributes, from v5's per-kind rope_parameters or v4's
    rope_theta + rope_scaling (global) and rope_local_base_freq (sliding)."""
    params = cfg.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:
        full = dict(params.get("full_attention") or {})
        sliding = dict(params.get("sliding_attention") or {})
        full.setdefault("rope_theta", cfg.get("rope_theta", 1_000_000.0))
        sliding.setdefault("rope_theta", cfg.get("rope_local_base_freq", LOCAL_THETA))
        return (decoder.rope_from_config({"rope_parameters": {"rope_type": "default", **full}}),
                decoder.rope_from_config({"rope_parameters": {"rope_type": "default", **sliding}}))
    glob = decoder.rope_from_config({"rope_theta": cfg.get("rope_theta", 1_000_000.0), "rope_parameters": params,
                                     "rope_scaling": cfg.get("rope_scaling")})
    return glob, {"theta": float(cfg.get("rope_local_base_freq", LOCAL_THETA)), "rope_type": "default"}


# Gemma3TextConfig's defaults: a Gemma3ForConditionalGeneration config.json (google/gemma-3-4b-it)
# lists only some text_config keys and leaves the rest to these.
TEXT_DEFAULTS = {"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                 "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "rms_norm_eps": 1e-6,
                 "query_pre_attn_scalar": 256, "sliding_window": 4096, "max_position_embeddings": 131072,
                 "bos_token_id": 2, "eos_token_id": 1}
# SiglipVisionConfig's defaults (vision_use_head: its pooling head, which Gemma 3 never reads).
VISION_DEFAULTS = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
                   "num_channels": 3, "image_size": 224, "patch_size": 16, "hidden_act": "gelu_pytorch_tanh",
                   "layer_norm_eps": 1e-6, "vision_use_head": True}
# Gemma3Config's own defaults.
MM_DEFAULTS = {"mm_tokens_per_image": 256, "boi_token_index": 255_999, "eoi_token_index": 256_000,
               "image_token_index": 262_144}


def _side(value, key: str) -> int:
    if isinstance(value, (list, tuple)):
        if len(value) != 2 or value[0] != value[1]:
            raise UnsupportedError(f"config.json: vision_config.{key} {list(value)} is not square",
                                   hint="Gemma 3's SigLIP tower takes square images and patches")
        value = value[0]
    return int(value)


def vision_spec_from_config(cfg: dict, text_hidden: int) -> VisionSpec:
    """The tower and projector of a Gemma3Config (config.json's vision_config and the mm keys)."""
    vc = {**VISION_DEFAULTS, **(cfg.get("vision_config") or {})}
    mm = {k: cfg.get(k, d) for k, d in MM_DEFAULTS.items()}
    for alias, key in (("image_token_id", "image_token_index"), ("boi_token_id", "boi_token_index"),
                       ("eoi_token_id", "eoi_token_index")):
        if cfg.get(key) is None and cfg.get(alias) is not None:
            mm[key] = cfg[alias]
    if vc.get("model_type", "siglip_vision_model") != "siglip_vision_model":
        raise UnsupportedError(f"config.json: vision_config.model_type {vc['model_type']!r} is not supported",
                               hint="Gemma 3's vision tower is SigLIP (siglip_vision_model)")
    if vc["vision_use_head"]:
        raise UnsupportedError("config.json: vision_config.vision_use_head is true (SigLIP's default): the "
                               "attention-pooling head is not supported",
                               hint="Gemma 3 never reads that head; its own configs set vision_use_head: false")
    act = vc["hidden_act"]
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise UnsupportedError(f"config.json: vision_config.hidden_act {act!r} is not supported",
                               hint="supported: gelu_pytorch_tanh (SigLIP's)")
    size, patch = _side(vc["image_size"], "image_size"), _side(vc["patch_size"], "patch_size")
    hidden, heads = int(vc["hidden_size"]), int(vc["num_attention_heads"])
    tokens = int(mm["mm_tokens_per_image"])
    side = int(round(tokens ** 0.5))
    problems = [
        (size % patch, f"vision_config.image_size {size} is not a multiple of patch_size {patch}"),
        (hidden % heads, f"vision_config.hidden_size {hidden} is not a multiple of num_attention_heads {heads}"),
        (side * side != tokens, f"mm_tokens_per_image {tokens} is not a square"),
        (side * side == tokens and (size // patch) % side,
         f"mm_tokens_per_image {tokens}: {side} tokens per side do not divide the {size // patch} patches per side"),
    ]
    for bad, msg in problems:
        if bad:
            raise ConfigError(f"config.json: {msg}", hint="check config.json")
    return VisionSpec(hidden_size=hidden, intermediate_size=int(vc["intermediate_size"]),
                      num_layers=int(vc["num_hidden_layers"]), num_heads=heads, image_size=size, patch_size=patch,
                      mm_tokens_per_image=tokens, image_token_index=int(mm["image_token_index"]),
                      text_hidden_size=text_hidden, num_channels=int(vc["num_channels"]),
                      layer_norm_eps=float(vc["layer_norm_eps"]), boi_token_index=mm["boi_token_index"],
                      eoi_token_index=mm["eoi_token_index"])


def spec_from_config(cfg: dict) -> nn.ModelSpec:
    """A Gemma3ForCausalLM / Gemma3TextModel config, or a Gemma3ForConditionalGeneration one (its
    text_config, with Gemma3TextConfig's defaults, and its vision tower: ModelSpec.vision)."""
    if "text_config" in cfg or cfg.get("model_type") == "gemma3":
        text = {**TEXT_DEFAULTS, **(cfg.get("text_config") or {})}
        for key in ("tie_word_embeddings", "bos_token_id", "eos_token_id"):  # the outer config's win
            if cfg.get(key) is not None:
                text[key] = cfg[key]
        spec = text_spec_from_config(text)
        if spec.causal is False:
            raise UnsupportedError("config.json: text_config.use_bidirectional_attention with images",
                                   hint="Gemma 3 with images is a causal model; check config.json")
        return dataclasses.replace(spec, vision=vision_spec_from_config(cfg, spec.hidden_size))
    return text_spec_from_config(cfg)


def text_spec_from_config(cfg: dict) -> nn.ModelSpec:
    if cfg.get("attn_logit_softcapping"):
        # transformers' Gemma3Attention never passes it to attention, and llama.cpp's converter
        # refuses it: there is no reference for what it would mean.
        raise UnsupportedError("config.json: attn_logit_softcapping is set, which Gemma 3 does not use "
                               "(transformers ignores it, llama.cpp refuses it)",
                               hint="set it to null, as Gemma 3's own configs have it")
    bidirectional = bool(cfg.get("use_bidirectional_attention"))
    if bidirectional and int(cfg.get("sliding_window", 4096)) < 2:
        raise UnsupportedError("config.json: use_bidirectional_attention with a sliding_window below 2",
                               hint="a bidirectional window of 1 would let a token see only itself; check config.json")
    types = layer_types(cfg)
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
    glob, sliding = _ropes(cfg)
    head_dim = int(cfg.get("head_dim") or 256)
    window = int(cfg.get("sliding_window", 4096))
    if bidirectional:  # transformers' Gemma3TextConfig: config.json's window W means |i - j| < W // 2 + 1
        window = window // 2 + 1
    base = {**cfg, "hidden_act": act, "head_dim": head_dim, "layer_types": types, "rope_parameters": None,
            "rope_scaling": None, "tie_word_embeddings": cfg.get("tie_word_embeddings", True),
            "sliding_window": window}
    spec = decoder.spec_from_config(base, "gemma3", qk_norm=True)
    return dataclasses.replace(
        spec, rope=glob, rope_sliding=sliding, norm_offset=NORM_OFFSET, embed_scale=True,
        attn_scale=float(cfg.get("query_pre_attn_scalar", head_dim)) ** -0.5,
        final_softcap=float(cfg.get("final_logit_softcapping") or 0.0), causal=not bidirectional)


_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")


def hf_name_table() -> NameTable:
    t = decoder.hf_name_table(qk_norm=True)
    L = "model.layers.{i}."
    extra = {f"layers.{{i}}.{n}.weight": Direct(f"{L}{n}.weight") for n in _NORMS}
    return NameTable({**t.entries, **extra, **vision_name_table().entries})


_VISION_LAYER = [f"{n}.{p}" for n in ("layer_norm1", "layer_norm2", "self_attn.q_proj", "self_attn.k_proj",
                                      "self_attn.v_proj", "self_attn.out_proj", "mlp.fc1", "mlp.fc2")
                 for p in ("weight", "bias")]


def vision_name_table() -> NameTable:
    """The tower's and projector's parameters <- the hub's names (vision_tower.vision_model.*,
    multi_modal_projector.*); `checkpoint_aliases` finds transformers' other layouts."""
    V, H = f"{VISION_PREFIX}.", f"{VISION_PREFIX}.vision_model."
    e = {f"{V}{n}": Direct(f"{H}{n}") for n in (
        "embeddings.patch_embedding.weight", "embeddings.patch_embedding.bias", "embeddings.position_embedding.weight",
        "post_layernorm.weight", "post_layernorm.bias")}
    e.update({f"{V}encoder.layers.{{i}}.{n}": Direct(f"{H}encoder.layers.{{i}}.{n}") for n in _VISION_LAYER})
    P = f"{PROJECTOR_PREFIX}."
    e[f"{P}mm_soft_emb_norm.weight"] = Direct(f"{P}mm_soft_emb_norm.weight")
    e[f"{P}mm_input_projection_weight"] = Transposed(f"{P}mm_input_projection_weight")
    return NameTable(e)


def checkpoint_aliases(hf: str) -> tuple[str, ...]:
    """Where a Gemma3ForConditionalGeneration checkpoint keeps a tensor of the table: the hub's
    files and transformers 5's save_pretrained use language_model.model.* (and vision_tower.* without
    vision_model on save), transformers 4.5x model.language_model.*, model.vision_tower.vision_model.*,
    model.multi_modal_projector.*; a text checkpoint has the table's names."""
    if hf == "lm_head.weight":
        return hf, "language_model.lm_head.weight"
    if hf.startswith("model."):
        rest = hf[len("model."):]
        return f"model.language_model.{rest}", f"language_model.model.{rest}", hf
    tower = f"{VISION_PREFIX}.vision_model."
    if hf.startswith(tower):
        rest = hf[len(tower):]
        return hf, f"model.{hf}", f"{VISION_PREFIX}.{rest}", f"model.{VISION_PREFIX}.{rest}"
    return hf, f"model.{hf}"


_GGUF_NORMS = {"input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
               "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
               "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}


def gguf_tensor_table() -> GGUFNameTable:
    """llama.cpp's Gemma 3 names; its converter adds Gemma's 1 to every norm weight."""
    e = dict(decoder.gguf_tensor_table(rope_permuted=False, qk_norm=True).entries)
    L, B = "model.layers.{i}.", "blk.{i}."
    for hf, gg in _GGUF_NORMS.items():
        e[f"{L}{hf}.weight"] = GGUFName(f"{B}{gg}.weight", shift=NORM_OFFSET)
    e["model.norm.weight"] = GGUFName("output_norm.weight", shift=NORM_OFFSET)
    return GGUFNameTable(e)


def _llama_cpp_scalar(layers: int, hidden: int, heads: int, head_dim: int) -> int:
    # llama.cpp's f_attention_scale for gemma3: (hidden / heads)**-0.5 for the 27B (62 layers),
    # head_dim**-0.5 otherwise.
    return hidden // heads if layers == 62 else head_dim


def config_from_gguf(gf) -> dict:
    cfg = gguf_config.hf_config(gf, "Gemma3ForCausalLM", "gemma3_text")
    n = cfg["num_hidden_layers"]
    window = gf.get("gemma3.attention.sliding_window")
    cfg.update(
        hidden_activation="gelu_pytorch_tanh", hidden_act="gelu_pytorch_tanh",
        sliding_window=int(window) if window is not None else 4096,
        layer_types=["sliding_attention" if (i + 1) % PATTERN else "full_attention" for i in range(n)],
        rope_local_base_freq=LOCAL_THETA,
        query_pre_attn_scalar=_llama_cpp_scalar(n, cfg["hidden_size"], cfg["num_attention_heads"], cfg["head_dim"]))
    return cfg


def gguf_metadata(config: dict, rope: dict) -> dict:
    spec = spec_from_config(config)
    fixed = {
        "layer_types": (layer_types(config),
                        ["sliding_attention" if (i + 1) % PATTERN else "full_attention" for i in range(spec.num_layers)]),
        "rope_local_base_freq": (spec.rope_sliding, {"theta": LOCAL_THETA, "rope_type": "default"}),
        "query_pre_attn_scalar": (round(spec.attn_scale ** -2, 6),
                                  _llama_cpp_scalar(spec.num_layers, spec.hidden_size, spec.num_heads, spec.head_dim)),
        "final_logit_softcapping": (spec.final_softcap, 0.0),
    }
    for key, (ours, theirs) in fixed.items():
        if ours != theirs:
            raise UnsupportedError(f"config.json: {key} is not what llama.cpp's gemma3 architecture fixes it to "
                                   f"({theirs}); a GGUF file cannot say otherwise",
                                   hint="only Gemma 3 configs with llama.cpp's fixed choices can be written as GGUF")
    meta = gguf_config.hyperparameters("gemma3", config, rope)
    meta["gemma3.attention.sliding_window"] = int(config.get("sliding_window", 4096))
    return meta


# ---- llama.cpp's mmproj file (convert_hf_to_gguf.py --mmproj: Gemma3VisionModel; tools/mtmd/clip.cpp reads it)
# The SigLIP tower and the projector in their own GGUF: general.architecture "clip", general.type
# "mmproj", clip.projector_type "gemma3", the tower's sizes under clip.vision.*, image_mean / std from
# preprocessor_config.json; tensors v.* and mm.*, the patch conv as HF has it ([C, 3, P, P]: ggml's
# conv layout), the projection weight untransposed ([vision, text]: clip.cpp transposes it), and
# only mm.soft_emb_norm shifted by Gemma's 1 (the SigLIP layer norms are plain). Written as
# llama.cpp's --outtype f16: 1-D tensors, the patch conv and the position embedding F32 (its
# tensor_force_quant: ".embeddings." in the HF name), every other matrix F16.

MMPROJ_SCALE = 4  # clip.cpp's clip.vision.projector.scale_factor for gemma3 when the file leaves it out
_MMPROJ_LAYER = {"layer_norm1": "ln1", "layer_norm2": "ln2", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                 "self_attn.v_proj": "attn_v", "self_attn.out_proj": "attn_out", "mlp.fc1": "ffn_up",
                 "mlp.fc2": "ffn_down"}
IMAGE_TOKENS = ("<start_of_image>", "<end_of_image>", "<image_soft_token>")  # boi, eoi, the image token


def mmproj_tensor_table(config: dict | None = None) -> GGUFNameTable:  # the same names for every config
    H = f"{VISION_PREFIX}.vision_model."
    e = {f"{H}embeddings.patch_embedding.weight": GGUFName("v.patch_embd.weight", f32=True),
         f"{H}embeddings.patch_embedding.bias": GGUFName("v.patch_embd.bias"),
         f"{H}embeddings.position_embedding.weight": GGUFName("v.position_embd.weight", f32=True),
         f"{H}post_layernorm.weight": GGUFName("v.post_ln.weight"),
         f"{H}post_layernorm.bias": GGUFName("v.post_ln.bias"),
         f"{PROJECTOR_PREFIX}.mm_input_projection_weight": GGUFName("mm.input_projection.weight"),
         f"{PROJECTOR_PREFIX}.mm_soft_emb_norm.weight": GGUFName("mm.soft_emb_norm.weight", shift=NORM_OFFSET)}
    for hf, gg in _MMPROJ_LAYER.items():
        for p in ("weight", "bias"):
            e[f"{H}encoder.layers.{{i}}.{hf}.{p}"] = GGUFName(f"v.blk.{{i}}.{gg}.{p}")
    return GGUFNameTable(e)


def checkpoint_name(name: str) -> str:
    """The tables' name of a checkpoint tensor (checkpoint_aliases the other way round)."""
    tower = f"{VISION_PREFIX}.vision_model."
    for prefix, canonical in (("model.language_model.", "model."), ("language_model.model.", "model."),
                              ("language_model.lm_head.", "lm_head."), (f"model.{tower}", tower),
                              (tower, tower), (f"model.{VISION_PREFIX}.", tower), (f"{VISION_PREFIX}.", tower),
                              (f"model.{PROJECTOR_PREFIX}.", f"{PROJECTOR_PREFIX}.")):
        if name.startswith(prefix):
            return canonical + name[len(prefix):]
    return name


def text_config(config: dict) -> dict:
    """A Gemma3ForConditionalGeneration config's language model as a Gemma3ForCausalLM config
    (Gemma3TextConfig's defaults under its text_config; the outer keys spec_from_config lets win)."""
    text = {**TEXT_DEFAULTS, **(config.get("text_config") or {})}
    for key in ("tie_word_embeddings", "bos_token_id", "eos_token_id"):
        if config.get(key) is not None:
            text[key] = config[key]
    return {**text, "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text"}


def mmproj_metadata(config: dict, folder) -> dict:
    """The clip.* keys convert_hf_to_gguf.py writes for a Gemma3ForConditionalGeneration
    (MmprojModel.set_gguf_parameters + Gemma3VisionModel's), from its config and image processor files."""

    spec = spec_from_config(config)
    v = spec.vision
    pre = gguf_config.mmproj_image_processor(folder)
    vc = {**VISION_DEFAULTS, **config.get("vision_config", {})}
    meta = {"clip.has_vision_encoder": True, "clip.vision.projection_dim": spec.hidden_size,
            "clip.vision.image_size": v.image_size, "clip.vision.patch_size": v.patch_size,
            "clip.vision.embedding_length": v.hidden_size, "clip.vision.feed_forward_length": v.intermediate_size,
            "clip.vision.block_count": v.num_layers, "clip.vision.attention.head_count": v.num_heads,
            "clip.vision.image_mean": [float(x) for x in pre["image_mean"]],
            "clip.vision.image_std": [float(x) for x in pre["image_std"]],
            "clip.projector_type": "gemma3",
            "clip.vision.attention.layer_norm_epsilon": float(vc["layer_norm_eps"]), "clip.use_gelu": True}
    side = int(int(pre.get("image_seq_length", 256)) ** 0.5)  # the converter reads the processor's, not config.json's
    scale = (v.image_size // v.patch_size) // side if side else 0
    if scale <= 0 or ((v.image_size // v.patch_size) // scale) ** 2 != v.mm_tokens_per_image:
        raise ConfigError(f"{folder.path}: the image processor's image_seq_length {pre.get('image_seq_length', 256)} "
                          f"does not give config.json's mm_tokens_per_image {v.mm_tokens_per_image}",
                          hint="llama.cpp derives the projector's pooling from image_seq_length; make them agree")
    if scale != MMPROJ_SCALE:
        meta["clip.vision.projector.scale_factor"] = scale
    return meta


def config_from_mmproj(text: dict, gf, tokenizer) -> dict:
    """A Gemma3ForConditionalGeneration config: the text GGUF's config as text_config, the tower and
    projector from the mmproj's clip.* keys, the image token ids from the text GGUF's tokenizer."""
    def key(name: str, default=None):
        value = gf.get(name, default)
        if value is None:
            raise FileFormatError(f"{gf.path}: no {name}", hint="the mmproj file is damaged or not llama.cpp's")
        return value

    if key("general.architecture") != "clip":
        raise UnsupportedError(f"{gf.path}: general.architecture is {gf.get('general.architecture')!r}, not 'clip'",
                               hint="--mmproj takes llama.cpp's mmproj file (convert_hf_to_gguf.py --mmproj)")
    projector = gf.get("clip.projector_type", gf.get("clip.vision.projector_type"))
    if projector != "gemma3":
        raise UnsupportedError(f"{gf.path}: clip.projector_type is {projector!r}; a Gemma 3 model takes 'gemma3'",
                               hint="use the mmproj file made from the same Gemma 3 checkpoint")
    if int(key("clip.vision.projection_dim")) != int(text["hidden_size"]):
        raise ConfigError(f"{gf.path}: clip.vision.projection_dim {key('clip.vision.projection_dim')} differs from the "
                          f"text model's hidden size {text['hidden_size']}",
                          hint="the mmproj and the text GGUF must come from the same checkpoint")
    size, patch = int(key("clip.vision.image_size")), int(key("clip.vision.patch_size"))
    scale = int(gf.get("clip.vision.projector.scale_factor", MMPROJ_SCALE))
    if scale <= 0 or (size // patch) % scale:
        raise ConfigError(f"{gf.path}: clip.vision.projector.scale_factor {scale} does not divide the "
                          f"{size // patch} patches per side", hint="the mmproj file is damaged")
    ids = []
    for token in IMAGE_TOKENS:
        index = tokenizer.token_to_id(token) if tokenizer is not None else None
        if index is None:
            raise ConfigError(f"the text GGUF's tokenizer has no {token} token, which the mmproj's images need",
                              hint="use the GGUF of a Gemma 3 checkpoint with images (its vocabulary has "
                                   "<start_of_image>, <end_of_image> and <image_soft_token>)")
        ids.append(int(index))
    vision = {"hidden_size": int(key("clip.vision.embedding_length")),
              "intermediate_size": int(key("clip.vision.feed_forward_length")),
              "num_hidden_layers": int(key("clip.vision.block_count")),
              "num_attention_heads": int(key("clip.vision.attention.head_count")),
              "image_size": size, "patch_size": patch, "vision_use_head": False,
              "layer_norm_eps": float(key("clip.vision.attention.layer_norm_epsilon", 1e-6)),
              "hidden_act": "gelu_pytorch_tanh", "model_type": "siglip_vision_model"}
    return {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "text_config": text,
            "vision_config": vision, "mm_tokens_per_image": (size // patch // scale) ** 2,
            "boi_token_index": ids[0], "eoi_token_index": ids[1], "image_token_index": ids[2],
            "max_position_embeddings": text.get("max_position_embeddings")}


def mmproj_processor_config(gf) -> dict:
    """Gemma3ImageProcessor's keys from an mmproj: its image size and normalisation (the rest
    are the processor's defaults: resize bilinear, rescale 1/255, no pan-and-scan)."""
    if gf.get("general.architecture") != "clip":
        raise FileFormatError(f"{gf.path}: general.architecture is {gf.get('general.architecture')!r}, not 'clip'",
                              hint="the images' processor is read from llama.cpp's mmproj file")
    size = int(gf.get("clip.vision.image_size"))
    return {"size": {"height": size, "width": size}, "image_mean": list(gf.get("clip.vision.image_mean")),
            "image_std": list(gf.get("clip.vision.image_std"))}


def _shape(**kw) -> dict:
    """A bench shape: Gemma 3's fixed choices around the real config's numbers."""
    layers, window = kw.pop("num_layers"), kw.pop("window")
    return dict(num_layers=layers, head_dim=256, rms_norm_eps=1e-6, qk_norm=True, tie_word_embeddings=True,
                activation="gelu_pytorch_tanh", norm_offset=NORM_OFFSET, embed_scale=True, attn_scale=256 ** -0.5,
                sliding_windows=[window if (i + 1) % PATTERN else 0 for i in range(layers)],
                rope_sliding={"theta": LOCAL_THETA, "rope_type": "default"}, **kw)


def architecture(spec: nn.ModelSpec) -> nn.CausalLM:
    if spec.vision is not None:
        return Gemma3VisionLM(spec)
    return nn.CausalLM(spec, block=nn.SandwichBlock)



def image_prompt(spec: nn.ModelSpec, tokenizer, folder: str | None) -> ImagePrompt:
    """Gemma3Processor's text rule: the template's <start_of_image> becomes "\\n\\n" + boi + the image
    token x mm_tokens_per_image + eoi + "\\n\\n" (its full_image_sequence); with pan-and-scan crops,
    "Here is the original image {seq} and here are some crops to help you see better " and one
    sequence per crop. The image processor is preprocessor_config.json's (without one: the
    processor's defaults at the tower's image_size); each image's tokens attend both ways."""
    import os

    from surogate.io.hf_folder import read_json
    from surogate.io.image_processing import IMAGE_CONFIG, Gemma3ImageProcessor, to_rgb

    v = spec.vision
    names = {}
    for what, index in (("boi", v.boi_token_index), ("eoi", v.eoi_token_index), ("image", v.image_token_index)):
        token = tokenizer.id_to_token(index) if index is not None else None
        if token is None:
            raise ConfigError(f"config.json: the {what} token (id {index}) is not in the tokenizer's vocabulary",
                              hint="serve the model's own tokenizer.json (Gemma 3's has <start_of_image>, "
                                   "<end_of_image> and <image_soft_token>)")
        names[what] = token
    seq = f"\n\n{names['boi']}{names['image'] * v.mm_tokens_per_image}{names['eoi']}\n\n"
    has = folder is not None and os.path.isfile(os.path.join(folder, IMAGE_CONFIG))
    defaults = {"size": {"height": v.image_size, "width": v.image_size}, "image_seq_length": v.mm_tokens_per_image}
    if folder is not None and os.path.isfile(folder):  # llama.cpp's mmproj: its size and mean / std
        from surogate.io.gguf import GGUFFile

        defaults.update(mmproj_processor_config(GGUFFile(folder)))
    processor = Gemma3ImageProcessor.from_folder(folder) if has else Gemma3ImageProcessor.from_config(defaults)
    processor_config = os.path.join(folder, "processor_config.json") if folder is not None else ""
    if os.path.isfile(processor_config):  # Gemma3Processor's image_seq_length: the tokens it writes per image
        length = read_json(processor_config).get("image_seq_length", v.mm_tokens_per_image)
        if length != v.mm_tokens_per_image:
            raise ConfigError(f"{processor_config}: image_seq_length {length} differs from config.json's "
                              f"mm_tokens_per_image {v.mm_tokens_per_image}",
                              hint="the projector gives mm_tokens_per_image rows per image; fix one of the files")

    def image_text(num_crops: int) -> str:
        if not num_crops:
            return seq
        return (f"Here is the original image {seq} and here are some crops to help you see better "
                + " ".join([seq] * num_crops))

    def num_crops(image) -> int:
        return len(processor.pan_and_scan(to_rgb(image))) if processor.do_pan_and_scan else 0

    return ImagePrompt(placeholder=names["boi"], image_text=image_text, processor=processor,
                       image_token_id=v.image_token_index, tokens_per_view=v.mm_tokens_per_image, bidirectional=True,
                       num_crops=num_crops)


# A tiny Gemma3ForConditionalGeneration (transformers' Gemma3Config; tests/sgtest/tiny_models.py
# make_gemma3_vision adds the vocabulary and the special tokens): the family's tiny text config as
# text_config, a 2-layer SigLIP tower over 56-pixel images of 14-pixel patches (a 4 x 4 grid) pooled
# to 4 tokens per image (kernel 2), vision width 32 != text width 64.
TINY_VISION = {
    "vision_config": {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 2,
                      "image_size": 56, "patch_size": 14, "layer_norm_eps": 1e-6, "vision_use_head": False},
    "mm_tokens_per_image": 4,
}


# ---- running the tower through a Model (Family.vision) -----------------------------------------
def encode_visual(model, pixel_values, grid_thw, hidden: bool, pooled: bool, projector=None):
    """`Model.encode_images` for Gemma 3: the SigLIP tower and projector over pixel values
    [n, channels, S, S]: the projected rows [n * mm_tokens_per_image, text hidden] (``pooled``: the
    pooled tower rows before the projector; ``hidden``: the tower's last hidden state;
    ``projector``: a served adapter's projector, Model.projectors' key)."""
    v = model.spec.vision
    if grid_thw is not None:
        raise InvalidArgumentError(f"{model.spec.family}: its images have a fixed size and no grid_thw",
                                   hint="pass the image processor's pixel_values only")
    px = np.asarray(pixel_values, dtype=np.float32)
    want = (v.num_channels, v.image_size, v.image_size)
    if px.ndim != 4 or px.shape[1:] != want:
        raise InvalidArgumentError(f"pixel_values has shape {px.shape}; this model takes [n, {want[0]}, "
                                   f"{want[1]}, {want[2]}]", hint="resize images with the model's image processor")
    n = px.shape[0]
    exe = model.executable("vision", n * v.patches, n, images=n, projector=projector)
    exe.bind("pixel_patches", patchify(px, v))  # f32: the graph rounds it to the model's dtype
    exe.bind("patch_positions", np.tile(np.arange(v.patches, dtype=np.int32), n))
    exe.bind("image_cu_seqlens", (np.arange(n + 1) * v.patches).astype(np.int32))
    exe.run()
    out = exe.graph.outputs["vision_hidden" if hidden else "image_pooled" if pooled else "image_features"]
    return np.array(exe.read(out.name), dtype=np.float32)


def visual_inputs(model, ids, pos, cu, images, videos):
    """The image feed of a Gemma 3 prompt (VisionHooks.inputs): the images' rows at the image tokens
    and each image span attending both ways; a trainable projector runs in the text graph, so it
    reads the pooled rows instead. No images: None (a text prompt), refused if it has image tokens."""
    v = model.spec.vision
    if videos is not None:
        raise UnsupportedError(f"{model.spec.family}: this model takes no videos", hint="pass images only")
    if images is None:
        if (ids == v.image_token_index).any():
            raise InvalidArgumentError(f"the prompt has image tokens (id {v.image_token_index}) "
                                       "but no images were given", hint="pass the images' pixel values: images=")
        return None
    rows = model.encode_images(images, pooled=v.train_projector)
    feed = (projector_inputs if v.train_projector else image_inputs)(ids, pos, cu, rows, v, model.np_dtype)
    return len(rows) // v.mm_tokens_per_image, feed.pop("input_ids"), pos, feed


FAMILY = Family(
    name="gemma3",
    # Gemma3TextModel: the encoder checkpoints (EmbeddingGemma: use_bidirectional_attention, no head,
    # tensors without the "model." prefix), served for embeddings only.
    # Gemma3ForConditionalGeneration (model_type gemma3): the language model with the SigLIP tower and
    # projector (ModelSpec.vision; dsl/nn_vision.py), its tensors under transformers' multimodal names.
    hf_architectures=("Gemma3ForCausalLM", "Gemma3TextModel", "Gemma3ForConditionalGeneration"),
    model_types=("gemma3_text", "gemma3"),
    spec_from_config=spec_from_config,
    architecture=architecture,
    name_table=hf_name_table,
    checkpoint_aliases=checkpoint_aliases,
    image_prompt=image_prompt,
    vision=VisionHooks(encode=encode_visual, inputs=visual_inputs),
    gguf=GGUFArchitecture(
        name="gemma3",
        tensors=gguf_tensor_table,
        config_from_gguf=config_from_gguf,
        metadata=gguf_metadata,
        mmproj=MmprojArchitecture(tensors=mmproj_tensor_table, checkpoint_name=checkpoint_name, text_config=text_config,
                                  metadata=mmproj_metadata, config=config_from_mmproj),
    ),
    # Gemma's template (<start_of_turn>user ... <end_of_turn>) shows no tool-call or reasoning
    # format of its own: nothing to assume.
    chat=ChatDefaults(),
    bench_shapes={
        # google/gemma-3-1b-it's config.json.
        "gemma-3-1b": _shape(vocab_size=262144, hidden_size=1152, num_layers=26, num_heads=4, num_kv_heads=1,
                             intermediate_size=6912, window=512, rope={"theta": 1_000_000.0, "rope_type": "default"}),
        # google/gemma-3-4b-it's text_config.
        "gemma-3-4b": _shape(vocab_size=262208, hidden_size=2560, num_layers=34, num_heads=8, num_kv_heads=4,
                             intermediate_size=10240, window=1024,
                             rope={"theta": 1_000_000.0, "rope_type": "linear", "factor": 8.0}),
    },
    # Three layers (sliding, global, sliding: pattern 2) with a window of 4, GQA 4/2, head 16, tied, q/k
    # norms; a query scalar that is not head_dim so that its scaling shows; Gemma's template.
    tiny=TinyModel(
        tokenizer="gemma",
        config={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
                "tie_word_embeddings": True, "sliding_window": 4, "query_pre_attn_scalar": 32,
                "sliding_window_pattern": 2,
                "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
                "pad_token_id": None},
        bos_token="<bos>",
        eos_token="<eos>",  # as Gemma 3's config (1); generation_config adds <end_of_turn>
        variants={
            "untied-mha-l2": {"tie_word_embeddings": False, "num_key_value_heads": 4, "num_hidden_layers": 2,
                                   "layer_types": ["full_attention", "sliding_attention"]},
        },
        # GGUF: llama.cpp's fixed choices (every 6th layer global, local rope base 10000, query
        # scalar = head_dim), rows of 256 values, head 256 (transformers' GGUF reader keeps
        # query_pre_attn_scalar's default of 256).
        gguf={"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 2, "num_key_value_heads": 1,
              "head_dim": 256, "query_pre_attn_scalar": 256, "num_hidden_layers": 2, "sliding_window_pattern": 6,
              "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                  "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}},
    ),
)
