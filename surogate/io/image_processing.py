"""The pixel values a vision model reads, computed as the Hugging Face processors compute them.

Three processors, each built from the JSON config a model folder ships and equal to transformers'
own to the last float32 bit. transformers has two backends: PIL/numpy (``...Pil`` classes, what
it runs without torchvision) and torchvision (what it picks when torchvision is installed: torch's
uint8 resize kernel and a fused float32 normalize). ``backend="pil"`` (the default) equals the
first; ``backend="torchvision"`` equals the second wherever torchvision resizes uint8 natively on
CPU (bicubic always, bilinear on AVX2 / AVX512 machines; ``image_resize.resize_like_torch``):

- ``Gemma3ImageProcessor`` (``preprocessor_config.json``; transformers' ``Gemma3ImageProcessorPil``):
  RGB, optional pan-and-scan crops, resize to a square, rescale, normalize -> ``[N, 3, S, S]``.
- ``QwenVLImageProcessor`` (Qwen2-VL, Qwen2.5-VL, Qwen3-VL images; ``Qwen2VLImageProcessorPil``):
  ``smart_resize`` to a multiple of patch_size * merge_size, rescale, normalize, the single frame
  repeated ``temporal_patch_size`` times, patches flattened in the merge-block order
  -> ``[grid_t * grid_h * grid_w, C * T * P * P]`` plus ``image_grid_thw``.
- ``QwenVLVideoProcessor`` (Qwen3-VL videos; ``video_preprocessor_config.json``;
  ``Qwen3VLVideoProcessor``): frame sampling by fps or count, one resize for the whole clip,
  temporal patches -> ``pixel_values_videos``, ``video_grid_thw`` and each temporal patch's time.
  transformers has this one only on torchvision, so it always takes that backend.

Arrays are channels-last uint8 until the rescale, as in transformers (both backends resize uint8
pixels), so every step is the same operation on the same dtype. Shape letters: N images, F frames,
C channels (3), T temporal_patch_size, P patch_size, M merge_size, S the square side.
The file holds the three processors and their shared steps; it is past ~400 lines for that reason.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import numpy as np
from PIL import Image

from surogate.errors import ConfigError, InvalidArgumentError
from surogate.io.hf_folder import read_json
from surogate.io.image_resize import resize_like_torch, resize_pil

BACKENDS = ("pil", "torchvision")

IMAGE_CONFIG = "preprocessor_config.json"
VIDEO_CONFIG = "video_preprocessor_config.json"

# transformers' IMAGENET_STANDARD_* and OPENAI_CLIP_* constants (the processors' class defaults).
STANDARD_MEAN = (0.5, 0.5, 0.5)
STANDARD_STD = (0.5, 0.5, 0.5)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

ImageLike = Image.Image | np.ndarray


# --- shared steps ----------------------------------------------------------------------------------

def to_rgb(image: ImageLike) -> np.ndarray:
    """``[H, W, 3]`` uint8: transformers' ``convert_to_rgb`` (transparency composited onto white)."""
    if isinstance(image, Image.Image):
        if "A" in image.getbands() or image.info.get("transparency") is not None:
            rgba = image.convert("RGBA")
            white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            image = Image.alpha_composite(white, rgba)
        return np.asarray(image.convert("RGB"))
    if not isinstance(image, np.ndarray):
        raise InvalidArgumentError(f"an image must be a PIL.Image.Image or a numpy array, got {type(image).__name__}",
                                   hint="decode it first (surogate.io.images.load_image)")
    if image.dtype != np.uint8:
        raise InvalidArgumentError(f"an image array must be uint8, got {image.dtype}",
                                   hint="pass 0..255 pixel values as np.uint8, channels last")
    if image.ndim == 2:
        image = image[..., None]
    if image.ndim != 3 or image.shape[-1] not in (1, 3, 4):
        raise InvalidArgumentError(f"an image array must be [H, W], [H, W, 1], [H, W, 3] or [H, W, 4]; "
                                   f"got {image.shape}",
                                   hint="pass one frame, channels last")
    if image.shape[-1] == 1:
        return np.repeat(image, 3, axis=-1)
    if image.shape[-1] == 4:  # the arithmetic of transformers' numpy branch, which differs from Pillow's
        alpha = image[..., 3:4] / 255
        return np.round(alpha * image[..., :3] + (1 - alpha) * 255).astype(np.uint8)
    return image


