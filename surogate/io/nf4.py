"""NF4 in bitsandbytes' layout (QLoRA's base format), quantized with numpy at load.

A weight W [rows, cols] is read row-major in blocks of ``blocksize`` (64) values; each block
keeps its absmax and every value the index of the nearest of the 16 NF4 levels (`NF4_CODE`) to
value / absmax, two indices per byte, the first in the high nibble: ``q`` uint8 [rows, cols / 2]
is bitsandbytes' packed tensor, reshaped. With double quantization (bnb's
``compress_statistics``) the f32 absmax are stored as 8-bit codes too: their mean (``offset``)
is subtracted, then blocks of 256 are quantized with bitsandbytes' signed dynamic code
(`dynamic_code`, 8-bit float-like: a sign, a unary exponent down to 1e-6 and a linear fraction)
against their own f32 absmax (``absmax_scale``). Decoding, as bnb does it in f32:

    absmax[b] = dynamic_code[absmax_q[b]] * absmax_scale[b // 256] + offset   (double quant)
    W[i]      = NF4_CODE[nibble(i)] * absmax[i // blocksize]

The native ``nf4_dequantize`` op decodes the same bits (tests/io/test_nf4.py checks both
directions bit for bit against bitsandbytes' own functions).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from surogate.errors import InvalidArgumentError

# bitsandbytes' NF4 levels (bitsandbytes/functional.py get_4bit_type("nf4"): the quantiles of
# N(0, 1) normalized to [-1, 1], with an exact 0), as float32.
NF4_CODE = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
    0.7229568362236023, 1.0], dtype=np.float32)
BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)  # what bitsandbytes accepts
ABSMAX_BLOCK = 256  # double quantization's block of absmax values (bnb's fixed choice)


def dynamic_code() -> np.ndarray:
    """bitsandbytes' signed dynamic code: 256 sorted float32 levels in [-1, 1]."""
    from surogate.io.bnb_dynamic_code import DYNAMIC_CODE

    return DYNAMIC_CODE


