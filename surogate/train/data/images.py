"""A chat row's images: their sources checked when the dataset is built, decoded and turned into
pixel values when a micro-batch is made.

A source (formats.Conversation.images) is a path (relative to the dataset file's folder, or
absolute; ``file://`` too), a ``data:image/...;base64,`` URL, or HF datasets' image record
``{"bytes": ..., "path": ...}`` (what an ``Image()`` column holds in parquet). When the dataset is
built each becomes a string the cache can hold: an absolute path (the file must exist) or a data
URL (bytes are base64-encoded). Remote URLs are not fetched: a training run reads what is on disk.
Decoding is `surogate.io.images.load_image`'s (PNG, JPEG, WebP, GIF; EXIF orientation; RGB).
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

import numpy as np

from surogate.errors import InvalidArgumentError
from surogate.train.data.formats import RowError


def resolve_image(source, base: Path | None, field: str) -> str:
    """The source as an absolute path to an existing file or a data URL (RowError naming ``field``)."""
    if isinstance(source, dict):
        data = source.get("bytes")
        if data:
            if isinstance(data, str):  # already base64 (JSON can hold no bytes)
                return f"data:image/png;base64,{data}"
            return "data:image/png;base64," + base64.b64encode(bytes(data)).decode("ascii")
        source = source.get("path")
        if not isinstance(source, str) or not source:
            raise RowError(f"{field}: an image record needs bytes or a path")
    if not isinstance(source, str) or not source:
        raise RowError(f"{field}: an image must be a path, a data: URL or a {{bytes, path}} record")
    head = source[:12].lower()
    if head.startswith("data:"):
        if not head.startswith("data:image/"):
            raise RowError(f"{field}: {source[:40]!r}... is a data: URL of no image type",
                           hint="data:image/png;base64,... (PNG, JPEG, WebP or GIF)")
        return source
    if head.startswith(("http://", "https://")):
        raise RowError(f"{field}: remote image {source!r} is not fetched in training",
                       hint="download the images and name their files (relative to the dataset file)")
    if head.startswith("file://"):
        source = source[len("file://"):]
    path = Path(source).expanduser()
    if not path.is_absolute():
        path = (base.parent if base is not None else Path.cwd()) / path
    if not path.is_file():
        raise RowError(f"{field}: no such image file {path}",
                       hint="image paths are relative to the dataset file's folder, or absolute")
    return str(path.resolve())


def resolve_images(sample, base: Path | None, prompt):
    """The Conversation with its image sources resolved (`resolve_image`, ``base``: the dataset
    file); with pan-and-scan (``prompt``: the family's ImagePrompt), each image decoded once to
    count its crops (the text holds a view per crop: ``image_crops``); for a family whose image
    tokens depend on the size (``prompt.image_tokens``: Qwen3-VL), ``image_crops`` holds each
    image's token count instead."""
    sources = tuple(resolve_image(s, base, f) for s, f in zip(sample.images, sample.image_fields))
    crops = ()
    if prompt is not None and prompt.image_tokens is not None:
        crops = tuple(prompt.image_tokens(img) for img in load_images(sources, sample.image_fields))
    elif prompt is not None and getattr(prompt.processor, "do_pan_and_scan", False):
        crops = tuple(prompt.num_crops(img) for img in load_images(sources, sample.image_fields))
    return sample._replace(images=sources, image_crops=crops)


def load_images(sources, fields=None) -> list:
    """The decoded RGB images (PIL) of resolved sources; with ``fields`` (building the dataset) a
    bad image is a RowError naming its field."""
    from surogate.io.images import load_image

    out = []
    for i, src in enumerate(sources):
        try:
            allowed = os.path.dirname(src) if not src.startswith("data:") else None
            out.append(load_image(src, allowed_local_media_path=allowed))
        except InvalidArgumentError as e:
            shown = src if not src.startswith("data:") else src[:40] + "..."
            if fields is not None:
                raise RowError(f"{fields[i]}: {e.message}", hint=e.hint) from None
            raise InvalidArgumentError(f"image {shown}: {e.message}", hint=e.hint) from None
    return out


def pixel_values(processor, sources) -> np.ndarray:
    """[views, 3, S, S] float32 for the resolved sources (the model's image processor): each
    image, then its pan-and-scan crops, the order the prompt holds their tokens in."""
    return processor(load_images(sources)).pixel_values
