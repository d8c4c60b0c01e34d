"""Gemma 3's image path (transformers' Gemma3ForConditionalGeneration), composed of DSL ops: the
SigLIP vision tower, the multimodal projector, and the language model reading the projected rows
in place of the image tokens' embeddings.

- The tower (SiglipVisionModel, no pooling head): the patch embedding (a conv with stride = patch
  size, run here as `patchify` on the host, in the conv weight's (channel, row, column) order,
  then a linear over the [out, in * p * p] view of the conv weight), learned position embeddings
  added, then per layer layer_norm -> attention (q / k / v / out biases, every patch seeing every
  patch of its own image: attention(causal=False) over per-image cu_seqlens) -> residual,
  layer_norm -> fc1 -> gelu_tanh -> fc2 -> residual; post_layernorm (HF's last_hidden_state).
- The projector (Gemma3MultiModalProjector): the patch grid average-pooled to mm_tokens_per_image
  cells (mean_pool_2d), RMS-normed times (1 + w) (mm_soft_emb_norm, the vision layer_norm_eps),
  times mm_input_projection_weight (HF's [vision, text]; held transposed, [text, vision], so that
  it is an ordinary linear).
- The language model (`Gemma3VisionLM`, Gemma 3's CausalLM): with images, each image token's row
  is the projected feature (not scaled by sqrt(hidden): HF replaces the scaled embeddings), and an
  image token sees every token of its image span (HF's token_type_ids mask; `kv_limit`).

The tower is frozen (forward only). So is the projector by default: the language model's graphs
read its rows as inputs. With ``VisionSpec.train_projector`` (the `train_projector` key) the
projector's norm and projection move into the language model's graph instead: it reads each
image token's pooled tower row (``image_pooled``, the frozen part) and projects it there, so
autodiff gives the projector's gradients (peft's ``modules_to_save: [multi_modal_projector]``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from surogate.dsl import ops
from surogate.dsl.graph import Graph, Value
from surogate.dsl.nn import KV_LIMIT, CausalLM, LoRAConfig, ModelSpec, SandwichBlock

VISION_PREFIX = "vision_tower"
PROJECTOR_PREFIX = "multi_modal_projector"
IMAGE_POOLED = "image_pooled"  # a trainable projector's input: each token's pooled tower row


@dataclass(frozen=True)
class VisionSpec:
    """The SigLIP tower and Gemma 3's projector, from Gemma3Config's vision_config and its own keys."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    image_size: int
    patch_size: int
    mm_tokens_per_image: int
    image_token_index: int
    text_hidden_size: int
    num_channels: int = 3
    layer_norm_eps: float = 1e-6
    boi_token_index: int | None = None
    eoi_token_index: int | None = None
    train_projector: bool = False  # the projector in the language model's graph, trainable

    @property
    def projector_modules(self) -> tuple[str, ...]:
        """The projector's module (our parameters' prefix, peft's modules_to_save name)."""
        return (PROJECTOR_PREFIX,)

    @property
    def grid(self) -> int:  # patches per side
        return self.image_size // self.patch_size

    @property
    def patches(self) -> int:  # patches per image
        return self.grid * self.grid

    @property
    def tokens_per_side(self) -> int:
        return int(round(self.mm_tokens_per_image ** 0.5))

    @property
    def pool_kernel(self) -> int:
        return self.grid // self.tokens_per_side

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_features(self) -> int:  # one patch's values: channels x patch x patch
        return self.num_channels * self.patch_size * self.patch_size


def patchify(pixel_values: np.ndarray, v: VisionSpec) -> np.ndarray:
    """[N, Cin, S, S] -> [N * grid * grid, Cin * p * p]: patch (gy, gx) of image n at row
    n * grid^2 + gy * grid + gx (HF's conv output flattened), its values in the conv weight's
    element order (channel, row in the patch, column)."""
    x = np.asarray(pixel_values)
    n, c, h, w = x.shape
    p, gr = v.patch_size, v.grid
    x = x.reshape(n, c, gr, p, gr, p).transpose(0, 2, 4, 1, 3, 5)
    return np.ascontiguousarray(x.reshape(n * gr * gr, c * p * p))


def project(g: Graph, pooled: Value, v: VisionSpec, dtype: str, trainable: bool) -> Value:
    """Gemma3MultiModalProjector after its pooling: (1 + w) RMSNorm, then the projection."""
    w = g.param("mm_soft_emb_norm.weight", (v.hidden_size,), dtype, trainable=trainable)
    y = ops.rmsnorm(pooled, w, v.layer_norm_eps, name="soft_emb_norm", weight_offset=1.0)
    proj = g.param("mm_input_projection_weight", (v.text_hidden_size, v.hidden_size), dtype, trainable=trainable)
    return ops.linear(y, proj, name="image_features")


