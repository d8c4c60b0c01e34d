"""Qwen3-VL and Qwen3-VL-MoE as llama.cpp ships them: a text GGUF of architecture ``qwen3vl``
(``qwen3vlmoe``) beside an mmproj file (convert_hf_to_gguf.py's Qwen3VLTextModel /
Qwen3VLMoeTextModel and Qwen3VLVisionModel; llama.cpp's src/llama-model.cpp, models/qwen3vl.cpp,
models/qwen3vl-moe.cpp and tools/mtmd/clip.cpp read them). Both ways: read into our Qwen3-VL or
Qwen3-VL-MoE (Family.gguf, Family.gguf.mmproj) and written from an HF folder by `surogate quantize`.
One `Qwen3VLGGUF` per family says what differs; the code is the same.

The dense text GGUF is Qwen3's (blk.*, q/k rows in HF's order: llama.cpp runs it with interleaved
MRoPE over NEOX halves), the MoE's Qwen3-MoE's (the router ffn_gate_inp [E, C]; the experts
ffn_gate_exps and ffn_up_exps [E, F, C] each, the halves of the checkpoint's gate_up_proj, and
ffn_down_exps [E, C, F], from a checkpoint's stacked experts in either orientation (the hub's
[E, in, out] or transformers 5's [E, out, in], told apart by their shapes as at load); ``{arch}.expert_count`` / ``expert_used_count`` /
``expert_feed_forward_length``; every layer sparse and the top-k renormalised, as llama.cpp's
qwen3vl-moe graph runs it), each plus ``{arch}.rope.dimension_sections`` (mrope_section padded to
four, the last 0) and ``{arch}.n_deepstack_layers`` (how many DeepStack features the language
model adds). Read alone it is the language model alone (model_type qwen3_vl_text /
qwen3_vl_moe_text: text prompts, Qwen3's or Qwen3-MoE's graph).

The mmproj, the same for both (general.architecture "clip", general.type "mmproj",
clip.projector_type "qwen3vl_merger"): the tower's sizes under clip.vision.* (image_size = sqrt(positions) x patch,
spatial_merge_size, is_deepstack_layers one bool per block, use_gelu), image_mean / std from the
image processor's files, and clip.vision.attention.layer_norm_epsilon the text model's
rms_norm_eps (the converter's choice; the tower's LayerNorms are 1e-6 in transformers' code, which
is what we run). Tensors: the patch Conv3d [C, 3, 2, P, P] as two Conv2d halves
v.patch_embd.weight and v.patch_embd.weight.1 ([C, 3, P, P], one per temporal slice) and its bias,
v.position_embd (the learned grid), per block ln1 / ln2 / attn_qkv (fused, as HF) / attn_out /
ffn_up / ffn_down, the final merger's norm as v.post_ln and its fc1 / fc2 as mm.0 / mm.2, and the
DeepStack mergers as v.deepstack.{block}.norm / fc1 / fc2 numbered by the block they follow
(deepstack_visual_indexes), not by their place in the list. Written at --outtype f16: 1-D tensors
and the position grid F32 (V_ENC_EMBD_POS is in the converter's always-F32 list), the rest F16.

llama.cpp fixes what the mmproj does not say: the vision rope base 10000, gelu (tanh) in the
blocks, and the images' size limits (clip.cpp: 8 to 4096 merged tokens per image), so a config
that differs is refused at write time and an mmproj is served with those limits
(`mmproj_processor_configs`; the resize is still transformers' bicubic, not clip.cpp's bilinear).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from surogate.errors import ConfigError, FileFormatError, UnsupportedError
from surogate.io import gguf_config
from surogate.models.family import GGUFArchitecture, MmprojArchitecture
from surogate.models.gguf_names import GGUFName, GGUFNameTable

PROJECTOR = "qwen3vl_merger"
DEEPSTACK_LAYERS = "n_deepstack_layers"  # a text config's count of DeepStack features (llama.cpp's key; no HF key)
TOKENS = {"image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>",
          "vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>"}
MIN_IMAGE_TOKENS, MAX_IMAGE_TOKENS = 8, 4096  # clip.cpp's set_limit_image_tokens for Qwen-VL projectors
ROPE_THETA = 10000.0  # clip.cpp's vision rope base for qwen3vl
TENSOR_ACTS = ("gelu_pytorch_tanh", "gelu_tanh")  # clip.cpp's FFN_GELU is ggml_gelu, the tanh form

_BLOCK = {"norm1": "ln1", "norm2": "ln2", "attn.qkv": "attn_qkv", "attn.proj": "attn_out",
          "mlp.linear_fc1": "ffn_up", "mlp.linear_fc2": "ffn_down"}
_MERGER = {"norm": "v.post_ln", "linear_fc1": "mm.0", "linear_fc2": "mm.2"}
_DEEPSTACK = {"norm": "norm", "linear_fc1": "fc1", "linear_fc2": "fc2"}


# ---- the family's GGUF form ---------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Qwen3VLGGUF:
    """A Qwen3-VL family as llama.cpp ships it, by what differs between the dense family (text
    GGUF ``qwen3vl``: Qwen3's tensors and keys) and the MoE (``qwen3vlmoe``: Qwen3-MoE's, the
    router ffn_gate_inp and the stacked ffn_gate_exps / ffn_up_exps / ffn_down_exps, the
    ``{arch}.expert_*`` keys); the MRoPE sections, the DeepStack count and the mmproj are the same."""

    arch: str                                  # the text GGUF's general.architecture
    hf_architecture: str                       # config.json's architectures[0]
    model_type: str                            # the config's model_type (qwen3_vl, qwen3_vl_moe)
    text_type: str                             # its text config's (qwen3_vl_text, qwen3_vl_moe_text)
    text_defaults: Mapping[str, object]        # the text config class's defaults
    spec_from_config: Callable[[dict], object]  # the family's
    text_tensors: Callable[[], GGUFNameTable]  # the text model's GGUF table (model.layers.*: Qwen3's, Qwen3-MoE's)
    # The experts: (arch, text config) -> their {arch}.expert_* keys (refusing dense layers);
    # (GGUF file, its text config) -> their HF keys. None: a dense model.
    expert_metadata: Callable[[str, dict], dict] | None = None
    expert_config: Callable[[object, dict], dict] | None = None

    def architecture(self) -> GGUFArchitecture:
        return GGUFArchitecture(
            name=self.arch, tensors=self.gguf_tensor_table, config_from_gguf=self.config_from_gguf,
            metadata=self.gguf_metadata,
            mmproj=MmprojArchitecture(tensors=mmproj_tensor_table, checkpoint_name=checkpoint_name,
                                      text_config=self.text_config, metadata=self.mmproj_metadata,
                                      config=self.config_from_mmproj))

    # ---- the text GGUF
    def gguf_tensor_table(self) -> GGUFNameTable:
        """The text model's GGUF names for the language model's tensors under their Qwen3-VL names."""
        from surogate.models.qwen3_vl import language_model_name

        return GGUFNameTable({language_model_name(hf): g for hf, g in self.text_tensors().entries.items()})

    def config_from_gguf(self, gf) -> dict:
        """A text GGUF as the family's text config (model_type ``text_type``: the language model
        alone until `config_from_mmproj` adds its tower), the MRoPE from rope.dimension_sections."""
        cfg = gguf_config.hf_config(gf, self.hf_architecture, self.text_type)
        sections = gf.require(f"{self.arch}.rope.dimension_sections")
        if (not isinstance(sections, list) or len(sections) != 4 or sections[3] != 0
                or sum(sections[:3]) != cfg["head_dim"] // 2):
            raise FileFormatError(f"{gf.path}: {self.arch}.rope.dimension_sections is {sections!r}, not (t, h, w, 0) "
                                  f"summing to head_dim / 2 ({cfg['head_dim'] // 2})", hint="the file is damaged")
        for key in ("partial_rotary_factor", "rope_scaling"):
            if key in cfg:
                raise UnsupportedError(f"{gf.path}: a {self.arch} file with {key.replace('_', ' ')}",
                                       hint="Qwen3-VL rotates the whole head with the default MRoPE")
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": cfg.pop("rope_theta"),
                                  "mrope_section": [int(s) for s in sections[:3]], "mrope_interleaved": True}
        cfg[DEEPSTACK_LAYERS] = int(gf.get(f"{self.arch}.n_deepstack_layers", 0))
        if self.expert_config is not None:
            cfg.update(self.expert_config(gf, cfg))
        return cfg

    def text_config(self, config: dict) -> dict:
        """A config's language model as its text config (what `config_from_gguf` reads back):
        text_config's keys with the text config class's defaults, the outer tie_word_embeddings,
        the MRoPE as rope_parameters and the DeepStack count."""
        spec = self.spec_from_config(config)
        vs = spec.vision
        text = {**self.text_defaults, **(config.get("text_config") or {})}
        return {**text, "architectures": [self.hf_architecture], "model_type": self.text_type,
                "tie_word_embeddings": spec.tie_word_embeddings, "rope_scaling": None,
                "rope_parameters": {"rope_type": "default", "rope_theta": vs.rope_theta,
                                    "mrope_section": list(vs.mrope_section), "mrope_interleaved": True},
                DEEPSTACK_LAYERS: len(vs.tower.deepstack_visual_indexes)}

    def gguf_metadata(self, config: dict, rope: dict) -> dict:
        """The ``{arch}.*`` keys of a text config (`text_config`'s), as convert_hf_to_gguf.py's
        Qwen3VLTextModel / Qwen3VLMoeTextModel write them."""
        from surogate.models.qwen3_vl import _text_rope

        if config.get("model_type") != self.text_type or DEEPSTACK_LAYERS not in config:
            raise UnsupportedError(f"the {self.arch} GGUF writer takes the language model's config "
                                   "(Qwen3VLGGUF.text_config)", hint="please report it")
        meta = gguf_config.hyperparameters(self.arch, config, rope)
        meta[f"{self.arch}.rope.dimension_sections"] = [*_text_rope(config)[1], 0]
        meta[f"{self.arch}.n_deepstack_layers"] = int(config[DEEPSTACK_LAYERS])
        if self.expert_metadata is not None:
            meta.update(self.expert_metadata(self.arch, config))
        return meta

    # ---- the mmproj
    def mmproj_metadata(self, config: dict, folder) -> dict:
        """The clip.* keys convert_hf_to_gguf.py writes (MmprojModel.set_gguf_parameters +
        Qwen3VLVisionModel's, the same for both families), from the config and image processor files."""
        text = {**self.text_defaults, **(config.get("text_config") or {})}
        return _mmproj_metadata(self.spec_from_config(config), text, folder)

    def config_from_mmproj(self, text: dict, gf, tokenizer) -> dict:
        """The family's config: the text GGUF's (`config_from_gguf`) as its text_config, the tower
        from the mmproj's clip.* keys and tensor shapes, the placeholder token ids from the text
        GGUF's tokenizer."""
        vision, ids = _tower_config(text, gf, tokenizer, self.arch)
        text_cfg = {k: v for k, v in text.items() if k not in ("architectures", DEEPSTACK_LAYERS)}
        return {"architectures": [self.hf_architecture], "model_type": self.model_type, "text_config": text_cfg,
                "vision_config": vision, "tie_word_embeddings": bool(text.get("tie_word_embeddings", False)), **ids}


# ---- the mmproj --------------------------------------------------------------------------------
def mmproj_tensor_table(config: dict) -> GGUFNameTable:
    """The tower's HF names (model.visual.*) <-> the mmproj's; the DeepStack mergers by the block
    each follows (the config's deepstack_visual_indexes)."""
    from surogate.models.qwen3_vl_vision import vision_spec_from_config

    v = vision_spec_from_config(config)
    if v.temporal_patch_size != 2:
        raise UnsupportedError(f"config.json: vision_config.temporal_patch_size {v.temporal_patch_size}: llama.cpp's "
                               "mmproj holds the patch conv as two temporal halves", hint="only 2 can be written")
    H = "model.visual."
    e = {f"{H}patch_embed.proj.weight": GGUFName("v.patch_embd.weight", parts=("v.patch_embd.weight.1",), axis=2,
                                                 stacked=True),
         f"{H}patch_embed.proj.bias": GGUFName("v.patch_embd.bias"),
         f"{H}pos_embed.weight": GGUFName("v.position_embd.weight", f32=True)}
    for hf, gg in _BLOCK.items():
        for p in ("weight", "bias"):
            e[f"{H}blocks.{{i}}.{hf}.{p}"] = GGUFName(f"v.blk.{{i}}.{gg}.{p}")
    for p in ("weight", "bias"):
        for hf, gg in _MERGER.items():
            e[f"{H}merger.{hf}.{p}"] = GGUFName(f"{gg}.{p}")
        for j, block in enumerate(v.deepstack_visual_indexes):
            for hf, gg in _DEEPSTACK.items():
                e[f"{H}deepstack_merger_list.{j}.{hf}.{p}"] = GGUFName(f"v.deepstack.{block}.{gg}.{p}")
    return GGUFNameTable(e)


def checkpoint_name(name: str) -> str:
    """The tables' name of a checkpoint tensor: transformers 4.5x's visual.* is model.visual.*."""
    return f"model.{name}" if name.startswith("visual.") else name


def _mmproj_metadata(spec, text: dict, folder) -> dict:
    """Qwen3VLGGUF.mmproj_metadata of a spec and its text config keys (with the class defaults)."""
    v = spec.vision.tower
    fixed = {"hidden_act": (v.hidden_act in TENSOR_ACTS, "gelu_pytorch_tanh"),
             "rope_parameters.rope_theta": (v.rope_theta == ROPE_THETA, ROPE_THETA)}
    for key, (ok, theirs) in fixed.items():
        if not ok:
            raise UnsupportedError(f"config.json: vision_config.{key} is not what llama.cpp's qwen3vl projector fixes "
                                   f"it to ({theirs}); an mmproj cannot say otherwise",
                                   hint="only Qwen3-VL towers with llama.cpp's fixed choices can be written as GGUF")
    pre = gguf_config.mmproj_image_processor(folder)
    return {"clip.has_vision_encoder": True, "clip.vision.projection_dim": spec.hidden_size,
            "clip.vision.image_size": int(v.num_position_embeddings ** 0.5 * v.patch_size),
            "clip.vision.patch_size": v.patch_size, "clip.vision.embedding_length": v.hidden_size,
            "clip.vision.feed_forward_length": v.intermediate_size, "clip.vision.block_count": v.depth,
            "clip.vision.attention.head_count": v.num_heads,
            "clip.vision.image_mean": [float(x) for x in pre["image_mean"]],
            "clip.vision.image_std": [float(x) for x in pre["image_std"]],
            "clip.projector_type": PROJECTOR, "clip.use_gelu": True,
            "clip.vision.spatial_merge_size": v.spatial_merge_size,
            "clip.vision.attention.layer_norm_epsilon": float(text.get("rms_norm_eps", 1e-6)),
            "clip.vision.is_deepstack_layers": [i in v.deepstack_visual_indexes for i in range(v.depth)]}



def _tower_config(text: dict, gf, tokenizer, arch: str) -> tuple[dict, dict]:
    """(vision_config, the placeholder token ids) of an mmproj beside a text GGUF of ``arch``
    (its config ``text``, its tokenizer), checked against each other."""
    def key(name: str):
        value = gf.get(name)
        if value is None:
            raise FileFormatError(f"{gf.path}: no {name}", hint="the mmproj file is damaged or not llama.cpp's")
        return value

    def tensor(name: str):
        if name not in gf.tensors:
            raise FileFormatError(f"{gf.path}: no tensor {name}", hint="the mmproj file is damaged or not llama.cpp's")
        return gf.tensors[name]

    if gf.get("general.architecture") != "clip":
        raise UnsupportedError(f"{gf.path}: general.architecture is {gf.get('general.architecture')!r}, not 'clip'",
                               hint="--mmproj takes llama.cpp's mmproj file (convert_hf_to_gguf.py --mmproj)")
    projector = gf.get("clip.projector_type", gf.get("clip.vision.projector_type"))
    if projector != PROJECTOR:
        raise UnsupportedError(f"{gf.path}: clip.projector_type is {projector!r}; a Qwen3-VL model takes {PROJECTOR!r}",
                               hint="use the mmproj file made from the same Qwen3-VL checkpoint")
    if int(key("clip.vision.projection_dim")) != int(text["hidden_size"]):
        raise ConfigError(f"{gf.path}: clip.vision.projection_dim {key('clip.vision.projection_dim')} differs from the "
                          f"text model's hidden size {text['hidden_size']}",
                          hint="the mmproj and the text GGUF must come from the same checkpoint")
    if not gf.get("clip.use_gelu", False) or gf.get("clip.use_silu", False):
        raise UnsupportedError(f"{gf.path}: clip.use_gelu is not set: the tower's activation is not Qwen3-VL's",
                               hint="use the mmproj file made from the same Qwen3-VL checkpoint")
    depth = int(key("clip.vision.block_count"))
    flags = key("clip.vision.is_deepstack_layers")
    if not isinstance(flags, list) or len(flags) != depth:
        raise FileFormatError(f"{gf.path}: clip.vision.is_deepstack_layers is {flags!r}, not one flag for each of the "
                              f"{depth} blocks", hint="the mmproj file is damaged")
    indexes = [i for i, f in enumerate(flags) if f]
    if text.get(DEEPSTACK_LAYERS) is not None and int(text[DEEPSTACK_LAYERS]) != len(indexes):
        raise ConfigError(f"{gf.path}: {len(indexes)} DeepStack blocks, but the text GGUF's {arch}.n_deepstack_layers "
                          f"is {text[DEEPSTACK_LAYERS]}", hint="the mmproj and the text GGUF must come from the same "
                                                               "checkpoint")
    tensor("v.patch_embd.weight.1")  # the second temporal half: temporal_patch_size 2
    channels, patch_w = tensor("v.patch_embd.weight").shape[1], tensor("v.patch_embd.weight").shape[-1]
    positions = tensor("v.position_embd.weight").shape[0]
    patch, size = int(key("clip.vision.patch_size")), int(key("clip.vision.image_size"))
    if patch_w != patch or int(positions ** 0.5) ** 2 != positions or int(positions ** 0.5) * patch != size:
        raise FileFormatError(f"{gf.path}: clip.vision.image_size {size} and patch_size {patch} do not fit the "
                              f"{positions} learned positions and the patch conv's {patch_w}-pixel kernel",
                              hint="the mmproj file is damaged")
    ids = {}
    for name, token in TOKENS.items():
        index = tokenizer.token_to_id(token) if tokenizer is not None else None
        if index is None:
            raise ConfigError(f"the text GGUF's tokenizer has no {token} token, which the mmproj's images need",
                              hint="use the GGUF of a Qwen3-VL checkpoint (its vocabulary has <|vision_start|>, "
                                   "<|image_pad|>, <|video_pad|> and <|vision_end|>)")
        ids[name] = int(index)
    vision = {"model_type": "qwen3_vl_vision", "depth": depth, "hidden_size": int(key("clip.vision.embedding_length")),
              "intermediate_size": int(key("clip.vision.feed_forward_length")),
              "num_heads": int(key("clip.vision.attention.head_count")), "in_channels": int(channels),
              "patch_size": patch, "temporal_patch_size": 2,
              "spatial_merge_size": int(gf.get("clip.vision.spatial_merge_size", 2)),
              "out_hidden_size": int(key("clip.vision.projection_dim")), "num_position_embeddings": int(positions),
              "deepstack_visual_indexes": indexes, "hidden_act": "gelu_pytorch_tanh"}
    return vision, ids


def mmproj_processor_configs(gf) -> tuple[dict, dict]:
    """(preprocessor_config.json, video_preprocessor_config.json) keys an mmproj implies: its
    patch and merge sizes and normalisation, images within clip.cpp's 8 to 4096 merged tokens,
    videos with the video processor's defaults."""
    if gf.get("general.architecture") != "clip":
        raise FileFormatError(f"{gf.path}: general.architecture is {gf.get('general.architecture')!r}, not 'clip'",
                              hint="the images' processor is read from llama.cpp's mmproj file")
    patch, merge = int(gf.require("clip.vision.patch_size")), int(gf.get("clip.vision.spatial_merge_size", 2))
    sizes = {"patch_size": patch, "merge_size": merge, "temporal_patch_size": 2,
             "image_mean": [float(x) for x in gf.require("clip.vision.image_mean")],
             "image_std": [float(x) for x in gf.require("clip.vision.image_std")]}
    area = (patch * merge) ** 2
    image = {**sizes, "size": {"shortest_edge": MIN_IMAGE_TOKENS * area, "longest_edge": MAX_IMAGE_TOKENS * area}}
    return image, dict(sizes)


__all__ = ["PROJECTOR", "Qwen3VLGGUF", "checkpoint_name", "mmproj_processor_configs", "mmproj_tensor_table"]
