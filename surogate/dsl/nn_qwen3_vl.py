"""Qwen3-VL's language model (transformers' Qwen3VLTextModel under Qwen3VLForConditionalGeneration)
reading the vision tower's rows: Qwen3's dense decoder (qk-norm blocks) with, when the graph has
visual rows (``build(images=M)``, M merged visual tokens of all images and videos):

- the merged rows in place of the image / video pad tokens' embeddings (``embed_rows``: HF's
  masked_scatter of the pooler output, rounded to the embeddings' dtype);
- interleaved MRoPE: each token's cos / sin [N, head_dim / 2] made on the host from its 3-D
  (temporal, height, width) position (models/qwen3_vl.py `mrope_tables`), applied by rope_table
  after the per-head q / k RMSNorm (Attention reads the graph inputs MROPE_COS / MROPE_SIN);
- DeepStack: after decoder layer j < len(deepstack_visual_indexes), the tower's j-th DeepStack
  feature added to the hidden state at the visual positions (an embedding of
  ``deepstack_rows.{j}`` [M + 1, C], its last row zeros, by each token's ``visual_slots``).

With ``train_projector`` (Qwen3VLSpec's, the `train_projector` key) the mergers move into this
graph, trainable (peft's modules_to_save: visual.merger and each visual.deepstack_merger_list.j):
it reads each visual token's merge block of tower rows instead of merged rows (``visual_patches``
[N merge^2, Cv], the tower's last hidden state, and ``deepstack_patches.{j}``, its hidden state
after DeepStack block j; zeros on text tokens) with ``visual_mask`` [N, C] (1 on visual tokens),
and runs each merger per token: the visual tokens' embeddings zeroed (embed_rows of zeros) plus
merger(visual_patches) * visual_mask, and after layer j DeepStack merger j's rows times the mask
(a text token's zeros would come out of the LayerNorm's bias, hence the mask). A merger treats
each merged row alone, so per token is HF's arithmetic, and no gather needs a gradient; the cost
is the mergers over every token rather than the M visual ones.

Without visual rows the graph is the qwen3 family's (1-D rope: HF's text positions are the same on
the three axes, so the interleaved tables equal the plain rope), serving included.

Serving (a paged step with request rows, ``KVCache(embeds=True)``): each row of an image's
EmbedSpan (models/qwen3_vl_prompt.py `serve_spans`) is [merged row | DeepStack row j for each j | cos |
sin] (``embed_width`` = C (1 + deepstack) + head_dim): the merged rows replace the embeddings, the
DeepStack rows are added after the first decoder layers at the same token rows, and the tokens'
cos / sin are the plain rope's at their (shifted) positions (``SERVE_COS`` / ``SERVE_SIN`` [P,
head_dim / 2], one row per position, `serve_tables`) with the span tokens' own interleaved MRoPE
angles in place. The steps without request rows (decode, text prompts) are Qwen3's graph at the
engine's rope positions, which each span's ``position_shift`` moves (HF's rope_deltas).
``build(mode="vision", images=(patches, frames))`` is the tower's graph (models/qwen3_vl_vision.py
Qwen3VLVisionTower). The tower is frozen: the language model's graphs read its rows as inputs.
"""

from __future__ import annotations

from surogate.dsl import ops
from surogate.dsl.graph import Dim, Graph, Value
from surogate.dsl.nn import MROPE_COS, MROPE_SIN, CausalLM, LoRAConfig, ModelSpec

VISUAL_INDEX = "visual_index"  # int32 [M]: the token row each merged visual row replaces
VISUAL_ROWS = "visual_rows"  # float32 [M, C]: the merged rows (images, then videos)
VISUAL_SLOTS = "visual_slots"  # int32 [N]: each token's visual row (M: none, the zero row)
DEEPSTACK = "deepstack_rows"  # deepstack_rows.{j} [M + 1, C] in the model's dtype
SERVE_COS, SERVE_SIN = "mrope_cos_by_position", "mrope_sin_by_position"  # serving: [P, head_dim / 2] f32
# train_projector's inputs: each token's merge block of tower rows [N merge^2, Cv] (the last
# hidden state; deepstack_patches.{j} the one after DeepStack block j), and the visual tokens' mask [N, C].
VISUAL_PATCHES, DEEPSTACK_PATCHES, VISUAL_MASK = "visual_patches", "deepstack_patches", "visual_mask"


