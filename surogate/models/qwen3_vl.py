"""Qwen3-VL (transformers' Qwen3VLForConditionalGeneration, the dense family qwen3_vl): the vision
tower, Qwen3VLVisionModel, as a forward-only DSL graph, and the language model (Qwen3's decoder,
dsl/nn_qwen3_vl.py Qwen3VLLM) reading its outputs: the merged rows replace the image / video pad
tokens' embeddings, DeepStack feature j is added to the hidden state after decoder layer j at the
same positions, and the attention rotates by interleaved MRoPE (3-D positions from the ids and
the grids, `rope_index` / `mrope_tables`, made on the host). Model.forward / loss take
``images=(pixel_values, image_grid_thw)`` and ``videos=(pixel_values_videos, video_grid_thw)``
(`visual_inputs`); a prompt without them is Qwen3's graph (all three axes the text position).

Shape letters: N patches of all images / videos in one call (the processor's pixel rows), M = N /
merge^2 merged tokens, C vision width, H heads, D head dim, F MLP width, O out_hidden_size (the LLM's).

The tower, per transformers 5 (modeling_qwen3_vl.py, vision_utils.py):
- patch embedding: a Conv3d with kernel = stride = (T, P, P) over rows the processor already cut
  (surogate/io/image_processing.py QwenVLImageProcessor: [N, Cin * T * P * P] in (channel, frame,
  row, column) order, the patches of each merge x merge block consecutive): a linear over the
  [C, Cin T P P] view of the conv weight, with its bias.
- learned position embeddings (num_position_embeddings = side^2 rows) bilinearly resampled
  (align_corners) to each grid: 4 (row, weight) taps per patch, made on the host from grid_thw
  (`grid_tables`), gathered and summed in the graph (embedding_bag).
- 2D rotary: head dim D split into a row half and a column half, each D/4 frequencies of
  rope_theta; each patch's cos / sin from its (row, column) in the grid (`grid_tables`),
  applied by rope_table (rotate_half pairs i, i + D/2, f32 math as apply_rotary_pos_emb_vision).
- blocks: x + proj(attn(LayerNorm(x))), x + fc2(act(fc1(LayerNorm(x)))) (eps 1e-6), attention
  bidirectional within each frame (HF's cu_seqlens: t segments of h * w per grid); the fused qkv
  projection is held as three row blocks (q, k, v), each an ordinary linear: the same products.
- mergers (Qwen3VLVisionPatchMerger): M rows of merge^2 consecutive patches viewed as one of
  merge^2 C; LayerNorm before the view (the final merger) or after it (use_postshuffle_norm: the
  DeepStack mergers after blocks deepstack_visual_indexes), then fc1, exact GELU, fc2 -> O.

The tower is frozen: its graph is forward only. It is compiled per (patches, segments); a call
runs the Program of `bucket`'s shape (the merged tokens rounded up to 4 sizes per octave, the
segments to a power of two), the padding one more attention segment of zero pixels and empty
segments after it (`padded_tables`), its outputs dropped: batches of varying images (the served
encoder's, serve/multimodal.py) reuse a few Programs. The pixel rows come in f32 and are rounded
to the tower's dtype in the graph (`ops.cast`).

One file past 400 lines because the family is one file (house rule): the tower's spec, host
tables, graph, name table and runner, the text config, the MRoPE positions and the family; the
language model's graph is its own module (dsl/nn_qwen3_vl.py, as Gemma 3's nn_vision.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from surogate.dsl import ops
from surogate.dsl.graph import Graph, Value
from surogate.errors import ConfigError, FileFormatError, InvalidArgumentError, UnsupportedError
from surogate.models import decoder
from surogate.models.family import ChatDefaults, Family, GGUFArchitecture, TinyModel, VisionHooks
from surogate.models.name_table import Direct, NameTable, Rows

PREFIX = "visual"  # our parameter names: visual.blocks.{i}.attn.q.weight, ...
LN_EPS = 1e-6  # every LayerNorm of the tower (fixed in transformers' code)
ACTS = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh", "gelu": "gelu"}

# Qwen3VLVisionConfig's defaults (Qwen/Qwen3-VL-*'s vision_config lists most of them).
VISION_DEFAULTS = {"depth": 27, "hidden_size": 1152, "hidden_act": "gelu_pytorch_tanh", "intermediate_size": 4304,
                   "num_heads": 16, "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2,
                   "temporal_patch_size": 2, "out_hidden_size": 3584, "num_position_embeddings": 2304,
                   "deepstack_visual_indexes": [8, 16, 24]}


@dataclass(frozen=True)
class VisionSpec:
    """Qwen3VLVisionConfig's numbers."""

    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int
    num_position_embeddings: int
    deepstack_visual_indexes: tuple[int, ...]
    in_channels: int = 3
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    hidden_act: str = "gelu_pytorch_tanh"
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_features(self) -> int:  # one pixel row: Cin x T x P x P
        return self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size

    @property
    def merge_unit(self) -> int:  # patches per merged token
        return self.spatial_merge_size * self.spatial_merge_size

    @property
    def merged_width(self) -> int:
        return self.hidden_size * self.merge_unit

    @property
    def grid_side(self) -> int:  # the learned position grid is grid_side x grid_side
        return int(self.num_position_embeddings ** 0.5)


def _int(value, key: str) -> int:
    if isinstance(value, (list, tuple)):  # transformers allows [p, p]
        if len(set(value)) != 1:
            raise UnsupportedError(f"config.json: vision_config.{key} {list(value)} is not one size",
                                   hint="Qwen3-VL's tower takes square patches")
        value = value[0]
    return int(value)