def resize(pixels: np.ndarray, height: int, width: int, spec: "PixelSpec") -> np.ndarray:
    """``pixels`` [..., H, W, 3] uint8 (one image or a stack of frames) resized by the backend's kernel."""
    if spec.backend == "torchvision":
        return resize_like_torch(pixels, height, width, spec.resample)
    if pixels.ndim == 3:
        return resize_pil(pixels, height, width, spec.resample)
    return np.stack([resize_pil(p, height, width, spec.resample) for p in pixels])


def rescale_normalize(pixels: np.ndarray, spec: "PixelSpec") -> np.ndarray:
    """``[..., 3]`` uint8 -> float32 in the backend's arithmetic: each output a function of its
    uint8 value and channel alone, so looked up in a table of the 256 x 3 results (bit-identical
    to computing them, 5x faster)."""
    table = _value_table(spec)
    out = np.empty(pixels.shape, np.float32)
    for c in range(3):
        np.take(table[:, c], pixels[..., c], out=out[..., c])
    return out


def rescale_normalize_chw(pixels: np.ndarray, spec: "PixelSpec", out: np.ndarray | None = None) -> np.ndarray:
    """``rescale_normalize`` of ``[H, W, 3]`` uint8, channels first: ``[3, H, W]`` float32 (into ``out``)."""
    table = _value_table(spec)
    out = np.empty((3, *pixels.shape[:-1]), np.float32) if out is None else out
    for c in range(3):
        np.take(table[:, c], pixels[..., c], out=out[c])
    return out


@functools.lru_cache(maxsize=32)
def _value_table(spec: "PixelSpec") -> np.ndarray:
    """[256, 3] float32: every uint8 value of every channel through ``_rescale_normalize``."""
    table = _rescale_normalize(np.repeat(np.arange(256, dtype=np.uint8)[:, None], 3, axis=1), spec)
    table.setflags(write=False)
    return table


def _rescale_normalize(pixels: np.ndarray, spec: "PixelSpec") -> np.ndarray:
    mean, std = np.asarray(spec.image_mean, np.float32), np.asarray(spec.image_std, np.float32)
    if spec.backend == "torchvision":
        # Fused: (x - mean / rescale_factor) / (std / rescale_factor), all float32 (TorchvisionBackend).
        x = pixels.astype(np.float32)
        if spec.do_rescale and spec.do_normalize:
            scale = np.float32(1.0 / spec.rescale_factor)
            return (x - mean * scale) / (std * scale)
        if spec.do_normalize:
            return (x - mean) / std
        return x * np.float32(spec.rescale_factor) if spec.do_rescale else x
    # PIL backend: rescale in float64, cast, then normalize in float32.
    x = pixels.astype(np.float64) * spec.rescale_factor if spec.do_rescale else pixels
    x = x.astype(np.float32)
    return (x - mean) / std if spec.do_normalize else x


@dataclass(frozen=True)
class PixelSpec:
    """The keys every processor shares: resize filter, rescale and normalize."""

    resample: Image.Resampling
    do_resize: bool
    do_rescale: bool
    rescale_factor: float
    do_normalize: bool
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    backend: str = "pil"


# --- config reading --------------------------------------------------------------------------------