@dataclass(frozen=True)
class NF4Spec:
    """How a projection weight is kept (a Model's ``quant`` value beside GGML type ids)."""

    blocksize: int = 64
    double_quant: bool = True

    def state(self, name: str, rows: int, cols: int) -> list[tuple[str, tuple[int, ...], str]]:
        """(name, shape, dtype) of the tensors beside the packed codes that hold the absmax."""
        blocks = rows * cols // self.blocksize
        if not self.double_quant:
            return [(name + ".absmax", (blocks,), "float32")]
        return [(name + ".absmax", (blocks,), "uint8"),
                (name + ".absmax_scale", (-(-blocks // ABSMAX_BLOCK),), "float32"),
                (name + ".absmax_offset", (1,), "float32")]


@dataclass
class NF4Weight:
    """One weight in bnb's NF4 layout (see the module header)."""

    q: np.ndarray  # uint8 [rows, cols / 2]
    absmax: np.ndarray  # f32 [blocks], or uint8 [blocks] with double quantization
    blocksize: int
    absmax_scale: np.ndarray | None = None  # f32 [ceil(blocks / 256)]
    offset: np.ndarray | None = None  # f32 [1]

    @property
    def shape(self) -> tuple[int, int]:
        return self.q.shape[0], self.q.shape[1] * 2

    def tensors(self, name: str) -> dict[str, np.ndarray]:
        """The model tensors that hold it: ``name`` (the packed codes) and its quantization state."""
        out = {name: self.q, name + ".absmax": self.absmax}
        if self.absmax_scale is not None:
            out[name + ".absmax_scale"] = self.absmax_scale
            out[name + ".absmax_offset"] = self.offset
        return out

    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.tensors("w").values())

    @classmethod
    def from_tensors(cls, tensors: dict[str, np.ndarray], name: str, spec: NF4Spec) -> NF4Weight:
        if spec.double_quant:
            return cls(tensors[name], tensors[name + ".absmax"], spec.blocksize, tensors[name + ".absmax_scale"],
                       tensors[name + ".absmax_offset"])
        return cls(tensors[name], tensors[name + ".absmax"], spec.blocksize)


def _blockwise_absmax(x: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """(absmax per block, x / absmax clamped to [-1, 1]) for flat f32 x, the last block partial."""
    n = x.size
    pad = (-n) % block
    xb = np.pad(x, (0, pad)).reshape(-1, block)
    absmax = np.abs(xb).max(axis=1).astype(np.float32)
    if pad:  # the partial block's max over its real values only (the pad is 0: same result)
        absmax[-1] = np.abs(x[n - (block - pad):]).max()
    inv = (np.float32(1.0) / np.maximum(absmax, np.float32(1e-38))).astype(np.float32)
    scaled = np.clip(xb * inv[:, None], -1, 1).reshape(-1)[:n]
    return absmax, scaled.astype(np.float32)


def _nearest(scaled: np.ndarray, code: np.ndarray) -> np.ndarray:
    """Index of the nearest level of sorted ``code`` (midpoints in f32; a tie goes to the lower
    level, as torch.bucketize(right=False) does in bitsandbytes)."""
    mids = ((code[:-1] + code[1:]) / np.float32(2)).astype(np.float32)
    return np.searchsorted(mids, scaled, side="left").astype(np.uint8)


def quantize_blockwise(x: np.ndarray, block: int = ABSMAX_BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """bnb.functional.quantize_blockwise with the dynamic code: (uint8 codes, f32 absmax per block)."""
    absmax, scaled = _blockwise_absmax(np.asarray(x, np.float32).reshape(-1), block)
    return _nearest(scaled, dynamic_code()), absmax


def quantize_nf4(w: np.ndarray, blocksize: int = 64, double_quant: bool = True) -> NF4Weight:
    """bnb.functional.quantize_4bit(w, blocksize, quant_type="nf4", compress_statistics=double_quant)."""
    if blocksize not in BLOCKSIZES:
        raise InvalidArgumentError(f"NF4 block size {blocksize} is not one bitsandbytes supports",
                                   hint=f"use one of {', '.join(map(str, BLOCKSIZES))}")
    rows, cols = w.shape
    if cols % blocksize:
        raise InvalidArgumentError(f"NF4: a row of {cols} values is not a whole number of {blocksize}-value blocks")
    absmax, scaled = _blockwise_absmax(np.asarray(w, np.float32).reshape(-1), blocksize)
    idx = _nearest(scaled, NF4_CODE)
    q = ((idx[0::2] << 4) | idx[1::2]).astype(np.uint8).reshape(rows, cols // 2)
    if not double_quant:
        return NF4Weight(q, absmax, blocksize)
    offset = np.float32(absmax.mean(dtype=np.float32))
    codes, scale = quantize_blockwise((absmax - offset).astype(np.float32))
    return NF4Weight(q, codes, blocksize, scale, np.array([offset], np.float32))


def dequantize_absmax(t: NF4Weight) -> np.ndarray:
    if t.absmax_scale is None:
        return t.absmax
    code = dynamic_code()
    blocks = np.arange(t.absmax.size) // ABSMAX_BLOCK
    return (code[t.absmax] * t.absmax_scale[blocks] + t.offset[0]).astype(np.float32)


def dequantize_nf4(t: NF4Weight) -> np.ndarray:
    """The f32 weight [rows, cols], as bnb.functional.dequantize_4bit computes it."""
    rows, cols = t.shape
    idx = np.empty(rows * cols, np.uint8)
    flat = t.q.reshape(-1)
    idx[0::2], idx[1::2] = flat >> 4, flat & 0xF
    absmax = dequantize_absmax(t)
    vals = NF4_CODE[idx].reshape(-1, t.blocksize) * absmax[:, None]
    return vals.astype(np.float32).reshape(rows, cols)