class SiglipTower:
    """SiglipVisionModel's forward (vision_use_head false) plus Gemma3MultiModalProjector."""

    def __init__(self, v: VisionSpec):
        self.v = v

    def build(self, images: int, dtype: str = "float32") -> Graph:
        """The graph of ``images`` images: inputs ``pixel_patches`` f32 [images * patches, Cin p p]
        (`patchify`; rounded to ``dtype`` in the graph, not by a host astype), ``patch_positions``
        [images * patches] (0 .. patches - 1 per image), ``image_cu_seqlens`` [images + 1];
        outputs ``vision_hidden`` (HF's last_hidden_state, [images * patches, Cv]) and
        ``image_features`` [images * mm_tokens_per_image, text hidden]."""
        v = self.v
        C, P = v.hidden_size, v.patches
        n = images * P
        g = Graph(f"gemma3-vision-{images}")
        patches = g.input("pixel_patches", (n, v.patch_features), "float32")
        pos = g.input("patch_positions", (n,), "int32")
        cu = g.input("image_cu_seqlens", (images + 1,), "int32")

        def param(name: str, shape) -> Value:
            return g.param(name, shape, dtype, trainable=False)

        with g.scope(VISION_PREFIX):
            with g.scope("embeddings"):
                w = param("patch_embedding.weight", (C, v.num_channels, v.patch_size, v.patch_size))
                w2 = ops.view(w, (C, v.patch_features), name="patch_embedding.weight_2d")
                x = ops.linear(ops.cast(patches, dtype, name="pixel_patches_cast"), w2,
                               param("patch_embedding.bias", (C,)), name="patch_embeds")
                table = param("position_embedding.weight", (P, C))
                x = ops.add(x, ops.embedding(pos, table, name="position_embeds"), name="embeddings")
            for i in range(v.num_layers):
                with g.scope(f"encoder.layers.{i}"):
                    x = self._layer(g, x, cu, n, param)
            x = self._norm(g, x, param, "post_layernorm")
        g.mark_output("vision_hidden", x)
        with g.scope(PROJECTOR_PREFIX):
            pooled = ops.mean_pool_2d(x, v.grid, v.grid, v.pool_kernel, name="pooled")
            feats = project(g, pooled, v, dtype, trainable=False)
        g.mark_output("image_pooled", pooled)  # what a trainable projector reads (train_projector)
        g.mark_output("image_features", feats)
        return g

    def _norm(self, g: Graph, x: Value, param, name: str) -> Value:
        C = self.v.hidden_size
        return ops.layer_norm(x, param(f"{name}.weight", (C,)), param(f"{name}.bias", (C,)), self.v.layer_norm_eps,
                              name=name)

    def _linear(self, g: Graph, x: Value, param, name: str, cin: int, cout: int) -> Value:
        return ops.linear(x, param(f"{name}.weight", (cout, cin)), param(f"{name}.bias", (cout,)), name=name)

    def _layer(self, g: Graph, x: Value, cu: Value, n: int, param) -> Value:
        v = self.v
        C, H, D, F = v.hidden_size, v.num_heads, v.head_dim, v.intermediate_size
        y = self._norm(g, x, param, "layer_norm1")
        q, k, vv = (ops.view(self._linear(g, y, param, f"self_attn.{p}_proj", C, C), (n, H, D)) for p in "qkv")
        o = ops.attention(q, k, vv, cu, causal=False, name="self_attn.attn")
        o = self._linear(g, ops.view(o, (n, C)), param, "self_attn.out_proj", C, C)
        x = ops.add(x, o, name="attn_residual")
        y = self._norm(g, x, param, "layer_norm2")
        h = ops.gelu_tanh(self._linear(g, y, param, "mlp.fc1", C, F), name="mlp.act")
        return ops.add(x, self._linear(g, h, param, "mlp.fc2", F, C), name="mlp_residual")


