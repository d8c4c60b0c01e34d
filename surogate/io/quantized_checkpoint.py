"""Checkpoints whose config.json carries a ``quantization_config``.

Read today: block-scaled FP8 (``quant_method: fp8`` with ``weight_block_size``, the layout of
Qwen's and DeepSeek's ``*-FP8`` releases and of transformers' FineGrainedFP8): a quantized
weight ``W`` is float8_e4m3fn beside ``W_scale_inv`` (``<module>.weight_scale_inv``), one f32 (or
bf16) scale per block of ``[bo, bi]`` values, and the real weight is ``W * scale_inv`` block by
block (the last blocks of a dimension may be partial). Those weights are dequantized at load
to the model's dtype; modules left unquantized (``modules_to_not_convert``) have no scale and
pass as they are.

Read too: MXFP4 (``quant_method: mxfp4``, GPT-OSS's release): a stacked expert weight ``W``
([E, in, out] as transformers holds it) is stored as ``W_blocks`` uint8 [E, out, G, 16] (two
e2m1 values a byte, the low nibble first) and ``W_scales`` uint8 [E, out, G] (e8m0: 2^(s - 127)
for each block of 32 values along ``in``), dequantized at load exactly as transformers'
convert_moe_packed_tensors does (the values are exact in f32).

Every other quantization method is refused by name: loading its packed tensors as if they
were weights gives wrong logits without an error.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from surogate.errors import FileFormatError, UnsupportedError

SCALE_SUFFIX = "_scale_inv"


class BlockFP8Weights:
    """A weights reader (``get``, ``in``, iteration) that dequantizes block-FP8 tensors."""

    def __init__(self, weights, block: tuple[int, int], source: str):
        self.weights, self.block, self.source = weights, block, source

    def __contains__(self, name: str) -> bool:
        return name in self.weights

    def __iter__(self):
        return (n for n in self.weights.keys() if not n.endswith(SCALE_SUFFIX))

    def keys(self):
        return list(self)

    def get(self, name: str) -> np.ndarray:
        w = self.weights.get(name)
        scale_name = name + SCALE_SUFFIX
        if scale_name not in self.weights:
            if w.dtype.itemsize == 1 and w.dtype.kind == "V" or "float8" in str(w.dtype):
                raise FileFormatError(f"{self.source}: {name} is FP8 but the checkpoint has no {scale_name}",
                                      hint="the checkpoint is incomplete: download it again")
            return w
        return dequantize_block_fp8(w, self.weights.get(scale_name), self.block, f"{self.source}: {name}")


def dequantize_block_fp8(w: np.ndarray, scale_inv: np.ndarray, block: tuple[int, int], what: str) -> np.ndarray:
    """f32 ``w * scale_inv`` with one scale per ``block`` of a 2-D weight."""
    if "float8_e4m3" not in str(w.dtype):
        raise FileFormatError(f"{what}: has a block scale but is {w.dtype}, not float8_e4m3fn",
                              hint="only e4m3 block-FP8 checkpoints are read")
    if w.ndim != 2 or scale_inv.ndim != 2:
        raise FileFormatError(f"{what}: block-FP8 weight {w.shape} / scale {scale_inv.shape} are not 2-D")
    bo, bi = block
    rows, cols = w.shape
    want = (-(-rows // bo), -(-cols // bi))
    if scale_inv.shape != want:
        raise FileFormatError(f"{what}: scale of shape {scale_inv.shape}, but a {w.shape} weight in blocks of "
                              f"{list(block)} needs {want}", hint="weight_block_size does not match the file")
    s = np.asarray(scale_inv, np.float32)
    full = np.repeat(np.repeat(s, bo, axis=0), bi, axis=1)[:rows, :cols]
    return w.astype(np.float32) * full


# e2m1 codes -> values (transformers' FP4_VALUES; the OCP MX spec's FP4 E2M1)
FP4_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                      np.float32)


def dequantize_mxfp4(blocks: np.ndarray, scales: np.ndarray, what: str) -> np.ndarray:
    """f32 [E, G * 32, out] from blocks [E, out, G, 16] and scales [E, out, G]: transformers'
    convert_moe_packed_tensors (its transpose(1, 2) included)."""
    blocks, scales = np.asarray(blocks), np.asarray(scales)
    if blocks.dtype != np.uint8 or scales.dtype != np.uint8:
        raise FileFormatError(f"{what}: MXFP4 blocks / scales are {blocks.dtype} / {scales.dtype}, not uint8")
    if blocks.ndim < 2 or blocks.shape[:-1] != scales.shape:
        raise FileFormatError(f"{what}: MXFP4 blocks {blocks.shape} do not match scales {scales.shape}",
                              hint="blocks are [..., G, 16] beside scales [..., G]")
    *prefix, G, B = blocks.shape
    out = np.empty((*prefix, G, 2 * B), np.float32)
    out[..., 0::2] = FP4_VALUES[blocks & 0x0F]
    out[..., 1::2] = FP4_VALUES[blocks >> 4]
    out = np.ldexp(out, (scales.astype(np.int32) - 127)[..., None])
    out = out.reshape(*prefix, G * 2 * B)
    return np.ascontiguousarray(np.swapaxes(out, 1, 2)) if out.ndim == 3 else out


class MXFP4Weights:
    """A weights reader whose ``W`` is dequantized from ``W_blocks`` / ``W_scales`` where the
    checkpoint holds those (the other tensors pass as they are)."""

    def __init__(self, weights, source: str):
        self.weights, self.source = weights, source

    def __contains__(self, name: str) -> bool:
        return name in self.weights or name + "_blocks" in self.weights

    def __iter__(self):
        for n in self.weights.keys():
            if n.endswith("_blocks"):
                yield n[:-len("_blocks")]
            elif not n.endswith("_scales") or n[:-len("_scales")] + "_blocks" not in self.weights:
                yield n

    def keys(self):
        return list(self)

    def get(self, name: str) -> np.ndarray:
        if name in self.weights:
            return self.weights.get(name)
        if name + "_scales" not in self.weights:
            raise FileFormatError(f"{self.source}: {name}_blocks has no {name}_scales beside it",
                                  hint="the checkpoint is incomplete: download it again")
        return dequantize_mxfp4(self.weights.get(name + "_blocks"), self.weights.get(name + "_scales"),
                                f"{self.source}: {name}")


def weights_reader(weights, config: Mapping, source: str):
    """``weights`` as load_model reads them: unchanged without a quantization_config, dequantizing
    block FP8, or an UnsupportedError naming a method this version does not read."""
    qc = config.get("quantization_config")
    if not qc:
        return weights
    if not isinstance(qc, Mapping):
        raise FileFormatError(f"{source}: quantization_config is not an object")
    method = qc.get("quant_method")
    if method == "fp8" and qc.get("weight_block_size") is not None:
        block = qc["weight_block_size"]
        if (not isinstance(block, list | tuple) or len(block) != 2
                or not all(isinstance(b, int) and b > 0 for b in block)):
            raise FileFormatError(f"{source}: quantization_config.weight_block_size {block!r} is not two positive "
                                  "integers")
        fmt = qc.get("fmt", "e4m3")
        if fmt != "e4m3":
            raise UnsupportedError(f"{source}: quantization_config.fmt {fmt!r}: only e4m3 block-FP8 is read")
        return BlockFP8Weights(weights, (block[0], block[1]), source)
    if method == "mxfp4":
        return MXFP4Weights(weights, source)
    what = f"quant_method {method!r}" + (" without weight_block_size (per-tensor FP8)" if method == "fp8" else "")
    raise UnsupportedError(
        f"{source}: quantization_config {what} is not read by this version (its packed tensors would load as "
        "wrong weights)", hint="use the unquantized release of this model, or dequantize it with transformers "
        "(from_pretrained, then save_pretrained without the quantization_config); block-scaled FP8 "
        "(quant_method fp8 with weight_block_size), MXFP4 and GGUF files load")
