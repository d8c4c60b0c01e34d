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

Without visual rows the graph is the qwen3 family's (1-D rope: HF's text positions are the same on
the three axes, so the interleaved tables equal the plain rope), serving included.
``build(mode="vision", images=(patches, frames))`` is the tower's graph (models/qwen3_vl.py
Qwen3VLVisionTower). The tower is frozen: the language model's graphs read its rows as inputs.
"""

from __future__ import annotations

from surogate.dsl import ops
from surogate.dsl.graph import Graph, Value
from surogate.dsl.nn import MROPE_COS, MROPE_SIN, CausalLM, LoRAConfig, ModelSpec
from surogate.errors import UnsupportedError

VISUAL_INDEX = "visual_index"  # int32 [M]: the token row each merged visual row replaces
VISUAL_ROWS = "visual_rows"  # float32 [M, C]: the merged rows (images, then videos)
VISUAL_SLOTS = "visual_slots"  # int32 [N]: each token's visual row (M: none, the zero row)
DEEPSTACK = "deepstack_rows"  # deepstack_rows.{j} [M + 1, C] in the model's dtype


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
        kv = kw.get("kv")
        if mode == "serve" and kv is not None and kv.embeds:
            # The rows alone would run with 1-D positions: the prompt's logits would be wrong.
            raise UnsupportedError("Qwen3-VL: serving with image rows needs the MRoPE positions (3-D per token) and "
                                   "the DeepStack rows in the paged step, which it does not take yet",
                                   hint="serve Qwen3-VL for text only; Model.forward(ids, images=...) runs images")
        self._rows = int(images)
        try:
            return super().build(mode=mode, **kw)
        finally:
            self._rows = 0

    def embed(self, g: Graph, ids: Value, table: Value, dtype: str, lora: LoRAConfig | None) -> Value:
        x = super().embed(g, ids, table, dtype, lora)
        if not self._rows:
            return x
        N, C = x.shape
        M, half = self._rows, self.spec.head_dim // 2
        g.input(MROPE_COS, (N, half), "float32")
        g.input(MROPE_SIN, (N, half), "float32")
        g.input(VISUAL_SLOTS, (N,), "int32")
        for j in range(self.deepstack_layers):
            g.input(f"{DEEPSTACK}.{j}", (M + 1, C), dtype)
        index = g.input(VISUAL_INDEX, (M,), "int32")
        return ops.embed_rows(x, index, g.input(VISUAL_ROWS, (M, C), "float32"), name="embed_visual")

    def after_block(self, g: Graph, layer: int, x: Value) -> Value:
        if not self._rows or layer >= self.deepstack_layers:
            return x
        rows = ops.embedding(g.values[VISUAL_SLOTS], g.values[f"{DEEPSTACK}.{layer}"], name=f"deepstack.{layer}")
        return ops.add(x, rows, name=f"deepstack_added.{layer}")
