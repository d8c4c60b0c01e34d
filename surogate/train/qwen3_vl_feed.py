"""Qwen3-VL's micro-batch inputs beyond the tokens (the training Program of dsl/nn_qwen3_vl.py
Qwen3VLLM built for M merged visual rows: `image_feed.images_per_batch`, the most image tokens
a micro-batch of the dataset holds).

Per micro-batch `Qwen3VLFeed.load` decodes the batch's images (in the order of their token runs
across the packed documents), runs QwenVLImageProcessor and the frozen tower once over them
(models/qwen3_vl.py `visual_inputs`: merged rows, DeepStack rows, interleaved-MRoPE cos / sin from
`rope_index` over the packed documents, each document's positions from 0 with its own images'
grids), and fills the Program's inputs padded to M: ``visual_index`` -1 past the batch's rows
(embed_rows skips them), ``visual_rows`` and ``deepstack_rows.{j}`` zeros there, ``visual_slots``
M (the zero row) on text tokens. A micro-batch without images gets the text positions' tables (all
three axes equal). No gradient reaches the tower. With train_projector (the mergers trainable in
the Program) the tower's pre-merger rows per token come instead (``visual_patches``,
``deepstack_patches.{j}``, ``visual_mask``: models/qwen3_vl.py projector_inputs), zeros and a zero
mask without images.
"""

from __future__ import annotations

import numpy as np

from surogate.errors import ConfigError


class Qwen3VLFeed:
    """The visual inputs of one training Program (``arrays``, bound once) for ``rows`` merged
    visual rows and ``n_tokens`` tokens per micro-batch; ``prompt``: the family's ``ImagePrompt``."""

    def __init__(self, model, prompt, rows: int, n_tokens: int):
        from surogate.dsl.nn import MROPE_COS, MROPE_SIN
        from surogate.dsl.nn_qwen3_vl import (DEEPSTACK, DEEPSTACK_PATCHES, VISUAL_INDEX, VISUAL_MASK, VISUAL_PATCHES,
                                              VISUAL_ROWS, VISUAL_SLOTS)

        self.model, self.rows, self.processor = model, rows, prompt.processor
        C, half = model.spec.hidden_size, model.spec.head_dim // 2
        dt = model.params["embed_tokens.weight"].dtype
        v = model.spec.vision
        k = len(v.tower.deepstack_visual_indexes)
        self.projector = v.train_projector
        self.deepstack = [f"{DEEPSTACK}.{j}" for j in range(k)]
        self.arrays = {MROPE_COS: np.zeros((n_tokens, half), np.float32),
                       MROPE_SIN: np.zeros((n_tokens, half), np.float32), VISUAL_INDEX: np.full(rows, -1, np.int32)}
        if self.projector:
            patches = (n_tokens * v.tower.merge_unit, v.tower.hidden_size)
            self.per_token = [VISUAL_PATCHES, *(f"{DEEPSTACK_PATCHES}.{j}" for j in range(k)), VISUAL_MASK]
            self.arrays.update({name: np.zeros(patches, dt) for name in self.per_token[:-1]})
            self.arrays[VISUAL_MASK] = np.zeros((n_tokens, C), dt)
        else:
            self.arrays.update({VISUAL_ROWS: np.zeros((rows, C), np.float32),
                                VISUAL_SLOTS: np.full(n_tokens, rows, np.int32),
                                **{name: np.zeros((rows + 1, C), dt) for name in self.deepstack}})
        self._names = (MROPE_COS, MROPE_SIN, VISUAL_INDEX, VISUAL_ROWS, VISUAL_SLOTS)

    def load(self, batch, input_ids: np.ndarray) -> None:
        """Fill ``arrays`` for the micro-batch (``input_ids``, its ids, stay as they are: the
        image pad tokens' embeddings are replaced in the graph)."""
        from surogate.models.qwen3_vl import mrope_tables, rope_index, visual_inputs
        from surogate.train.data.images import load_images

        m, a = self.model, self.arrays
        cos_name, sin_name, index_name, rows_name, slots_name = self._names
        ids = np.asarray(batch.input_ids)
        cu = np.unique(np.concatenate([[0], np.asarray(batch.cu_seqlens), [len(ids)]])).astype(np.int64)
        images = None
        if batch.images:
            out = self.processor(load_images(batch.images))
            images = (out.pixel_values, out.image_grid_thw)
        M, feed = visual_inputs(m, ids, cu, images, None)
        if M > self.rows:
            raise ConfigError(f"a micro-batch holds {M} image tokens, the training Program {self.rows}",
                              where="datasets")
        if not M:  # text only: the positions on all three axes
            feed = dict(zip((cos_name, sin_name),
                            mrope_tables(rope_index(ids, cu, None, None, m.spec.vision), m.spec.head_dim,
                                         m.spec.vision)))
        a[cos_name][:], a[sin_name][:] = feed[cos_name], feed[sin_name]
        a[index_name][:] = -1
        if self.projector:  # the mergers' inputs per token (zeros and a zero mask without images)
            if M:
                a[index_name][:M] = feed[index_name]
            for name in self.per_token:
                a[name][:] = feed[name] if M else 0
            return
        a[rows_name][:] = 0
        a[slots_name][:] = self.rows
        for name in self.deepstack:
            a[name][:] = 0
        if M:
            a[index_name][:M] = feed[index_name]
            a[rows_name][:M] = feed[rows_name]
            slots = feed[slots_name]
            a[slots_name][:] = np.where(slots == M, self.rows, slots)
            for name in self.deepstack:
                a[name][:M] = feed[name][:M]