class _Keys:
    """One config dict and the file it came from: typed look-ups whose errors name both."""

    def __init__(self, config: dict, source: str):
        if not isinstance(config, dict):
            raise ConfigError(f"{source}: expected a JSON object, found {type(config).__name__}",
                              hint="pass the dict read from the processor config file")
        self.config, self.source = config, source

    def error(self, key: str, what: str) -> ConfigError:
        return ConfigError(f"{self.source}: key '{key}' {what}, got {self.config.get(key)!r}",
                           hint=f"fix '{key}' in {self.source} (or remove it to take transformers' default)")

    def get(self, key: str, default: Any) -> Any:
        value = self.config.get(key)
        return default if value is None else value  # null in the file means the processor's default, as in HF

    def bool(self, key: str, default: bool) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise self.error(key, "must be true or false")
        return value

    def int(self, key: str, default: int | None, minimum: int = 1) -> int | None:
        value = self.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.error(key, f"must be an integer >= {minimum}")
        return value

    def float(self, key: str, default: float) -> float:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise self.error(key, "must be a positive number")
        return float(value)

    def triple(self, key: str, default: tuple[float, float, float]) -> tuple[float, float, float]:
        value = self.get(key, default)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = [value] * 3
        if (not isinstance(value, (list, tuple)) or len(value) != 3
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
            raise self.error(key, "must be a number or a list of 3 numbers (one per RGB channel)")
        if key == "image_std" and not all(v > 0 for v in value):
            raise self.error(key, "must be positive")
        return tuple(float(v) for v in value)

    def resample(self, default: Image.Resampling) -> Image.Resampling:
        value = self.get("resample", int(default))
        try:
            return Image.Resampling(value)
        except (ValueError, TypeError):
            raise self.error("resample", "must be a PIL filter number (0 nearest, 1 lanczos, 2 bilinear, 3 bicubic, "
                                         "4 box, 5 hamming)") from None

    def pixel_spec(self, resample: Image.Resampling, mean: tuple, std: tuple, backend: str) -> PixelSpec:
        if backend not in BACKENDS:
            raise InvalidArgumentError(f"image processing backend {backend!r}: expected one of {', '.join(BACKENDS)}",
                                       hint="'pil' is transformers' PIL backend, 'torchvision' its torchvision one")
        spec = PixelSpec(resample=self.resample(resample), do_resize=self.bool("do_resize", True),
                         do_rescale=self.bool("do_rescale", True), rescale_factor=self.float("rescale_factor", 1 / 255),
                         do_normalize=self.bool("do_normalize", True), image_mean=self.triple("image_mean", mean),
                         image_std=self.triple("image_std", std), backend=backend)
        if backend == "torchvision" and spec.resample not in (Image.Resampling.BILINEAR, Image.Resampling.BICUBIC):
            raise self.error("resample", "must be 2 (bilinear) or 3 (bicubic) with the torchvision backend")
        return spec

    def pixel_bounds(self, default_min: int, default_max: int) -> tuple[int, int]:
        """Qwen's min/max pixels: ``size`` {shortest_edge, longest_edge}, overridden by top-level min/max_pixels."""
        size = self.get("size", {})
        if not isinstance(size, dict):
            raise self.error("size", "must be an object {shortest_edge, longest_edge}")
        lo = size.get("shortest_edge", size.get("min_pixels", default_min))
        hi = size.get("longest_edge", size.get("max_pixels", default_max))
        lo, hi = self.get("min_pixels", lo), self.get("max_pixels", hi)
        for name, v in (("shortest_edge / min_pixels", lo), ("longest_edge / max_pixels", hi)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{self.source}: size {name} must be a positive integer (a pixel count), got {v!r}",
                                  hint=f"fix 'size' in {self.source}")
        if lo > hi:
            raise ConfigError(f"{self.source}: size shortest_edge (min pixels {lo}) exceeds longest_edge "
                              f"(max pixels {hi})", hint=f"fix 'size' in {self.source}")
        return lo, hi


def _folder_config(path: str | os.PathLike, name: str) -> tuple[dict, str]:
    folder = Path(path)
    file = folder / name if folder.is_dir() or not folder.name.endswith(".json") else folder
    if not file.is_file():
        raise ConfigError(f"no {name} in {folder}",
                          hint=f"a Hugging Face vision model folder ships {name}; copy it from the model's repository")
    return read_json(file), str(file)


def _images_list(images: Sequence[ImageLike] | ImageLike) -> list[ImageLike]:
    if isinstance(images, (Image.Image, np.ndarray)):
        return [images]
    images = list(images)
    if not images:
        raise InvalidArgumentError("no images to process", hint="pass a list of at least one PIL image")
    return images


# --- Gemma 3 ---------------------------------------------------------------------------------------

class ImageBatch(NamedTuple):
    """``pixel_values`` [N, 3, S, S] float32: each image followed by its pan-and-scan crops; ``num_crops`` per image."""

    pixel_values: np.ndarray
    num_crops: list[int]


@dataclass(frozen=True)
class Gemma3ImageProcessor:
    spec: PixelSpec
    height: int = 896
    width: int = 896
    do_pan_and_scan: bool = False
    pan_and_scan_min_crop_size: int = 256
    pan_and_scan_max_num_crops: int = 4
    pan_and_scan_min_ratio_to_activate: float = 1.2
    image_seq_length: int = 256  # soft tokens per view (image or crop) in the prompt: Gemma3Processor's

    @classmethod
    def from_config(cls, config: dict, *, source: str = IMAGE_CONFIG, backend: str = "pil") -> "Gemma3ImageProcessor":
        # Defaults: transformers' class attributes, and Gemma3Processor's for the keys Gemma's files leave null.
        # HF's class default size is 224; every Gemma 3 checkpoint ships 896 (its SigLIP tower's image_size).
        keys = _Keys(config, source)
        size = keys.get("size", {"height": 896, "width": 896})
        if not isinstance(size, dict) or not all(isinstance(size.get(k), int) and size[k] > 0
                                                 for k in ("height", "width")):
            raise keys.error("size", "must be an object {height, width} of positive integers")
        return cls(spec=keys.pixel_spec(Image.Resampling.BILINEAR, STANDARD_MEAN, STANDARD_STD, backend),
                   height=size["height"], width=size["width"],
                   do_pan_and_scan=keys.bool("do_pan_and_scan", False),
                   pan_and_scan_min_crop_size=keys.int("pan_and_scan_min_crop_size", 256),
                   pan_and_scan_max_num_crops=keys.int("pan_and_scan_max_num_crops", 4),
                   pan_and_scan_min_ratio_to_activate=keys.float("pan_and_scan_min_ratio_to_activate", 1.2),
                   image_seq_length=keys.int("image_seq_length", 256))

    @classmethod
    def from_folder(cls, path: str | os.PathLike, *, backend: str = "pil") -> "Gemma3ImageProcessor":
        config, source = _folder_config(path, IMAGE_CONFIG)
        return cls.from_config(config, source=source, backend=backend)

    def pan_and_scan(self, rgb: np.ndarray) -> list[np.ndarray]:
        """The crops of ``rgb`` [H, W, 3] (none when it is not elongated enough), row-major as HF orders them."""
        height, width = rgb.shape[:2]
        long, short = max(width, height), min(width, height)
        if long / short < self.pan_and_scan_min_ratio_to_activate:
            return []
        # Crops along the long side: about the aspect ratio (half rounded up), each at least min_crop_size.
        n = min(int(math.floor(long / short + 0.5)), int(math.floor(long / self.pan_and_scan_min_crop_size)))
        n = min(self.pan_and_scan_max_num_crops, max(2, n))
        n_w, n_h = (n, 1) if width >= height else (1, n)
        crop_w, crop_h = int(math.ceil(width / n_w)), int(math.ceil(height / n_h))
        if min(crop_w, crop_h) < self.pan_and_scan_min_crop_size:
            return []
        return [rgb[i * crop_h:(i + 1) * crop_h, j * crop_w:(j + 1) * crop_w] for i in range(n_h) for j in range(n_w)]

    def __call__(self, images: Sequence[ImageLike] | ImageLike) -> ImageBatch:
        views, num_crops = [], []
        for image in _images_list(images):
            rgb = to_rgb(image)
            crops = self.pan_and_scan(rgb) if self.do_pan_and_scan else []
            views += [rgb, *crops]
            num_crops.append(len(crops))
        # transformers' torchvision Gemma 3 resizes pan-and-scan views even with do_resize false.
        do_resize = self.spec.do_resize or (self.do_pan_and_scan and self.spec.backend == "torchvision")
        height, width = (self.height, self.width) if do_resize else views[0].shape[:2]
        out = np.empty((len(views), 3, height, width), np.float32)
        for i, view in enumerate(views):
            if do_resize:
                view = resize(view, self.height, self.width, self.spec)
            elif view.shape[:2] != views[0].shape[:2]:
                raise InvalidArgumentError(f"images of different sizes ({view.shape[:2]} and {views[0].shape[:2]}) "
                                           "cannot be batched with do_resize false",
                                           hint="set do_resize true in the processor config, or pass one size")
            rescale_normalize_chw(view, self.spec, out[i])
        return ImageBatch(out, num_crops)


# --- Qwen-VL images --------------------------------------------------------------------------------

def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen's target size: both sides multiples of ``factor``, the area within [min_pixels, max_pixels],
    the aspect ratio kept as closely as that allows (transformers' qwen2_vl ``smart_resize``)."""
    if max(height, width) / min(height, width) > 200:
        raise InvalidArgumentError(f"image of {width}x{height}: aspect ratio over 200",
                                   hint="Qwen-VL processors accept images at most 200 times longer than wide; crop it")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def patchify(frames: np.ndarray, temporal_patch_size: int, patch_size: int, merge_size: int) -> np.ndarray:
    """``frames`` [grid_t * T, H, W, C] float32 -> ``[grid_t * grid_h * grid_w, C * T * P * P]``.

    Rows go temporal patch, then M x M merge block (row-major), then the patch inside the block, so
    each run of M * M rows is one token after the vision tower's patch merger; a row is C, T, P, P.
    """
    nt, height, width, channels = frames.shape
    t, p, m = temporal_patch_size, patch_size, merge_size
    gt, gh, gw = nt // t, height // p, width // p
    x = frames.reshape(gt, t, gh // m, m, p, gw // m, m, p, channels)
    # (gt, gh/M, gw/M, M, M, C, T, P, P)
    x = x.transpose(0, 2, 5, 3, 6, 8, 1, 4, 7)
    return np.ascontiguousarray(x).reshape(gt * gh * gw, channels * t * p * p)


class QwenImages(NamedTuple):
    """``pixel_values`` [sum of grid_t * grid_h * grid_w, C * T * P * P] float32; ``image_grid_thw`` [N, 3] int64."""

    pixel_values: np.ndarray
    image_grid_thw: np.ndarray


def num_placeholder_tokens(grid_thw: Sequence[int], merge_size: int) -> int:
    """The image (or video) pad tokens one grid row stands for in the prompt: t * h * w / M^2."""
    t, h, w = (int(v) for v in grid_thw)
    return t * h * w // (merge_size * merge_size)


@dataclass(frozen=True)
class QwenVLImageProcessor:
    spec: PixelSpec
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2

    @classmethod
    def from_config(cls, config: dict, *, source: str = IMAGE_CONFIG, backend: str = "pil") -> "QwenVLImageProcessor":
        # Defaults: transformers' Qwen2VLImageProcessor class attributes (Qwen3-VL's file sets its own).
        keys = _Keys(config, source)
        lo, hi = keys.pixel_bounds(cls.min_pixels, cls.max_pixels)
        return cls(spec=keys.pixel_spec(Image.Resampling.BICUBIC, CLIP_MEAN, CLIP_STD, backend),
                   min_pixels=lo, max_pixels=hi,
                   patch_size=keys.int("patch_size", 14), temporal_patch_size=keys.int("temporal_patch_size", 2),
                   merge_size=keys.int("merge_size", 2))

    @classmethod
    def from_folder(cls, path: str | os.PathLike, *, backend: str = "pil") -> "QwenVLImageProcessor":
        config, source = _folder_config(path, IMAGE_CONFIG)
        return cls.from_config(config, source=source, backend=backend)

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    def resized_size(self, height: int, width: int) -> tuple[int, int]:
        if not self.spec.do_resize:
            return height, width
        return smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)

    def grid_thw(self, height: int, width: int) -> tuple[int, int, int]:
        """The ``image_grid_thw`` row of an image of ``height`` x ``width`` pixels, without the pixels."""
        h, w = self.resized_size(height, width)
        return 1, h // self.patch_size, w // self.patch_size

    def num_image_tokens(self, height: int, width: int) -> int:
        """How many image pad tokens the prompt holds for an image of this size."""
        return num_placeholder_tokens(self.grid_thw(height, width), self.merge_size)

    def __call__(self, images: Sequence[ImageLike] | ImageLike) -> QwenImages:
        rows, grids = [], []
        for image in _images_list(images):
            rgb = to_rgb(image)
            h, w = self.resized_size(*rgb.shape[:2])
            if h % self.factor or w % self.factor:
                raise InvalidArgumentError(f"image of {rgb.shape[1]}x{rgb.shape[0]} is not a multiple of "
                                           f"patch_size * merge_size = {self.factor} and do_resize is false",
                                           hint="set do_resize true in the processor config")
            if self.spec.do_resize:
                rgb = resize(rgb, h, w, self.spec)
            x = rescale_normalize(rgb, self.spec)
            # One image is one temporal patch: the frame repeated T times.
            frames = np.broadcast_to(x, (self.temporal_patch_size, *x.shape))
            rows.append(patchify(frames, self.temporal_patch_size, self.patch_size, self.merge_size))
            grids.append((1, h // self.patch_size, w // self.patch_size))
        return QwenImages(np.concatenate(rows), np.asarray(grids, dtype=np.int64))


# --- Qwen3-VL video --------------------------------------------------------------------------------

class QwenVideo(NamedTuple):
    """``pixel_values_videos`` [grid_t * grid_h * grid_w, C * T * P * P] float32, ``video_grid_thw`` [1, 3]
    int64, ``frame_indices`` (the source frames used) and ``timestamps`` (seconds, one per temporal patch,
    the mean of its first and last frame's time: the ``<t seconds>`` Qwen3-VL's prompt puts before each)."""

    pixel_values_videos: np.ndarray
    video_grid_thw: np.ndarray
    frame_indices: np.ndarray
    timestamps: list[float]


def video_smart_resize(num_frames: int, height: int, width: int, temporal_factor: int, factor: int,
                       min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen3-VL's per-clip target size: the pixel bounds count all frames (transformers' qwen3_vl smart_resize)."""
    if num_frames < temporal_factor:
        raise InvalidArgumentError(f"a video of {num_frames} frame(s) is shorter than temporal_patch_size "
                                   f"{temporal_factor}", hint="pass at least that many frames, or send it as an image")
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > 200:
        raise InvalidArgumentError(f"video frames of {width}x{height}: aspect ratio over 200",
                                   hint="Qwen-VL processors accept frames at most 200 times longer than wide")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    t_bar = round(num_frames / temporal_factor) * temporal_factor
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt(num_frames * height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (num_frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass(frozen=True)
class QwenVLVideoProcessor:
    spec: PixelSpec
    min_pixels: int = 128 * 32 * 32
    max_pixels: int = 32 * 32 * 768
    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    fps: float = 2.0                  # frames sampled per second of video
    num_frames: int | None = None     # a fixed frame count instead of fps
    min_frames: int = 4
    max_frames: int = 768
    do_sample_frames: bool = True
    cap_pixels_per_frame: bool = False
    max_video_tokens: int = 768

    @classmethod
    def from_config(cls, config: dict, *, source: str = VIDEO_CONFIG) -> "QwenVLVideoProcessor":
        # Defaults: transformers' Qwen3VLVideoProcessor class attributes; it exists only on torchvision.
        keys = _Keys(config, source)
        lo, hi = keys.pixel_bounds(cls.min_pixels, cls.max_pixels)
        return cls(spec=keys.pixel_spec(Image.Resampling.BICUBIC, STANDARD_MEAN, STANDARD_STD, "torchvision"),
                   min_pixels=lo, max_pixels=hi, patch_size=keys.int("patch_size", 16),
                   temporal_patch_size=keys.int("temporal_patch_size", 2), merge_size=keys.int("merge_size", 2),
                   fps=keys.float("fps", 2.0), num_frames=keys.int("num_frames", None),
                   min_frames=keys.int("min_frames", 4), max_frames=keys.int("max_frames", 768),
                   do_sample_frames=keys.bool("do_sample_frames", True),
                   cap_pixels_per_frame=keys.bool("cap_pixels_per_frame", False),
                   max_video_tokens=keys.int("max_video_tokens", 768))

    @classmethod
    def from_folder(cls, path: str | os.PathLike) -> "QwenVLVideoProcessor":
        config, source = _folder_config(path, VIDEO_CONFIG)
        return cls.from_config(config, source=source)

    def sample_frame_indices(self, total_frames: int, video_fps: float | None,
                             num_frames: int | None = None) -> np.ndarray:
        """Which of ``total_frames`` frames are used: ``num_frames`` (or the config's) evenly spread, else
        ``fps`` per second of a ``video_fps`` video, within [min_frames, max_frames] and at most all of them."""
        num_frames = num_frames if num_frames is not None else self.num_frames
        if num_frames is None:
            if video_fps is None or not video_fps > 0:
                raise InvalidArgumentError("sampling video frames by time needs the video's frame rate",
                                           hint="pass fps= (the source video's frames per second), num_frames=, "
                                                "or sample=False when the frames are already the ones to use")
            num_frames = int(total_frames / video_fps * self.fps)
            num_frames = min(max(num_frames, self.min_frames), self.max_frames, total_frames)
        return np.linspace(0, total_frames - 1, num_frames).round().astype(np.int64)

    def resized_size(self, num_frames: int, height: int, width: int) -> tuple[int, int]:
        """The (height, width) ``num_frames`` sampled frames of height x width are resized to."""
        factor = self.patch_size * self.merge_size
        if not self.spec.do_resize:
            if height % factor or width % factor:
                raise InvalidArgumentError(f"video frames of {width}x{height} are not a multiple of patch_size * "
                                           f"merge_size = {factor} and do_resize is false",
                                           hint="set do_resize true in the config")
            return height, width
        max_pixels = self.max_pixels
        if self.cap_pixels_per_frame:  # qwen-vl-utils' cap: per-frame pixels shrink as the clip gets longer
            per_frame = max(min(self.max_video_tokens * factor * factor, self.max_pixels // num_frames),
                            int(self.min_pixels * 1.05))
            max_pixels = per_frame * num_frames
        return video_smart_resize(num_frames, height, width, self.temporal_patch_size, factor, self.min_pixels,
                                  max_pixels)

    def grid_thw(self, num_frames: int, height: int, width: int) -> tuple[int, int, int]:
        """The ``video_grid_thw`` row of ``num_frames`` sampled frames of height x width, without the pixels."""
        h, w = self.resized_size(num_frames, height, width)
        return -(-num_frames // self.temporal_patch_size), h // self.patch_size, w // self.patch_size

    def timestamps(self, frame_indices: Sequence[int], video_fps: float) -> list[float]:
        """Seconds of each temporal patch: Qwen3VLProcessor's ``_calculate_timestamps``."""
        t = self.temporal_patch_size
        idx = [int(i) for i in frame_indices]
        idx += [idx[-1]] * (-len(idx) % t)
        secs = [i / video_fps for i in idx]
        return [(secs[i] + secs[i + t - 1]) / 2 for i in range(0, len(secs), t)]

    def __call__(self, frames: Sequence[ImageLike] | np.ndarray, fps: float | None = None, *,
                 num_frames: int | None = None, sample: bool | None = None) -> QwenVideo:
        """``frames``: [F, H, W, 3] uint8 or a list of images, all one size; ``fps``: the video's frame rate."""
        stack = self._frames(frames)
        total = len(stack)
        sample = self.do_sample_frames if sample is None else sample
        indices = self.sample_frame_indices(total, fps, num_frames) if sample else np.arange(total, dtype=np.int64)
        stack = stack[indices]
        n, height, width = stack.shape[:3]
        t = self.temporal_patch_size
        h, w = self.resized_size(n, height, width)
        if (h, w) != (height, width):
            stack = resize(stack, h, w, self.spec)
        x = rescale_normalize(stack, self.spec)
        if pad := -n % t:  # the last frame repeated to fill the last temporal patch
            x = np.concatenate([x, np.repeat(x[-1:], pad, axis=0)])
        grid = (len(x) // t, x.shape[1] // self.patch_size, x.shape[2] // self.patch_size)
        pixels = patchify(x, t, self.patch_size, self.merge_size)
        stamps = self.timestamps(indices, fps) if fps else []
        return QwenVideo(pixels, np.asarray([grid], dtype=np.int64), indices, stamps)

    def _frames(self, frames: Sequence[ImageLike] | np.ndarray) -> np.ndarray:
        if isinstance(frames, np.ndarray) and frames.ndim == 4:
            if frames.dtype != np.uint8 or frames.shape[-1] != 3:
                raise InvalidArgumentError(f"video frames must be [F, H, W, 3] uint8, got {frames.shape} "
                                           f"{frames.dtype}",
                                           hint="decode the video to RGB uint8 frames, channels last")
            stack = frames
        else:
            rgb = [to_rgb(f) for f in _images_list(frames)]
            if len({f.shape for f in rgb}) > 1:
                raise InvalidArgumentError(f"video frames of different sizes: {sorted({f.shape[:2] for f in rgb})}",
                                           hint="every frame of one video must have the same size")
            stack = np.stack(rgb)
        if len(stack) == 0:
            raise InvalidArgumentError("a video with no frames", hint="pass at least temporal_patch_size frames")
        return stack
