"""Block-scaled FP8 quantization in numpy: the e4m3 encoder and the per-block scales of the
``*-FP8`` checkpoint layout (reading it back is io/quantized_checkpoint.py's dequantize_block_fp8).

e4m3 (float8_e4m3fn): 1 sign, 4 exponent (bias 7), 3 mantissa bits, no infinities, one NaN code
per sign (0x7F / 0xFF); largest 448, smallest normal 2^-6, subnormals m * 2^-9 (m = 1..7).
``encode_e4m3`` rounds an f32 to the nearest e4m3 value, ties to even, and saturates at +-448
(infinities too), which is what torch's ``x.to(torch.float8_e4m3fn)`` does on the CPU, bit for bit
(tests/io/test_fp8_export.py checks it). The value 448 * (1 + 2^-4) lies between 448 and the NaN
code's would-be 480; saturation keeps every finite input finite.

A weight W [rows, cols] in blocks of [bo, bi] (the last block of a dimension may be partial):
per block, ``scale = amax(|W|) / 448`` (1 where the block is all zero), ``q = e4m3(W / scale)``,
and the checkpoint stores ``q`` as ``W`` and ``scale`` (f32) as ``W_scale_inv``, one value a block
([ceil(rows / bo), ceil(cols / bi)]); a reader gets ``W ~= q * scale_inv`` block by block. That is
DeepSeek-V3's, vLLM's and Qwen's ``*-FP8`` convention (the stored "inverse" scale multiplies).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from surogate.errors import FileFormatError

E4M3_MAX = 448.0
_MIN_NORMAL = np.float32(2.0 ** -6)
_NAN = 0x7F
_CHUNK = 1 << 22  # values encoded at a time


def encode_e4m3(x: np.ndarray) -> np.ndarray:
    """uint8 e4m3 codes of ``x`` (any float array, taken as f32): round to nearest even, saturating."""
    x = np.asarray(x, np.float32)
    sign = ((x.view(np.uint32) >> 24) & 0x80).astype(np.uint8)
    nan = np.isnan(x)
    a = np.minimum(np.abs(np.where(nan, np.float32(0), x)), np.float32(E4M3_MAX))
    # Normal range: drop 20 of f32's 23 mantissa bits with round-half-even (the carry may step the
    # exponent, which is right), then move the exponent bias from 127 to 7: (127 - 7) << 3.
    abits = a.view(np.uint32)
    normal = ((abits + np.uint32(0x7FFFF) + ((abits >> 20) & 1)) >> 20) - np.uint32(120 << 3)
    # Below 2^-6: multiples of 2^-9; a * 512 is exact in f32 and rint rounds half to even (8 is 2^-6's code).
    sub = np.rint(a * np.float32(512.0)).astype(np.uint32)
    code = np.where(a < _MIN_NORMAL, sub, normal).astype(np.uint8)  # (normal wraps where sub is taken)
    code[nan] = _NAN
    return code | sign


def as_e4m3(codes: np.ndarray) -> np.ndarray:
    """uint8 codes viewed as float8_e4m3fn (the dtype the safetensors writer stores as F8_E4M3)."""
    return np.asarray(codes, np.uint8).view(ml_dtypes.float8_e4m3fn)


def _blocks(w: np.ndarray, block: tuple[int, int]) -> np.ndarray:
    """``w`` zero-padded to whole blocks, as [R, bo, C, bi]."""
    bo, bi = block
    rows, cols = w.shape
    R, C = -(-rows // bo), -(-cols // bi)
    if (R * bo, C * bi) != (rows, cols):
        pad = np.zeros((R * bo, C * bi), np.float32)
        pad[:rows, :cols] = w
        w = pad
    return w.reshape(R, bo, C, bi)


def block_scale_inv(w: np.ndarray, block: tuple[int, int], what: str = "weight") -> np.ndarray:
    """f32 [ceil(rows / bo), ceil(cols / bi)]: each block's amax / 448 (1 for an all-zero block)."""
    w = np.asarray(w, np.float32)
    if w.ndim != 2:
        raise FileFormatError(f"{what}: block FP8 quantizes 2-D weights, not {w.shape}")
    amax = np.abs(_blocks(w, block)).max(axis=(1, 3))
    if not np.isfinite(amax).all():
        raise FileFormatError(f"{what}: holds inf or NaN, which FP8 cannot scale",
                              hint="the checkpoint is damaged or the training diverged; check the source weights")
    scale = amax / np.float32(E4M3_MAX)
    scale[scale == 0] = 1.0  # an all-zero block (or one below f32's range once divided): codes are 0 anyway
    return scale


def quantize_block_fp8(w: np.ndarray, block: tuple[int, int], what: str = "weight") -> tuple[np.ndarray, np.ndarray]:
    """(float8_e4m3fn ``q`` of w's shape, f32 ``scale_inv``) with ``w ~= q * scale_inv`` per block."""
    w = np.asarray(w)
    scale = block_scale_inv(w, block, what)
    bo, bi = block
    rows, cols = w.shape
    codes = np.empty((rows, cols), np.uint8)
    step = bo * max(1, _CHUNK // max(1, bo * cols))  # whole block rows at a time: temporaries stay small
    for r in range(0, rows, step):
        s = np.repeat(np.repeat(scale[r // bo:(r + step) // bo + 1], bo, axis=0), bi, axis=1)
        part = np.asarray(w[r:r + step], np.float32)
        codes[r:r + step] = encode_e4m3(part / s[:part.shape[0], :cols])
    return as_e4m3(codes), scale