class Gemma3VisionLM(CausalLM):
    """Gemma 3's language model that may read image rows: ``build(..., images=k)`` adds the inputs
    ``image_rows`` [k * mm_tokens + 1, C] (the projected features, then a row of zeros),
    ``image_slots`` [N] (each token's row of image_rows: its feature, or the zero row for a text
    token), ``text_mask`` [N, C] (1 on text tokens, 0 on image tokens) and ``kv_limit`` [N]; the
    first layer then reads embed(ids) * text_mask + image_rows[image_slots]. With train_projector
    the inputs are ``image_pooled`` [N, vision hidden] (each image token's pooled tower row, zeros
    on text tokens), text_mask and kv_limit, and the first layer reads embed(ids) * text_mask +
    project(image_pooled) (a zero row projects to zero: RMSNorm of 0 is 0, no bias), the
    projector's weights trainable. ``build(mode="vision", images=k)`` is the tower's graph."""

    def __init__(self, spec: ModelSpec):
        super().__init__(spec, block=SandwichBlock)
        self.tower = SiglipTower(spec.vision)
        self._images = 0

    def build(self, *, mode: str = "train", images: int = 0, **kw) -> Graph:
        if mode == "vision":
            return self.tower.build(max(images, 1), kw.get("dtype", "float32"))
        if images and mode == "serve":
            raise ValueError("image rows in a serving graph come through the engine's embeddings, not this build")
        self._images = images
        try:
            return super().build(mode=mode, **kw)
        finally:
            self._images = 0

    def embed(self, g: Graph, ids: Value, table: Value, dtype: str, lora: LoRAConfig | None) -> Value:
        x = super().embed(g, ids, table, dtype, lora)
        if not self._images:
            return x
        N, C = x.shape
        v = self.spec.vision
        if v.train_projector:
            pooled = g.input(IMAGE_POOLED, (N, v.hidden_size), dtype)
            mask = g.input("text_mask", (N, C), dtype)
            g.input(KV_LIMIT, (N,), "int32")
            with g.scope(PROJECTOR_PREFIX):
                feats = project(g, pooled, v, dtype, trainable=True)
            return ops.add(ops.act_mul(x, mask, name="embed_text"), feats, name="embed_merged")
        rows = g.input("image_rows", (self._images * self.spec.vision.mm_tokens_per_image + 1, C), dtype)
        slots = g.input("image_slots", (N,), "int32")
        mask = g.input("text_mask", (N, C), dtype)
        g.input(KV_LIMIT, (N,), "int32")
        text = ops.act_mul(x, mask, name="embed_text")
        return ops.add(text, ops.embedding(slots, rows, name="embed_images"), name="embed_merged")


def image_spans(ids: np.ndarray, cu: np.ndarray, image_token: int) -> list[tuple[int, int]]:
    """The [start, end) runs of image tokens in packed ids, none crossing a document boundary
    (HF's blocks of token_type_ids == 1)."""
    spans = []
    for a, b in zip(cu[:-1], cu[1:]):
        is_img = np.asarray(ids[a:b]) == image_token
        edges = np.flatnonzero(np.diff(np.concatenate([[0], is_img.astype(np.int8), [0]])))
        spans += [(int(a + s), int(a + e)) for s, e in zip(edges[::2], edges[1::2])]
    return spans


def image_inputs(ids: np.ndarray, pos: np.ndarray, cu: np.ndarray, rows: np.ndarray, v: VisionSpec,
                 np_dtype) -> dict[str, np.ndarray]:
    """The inputs of a Gemma3VisionLM graph with images for packed ids (the image tokens in order
    take the rows in order): input_ids with image tokens as 0 (HF's placeholder; their rows are
    replaced), image_rows, image_slots, text_mask and kv_limit (i for a text token; for a token of
    an image span, the span's last position, both within its sequence)."""
    is_img = ids == v.image_token_index
    n_img = int(is_img.sum())
    if n_img != rows.shape[0]:
        from surogate.errors import InvalidArgumentError

        raise InvalidArgumentError(f"the prompt has {n_img} image tokens (id {v.image_token_index}) but the images "
                                   f"give {rows.shape[0]} rows ({v.mm_tokens_per_image} per image)",
                                   hint="put mm_tokens_per_image image tokens in the prompt for each image")
    C = rows.shape[1]
    slots = np.full(len(ids), n_img, np.int32)
    slots[is_img] = np.arange(n_img, dtype=np.int32)
    kv_limit = pos.astype(np.int32).copy()
    for s, e in image_spans(ids, cu, v.image_token_index):
        kv_limit[s:e] = pos[e - 1]
    return {
        "input_ids": np.where(is_img, 0, ids).astype(np.int32),
        "image_rows": np.ascontiguousarray(np.concatenate([rows, np.zeros((1, C), np.float32)]).astype(np_dtype)),
        "image_slots": slots,
        "text_mask": np.ascontiguousarray(np.broadcast_to((~is_img)[:, None], (len(ids), C)).astype(np_dtype)),
        KV_LIMIT: kv_limit,
    }


def projector_inputs(ids: np.ndarray, pos: np.ndarray, cu: np.ndarray, pooled: np.ndarray, v: VisionSpec,
                     np_dtype) -> dict[str, np.ndarray]:
    """`image_inputs` for a graph with a trainable projector (train_projector): ``pooled``
    [images * mm_tokens_per_image, vision hidden] (the tower's pooled rows) give input_ids,
    image_pooled [N, vision hidden] (each image token's row, zeros on text tokens), text_mask and
    kv_limit."""
    feed = image_inputs(ids, pos, cu, pooled, v, np_dtype)
    table, slots = feed.pop("image_rows"), feed.pop("image_slots")
    feed[IMAGE_POOLED] = np.ascontiguousarray(table[slots])
    text = slots == len(table) - 1
    feed["text_mask"] = np.ascontiguousarray(np.broadcast_to(text[:, None], (len(ids), v.text_hidden_size))
                                             .astype(np_dtype))
    return feed