class Qwen3VLLM(CausalLM):
    """Qwen3's CausalLM that may read M visual rows (see the module doc); ``tower``: the vision
    tower's graph builder (``tower.build(patches, frames, dtype)``)."""

    def __init__(self, spec: ModelSpec, tower):
        super().__init__(spec)
        self.tower = tower
        self._rows = 0

    @property
    def deepstack_layers(self) -> int:
        return len(self.spec.vision.tower.deepstack_visual_indexes)

    def build(self, *, mode: str = "train", images=0, **kw) -> Graph:
        if mode == "vision":
            patches, frames = images or (self.spec.vision.tower.merge_unit, 1)
            return self.tower.build(patches, frames, kw.get("dtype", "float32"))
        if images and mode == "serve":
            raise ValueError("visual rows in a serving graph come through the engine's embeddings, not this build")
        self._rows = int(images)
        self._serve_deep = []
        try:
            return super().build(mode=mode, **kw)
        finally:
            self._rows = 0
            self._serve_deep = []

    @property
    def embed_width(self) -> int:
        return self.spec.hidden_size * (1 + self.deepstack_layers) + self.spec.head_dim

    def serve_tables(self, kv) -> dict:
        """The plain rope's cos / sin of every position a step may hold (the KV cache's), f32 as
        models/qwen3_vl.py `mrope_tables` makes them for text tokens (all three axes equal)."""
        import numpy as np

        from surogate.models.qwen3_vl import mrope_tables

        P = kv.num_blocks * kv.block_size
        cos, sin = mrope_tables(np.broadcast_to(np.arange(P, dtype=np.int64), (3, P)), self.spec.head_dim,
                                self.spec.vision)
        return {SERVE_COS: cos, SERVE_SIN: sin}

    def embed_request_rows(self, g: Graph, x: Value, pos: Value, kv) -> Value:
        C, half = self.spec.hidden_size, self.spec.head_dim // 2
        k = self.deepstack_layers
        E = Dim("E")
        index = g.input("embed_index", (E,), "int32")
        rows = g.input("embed_rows", (E, self.embed_width), "float32")
        x = ops.embed_rows(x, index, ops.columns(rows, 0, (E, C), name="visual_rows"), name="embed_visual")
        self._serve_deep = [(index, ops.columns(rows, C * (1 + j), (E, C), name=f"deepstack_rows.{j}"))
                            for j in range(k)]
        P = kv.num_blocks * kv.block_size
        for name, table, offset in ((MROPE_COS, SERVE_COS, 0), (MROPE_SIN, SERVE_SIN, half)):
            by_pos = ops.embedding(pos, g.input(table, (P, half), "float32"), name=f"{name}.by_position")
            span = ops.columns(rows, C * (1 + k) + offset, (E, half), name=f"{name}.rows")
            ops.embed_rows(by_pos, index, span, name=name)  # MROPE_COS / MROPE_SIN: Attention reads them
        return x

    def embed(self, g: Graph, ids: Value, table: Value, dtype: str, lora: LoRAConfig | None) -> Value:
        x = super().embed(g, ids, table, dtype, lora)
        if not self._rows:
            return x
        N, C = x.shape
        M, half = self._rows, self.spec.head_dim // 2
        g.input(MROPE_COS, (N, half), "float32")
        g.input(MROPE_SIN, (N, half), "float32")
        if self.spec.vision.train_projector:
            t = self.spec.vision.tower
            g.input(VISUAL_MASK, (N, C), dtype)
            for j in range(self.deepstack_layers):
                g.input(f"{DEEPSTACK_PATCHES}.{j}", (N * t.merge_unit, t.hidden_size), dtype)
            index = g.input(VISUAL_INDEX, (M,), "int32")
            zeros = ops.fill(g, (M, C), "float32", 0.0, name="visual_zero_rows")
            text = ops.embed_rows(x, index, zeros, name="embed_text")
            patches = g.input(VISUAL_PATCHES, (N * t.merge_unit, t.hidden_size), dtype)
            return ops.add(text, self._project(g, patches, "merger", postshuffle=False), name="embed_visual")
        g.input(VISUAL_SLOTS, (N,), "int32")
        for j in range(self.deepstack_layers):
            g.input(f"{DEEPSTACK}.{j}", (M + 1, C), dtype)
        index = g.input(VISUAL_INDEX, (M,), "int32")
        return ops.embed_rows(x, index, g.input(VISUAL_ROWS, (M, C), "float32"), name="embed_visual")

    def after_block(self, g: Graph, layer: int, x: Value) -> Value:
        if self._serve_deep and layer < len(self._serve_deep):  # serving: the span tokens' rows, others 0
            index, rows = self._serve_deep[layer]
            zeros = ops.fill(g, x.shape, x.dtype, 0.0, name=f"deepstack.{layer}.zeros")
            return ops.add(x, ops.embed_rows(zeros, index, rows, name=f"deepstack.{layer}"),
                           name=f"deepstack_added.{layer}")
        if not self._rows or layer >= self.deepstack_layers:
            return x
        if self.spec.vision.train_projector:
            rows = self._project(g, g.values[f"{DEEPSTACK_PATCHES}.{layer}"], f"deepstack_merger_list.{layer}",
                                 postshuffle=True)
            return ops.add(x, rows, name=f"deepstack_added.{layer}")
        rows = ops.embedding(g.values[VISUAL_SLOTS], g.values[f"{DEEPSTACK}.{layer}"], name=f"deepstack.{layer}")
        return ops.add(x, rows, name=f"deepstack_added.{layer}")

    def _project(self, g: Graph, patches: Value, module: str, postshuffle: bool) -> Value:
        """A trainable merger (the tower's ``visual.{module}`` parameters) over each token's patch
        rows, times the visual tokens' mask: [N, C]."""
        mask = g.values[VISUAL_MASK]

        def param(name: str, shape) -> Value:
            return g.param(name, shape, mask.dtype, trainable=True)

        with g.scope(self.tower.prefix), g.scope(module):
            rows = self.tower.merger(patches, param, postshuffle, rows=mask.shape[0])
            return ops.act_mul(rows, mask, name="masked")