def vision_spec_from_config(cfg: dict) -> VisionSpec:
    """The tower of a Qwen3VLConfig (its vision_config) or of a Qwen3VLVisionConfig itself."""
    if cfg.get("model_type") == "qwen3_vl_vision":
        vc = cfg
    elif "vision_config" in cfg or cfg.get("model_type") == "qwen3_vl":
        vc = cfg.get("vision_config") or {}  # absent: Qwen3VLVisionConfig's defaults, as transformers
    else:
        raise ConfigError("config.json: no vision_config (and model_type is not qwen3_vl)",
                          hint="a Qwen3VLForConditionalGeneration checkpoint's config.json has one")
    if vc.get("model_type", "qwen3_vl_vision") != "qwen3_vl_vision":
        raise UnsupportedError(f"config.json: vision_config.model_type {vc['model_type']!r} is not qwen3_vl_vision",
                               hint="this is Qwen3-VL's dense tower (Qwen3-VL-MoE's has the same layout but is not "
                                    "checked here)")
    c = {**VISION_DEFAULTS, **vc}
    c["depth"] = vc.get("depth", vc.get("num_hidden_layers", c["depth"]))
    c["num_heads"] = vc.get("num_heads", vc.get("num_attention_heads", c["num_heads"]))
    act = c["hidden_act"]
    if act not in ACTS:
        raise UnsupportedError(f"config.json: vision_config.hidden_act {act!r} is not supported",
                               hint=f"supported: {', '.join(ACTS)}")
    rope = c.get("rope_parameters") or {}
    if rope.get("rope_type", "axial") != "axial":
        raise UnsupportedError(f"config.json: vision_config.rope_parameters.rope_type {rope['rope_type']!r}",
                               hint="Qwen3-VL's tower has the axial 2D rope only")
    spec = VisionSpec(depth=int(c["depth"]), hidden_size=int(c["hidden_size"]),
                      intermediate_size=int(c["intermediate_size"]), num_heads=int(c["num_heads"]),
                      out_hidden_size=int(c["out_hidden_size"]),
                      num_position_embeddings=int(c["num_position_embeddings"]),
                      deepstack_visual_indexes=tuple(int(i) for i in c["deepstack_visual_indexes"]),
                      in_channels=int(c["in_channels"]), patch_size=_int(c["patch_size"], "patch_size"),
                      temporal_patch_size=_int(c["temporal_patch_size"], "temporal_patch_size"),
                      spatial_merge_size=int(c["spatial_merge_size"]), hidden_act=act,
                      rope_theta=float(rope.get("rope_theta", 10000.0)))
    problems = [
        (spec.hidden_size % spec.num_heads, f"hidden_size {spec.hidden_size} is not a multiple of num_heads "
                                            f"{spec.num_heads}"),
        (spec.head_dim % 4, f"the head dim {spec.head_dim} is not a multiple of 4 (the 2D rope's row and column "
                            "halves of rotated pairs)"),
        (spec.grid_side ** 2 != spec.num_position_embeddings,
         f"num_position_embeddings {spec.num_position_embeddings} is not a square"),
        (any(not 0 <= i < spec.depth for i in spec.deepstack_visual_indexes),
         f"deepstack_visual_indexes {list(spec.deepstack_visual_indexes)} are not all blocks of the {spec.depth}"),
    ]
    for bad, msg in problems:
        if bad:
            raise ConfigError(f"config.json: vision_config.{msg}", hint="check config.json")
    return spec


# ---- host tables: everything that depends only on grid_thw ----------------------------------
def _grids(grid_thw, v: VisionSpec) -> np.ndarray:
    g = np.asarray(grid_thw, dtype=np.int64).reshape(-1, 3)
    m = v.spatial_merge_size
    bad = [tuple(int(x) for x in r) for r in g if r.min() < 1 or r[1] % m or r[2] % m]
    if bad:
        raise InvalidArgumentError(f"grid_thw rows {bad}: t, h, w must be >= 1 and h, w multiples of "
                                   f"spatial_merge_size {m}", hint="pass the image processor's image_grid_thw")
    return g


