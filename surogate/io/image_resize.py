"""The two resizes transformers' image processors use, on channels-last uint8 arrays.

``resize_pil``: Pillow's ``Image.resize``, what transformers' PIL backend calls.

``resize_like_torch``: torch's native uint8 antialiased bilinear / bicubic kernel, what
torchvision's ``resize`` runs on CPU for uint8 tensors (and so transformers' torchvision backend
and its video processors), written in numpy. It is Pillow's algorithm (same filters, support and
centring, width pass then height pass, each an integer dot product rounded and clamped to uint8)
with the weights in int16 at a precision chosen per axis instead of Pillow's 22 bits, so a few
pixels land a level or two away from Pillow's. The source is ATen's UpSampleKernel.cpp:
``_compute_indices_min_size_weights_aa``, ``_compute_index_ranges_int16_weights``,
``basic_loop_aa_horizontal/vertical<uint8_t>``, ``separable_upsample_generic_Nd_kernel_impl``.
Shape letters: H, W in, h, w out, C channels; K taps per output sample.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image


def resize_pil(rgb: np.ndarray, height: int, width: int, resample: Image.Resampling) -> np.ndarray:
    """``rgb`` [H, W, C] uint8 -> [height, width, C] by Pillow (transformers' ``image_transforms.resize``)."""
    return np.asarray(Image.fromarray(rgb).resize((width, height), resample=resample))


def _triangle(x: np.ndarray) -> np.ndarray:
    x = np.abs(x)
    return np.where(x < 1, 1 - x, 0.0)


def _keys_cubic(x: np.ndarray) -> np.ndarray:
    # a = -0.5, as Pillow (torch uses -0.75 only without antialiasing), in UpSample.h's operation order.
    a, x = -0.5, np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x < 1, near, np.where(x < 2, far, 0.0))


# resample -> (the filter, its support at scale 1 in input samples: interp_size / 2)
_FILTERS = {Image.Resampling.BILINEAR: (_triangle, 1.0), Image.Resampling.BICUBIC: (_keys_cubic, 2.0)}


def _taps(in_size: int, out_size: int, resample: Image.Resampling) -> tuple[np.ndarray, np.ndarray, int]:
    """One axis: source indices [out, K], int16-valued weights [out, K] (zero past each sample's
    taps) and the fixed-point precision the weights are scaled to."""
    fn, half = _FILTERS[resample]
    scale = in_size / out_size
    support = half * scale if scale >= 1.0 else half
    k_max = int(math.ceil(support)) * 2 + 1
    invscale = 1.0 / scale if scale >= 1.0 else 1.0
    center = scale * (np.arange(out_size) + 0.5)
    xmin = np.maximum((center - support + 0.5).astype(np.int64), 0)  # C's truncating casts
    xsize = np.clip(np.minimum((center + support + 0.5).astype(np.int64), in_size) - xmin, 0, k_max)
    k = np.arange(k_max)
    valid = k[None, :] < xsize[:, None]
    w = np.where(valid, fn((k[None, :] + xmin[:, None] - center[:, None] + 0.5) * invscale), 0.0)
    total = np.zeros(out_size)
    for j in range(k_max):  # summed tap by tap, as the C loop does
        total += w[:, j]
    w = np.where(total[:, None] != 0, w / np.where(total == 0, 1, total)[:, None], w)
    # The most bits under which the largest weight still fits an int16.
    wt_max, precision = w.max(), 0
    while precision < 22 and int(0.5 + wt_max * (1 << (precision + 1))) < (1 << 15):
        precision += 1
    v = w * (1 << precision)
    w16 = np.where(v < 0, np.trunc(-0.5 + v), np.trunc(0.5 + v)).astype(np.int32)
    index = np.minimum(xmin[:, None] + k[None, :], in_size - 1)
    return index, np.where(valid, w16, 0), precision


def _pass(x: np.ndarray, axis: int, out_size: int, resample: Image.Resampling) -> np.ndarray:
    index, w, precision = _taps(x.shape[axis], out_size, resample)
    # int32 holds it: 255 * sum(|w|) stays under 2^31 at <= 15 bits of weight.
    acc = np.full(x.shape[:axis] + (out_size,) + x.shape[axis + 1:], 1 << (precision - 1), dtype=np.int32)
    shape = [1] * x.ndim
    shape[axis] = out_size
    for j in range(index.shape[1]):
        acc += np.take(x, index[:, j], axis=axis).astype(np.int32) * w[:, j].reshape(shape)
    return np.clip(acc >> precision, 0, 255).astype(np.uint8)


def resize_like_torch(frames: np.ndarray, height: int, width: int,
                      resample: Image.Resampling = Image.Resampling.BICUBIC) -> np.ndarray:
    """``frames`` [..., H, W, C] uint8 -> [..., height, width, C], equal to
    ``torch.nn.functional.interpolate(uint8 NCHW, mode=..., antialias=True, align_corners=False)``."""
    if resample not in _FILTERS:
        raise ValueError(f"resize_like_torch has bilinear and bicubic, not {Image.Resampling(resample).name}")
    if frames.dtype != np.uint8:
        raise ValueError(f"resize_like_torch takes uint8 frames, got {frames.dtype}")
    if frames.shape[-2] != width:
        frames = _pass(frames, frames.ndim - 2, width, resample)
    if frames.shape[-3] != height:
        frames = _pass(frames, frames.ndim - 3, height, resample)
    return frames
