"""Qwen3-VL (transformers' Qwen3VLForConditionalGeneration, the dense family qwen3_vl): the
language model (Qwen3's decoder, dsl/nn_qwen3_vl.py Qwen3VLLM) reading the vision tower's outputs
(models/qwen3_vl_vision.py Qwen3VLVisionModel): the merged rows replace the image / video pad
tokens' embeddings, DeepStack feature j is added to the hidden state after decoder layer j at the
same positions, and the attention rotates by interleaved MRoPE (3-D positions from the ids and
the grids, `rope_index` / `mrope_tables`, made on the host). Model.forward / loss take
``images=(pixel_values, image_grid_thw)`` and ``videos=(pixel_values_videos, video_grid_thw)``
(`visual_inputs`); a prompt without them is Qwen3's graph (all three axes the text position).

The family is four files: this one (the text config and spec, the MRoPE positions, the visual
inputs of a forward, the name tables and the Family), the tower (qwen3_vl_vision.py), the served
prompts (qwen3_vl_prompt.py) and the GGUF form, llama.cpp's qwen3vl text model beside its mmproj
file (qwen3_vl_gguf.py). A config of model_type qwen3_vl_text (Qwen3VLTextConfig: a text GGUF read
without its mmproj) is the language model alone, Qwen3's graph.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from surogate.dsl import nn
from surogate.errors import ConfigError, InvalidArgumentError, UnsupportedError
from surogate.models import decoder, qwen3_vl_gguf
from surogate.models.family import ChatDefaults, Family, TinyModel, VisionHooks
from surogate.models.name_table import NameTable
from surogate.models.qwen3_vl_prompt import image_prompt
from surogate.models.qwen3_vl_vision import (Qwen3VLVisionTower, VisionSpec, checkpoint_aliases, run_tower,
                                             vision_name_table, vision_spec_from_config)


# ---- the text config: Qwen3VLForConditionalGeneration's language model ---------------------
# Qwen3VLTextConfig's defaults (the hub's text_config lists most of them) and Qwen3VLConfig's own.
TEXT_DEFAULTS = {"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
                 "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128, "hidden_act": "silu",
                 "max_position_embeddings": 128000, "rms_norm_eps": 1e-6, "attention_bias": False}
TEXT_THETA = 500000.0  # Qwen3VLTextConfig.default_theta
MROPE_SECTION = [24, 20, 20]  # Qwen3VLTextRotaryEmbedding's default
MM_DEFAULTS = {"image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
               "vision_end_token_id": 151653}


@dataclass(frozen=True)
class Qwen3VLSpec:
    """ModelSpec.vision of a Qwen3-VL model: the tower, the placeholder token ids and the MRoPE
    (rope_theta, mrope_section: the (t, h, w) frequency counts, interleaved as transformers'
    Qwen3VLTextRotaryEmbedding.recomposition_frequencies)."""

    tower: VisionSpec
    image_token_id: int
    video_token_id: int
    vision_start_token_id: int
    rope_theta: float
    mrope_section: tuple[int, int, int]
    vision_end_token_id: int = MM_DEFAULTS["vision_end_token_id"]
    # The mergers (visual.merger, the DeepStack ones) in the language model's graph, trainable
    # (the `train_projector` key; dsl/nn_qwen3_vl.py); the rest of the tower stays frozen.
    train_projector: bool = False

    @property
    def image_token_index(self) -> int:  # the name surogate/model.py reads (Gemma 3's)
        return self.image_token_id

    @property
    def projector_modules(self) -> tuple[str, ...]:
        """The projector's modules under the model's HF names less ``model.`` (our parameters'
        prefixes; peft's modules_to_save names them so)."""
        return ("visual.merger", *(f"visual.deepstack_merger_list.{j}"
                                   for j in range(len(self.tower.deepstack_visual_indexes))))


def _text_rope(text: dict) -> tuple[float, tuple[int, ...]]:
    """(rope_theta, mrope_section) from v5's rope_parameters or v4's rope_theta + rope_scaling."""
    rp = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    rope_type = rp.get("rope_type") or rp.get("type") or "default"
    if rope_type not in ("default", "mrope"):
        raise UnsupportedError(f"config.json: text_config rope type {rope_type!r} is not supported for Qwen3-VL",
                               hint="Qwen3-VL's checkpoints use the default MRoPE (rope_type default)")
    theta = float(rp.get("rope_theta", text.get("rope_theta", TEXT_THETA)))
    return theta, tuple(int(s) for s in rp.get("mrope_section", MROPE_SECTION))


def spec_from_config(cfg: dict):
    """A Qwen3VLForConditionalGeneration config: its text_config (Qwen3's dense decoder, with
    Qwen3VLTextConfig's defaults; tie_word_embeddings the outer config's) and ModelSpec.vision. A
    Qwen3VLTextConfig (model_type qwen3_vl_text, its keys at the top) is the language model alone:
    no ModelSpec.vision."""
    return language_spec(cfg, "qwen3_vl", "qwen3_vl_text", TEXT_DEFAULTS)


def text_config_of(cfg: dict, text_type: str, defaults: dict) -> dict:
    """The language model's config keys (text_config, or the config itself for ``text_type``) over
    the text config class's ``defaults``."""
    text_only = cfg.get("model_type") == text_type
    return {**defaults, **(cfg if text_only else cfg.get("text_config") or {})}


def language_spec(cfg: dict, family: str, text_type: str, defaults: dict):
    """`spec_from_config` for a family of Qwen3-VL's layout (qwen3_vl; qwen3_vl_moe, which adds its
    experts to this spec): ``text_type`` the text config's model_type, ``defaults`` its class's."""
    text_only = cfg.get("model_type") == text_type
    text = text_config_of(cfg, text_type, defaults)
    if text.get("model_type", text_type) != text_type:
        raise UnsupportedError(f"config.json: text_config.model_type {text['model_type']!r} is not {text_type}",
                               hint=f"this is the {family} family's language model (Qwen3-VL-MoE's text_config is "
                                    "qwen3_vl_moe_text, in Qwen3VLMoeForConditionalGeneration)")
    theta, section = _text_rope(text)
    # transformers 5 ties by the outer key alone (Qwen3VLConfig's default False; text_config's is not read).
    tie = cfg.get("tie_word_embeddings", False)
    base = {**text, "tie_word_embeddings": bool(tie), "rope_parameters": {"rope_type": "default", "rope_theta": theta},
            "rope_scaling": None}
    spec = decoder.spec_from_config(base, family, qk_norm=True)
    if len(section) != 3 or sum(section) != spec.head_dim // 2:
        raise ConfigError(f"config.json: text_config mrope_section {list(section)} must be three counts summing to "
                          f"head_dim / 2 ({spec.head_dim // 2})", hint="check config.json")
    if text_only:
        return spec
    tower = vision_spec_from_config(cfg)
    if tower.out_hidden_size != spec.hidden_size:
        raise ConfigError(f"config.json: vision_config.out_hidden_size {tower.out_hidden_size} is not "
                          f"text_config.hidden_size {spec.hidden_size}", hint="check config.json")
    mm = {k: int(cfg.get(k, d)) for k, d in MM_DEFAULTS.items()}
    vision = Qwen3VLSpec(tower=tower, image_token_id=mm["image_token_id"], video_token_id=mm["video_token_id"],
                         vision_start_token_id=mm["vision_start_token_id"],
                         vision_end_token_id=mm["vision_end_token_id"], rope_theta=theta,
                         mrope_section=tuple(section))
    return dataclasses.replace(spec, vision=vision)



# ---- MRoPE positions and tables -------------------------------------------------------------
def rope_index(ids: np.ndarray, cu: np.ndarray, image_grid_thw, video_grid_thw, vs: Qwen3VLSpec) -> np.ndarray:
    """[3, N] (temporal, height, width) positions of packed ids, each document from 0, as
    transformers' Qwen3VLModel.get_rope_index with mm_token_type_ids from the ids (image tokens 1,
    video tokens 2): a text run counts on from the current position on all three axes; a run of
    visual tokens takes the next grid (a video one grid per frame: its timestamps are text tokens
    between the frames) and gets (start, start + row, start + column) over the merged grid, then
    the position moves on by max(h, w) / merge. Grids are taken in order across documents."""
    m = vs.tower.spatial_merge_size
    grids = {1: [tuple(int(x) for x in r) for r in np.asarray(image_grid_thw if image_grid_thw is not None else
                                                             np.zeros((0, 3)), np.int64).reshape(-1, 3)],
             2: [(1, int(h), int(w)) for t, h, w in np.asarray(video_grid_thw if video_grid_thw is not None else
                                                               np.zeros((0, 3)), np.int64).reshape(-1, 3)
                 for _ in range(int(t))]}
    used = {1: 0, 2: 0}
    kind = np.where(ids == vs.image_token_id, 1, np.where(ids == vs.video_token_id, 2, 0))
    out = np.zeros((3, len(ids)), np.int64)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        k = kind[a:b]
        edges = np.flatnonzero(np.diff(k)) + 1
        cur = 0
        for s, e in zip([0, *edges.tolist()], [*edges.tolist(), b - a]):
            t = int(k[s])
            if t == 0:
                out[:, a + s:a + e] = cur + np.arange(e - s)
                cur += e - s
                continue
            what = "image" if t == 1 else "video frame"
            if used[t] >= len(grids[t]):
                raise InvalidArgumentError(f"the prompt has more {what} token runs than {what} grids "
                                           f"({len(grids[t])})", hint="one vision_start ... vision_end run of pad "
                                           "tokens per image, per video frame")
            _, h, w = grids[t][used[t]]
            used[t] += 1
            gh, gw = h // m, w // m
            if e - s != gh * gw:
                raise InvalidArgumentError(f"a run of {e - s} {what} tokens at token {a + s} does not fit its "
                                           f"grid {h} x {w} ({gh * gw} merged tokens)",
                                           hint="put (h / merge) * (w / merge) pad tokens per image / frame")
            r, c = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
            out[0, a + s:a + e] = cur
            out[1, a + s:a + e] = cur + r.ravel()
            out[2, a + s:a + e] = cur + c.ravel()
            cur += max(h, w) // m
    for t, what in ((1, "image"), (2, "video frame")):
        if used[t] != len(grids[t]):
            raise InvalidArgumentError(f"{len(grids[t])} {what} grids but {used[t]} runs of their tokens",
                                       hint="one run of pad tokens per image, per video frame")
    return out


def mrope_tables(pos3: np.ndarray, head_dim: int, vs: Qwen3VLSpec) -> tuple[np.ndarray, np.ndarray]:
    """cos / sin f32 [N, head_dim / 2] of [3, N] positions: frequency i from the temporal axis,
    but from height where i % 3 == 1 and i < 3 section[1], from width where i % 3 == 2 and
    i < 3 section[2] (HF's interleaved MRoPE), all in f32 as transformers."""
    inv = (np.float32(1.0) / (np.float32(vs.rope_theta) ** (np.arange(0, head_dim, 2, dtype=np.float32)
                                                            / np.float32(head_dim)))).astype(np.float32)
    freqs = pos3.astype(np.float32)[:, :, None] * inv[None, None, :]  # [3, N, D/2]
    f = freqs[0].copy()
    for axis, offset in ((1, 1), (2, 2)):
        idx = slice(offset, vs.mrope_section[axis] * 3, 3)
        f[:, idx] = freqs[axis][:, idx]
    return np.ascontiguousarray(np.cos(f).astype(np.float32)), np.ascontiguousarray(np.sin(f).astype(np.float32))


def _visual(pixels, grid, what: str, v: VisionSpec):
    if pixels is None:
        return np.zeros((0, v.patch_features), np.float32), np.zeros((0, 3), np.int64)
    g = np.asarray(grid, np.int64).reshape(-1, 3)
    px = np.asarray(pixels, np.float32)
    if not len(g):
        raise InvalidArgumentError(f"{what}: no grid_thw rows", hint=f"pass None for no {what}")
    if px.ndim != 2 or px.shape != (int(g.prod(axis=1).sum()), v.patch_features):
        raise InvalidArgumentError(f"{what}: pixel rows {px.shape} do not fit the grids {g.tolist()} "
                                   f"([{int(g.prod(axis=1).sum())}, {v.patch_features}])",
                                   hint="pass the image / video processor's pixel_values with its grid_thw")
    return px, g


def encode_visual(model, pixels: np.ndarray, grid: np.ndarray, hidden: bool = False, padded: bool = True,
                  pre_merger: bool = False, projector=None):
    """The tower over the pixel rows of grids ``grid`` through the Model's executables (its weights):
    (merged rows [M, C], [DeepStack rows [M, C] per index]) f32, with ``hidden`` also the last
    hidden state; ``padded``: in the Program of `bucket`'s shape; ``pre_merger``: the rows the
    mergers read instead (run_tower's); ``projector``: the mergers of a served adapter
    (Model.projectors' key) in place of the model's."""
    def executable(patches: int, segments: int):
        return model.executable("vision", patches, segments, images=(patches, segments), projector=projector)

    return run_tower(executable, np.asarray(pixels, np.float32), grid, model.spec.vision.tower, hidden=hidden,
                     padded=padded, pre_merger=pre_merger)


def projector_inputs(n_tokens: int, index: np.ndarray, hidden: np.ndarray, deep: list[np.ndarray], v: VisionSpec,
                     C: int, dt) -> dict[str, np.ndarray]:
    """A trainable projector's inputs (dsl/nn_qwen3_vl.py): the tower rows the mergers read
    (``hidden`` [merge^2 M, Cv] and each DeepStack block's, merge blocks consecutive) put at the
    visual tokens ``index`` [M] (each token its block of merge^2 rows, zeros elsewhere), and the
    visual tokens' mask [N, C], in the model's dtype ``dt``."""
    from surogate.dsl.nn_qwen3_vl import DEEPSTACK_PATCHES, VISUAL_MASK, VISUAL_PATCHES

    def per_token(rows: np.ndarray) -> np.ndarray:
        out = np.zeros((n_tokens, v.merged_width), dt)
        out[index] = rows.reshape(len(index), v.merged_width)
        return out.reshape(n_tokens * v.merge_unit, v.hidden_size)

    mask = np.zeros((n_tokens, C), dt)
    mask[index] = 1
    feed = {VISUAL_PATCHES: per_token(hidden), VISUAL_MASK: mask}
    feed.update({f"{DEEPSTACK_PATCHES}.{j}": per_token(d) for j, d in enumerate(deep)})
    return feed


def visual_inputs(model, ids: np.ndarray, cu: np.ndarray, images, videos) -> tuple[int, dict[str, np.ndarray]]:
    """(M, the inputs of a Qwen3VLLM graph with M visual rows) for packed ids and ``images`` /
    ``videos`` = (pixel rows, grid_thw) or None: the tower run once over both (each frame attends
    within itself, so that equals HF's two calls), the merged rows at the image then the video pad
    tokens, the DeepStack rows, the MRoPE tables (with train_projector the mergers' inputs per token
    instead, `projector_inputs`). Neither: (0, {}), a text prompt (Qwen3's graph)."""
    from surogate.dsl.nn import MROPE_COS, MROPE_SIN
    from surogate.dsl.nn_qwen3_vl import DEEPSTACK, VISUAL_INDEX, VISUAL_ROWS, VISUAL_SLOTS

    vs = model.spec.vision
    v = vs.tower
    if images is None and videos is None:
        if np.isin(ids, [vs.image_token_id, vs.video_token_id]).any():
            raise InvalidArgumentError(f"the prompt has image or video tokens (ids {vs.image_token_id}, "
                                       f"{vs.video_token_id}) but no pixels were given",
                                       hint="pass images=(pixel_values, image_grid_thw) / videos=")
        return 0, {}
    (ipx, igrid), (vpx, vgrid) = _visual(*(images or (None, None)), "images", v), \
        _visual(*(videos or (None, None)), "videos", v)
    img_pos = np.flatnonzero(ids == vs.image_token_id)
    vid_pos = np.flatnonzero(ids == vs.video_token_id)
    n_img, n_vid = int(igrid.prod(axis=1).sum()) // v.merge_unit, int(vgrid.prod(axis=1).sum()) // v.merge_unit
    for what, have, want, tok in (("image", len(img_pos), n_img, vs.image_token_id),
                                  ("video", len(vid_pos), n_vid, vs.video_token_id)):
        if have != want:
            raise InvalidArgumentError(f"the prompt has {have} {what} tokens (id {tok}) but the {what}s give {want} "
                                       "merged rows", hint=f"put (t h w / merge^2) {what} tokens per {what}")
    pos3 = rope_index(ids, cu, igrid if len(igrid) else None, vgrid if len(vgrid) else None, vs)
    cos, sin = mrope_tables(pos3, model.spec.head_dim, vs)
    index = np.concatenate([img_pos, vid_pos]).astype(np.int32)
    dt = model.params["embed_tokens.weight"].dtype
    if vs.train_projector:  # the mergers are the language model's graph's: their inputs per token
        hidden, deep = encode_visual(model, np.concatenate([ipx, vpx]), np.concatenate([igrid, vgrid]),
                                     pre_merger=True)
        return len(index), {MROPE_COS: cos, MROPE_SIN: sin, VISUAL_INDEX: index,
                            **projector_inputs(len(ids), index, hidden, deep, v, model.spec.hidden_size, dt)}
    rows, deep = encode_visual(model, np.concatenate([ipx, vpx]), np.concatenate([igrid, vgrid]))
    M, C = rows.shape
    slots = np.full(len(ids), M, np.int32)
    slots[index] = np.arange(M, dtype=np.int32)
    feed = {MROPE_COS: cos, MROPE_SIN: sin, VISUAL_INDEX: index, VISUAL_ROWS: np.ascontiguousarray(rows),
            VISUAL_SLOTS: slots}
    for j, d in enumerate(deep):
        feed[f"{DEEPSTACK}.{j}"] = np.ascontiguousarray(np.concatenate([d, np.zeros((1, C), np.float32)]).astype(dt))
    return M, feed




def architecture(spec):
    from surogate.dsl.nn_qwen3_vl import Qwen3VLLM

    if spec.vision is None:  # the language model alone (qwen3_vl_text)
        return nn.CausalLM(spec)
    return Qwen3VLLM(spec, Qwen3VLVisionTower(spec.vision.tower))


def language_model_name(hf: str) -> str:
    """A text model's checkpoint name (model.layers.*) as Qwen3-VL's (model.language_model.layers.*)."""
    return f"model.language_model.{hf[len('model.'):]}" if hf.startswith("model.") else hf


def hf_name_table() -> NameTable:
    """The language model's parameters (Qwen3's table, under model.language_model.*: transformers 5's
    and the hub's names, so that load and `Model.to_hf` use them) and the tower's."""
    text = {}
    for ours, r in decoder.hf_name_table(qk_norm=True).entries.items():
        hf = tuple(language_model_name(h) for h in r.hf) if isinstance(r.hf, tuple) else language_model_name(r.hf)
        text[ours] = dataclasses.replace(r, hf=hf)
    return NameTable({**text, **vision_name_table().entries})


def family_aliases(hf: str) -> tuple[str, ...]:
    """The tower's tensors may be visual.* (transformers 4.5x); the rest as the table names them,
    and a text model's name (model.layers.*: what an adapter's modules are relative to, train/
    export.py checkpoint_prefix) under model.language_model.*."""
    if hf.startswith("model.") and not hf.startswith(("model.visual.", "model.language_model.")):
        return hf, language_model_name(hf)
    return checkpoint_aliases(hf)


def _encode_hook(model, pixel_values, grid_thw, hidden: bool, pooled: bool, projector=None):
    """`Model.encode_images` for Qwen3-VL (VisionHooks.encode): `encode_visual` over pixel rows
    with their grid_thw (no pooled form: its mergers are the tower's)."""
    if grid_thw is None:
        raise InvalidArgumentError(f"{model.spec.family}: encode_images needs the images' grid_thw",
                                   hint="pass the image processor's image_grid_thw")
    return encode_visual(model, np.asarray(pixel_values, np.float32), np.asarray(grid_thw), hidden=hidden,
                         projector=projector)


def _inputs_hook(model, ids, pos, cu, images, videos):
    """VisionHooks.inputs for Qwen3-VL: `visual_inputs`' feed (MRoPE tables, no positions), or
    None for a prompt without images or videos (Qwen3's graph)."""
    rows, feed = visual_inputs(model, ids, cu, images, videos)
    return (rows, ids, None, feed) if rows else None


# llama.cpp's form: Qwen3's text GGUF (qwen3vl) beside the mmproj (qwen3_vl_gguf.py).
GGUF = qwen3_vl_gguf.Qwen3VLGGUF(
    arch="qwen3vl", hf_architecture="Qwen3VLForConditionalGeneration", model_type="qwen3_vl",
    text_type="qwen3_vl_text", text_defaults=TEXT_DEFAULTS, spec_from_config=spec_from_config,
    text_tensors=lambda: decoder.gguf_tensor_table(rope_permuted=False, qk_norm=True))


def _family() -> Family:
    return Family(
        name="qwen3_vl",
        hf_architectures=("Qwen3VLForConditionalGeneration",),
        model_types=("qwen3_vl",),
        spec_from_config=spec_from_config,
        architecture=architecture,
        name_table=hf_name_table,
        checkpoint_aliases=family_aliases,
        image_prompt=image_prompt,
        vision=VisionHooks(encode=_encode_hook, inputs=_inputs_hook),
        # Block FP8 as Qwen's and RedHat's Qwen3-VL FP8 releases: the language model's projections
        # quantized, the whole vision tower kept (and listed module by module).
        fp8_linears=r"model\.language_model" + decoder.FP8_PROJECTIONS,
        fp8_kept=r"(model\.)?visual\..+",
        # llama.cpp's qwen3vl text model and its mmproj file (qwen3_vl_gguf.py).
        gguf=GGUF.architecture(),
        # Qwen's ChatML templates: Hermes tool calls; the Thinking checkpoints write <think>.
        chat=ChatDefaults(reasoning_parser="qwen3", tool_parser="hermes", model_types=("qwen3_vl",)),
        bench_shapes={},
        # tests/sgtest/tiny_models.py make_qwen3_vl's checkpoint (weights only: its tests feed token
        # ids 0..95, the placeholders 90..93): text 2 layers, hidden 64, heads 4 / 2 of 16,
        # mrope_section [2, 3, 3]; the tower of the tower tests (out 64).
        tiny=TinyModel(tokenizer="chatml", config=TINY, bos_token=None, eos_token="<|im_end|>"),
    )


TINY = {
    "vision_config": {"depth": 3, "hidden_size": 32, "intermediate_size": 48, "num_heads": 2, "in_channels": 3,
                      "patch_size": 8, "temporal_patch_size": 2, "spatial_merge_size": 2, "out_hidden_size": 64,
                      "num_position_embeddings": 16, "deepstack_visual_indexes": [0, 2],
                      "hidden_act": "gelu_pytorch_tanh"},
    "text_config": {"vocab_size": 96, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6,
                    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3],
                                        "mrope_interleaved": True}},
    "image_token_id": 90, "video_token_id": 91, "vision_start_token_id": 92, "vision_end_token_id": 93,
}

FAMILY = _family()