def _block_order(h: int, w: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, column) of each patch of an h x w grid in the processor's order: m x m blocks
    row-major, the patches of a block row-major (transformers' get_vision_position_ids)."""
    r, c = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    shape = (h // m, m, w // m, m)
    return r.reshape(shape).transpose(0, 2, 1, 3).ravel(), c.reshape(shape).transpose(0, 2, 1, 3).ravel()


def _taps(index: np.ndarray, size: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Bilinear align_corners taps into a side-long axis for positions of a size-long one, f32 as
    transformers' _interpolation_axis_taps_weights (border clamp: the tap past the end weighs 0)."""
    src = index.astype(np.float32) * np.float32(side - 1) / np.float32(max(size - 1, 1))
    floor = np.floor(src)
    offsets = np.arange(2)
    taps = np.clip(floor.astype(np.int64)[:, None] + offsets, 0, side - 1)
    weights = np.clip(np.float32(1) - np.abs(src[:, None] - floor[:, None] - offsets.astype(np.float32)), 0, None)
    return taps, weights.astype(np.float32)


def grid_tables(grid_thw, v: VisionSpec) -> dict[str, np.ndarray]:
    """The graph inputs beside the pixels for images / videos of ``grid_thw`` [n, 3]:
    ``pos_ids`` / ``pos_weights`` [N, 4] (the position table rows and bilinear weights of each
    patch), ``rope_cos`` / ``rope_sin`` f32 [N, D/2] (row angles then column angles), and
    ``vision_cu_seqlens`` [frames + 1] (each frame of each grid its own attention segment)."""
    g = _grids(grid_thw, v)
    m, side, D = v.spatial_merge_size, v.grid_side, v.head_dim
    quarter = D // 4
    inv_freq = (np.float32(1.0) / (np.float32(v.rope_theta) ** (np.arange(0, D // 2, 2, dtype=np.float32)
                                                                / np.float32(D // 2)))).astype(np.float32)
    ids, wts, rows, cols, seg = [], [], [], [], []
    for t, h, w in g.tolist():
        r, c = _block_order(h, w, m)
        ht, hw = _taps(r, h, side)
        wt, ww = _taps(c, w, side)
        idx = (ht[:, :, None] * side + wt[:, None, :]).reshape(-1, 4)
        wgt = (hw[:, :, None] * ww[:, None, :]).reshape(-1, 4)
        ids += [idx] * t
        wts += [wgt] * t
        rows += [r] * t
        cols += [c] * t
        seg += [h * w] * t
    r = np.concatenate(rows).astype(np.float32)[:, None] * inv_freq[:quarter]
    c = np.concatenate(cols).astype(np.float32)[:, None] * inv_freq[:quarter]
    angles = np.concatenate([r, c], axis=1).astype(np.float32)
    cu = np.zeros(len(seg) + 1, np.int32)
    cu[1:] = np.cumsum(seg)
    return {"pos_ids": np.ascontiguousarray(np.concatenate(ids).astype(np.int32)),
            "pos_weights": np.ascontiguousarray(np.concatenate(wts).astype(np.float32)),
            "rope_cos": np.ascontiguousarray(np.cos(angles).astype(np.float32)),
            "rope_sin": np.ascontiguousarray(np.sin(angles).astype(np.float32)),
            "vision_cu_seqlens": cu}


def bucket(patches: int, segments: int, v: VisionSpec) -> tuple[int, int]:
    """The (patches, segments) of the Program a call of that many patches in that many frames runs
    (the tower compiles one per pair): the merged tokens (patches / merge^2) exact up to 8, then
    rounded up to 4 sizes per octave (10, 12, 14, 16, 20, 24, ...: under 25% padding), so that
    batches of varying images reuse a few Programs; the frames plus the padding's own, rounded up
    to a power of two (the rest empty segments)."""
    u = patches // v.merge_unit
    if u > 8:
        step = 1 << ((u - 1).bit_length() - 3)
        u = -(-u // step) * step
    padded = u * v.merge_unit
    s = segments + (padded > patches)
    return padded, 1 << (s - 1).bit_length()


def padded_tables(tables: dict[str, np.ndarray], patches: int, segments: int) -> dict[str, np.ndarray]:
    """`grid_tables`' tables for ``patches`` rows in ``segments`` segments: the padding rows one more
    attention segment (so that no real patch attends to them; whole merge blocks, so that no merged
    row mixes them in), reading position row 0 with weight 0 and rotated by nothing (cos 1, sin 0);
    the segments past it empty. The padding's outputs are dropped."""
    n = len(tables["pos_ids"])
    pad = patches - n
    cu = tables["vision_cu_seqlens"]
    if pad == 0 and len(cu) == segments + 1:
        return tables
    half = tables["rope_cos"].shape[1]
    return {"pos_ids": np.concatenate([tables["pos_ids"], np.zeros((pad, 4), np.int32)]),
            "pos_weights": np.concatenate([tables["pos_weights"], np.zeros((pad, 4), np.float32)]),
            "rope_cos": np.concatenate([tables["rope_cos"], np.ones((pad, half), np.float32)]),
            "rope_sin": np.concatenate([tables["rope_sin"], np.zeros((pad, half), np.float32)]),
            "vision_cu_seqlens": np.concatenate([cu, np.full(segments + 1 - len(cu), patches, np.int32)])}


def run_tower(executable, pixels: np.ndarray, grid_thw, v: VisionSpec, *, hidden: bool = False,
              padded: bool = True):
    """The tower over f32 pixel rows [N, Cin T P P] of grids ``grid_thw``: ``executable(patches,
    segments)`` gives the compiled Program; with ``padded`` the shape is `bucket`'s (zero pixel
    rows after the real ones, `padded_tables`). (merged rows [M, O], [DeepStack rows [M, O] per
    index]) f32 of the real patches, with ``hidden`` also the last hidden state [N, C]."""
    tables = grid_tables(grid_thw, v)
    n, frames = len(tables["pos_ids"]), len(tables["vision_cu_seqlens"]) - 1
    if pixels.shape != (n, v.patch_features):
        raise InvalidArgumentError(f"pixel_values has shape {pixels.shape}; grid_thw gives {n} patches of "
                                   f"{v.patch_features} values ([{n}, {v.patch_features}])",
                                   hint="pass the image processor's pixel_values with its image_grid_thw")
    patches, segments = bucket(n, frames, v) if padded else (n, frames)
    tables = padded_tables(tables, patches, segments)
    px = np.ascontiguousarray(pixels, dtype=np.float32)
    if patches > n:
        px = np.concatenate([px, np.zeros((patches - n, v.patch_features), np.float32)])
    exe = executable(patches, segments)
    exe.bind("pixel_values", px)
    for name, arr in tables.items():
        exe.bind(name, arr)
    exe.run()
    out = exe.graph.outputs
    m = n // v.merge_unit
    embeds = np.array(exe.read(out["image_embeds"].name), dtype=np.float32)[:m]
    deep = [np.array(exe.read(out[f"deepstack.{j}"].name), dtype=np.float32)[:m]
            for j in range(len(v.deepstack_visual_indexes))]
    if hidden:
        return embeds, deep, np.array(exe.read(out["vision_hidden"].name), dtype=np.float32)[:n]
    return embeds, deep


# ---- the graph ------------------------------------------------------------------------------
class Qwen3VLVisionTower:
    """Qwen3VLVisionModel's forward as a graph over N patches in ``segments`` frames."""

    def __init__(self, v: VisionSpec):
        self.v = v

    def build(self, patches: int, segments: int, dtype: str = "float32") -> Graph:
        """Inputs ``pixel_values`` f32 [N, Cin T P P] (rounded to ``dtype`` in the graph: a host
        astype to bf16 of 32 images' rows costs more than the device's cast) and `grid_tables`' five; outputs
        ``vision_hidden`` (HF's last_hidden_state, [N, C]), ``image_embeds`` (its pooler_output,
        [M, O]) and ``deepstack.{j}`` [M, O] for each DeepStack index j in order."""
        v = self.v
        C, N, Dh = v.hidden_size, patches, v.head_dim
        if N % v.merge_unit:
            raise InvalidArgumentError(f"{N} patches are not whole {v.spatial_merge_size} x {v.spatial_merge_size} "
                                       "merge blocks", hint="pass the image processor's pixel rows")
        g = Graph(f"qwen3-vl-vision-{N}-{segments}")
        px = g.input("pixel_values", (N, v.patch_features), "float32")
        pos_ids = g.input("pos_ids", (N, 4), "int32")
        pos_w = g.input("pos_weights", (N, 4), "float32")
        cos = g.input("rope_cos", (N, Dh // 2), "float32")
        sin = g.input("rope_sin", (N, Dh // 2), "float32")
        cu = g.input("vision_cu_seqlens", (segments + 1,), "int32")

        def param(name: str, shape) -> Value:
            return g.param(name, shape, dtype, trainable=False)

        deepstack = []
        with g.scope(PREFIX):
            w = param("patch_embed.proj.weight",
                      (C, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size))
            w2 = ops.view(w, (C, v.patch_features), name="patch_embed.proj.weight_2d")
            x = ops.linear(ops.cast(px, dtype, name="pixel_values_cast"), w2, param("patch_embed.proj.bias", (C,)),
                           name="patch_embeds")
            table = param("pos_embed.weight", (v.num_position_embeddings, C))
            x = ops.add(x, ops.embedding_bag(pos_ids, pos_w, table, name="pos_embeds"), name="embeddings")
            for i in range(v.depth):
                with g.scope(f"blocks.{i}"):
                    x = self._block(x, cos, sin, cu, param)
                if i in v.deepstack_visual_indexes:
                    j = v.deepstack_visual_indexes.index(i)
                    with g.scope(f"deepstack_merger_list.{j}"):
                        deepstack.append(self._merger(x, param, postshuffle=True))
            g.mark_output("vision_hidden", x)
            with g.scope("merger"):
                g.mark_output("image_embeds", self._merger(x, param, postshuffle=False))
        for j, d in enumerate(deepstack):
            g.mark_output(f"deepstack.{j}", d)
        return g

    def _linear(self, x: Value, param, name: str, cin: int, cout: int) -> Value:
        return ops.linear(x, param(f"{name}.weight", (cout, cin)), param(f"{name}.bias", (cout,)), name=name)

    def _norm(self, x: Value, param, name: str, width: int) -> Value:
        return ops.layer_norm(x, param(f"{name}.weight", (width,)), param(f"{name}.bias", (width,)), LN_EPS,
                              name=name)

    def _block(self, x: Value, cos: Value, sin: Value, cu: Value, param) -> Value:
        v = self.v
        C, H, D, F = v.hidden_size, v.num_heads, v.head_dim, v.intermediate_size
        N = x.shape[0]
        y = self._norm(x, param, "norm1", C)
        q, k, vv = (ops.view(self._linear(y, param, f"attn.{p}", C, C), (N, H, D)) for p in "qkv")
        q = ops.rope_table(q, cos, sin, name="attn.q_rope")
        k = ops.rope_table(k, cos, sin, name="attn.k_rope")
        o = ops.attention(q, k, vv, cu, causal=False, name="attn.attn")
        x = ops.add(x, self._linear(ops.view(o, (N, C)), param, "attn.proj", C, C), name="attn_residual")
        y = self._norm(x, param, "norm2", C)
        h = self._linear(y, param, "mlp.linear_fc1", C, F)
        h = ops.gelu_tanh(h, name="mlp.act") if ACTS[v.hidden_act] == "gelu_tanh" else ops.gelu(h, name="mlp.act")
        return ops.add(x, self._linear(h, param, "mlp.linear_fc2", F, C), name="mlp_residual")

    def _merger(self, x: Value, param, postshuffle: bool) -> Value:
        v = self.v
        W = v.merged_width
        M = x.shape[0] // v.merge_unit
        if postshuffle:
            y = self._norm(ops.view(x, (M, W), name="shuffled"), param, "norm", W)
        else:
            y = ops.view(self._norm(x, param, "norm", v.hidden_size), (M, W), name="shuffled")
        h = ops.gelu(self._linear(y, param, "linear_fc1", W, W), name="act")
        return self._linear(h, param, "linear_fc2", W, v.out_hidden_size)


# ---- names: our parameters <- a Qwen3VLForConditionalGeneration checkpoint -----------------
_TOWER = ["patch_embed.proj.weight", "patch_embed.proj.bias", "pos_embed.weight"]
_BLOCK = [f"{n}.{p}" for n in ("norm1", "norm2", "attn.proj", "mlp.linear_fc1", "mlp.linear_fc2")
          for p in ("weight", "bias")]
_MERGER = [f"{n}.{p}" for n in ("norm", "linear_fc1", "linear_fc2") for p in ("weight", "bias")]


def vision_name_table() -> NameTable:
    """Our tower's parameters <- transformers 5's names (model.visual.*, what its save_pretrained
    and the hub's Qwen3-VL files hold; `checkpoint_aliases` finds the older visual.*): the fused
    attn.qkv held as its q, k and v row blocks (name_table.Rows)."""
    V, H = f"{PREFIX}.", "model.visual."
    e = {f"{V}{n}": Direct(f"{H}{n}") for n in _TOWER}
    e.update({f"{V}blocks.{{i}}.{n}": Direct(f"{H}blocks.{{i}}.{n}") for n in _BLOCK})
    for j, part in enumerate("qkv"):
        for kind in ("weight", "bias"):
            e[f"{V}blocks.{{i}}.attn.{part}.{kind}"] = Rows(f"{H}blocks.{{i}}.attn.qkv.{kind}", j, 3)
    e.update({f"{V}merger.{n}": Direct(f"{H}merger.{n}") for n in _MERGER})
    # The DeepStack mergers are numbered like layers: {i} is the merger's index.
    e.update({f"{V}deepstack_merger_list.{{i}}.{n}": Direct(f"{H}deepstack_merger_list.{{i}}.{n}") for n in _MERGER})
    return NameTable(e)


def checkpoint_aliases(hf: str) -> tuple[str, ...]:
    """Where a checkpoint keeps a tensor of the table: model.visual.* (transformers 5, the hub's
    Qwen3-VL files), visual.* (transformers 4.5x's layout)."""
    if hf.startswith("model.visual."):
        return hf, hf[len("model."):]
    return (hf,)


def load_params(names: list[str], weights, source: str) -> dict[str, np.ndarray]:
    """Our parameters from a checkpoint's tensors (``weights``: ``name in weights``,
    ``weights.get(name)``), as float32 arrays; the first missing tensor is named."""
    def resolve(hf: str) -> str:
        found = next((a for a in checkpoint_aliases(hf) if a in weights), None)
        if found is None:
            raise FileFormatError(f"{source}: no tensor {' or '.join(checkpoint_aliases(hf))} for the vision tower",
                                  hint="the checkpoint lacks the vision tower, or the config does not match it "
                                       "(depth, deepstack_visual_indexes)")
        return found

    return vision_name_table().load(names, lambda hf: np.asarray(weights.get(resolve(hf)), dtype=np.float32),
                                    source, has=lambda hf: any(a in weights for a in checkpoint_aliases(hf)))


# ---- running it -----------------------------------------------------------------------------
class Qwen3VLVision:
    """The tower with its weights in ``dtype`` (float32 or bfloat16; the host tables and the pixel
    rows stay f32): `encode` compiles (once per `bucket` of patches and frames) and runs the graph."""

    def __init__(self, spec: VisionSpec, params: dict[str, np.ndarray], device: str = "cpu",
                 dtype: str = "float32"):
        import ml_dtypes

        if dtype not in ("float32", "bfloat16"):
            raise InvalidArgumentError(f"dtype {dtype!r} is not supported", hint="use float32 or bfloat16")
        self.spec, self.device, self.dtype = spec, device, dtype
        self._np = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float32)
        self.tower = Qwen3VLVisionTower(spec)
        names = [p.name for p in self.tower.build(spec.merge_unit, 1).params()]
        missing = [n for n in names if n not in params]
        if missing:
            raise InvalidArgumentError(f"vision tower parameters missing: {', '.join(missing[:5])}"
                                       + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""),
                                       hint="load them with Qwen3VLVision.from_folder or load_params")
        self.params = {n: np.ascontiguousarray(np.asarray(params[n]).astype(self._np)) for n in names}
        self._cache: dict[tuple[int, int], object] = {}
        self._on_device: dict[str, object] = {}  # GPU: one device copy of each weight for every executable

    @classmethod
    def from_folder(cls, path: str | Path, device: str = "cpu", dtype: str = "float32") -> "Qwen3VLVision":
        """A Qwen3VLForConditionalGeneration folder's tower (config.json's vision_config and the
        model.visual.* tensors)."""
        from surogate.io import ModelFolder

        folder = ModelFolder(path)
        spec = vision_spec_from_config(folder.config)
        graph_params = Qwen3VLVisionTower(spec).build(spec.merge_unit, 1).params()
        params = load_params([p.name for p in graph_params], folder.open_weights(), str(folder.path))
        for p in graph_params:
            if params[p.name].shape != tuple(p.shape):
                raise FileFormatError(f"{folder.path}: the tensor for {p.name} has shape {params[p.name].shape}, but "
                                      f"the config implies {tuple(p.shape)}",
                                      hint="the weights and the config do not belong together")
        return cls(spec, params, device, dtype)

    def _executable(self, patches: int, segments: int):
        from surogate.compile import Executable

        exe = self._cache.get((patches, segments))
        if exe is None:
            g = self.tower.build(patches, segments, self.dtype)
            keep = [g.outputs["image_embeds"], g.outputs["vision_hidden"]] + \
                [g.outputs[f"deepstack.{j}"] for j in range(len(self.spec.deepstack_visual_indexes))]
            exe = Executable(g, {}, self.device, keep=keep)
            for name in exe.external_names("param"):
                exe.bind(name, self.params[name], self._device_param(name))
            self._cache[(patches, segments)] = exe
        return exe

    def _device_param(self, name: str):
        if self.device == "cpu":
            return None
        if name not in self._on_device:
            from surogate import _native

            self._on_device[name] = _native.tensor(self.params[name]).to(self.device)
        return self._on_device[name]

    def encode(self, pixel_values, grid_thw, *, hidden: bool = False, padded: bool = True):
        """(merged embeddings [M, O], [DeepStack feature [M, O] per deepstack_visual_indexes]),
        float32 whatever the tower's dtype, for the processor's ``pixel_values`` [N, Cin T P P]
        and ``grid_thw`` [n, 3] (images and videos alike, in order); with ``hidden`` also the last
        hidden state [N, C]. ``padded``: run the Program of `bucket`'s shape (the same rows)."""
        px = np.asarray(pixel_values, dtype=np.float32)
        if px.ndim != 2:
            raise InvalidArgumentError(f"pixel_values has shape {px.shape}, not [N, {self.spec.patch_features}]",
                                       hint="pass the image processor's pixel_values with its image_grid_thw")
        return run_tower(self._executable, px, grid_thw, self.spec, hidden=hidden, padded=padded)


# ---- the language model: Qwen3VLForConditionalGeneration -----------------------------------
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

    @property
    def image_token_index(self) -> int:  # the name surogate/model.py reads (Gemma 3's)
        return self.image_token_id


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
    Qwen3VLTextConfig's defaults; tie_word_embeddings the outer config's) and ModelSpec.vision."""
    text = {**TEXT_DEFAULTS, **(cfg.get("text_config") or {})}
    if text.get("model_type", "qwen3_vl_text") != "qwen3_vl_text":
        raise UnsupportedError(f"config.json: text_config.model_type {text['model_type']!r} is not qwen3_vl_text",
                               hint="this is Qwen3-VL's dense language model (Qwen3-VL-MoE's is not supported)")
    theta, section = _text_rope(text)
    # transformers 5 ties by the outer key alone (Qwen3VLConfig's default False; text_config's is not read).
    tie = cfg.get("tie_word_embeddings", False)
    base = {**text, "tie_word_embeddings": bool(tie), "rope_parameters": {"rope_type": "default", "rope_theta": theta},
            "rope_scaling": None}
    spec = decoder.spec_from_config(base, "qwen3_vl", qk_norm=True)
    tower = vision_spec_from_config(cfg)
    problems = [
        (len(section) != 3 or sum(section) != spec.head_dim // 2,
         f"text_config mrope_section {list(section)} must be three counts summing to head_dim / 2 "
         f"({spec.head_dim // 2})"),
        (tower.out_hidden_size != spec.hidden_size,
         f"vision_config.out_hidden_size {tower.out_hidden_size} is not text_config.hidden_size {spec.hidden_size}"),
    ]
    for bad, msg in problems:
        if bad:
            raise ConfigError(f"config.json: {msg}", hint="check config.json")
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


def encode_visual(model, pixels: np.ndarray, grid: np.ndarray, hidden: bool = False, padded: bool = True):
    """The tower over the pixel rows of grids ``grid`` through the Model's executables (its weights):
    (merged rows [M, C], [DeepStack rows [M, C] per index]) f32, with ``hidden`` also the last
    hidden state; ``padded``: in the Program of `bucket`'s shape."""
    def executable(patches: int, segments: int):
        return model.executable("vision", patches, segments, images=(patches, segments))

    return run_tower(executable, np.asarray(pixels, np.float32), grid, model.spec.vision.tower, hidden=hidden,
                     padded=padded)


def visual_inputs(model, ids: np.ndarray, cu: np.ndarray, images, videos) -> tuple[int, dict[str, np.ndarray]]:
    """(M, the inputs of a Qwen3VLLM graph with M visual rows) for packed ids and ``images`` /
    ``videos`` = (pixel rows, grid_thw) or None: the tower run once over both (each frame attends
    within itself, so that equals HF's two calls), the merged rows at the image then the video pad
    tokens, the DeepStack rows, the MRoPE tables. Neither: (0, {}), a text prompt (Qwen3's graph)."""
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
    rows, deep = encode_visual(model, np.concatenate([ipx, vpx]), np.concatenate([igrid, vgrid]))
    index = np.concatenate([img_pos, vid_pos]).astype(np.int32)
    M, C = rows.shape
    slots = np.full(len(ids), M, np.int32)
    slots[index] = np.arange(M, dtype=np.int32)
    dt = model.params["embed_tokens.weight"].dtype
    feed = {MROPE_COS: cos, MROPE_SIN: sin, VISUAL_INDEX: index, VISUAL_ROWS: np.ascontiguousarray(rows),
            VISUAL_SLOTS: slots}
    for j, d in enumerate(deep):
        feed[f"{DEEPSTACK}.{j}"] = np.ascontiguousarray(np.concatenate([d, np.zeros((1, C), np.float32)]).astype(dt))
    return M, feed


# ---- serving: the prompt's images --------------------------------------------------------------
def serve_spans(token_ids, spec, images=((), (), ()), videos=((), (), ())) -> list:
    """The EmbedSpans of a prompt's images and video frames for the paged engine (dsl/nn_qwen3_vl.py's
    serving rows): ``images`` / ``videos`` = (grids_thw, rows, keys), one entry each, rows [t h w /
    merge^2, C (1 + deepstack)] (`encode_visual`'s merged rows and DeepStack rows side by side). Each
    run of pad tokens (an image; a video frame: its timestamp is text between frames) takes its rows
    [merged | DeepStack j ... | cos | sin], the tokens' MRoPE angles from `rope_index` over the
    whole prompt (the run's place in it: the prefix cache keys a block by its chain of tokens and
    spans, so equal keys see equal positions), and shifts the positions after it by max(h, w) /
    merge - its tokens (HF's rope_deltas, summed over runs). A video frame's key is the video's
    hashed with the frame index."""
    import hashlib

    from surogate.serve.multimodal import image_runs
    from surogate.serve.types import EmbedSpan

    vs = spec.vision
    m = vs.tower.spatial_merge_size
    ids = np.asarray(token_ids, np.int64)
    grids = {}
    views = []  # (token id, [(grid row of one run, rows, key)]) for images, then video frames
    for token, (g, rows, keys), what in ((vs.image_token_id, images, "image"), (vs.video_token_id, videos, "video")):
        g = np.asarray(g, np.int64).reshape(-1, 3)
        grids[what] = g if len(g) else None
        runs = []
        for (t, h, w), r, key in zip(g.tolist(), rows, keys):
            n = h * w // (m * m)
            if len(r) != t * n:
                raise InvalidArgumentError(f"a {what}'s rows {np.shape(r)} do not fit its grid {(t, h, w)}",
                                           hint="pass encode_visual's rows for the grid")
            runs += [((1, h, w), r[f * n:(f + 1) * n],
                      key if t == 1 else hashlib.sha256(key + f.to_bytes(4, "little")).digest()) for f in range(t)]
        got = image_runs(ids, token)
        want = [h * w // (m * m) for (_, h, w), _, _ in runs]
        if [n for _, n in got] != want:
            raise InvalidArgumentError(f"the prompt's {what} tokens (id {token}) come in runs of {[n for _, n in got]}; "
                                       f"its {what}s need runs of {want}",
                                       hint="render the messages with the model's chat template (LLM.render), which "
                                            f"expands each {what}; do not write the {what} token in the text")
        views += [(start, n, run) for (start, n), run in zip(got, runs)]
    pos3 = rope_index(ids, np.array([0, len(ids)]), grids["image"], grids["video"], vs)
    cos, sin = mrope_tables(pos3, spec.head_dim, vs)
    out = []
    for start, n, ((_, h, w), r, key) in sorted(views, key=lambda v: v[0]):
        payload = np.concatenate([np.asarray(r, np.float32), cos[start:start + n], sin[start:start + n]], axis=1)
        out.append(EmbedSpan(start, np.ascontiguousarray(payload), key, False, position_shift=max(h, w) // m - n))
    return out


def image_prompt(spec, tokenizer, folder: str | None):
    """Qwen3VLProcessor's text rule: the template writes <|vision_start|><|image_pad|><|vision_end|>
    per image and the processor repeats <|image_pad|> grid_t grid_h grid_w / merge^2 times (the grid
    of the image as QwenVLImageProcessor resizes it: preprocessor_config.json's, or without one the
    tower's patch and merge sizes); the tokens attend causally; each image's rows carry its
    DeepStack rows and MRoPE angles (`serve_spans`). Videos (``video``, when the tokenizer has
    <|video_pad|>): the template writes <|vision_start|><|video_pad|><|vision_end|> per video part
    and, as Qwen3VLProcessor in transformers 4.57 and vLLM expand it, that whole placeholder becomes
    ``<t seconds><|vision_start|><|video_pad|> x h w / merge^2<|vision_end|>`` per temporal patch
    (its frames' mean time), the clip sampled and resized by QwenVLVideoProcessor
    (video_preprocessor_config.json, or the tower's patch sizes with transformers' defaults)."""
    import os

    from surogate.io.image_processing import (IMAGE_CONFIG, VIDEO_CONFIG, QwenImages, QwenVLImageProcessor,
                                              QwenVLVideoProcessor, to_rgb)
    from surogate.models.family import ImagePrompt, VideoPrompt

    vs = spec.vision
    names = {}
    for what, index in (("vision_start", vs.vision_start_token_id), ("image", vs.image_token_id),
                        ("vision_end", vs.vision_end_token_id)):
        token = tokenizer.id_to_token(index)
        if token is None:
            raise ConfigError(f"config.json: the {what} token (id {index}) is not in the tokenizer's vocabulary",
                              hint="serve the model's own tokenizer.json (Qwen3-VL's has <|vision_start|>, "
                                   "<|image_pad|> and <|vision_end|>)")
        names[what] = token
    t = vs.tower
    if folder is not None and os.path.isfile(os.path.join(folder, IMAGE_CONFIG)):
        processor = QwenVLImageProcessor.from_folder(folder)
    else:
        processor = QwenVLImageProcessor.from_config({"patch_size": t.patch_size, "merge_size": t.spatial_merge_size,
                                                      "temporal_patch_size": t.temporal_patch_size})
    if (processor.patch_size, processor.merge_size, processor.temporal_patch_size) != \
            (t.patch_size, t.spatial_merge_size, t.temporal_patch_size):
        raise ConfigError(f"{IMAGE_CONFIG}: patch_size {processor.patch_size}, merge_size {processor.merge_size}, "
                          f"temporal_patch_size {processor.temporal_patch_size} differ from config.json's "
                          f"vision_config ({t.patch_size}, {t.spatial_merge_size}, {t.temporal_patch_size})",
                          hint="the tower cuts the processor's patches; fix one of the files")

    def grid(image) -> tuple[int, int, int]:
        return processor.grid_thw(*to_rgb(image).shape[:2])

    def image_text(n: int) -> str:  # an image of n merged tokens
        return f"{names['vision_start']}{names['image'] * n}{names['vision_end']}"

    def encode(encode_images, batches) -> list[np.ndarray]:  # the images' patch rows and grids in one call
        grids = np.concatenate([b.image_grid_thw for b in batches])
        merged, deep = encode_images(np.concatenate([b.pixel_values for b in batches]), grids)
        rows = np.concatenate([merged, *deep], axis=1)
        bounds = np.cumsum([0, *(grids.prod(axis=1) // t.merge_unit)])
        return [rows[a:b] for a, b in zip(bounds[:-1], bounds[1:])]

    video = None
    video_pad = tokenizer.id_to_token(vs.video_token_id)
    if video_pad is not None:
        tower_sizes = {"patch_size": t.patch_size, "merge_size": t.spatial_merge_size,
                       "temporal_patch_size": t.temporal_patch_size}
        if folder is not None and os.path.isfile(os.path.join(folder, VIDEO_CONFIG)):
            vproc = QwenVLVideoProcessor.from_folder(folder)
        else:
            vproc = QwenVLVideoProcessor.from_config(tower_sizes)
        if (vproc.patch_size, vproc.merge_size, vproc.temporal_patch_size) != tuple(tower_sizes.values()):
            raise ConfigError(f"{VIDEO_CONFIG}: patch_size {vproc.patch_size}, merge_size {vproc.merge_size}, "
                              f"temporal_patch_size {vproc.temporal_patch_size} differ from config.json's "
                              f"vision_config ({', '.join(map(str, tower_sizes.values()))})",
                              hint="the tower cuts the processor's patches; fix one of the files")

        def video_grid(v) -> tuple[int, int, int]:
            width, height = v.size
            return vproc.grid_thw(len(v.frames), height, width)

        def video_text(v) -> str:
            _, h, w = video_grid(v)
            frame = f"{names['vision_start']}{video_pad * (h * w // t.merge_unit)}{names['vision_end']}"
            return "".join(f"<{s:.1f} seconds>{frame}" for s in vproc.timestamps(v.frame_indices, v.fps))

        def video_batch(v) -> QwenImages:
            out = vproc(list(v.frames), fps=v.fps, sample=False)
            return QwenImages(out.pixel_values_videos, out.video_grid_thw)

        video = VideoPrompt(placeholder=f"{names['vision_start']}{video_pad}{names['vision_end']}",
                            text_of=video_text, batch=video_batch, fps=vproc.fps,
                            sample=lambda total, fps: vproc.sample_frame_indices(total, fps))

    def spans(token_ids, images, keys, rows, videos=(), video_keys=(), video_rows=()) -> list:
        return serve_spans(token_ids, spec, images=([grid(im) for im in images], rows, keys),
                           videos=([video_grid(v) for v in videos], video_rows, video_keys))

    return ImagePrompt(placeholder=f"{names['vision_start']}{names['image']}{names['vision_end']}",
                       image_text=image_text, processor=processor, image_token_id=vs.image_token_id,
                       tokens_per_view=0, bidirectional=False,
                       text_of=lambda image: image_text(processor.num_image_tokens(*to_rgb(image).shape[:2])),
                       encode=encode, spans=spans, video=video,
                       image_tokens=lambda image: processor.num_image_tokens(*to_rgb(image).shape[:2]))


def architecture(spec):
    from surogate.dsl.nn_qwen3_vl import Qwen3VLLM

    return Qwen3VLLM(spec, Qwen3VLVisionTower(spec.vision.tower))


def _language_model(hf: str) -> str:
    return f"model.language_model.{hf[len('model.'):]}" if hf.startswith("model.") else hf


def hf_name_table() -> NameTable:
    """The language model's parameters (Qwen3's table, under model.language_model.*: transformers 5's
    and the hub's names, so that load and `Model.to_hf` use them) and the tower's."""
    text = {}
    for ours, r in decoder.hf_name_table(qk_norm=True).entries.items():
        hf = tuple(_language_model(h) for h in r.hf) if isinstance(r.hf, tuple) else _language_model(r.hf)
        text[ours] = dataclasses.replace(r, hf=hf)
    return NameTable({**text, **vision_name_table().entries})


def family_aliases(hf: str) -> tuple[str, ...]:
    """The tower's tensors may be visual.* (transformers 4.5x); the rest as the table names them,
    and a text model's name (model.layers.*: what an adapter's modules are relative to, train/
    export.py checkpoint_prefix) under model.language_model.*."""
    if hf.startswith("model.") and not hf.startswith(("model.visual.", "model.language_model.")):
        return hf, _language_model(hf)
    return checkpoint_aliases(hf)


def _no_gguf(*_):
    raise UnsupportedError("Qwen3-VL in GGUF (llama.cpp's qwen3vl text model and mmproj file) is not supported",
                           hint="load the Hugging Face folder")


def _encode_hook(model, pixel_values, grid_thw, hidden: bool, pooled: bool):
    """`Model.encode_images` for Qwen3-VL (VisionHooks.encode): `encode_visual` over pixel rows
    with their grid_thw (no pooled form: its mergers are the tower's)."""
    if grid_thw is None:
        raise InvalidArgumentError(f"{model.spec.family}: encode_images needs the images' grid_thw",
                                   hint="pass the image processor's image_grid_thw")
    return encode_visual(model, np.asarray(pixel_values, np.float32), np.asarray(grid_thw), hidden=hidden)


def _inputs_hook(model, ids, pos, cu, images, videos):
    """VisionHooks.inputs for Qwen3-VL: `visual_inputs`' feed (MRoPE tables, no positions), or
    None for a prompt without images or videos (Qwen3's graph)."""
    rows, feed = visual_inputs(model, ids, cu, images, videos)
    return (rows, ids, None, feed) if rows else None


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
        gguf=GGUFArchitecture(name="qwen3vl", tensors=_no_gguf, config_from_gguf=_no_gguf, metadata=_no_gguf),
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
