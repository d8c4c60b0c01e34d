"""A vision model's micro-batch inputs beyond the tokens: the rows its image tokens read.

The training Program of a model with a vision tower (dsl/nn_vision.py Gemma3VisionLM) is built
for a fixed number of images K: the most a micro-batch can hold (`images_per_batch`, the B
fullest packed rows). Per micro-batch `ImageFeed.load` decodes the batch's images (train/data/
images.py), runs the frozen tower and projector over K images (the batch's, then zero images, so
one vision Program serves every step; `Model.encode_images`), and fills the Program's inputs:
``image_rows`` [K * tokens + 1, C] (the rows, then zeros), ``image_slots`` [N] (each token's row;
the zero row for a text token), ``text_mask`` [N, C] and ``kv_limit`` [N] (an image token sees
its whole span). No gradient reaches the tower or the projector. With a trainable projector
(train_projector) the tower's rows pooled to the image tokens are the input instead:
``image_pooled`` [N, vision hidden] (each image token's row, zeros on text tokens), text_mask and
kv_limit; the training graph projects them (dsl/nn_vision.py projector_inputs).
"""

from __future__ import annotations

import numpy as np

from surogate.errors import ConfigError

IMAGE_INPUTS = ("image_rows", "image_slots", "text_mask", "kv_limit")
PROJECTOR_INPUTS = ("image_pooled", "text_mask", "kv_limit")  # train_projector's


def images_per_batch(datasets, batch_size: int, prompt) -> int:
    """The most image views (images and their pan-and-scan crops) one micro-batch of
    ``batch_size`` rows can hold, over the datasets (None entries and datasets without images
    count 0): each view is a run of ``prompt.tokens_per_view`` image tokens; for a family with
    size-dependent image tokens (``prompt.image_tokens``) the most image tokens instead."""
    most = 0
    for data in datasets:
        docs = getattr(data, "docs", None)
        if docs is None or docs.images is None:
            continue
        is_image = (docs.input_ids == prompt.image_token_id).astype(np.int64)
        per = 1 if prompt.image_tokens is not None else prompt.tokens_per_view  # Qwen3-VL: its merged rows
        per_doc = np.add.reduceat(is_image, docs.offsets[:-1]) // per if len(docs) else []
        per_row = sorted((int(sum(per_doc[d] for d in data.plan.row(r).tolist())) for r in range(data.num_rows)),
                         reverse=True)
        most = max(most, sum(per_row[:batch_size]))
    return most


class ImageFeed:
    """The image inputs of one training Program (``arrays``, bound once) for ``images`` images
    and ``n_tokens`` tokens per micro-batch; ``prompt``: the family's ``ImagePrompt``."""

    def __init__(self, model, prompt, images: int, n_tokens: int):
        from surogate.model import _np_dtype

        self.model, self.images = model, images
        self.processor = prompt.processor  # the family's ImagePrompt: the folder's image processor
        v, C = model.spec.vision, model.spec.hidden_size
        self.dtype = _np_dtype(model.dtype)
        self.projector = getattr(v, "train_projector", False)
        if self.projector:
            self.arrays = dict(zip(PROJECTOR_INPUTS, (np.zeros((n_tokens, v.hidden_size), self.dtype),
                                                      np.ones((n_tokens, C), self.dtype),
                                                      np.zeros(n_tokens, np.int32))))
        else:
            self.arrays = dict(zip(IMAGE_INPUTS, (np.zeros((images * v.mm_tokens_per_image + 1, C), self.dtype),
                                                  np.zeros(n_tokens, np.int32), np.ones((n_tokens, C), self.dtype),
                                                  np.zeros(n_tokens, np.int32))))

    def load(self, batch, input_ids: np.ndarray) -> None:
        """Fill ``arrays`` for the micro-batch, and ``input_ids`` with its ids (image tokens read
        as 0: their rows are replaced)."""
        from surogate.dsl.nn_vision import image_inputs, projector_inputs
        from surogate.train.data.images import pixel_values

        m, v = self.model, self.model.spec.vision
        rows = np.zeros((0, v.hidden_size if self.projector else m.spec.hidden_size), np.float32)
        if batch.images:
            px = pixel_values(self.processor, batch.images)  # the views: images and their crops
            n = len(px)
            if n > self.images:
                raise ConfigError(f"a micro-batch holds {n} image views, the training Program {self.images}",
                                  where="datasets")
            padded = np.zeros((self.images, *px.shape[1:]), np.float32)
            padded[:n] = px
            rows = m.encode_images(padded, pooled=self.projector)[:n * v.mm_tokens_per_image]
        inputs = projector_inputs if self.projector else image_inputs
        feed = inputs(batch.input_ids, batch.position_ids, batch.cu_seqlens, rows, v, self.dtype)
        input_ids[:] = feed.pop("input_ids")
        if not self.projector:
            table, used = self.arrays["image_rows"], feed.pop("image_rows")
            table[:len(used)] = used
            table[len(used):] = 0
        for name, arr in feed.items():
            self.arrays[name][:] = arr


def _qwen3_vl_feed(model, prompt, images: int, n_tokens: int):
    from surogate.train.qwen3_vl_feed import Qwen3VLFeed

    return Qwen3VLFeed(model, prompt, images, n_tokens)


# The training feed of each vision family, by family name (models/ cannot import train/: the
# choice lives here). A vision family not listed trains on text rows only (images_refused).
FEEDS = {"gemma3": lambda model, prompt, images, n_tokens: ImageFeed(model, prompt, images, n_tokens),
         "qwen3_vl": _qwen3_vl_feed, "qwen3_vl_moe": _qwen3_vl_feed}


def has_feed(family_name: str) -> bool:
    """Whether the trainer can feed this vision family's images (Gemma 3's, Qwen3-VL's and its MoE's)."""
    return family_name in FEEDS


def make_feed(model, prompt, images: int, n_tokens: int):
    """The family's training feed: Qwen3-VL's (train/qwen3_vl_feed.py, ``images``: merged rows)
    or Gemma 3's `ImageFeed`."""
    return FEEDS[model.family.name](model, prompt, images, n_tokens)
