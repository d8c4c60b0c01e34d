"""GGUF files out: a Hugging Face model folder (a checkpoint or a merged fine-tune) written as
llama.cpp's convert_hf_to_gguf.py followed by llama-quantize would write it, with the blocks
quantized by our native ``gguf_quantize``.

What goes in: ``general.*`` (architecture, name, file_type, quantization_version), the family's
hyper-parameters under ``{arch}.*`` (io/gguf_config.py, plus any keys of the family's own), the
tokenizer as ``tokenizer.ggml.*`` (byte-level BPE: tokens, token types, merges, pre-tokenizer
name, special ids) and the chat templates; the tensors under llama.cpp's names, Llama's q/k rows
in its rope order (the family's GGUF table, planned in models/gguf_names.py), and for Llama 3
rope scaling the ``rope_freqs.weight`` llama.cpp reads it from.

Types (``QUANT_TYPES``) and the type each tensor gets (after llama.cpp's llama_tensor_get_type;
n layers; the "more bits" layers are i < n/8, i >= 7n/8 and every third one in between, where for
attn_v, as llama-quantize counts it, i and n run over the attn_v tensors rather than the layers):

    tensor                                 F32  F16  BF16  Q8_0  Q6_K  Q5_K_M  Q4_K_M
    1-D (norms, biases, rope_freqs)        F32  F32  F32   F32   F32   F32     F32
    output (token_embd when tied)          F32  F16  BF16  Q8_0  Q6_K  Q6_K    Q6_K
    attn_v, ffn_down on more-bits layers   F32  F16  BF16  Q8_0  Q6_K  Q6_K    Q6_K
    every other 2-D weight                 F32  F16  BF16  Q8_0  Q6_K  Q5_K    Q4_K

A K type packs 256 values per block, so it needs rows (input features) of a multiple of 256;
other rows fall back as llama.cpp does: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, and output
straight to Q8_0. A type of 32-value blocks (Q8_0, Q5_x) needs rows of a multiple of 32, else F16.

The file is written to a temp name beside the destination and renamed into place; tensors are
quantized and written one at a time (memory stays near one tensor), with a progress callback.
This module knows no model family: models/gguf_names.py plans the tensors of a checkpoint
(names, row order) and ``quantize_to_gguf`` there drives a whole HF folder through here.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from surogate.errors import FileFormatError, UnsupportedError
from surogate.io.gguf import ggml_type_id, row_bytes

QUANT_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M")
QK_K = 256

# --type -> (llama.cpp file type, base tensor type).
_RECIPES = {
    "F32": ("ALL_F32", "F32"), "F16": ("MOSTLY_F16", "F16"), "BF16": ("MOSTLY_BF16", "BF16"),
    "Q8_0": ("MOSTLY_Q8_0", "Q8_0"), "Q6_K": ("MOSTLY_Q6_K", "Q6_K"),
    "Q5_K_M": ("MOSTLY_Q5_K_M", "Q5_K"), "Q4_K_M": ("MOSTLY_Q4_K_M", "Q4_K"),
}
_K_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}
_BLOCK = {"Q8_0": 32, "Q5_0": 32, "Q5_1": 32, "Q4_0": 32, "Q4_1": 32, "Q4_K": QK_K, "Q5_K": QK_K, "Q6_K": QK_K}

Progress = Callable[[int, int, str, str, tuple], None]  # (index, count, name, type, shape)


def check_quant_type(qtype: str) -> str:
    """``qtype`` in upper case, or UnsupportedError listing the types."""
    if str(qtype).upper() not in _RECIPES:
        raise UnsupportedError(f"unknown GGUF type {qtype!r} for quantize", hint="use one of " + ", ".join(QUANT_TYPES))
    return str(qtype).upper()


def use_more_bits(layer: int, n_layers: int) -> bool:
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def tensor_type(qtype: str, name: str, shape: tuple[int, ...], n_layers: int, has_output: bool,
                attn_v: tuple[int, int] | None = None) -> str:
    """The GGML type the recipe ``qtype`` gives GGUF tensor ``name`` (see the module header).
    ``attn_v``: (this attn_v's index among the file's attn_v tensors, their count): llama.cpp
    counts those, not layers, where some layers have none (KV-shared or K = V layers, conv layers);
    without it the layer index and n_layers stand in."""
    qtype = check_quant_type(qtype)
    base = _RECIPES[qtype][1]
    if len(shape) < 2 or qtype == "F32":
        return "F32"
    if base in ("F16", "BF16"):
        return base
    cols = shape[-1]
    is_output = name == "output.weight" or (not has_output and name == "token_embd.weight")
    if is_output and base != "Q8_0":
        return fit_block_type("Q6_K" if cols % QK_K == 0 else "Q8_0", cols)
    kind = name.split(".")[2] if name.startswith("blk.") else None
    more = kind in ("attn_v", "ffn_down") and use_more_bits(
        *(attn_v if attn_v and kind == "attn_v" else (int(name.split(".")[1]), n_layers)))
    return block_type(qtype, cols, more_bits=more)


def block_type(qtype: str, cols: int, *, more_bits: bool = False) -> str:
    """The GGML type recipe ``qtype`` gives a projection weight of ``cols`` input features:
    its base type, Q6_K for the tensors the _M recipes give more bits (``more_bits``: attn_v
    and ffn_down of some layers), and the fallback when the rows do not fill whole blocks."""
    qtype = check_quant_type(qtype)
    base = _RECIPES[qtype][1]
    if base in ("F32", "F16", "BF16"):
        return base
    return fit_block_type("Q6_K" if more_bits and qtype in ("Q4_K_M", "Q5_K_M") else base, cols)


def fit_block_type(t: str, cols: int) -> str:
    """``t``, or llama.cpp's fallback for it when rows of ``cols`` values do not fill its blocks."""
    if cols % _BLOCK[t]:
        t = _K_FALLBACK.get(t, "F16")
        if cols % _BLOCK.get(t, 1):
            t = "F16"
    return t


