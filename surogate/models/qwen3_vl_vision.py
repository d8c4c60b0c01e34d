"""Qwen3-VL's vision tower (transformers' Qwen3VLVisionModel) as a forward-only DSL graph: its
spec from config.json's vision_config, the host tables that depend only on the grids, the graph,
its HF name table, and a runner (`Qwen3VLVision`, the tower on its own; a loaded Model runs the
same graph through its executables, models/qwen3_vl.py `encode_visual`).

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

One file past 400 lines: the tower is one concept (its spec, tables, graph, names and runner
change together); the family around it is models/qwen3_vl.py, its served prompts
models/qwen3_vl_prompt.py, its GGUF form (llama.cpp's mmproj) models/qwen3_vl_gguf.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from surogate.dsl import ops
from surogate.dsl.graph import Graph, Value
from surogate.errors import ConfigError, FileFormatError, InvalidArgumentError, UnsupportedError
from surogate.models.name_table import Direct, NameTable, Rows

PREFIX = "visual"  # our parameter names: visual.blocks.{i}.attn.q.weight, ...
LN_EPS = 1e-6  # every LayerNorm of the tower (fixed in transformers' code)
# Qwen3VLVisionConfig's model_type, and Qwen3-VL-MoE's (Qwen3VLMoeVisionConfig subclasses it unchanged).
VISION_TYPES = ("qwen3_vl_vision", "qwen3_vl_moe_vision")
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
    if cfg.get("model_type") in VISION_TYPES:
        vc = cfg
    elif "vision_config" in cfg or cfg.get("model_type") in ("qwen3_vl", "qwen3_vl_moe"):
        vc = cfg.get("vision_config") or {}  # absent: Qwen3VLVisionConfig's defaults, as transformers
    else:
        raise ConfigError("config.json: no vision_config (and model_type is not qwen3_vl)",
                          hint="a Qwen3VLForConditionalGeneration checkpoint's config.json has one")
    if vc.get("model_type", "qwen3_vl_vision") not in VISION_TYPES:
        raise UnsupportedError(f"config.json: vision_config.model_type {vc['model_type']!r} is not qwen3_vl_vision",
                               hint="this is Qwen3-VL's tower (Qwen3VLVisionConfig, or Qwen3-VL-MoE's "
                                    "Qwen3VLMoeVisionConfig, the same class)")
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
              padded: bool = True, pre_merger: bool = False):
    """The tower over f32 pixel rows [N, Cin T P P] of grids ``grid_thw``: ``executable(patches,
    segments)`` gives the compiled Program; with ``padded`` the shape is `bucket`'s (zero pixel
    rows after the real ones, `padded_tables`). (merged rows [M, O], [DeepStack rows [M, O] per
    index]) f32 of the real patches, with ``hidden`` also the last hidden state [N, C];
    ``pre_merger``: what the mergers read instead, (last hidden state [N, C], [the hidden state
    after each DeepStack block [N, C]]) (a trainable projector's inputs)."""
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
    if pre_merger:
        return (np.array(exe.read(out["vision_hidden"].name), dtype=np.float32)[:n],
                [np.array(exe.read(out[f"deepstack_hidden.{j}"].name), dtype=np.float32)[:n]
                 for j in range(len(v.deepstack_visual_indexes))])
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

    prefix = PREFIX  # its parameters' scope

    def __init__(self, v: VisionSpec):
        self.v = v

    def build(self, patches: int, segments: int, dtype: str = "float32") -> Graph:
        """Inputs ``pixel_values`` f32 [N, Cin T P P] (rounded to ``dtype`` in the graph: a host
        astype to bf16 of 32 images' rows costs more than the device's cast) and `grid_tables`' five; outputs
        ``vision_hidden`` (HF's last_hidden_state, [N, C]), ``image_embeds`` (its pooler_output,
        [M, O]) and ``deepstack.{j}`` [M, O] for each DeepStack index j in order, with
        ``deepstack_hidden.{j}`` [N, C] the hidden state that merger reads (train_projector's input)."""
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
                    g.mark_output(f"deepstack_hidden.{j}", x)  # what a trainable DeepStack merger reads
                    with g.scope(f"deepstack_merger_list.{j}"):
                        deepstack.append(self.merger(x, param, postshuffle=True))
            g.mark_output("vision_hidden", x)
            with g.scope("merger"):
                g.mark_output("image_embeds", self.merger(x, param, postshuffle=False))
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

    def merger(self, x: Value, param, postshuffle: bool, rows=None) -> Value:
        """Qwen3VLVisionPatchMerger over patch rows x [merge^2 M, C] (merge blocks consecutive) ->
        [M, O] (``rows``: M, given when it is symbolic); the language model's graph runs it too when
        the projector trains (dsl/nn_qwen3_vl.py)."""
        v = self.v
        W = v.merged_width
        M = x.shape[0] // v.merge_unit if rows is None else rows
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
    Qwen3-VL files), visual.* (transformers 4.5x's layout); a name given as visual.* (an adapter's
    projector, peft.load_peft_adapter) is either too."""
    if hf.startswith("model.visual."):
        return hf, hf[len("model."):]
    if hf.startswith("visual."):
        return hf, f"model.{hf}"
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