@dataclass(frozen=True)
class PlannedTensor:
    name: str                      # GGUF name
    type: str                      # GGML type name
    shape: tuple[int, ...]         # numpy order
    read: Callable[[], np.ndarray]  # the values, in GGUF row order


def write_gguf(path: str | Path, arch: str, metadata: Mapping[str, object], plan: list[PlannedTensor],
               qtype: str, progress: Progress | None = None, file_kind: str = "model") -> Path:
    """Write the file atomically: metadata, tensor infos, then each tensor quantized in turn
    (``qtype`` names the recipe for general.file_type; each tensor's type is in the plan;
    ``file_kind``: general.type, "model" or "mmproj")."""
    from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    writer = GGUFWriter(tmp, arch)
    try:
        writer.add_type(file_kind)
        writer.add_file_type(int(LlamaFileType[_RECIPES[check_quant_type(qtype)][0]]))
        writer.add_quantization_version(2)
        for key, value in metadata.items():
            _add_value(writer, key, value)
        for t in plan:
            type_id = ggml_type_id(t.type)
            rows = int(np.prod(t.shape[:-1]))
            nbytes = rows * row_bytes(type_id, t.shape[-1])
            byte_shape = (*t.shape[:-1], nbytes // max(rows, 1))
            writer.add_tensor_info(t.name, byte_shape, np.dtype(np.uint8), nbytes,
                                   raw_dtype=GGMLQuantizationType(type_id))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for i, t in enumerate(plan):
            if progress is not None:
                progress(i, len(plan), t.name, t.type, t.shape)
            writer.write_tensor_data(quantize(t.read(), t.type, t.name))
        writer.flush()
        for f in writer.fout or []:
            os.fsync(f.fileno())
        writer.close()
        os.replace(tmp, path)
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    return path


def quantize(values: np.ndarray, type_name: str, name: str = "tensor") -> np.ndarray:
    """Raw GGML blocks (uint8 [rows, bytes_per_row]) of ``values`` (any float dtype, >= 1-D)."""
    from surogate import _native
    from surogate.io.gguf import _np_dtype

    x = np.asarray(values)
    if x.dtype not in (np.dtype(np.float32), np.dtype(np.float16), _np_dtype("bfloat16")):
        x = x.astype(np.float32)
    if not np.all(np.isfinite(x)):
        raise FileFormatError(f"{name} holds NaN or infinite values", hint="the checkpoint is damaged or diverged")
    x = np.ascontiguousarray(x.reshape(-1, x.shape[-1]))
    type_id = ggml_type_id(type_name)
    q = np.empty((x.shape[0], row_bytes(type_id, x.shape[1])), np.uint8)
    _native.call_op("gguf_quantize", [x], [q], {"type": type_id})
    return q


# ---- helpers --------------------------------------------------------------------------------

def _add_value(writer, key: str, value) -> None:
    from gguf import GGUFValueType

    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int) and value >= 0:
        writer.add_uint32(key, value)
    elif isinstance(value, int):
        writer.add_int32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    elif isinstance(value, (list, tuple)):
        if key == "tokenizer.ggml.token_type":
            writer.add_key_value(key, list(value), GGUFValueType.ARRAY, sub_type=GGUFValueType.INT32)
        else:
            writer.add_array(key, list(value))
    else:
        raise TypeError(f"metadata {key}: cannot write a {type(value).__name__}")


__all__ = ["QUANT_TYPES", "PlannedTensor", "check_quant_type", "quantize", "tensor_type",
           "use_more_bits", "write_gguf"]
