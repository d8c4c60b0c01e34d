"""GGUF files in: llama.cpp's one-file model format (metadata, tokenizer and GGML-typed tensors).

``GGUFFile`` memory-maps a file, parses its header (our reader: gguf-py's ``GGUFReader`` takes
seconds on a large vocabulary; gguf-py stays the reference in the tests) and gives the metadata
as Python values and the tensors as raw blocks (uint8 views of the mapped file, one row of
blocks per weight row). The HF-style ``config.json`` of a file comes from its family
(``surogate.models.config_from_gguf``, over io/gguf_config.py), so a model family builds its
spec from a GGUF as from a HF folder.
Dequantization runs the native ``gguf_dequantize`` kernel; ``GGUFTensor.matmul`` runs
``gguf_matmul`` on the blocks as they are (the path the runtime will take for quantized weights).

Shapes are in numpy / HF order, ``(rows, cols)``: ggml's ``ne`` reversed, so a GGUF weight has
the shape of the HF tensor it came from.

A file that is not GGUF, truncated, damaged, of another version or byte order is a
``FileFormatError`` / ``UnsupportedError`` naming the file; never a crash from the reader.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from surogate.errors import FileFormatError, NotFoundError, UnsupportedError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)

def ggml_type_name(type_id: int) -> str:
    from gguf import GGMLQuantizationType

    try:
        return GGMLQuantizationType(type_id).name
    except ValueError:
        return f"type {type_id}"


def ggml_type_id(name: str) -> int:
    from gguf import GGMLQuantizationType

    try:
        return int(GGMLQuantizationType[name.upper()])
    except KeyError:
        raise UnsupportedError(f"unknown GGML type {name!r}") from None


def row_bytes(type_id: int, cols: int) -> int:
    """Bytes of one row of ``cols`` values of a GGML type."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]
    if cols % block:
        raise UnsupportedError(f"a row of {cols} values is not a whole number of {ggml_type_name(type_id)} blocks "
                               f"({block} values each)")
    return cols // block * size


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of a GGUF file: ``raw`` is a uint8 [rows, bytes_per_row] view of its blocks."""

    name: str
    type: int
    shape: tuple[int, ...]
    raw: np.ndarray
    source: str = "GGUF file"

    @property
    def type_name(self) -> str:
        return ggml_type_name(self.type)

    @property
    def rows(self) -> int:
        return math.prod(self.shape[:-1])

    @property
    def cols(self) -> int:
        return self.shape[-1]

    @property
    def n_bytes(self) -> int:
        return self.raw.size

    def check_supported(self) -> None:
        """UnsupportedError naming the tensor when this build cannot decode its type."""
        probe = np.zeros((0, self.raw.shape[1]), np.uint8)
        try:
            _native_call("gguf_dequantize", [probe], [np.zeros((0, self.cols), np.float32)],
                         {"type": self.type, "cols": self.cols})
        except UnsupportedError as e:
            raise UnsupportedError(f"{self.source}: unsupported GGUF type {self.type_name} in tensor {self.name}",
                                   hint=e.hint) from None

    def dequantize(self, dtype: str = "float32", rows: np.ndarray | None = None) -> np.ndarray:
        """The values as a float32 / bfloat16 / float16 array of ``shape``; ``rows`` picks (and
        orders) a subset of rows first."""
        self.check_supported()
        raw = self.raw if rows is None else self.raw[rows]
        y = np.empty((raw.shape[0], self.cols), _np_dtype(dtype))
        if raw.shape[0]:
            _native_call("gguf_dequantize", [np.ascontiguousarray(raw)], [y], {"type": self.type, "cols": self.cols})
        return y.reshape(self.shape if rows is None else (raw.shape[0], self.cols))

    def matmul(self, x: np.ndarray) -> np.ndarray:
        """``x @ W.T`` for x [N, cols] (float32), on the blocks without dequantizing them first."""
        if len(self.shape) != 2:
            raise UnsupportedError(f"{self.name}: gguf_matmul takes a 2-D weight, this one is {self.shape}")
        x = np.ascontiguousarray(x, np.float32)
        y = np.empty((x.shape[0], self.rows), np.float32)
        _native_call("gguf_matmul", [x, np.ascontiguousarray(self.raw)], [y], {"type": self.type})
        return y

    def __repr__(self) -> str:
        return f"GGUFTensor({self.name!r}, {self.type_name}, shape={self.shape})"


class GGUFFile:
    """A GGUF file, memory-mapped: metadata parsed at open, tensor blocks read when used."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.version, self._values, self.tensors = _parse(self.path)

    # ---- metadata ---------------------------------------------------------------------------
    def keys(self) -> list[str]:
        return list(self._values)

    def __contains__(self, key: str) -> bool:
        return key in self._values

    def get(self, key: str, default=None):
        """A metadata value as a Python scalar, string or list; ``default`` when absent."""
        return self._values.get(key, default)

    def require(self, key: str):
        value = self.get(key)
        if value is None:
            raise FileFormatError(f"{self.path}: metadata key {key} is missing",
                                  hint="the file was written by a converter this reader does not know")
        return value

    @property
    def metadata(self) -> dict[str, object]:
        return dict(self._values)

    @property
    def architecture(self) -> str:
        return str(self.require("general.architecture"))

    @property
    def name(self) -> str | None:
        return self.get("general.name")

    # ---- tensors ----------------------------------------------------------------------------
    def tensor(self, name: str) -> GGUFTensor:
        t = self.tensors.get(name)
        if t is None:
            raise NotFoundError(f"{self.path}: no tensor {name}",
                                hint=f"the file has {len(self.tensors)} tensors, e.g. {', '.join(list(self.tensors)[:4])}")
        return t

    def check_supported(self) -> None:
        """UnsupportedError for the first tensor whose type this build cannot decode."""
        for t in self.tensors.values():
            t.check_supported()

    def __repr__(self) -> str:
        return f"GGUFFile({str(self.path)!r}, {self.get('general.architecture')}, {len(self.tensors)} tensors)"


def is_gguf(path: str | os.PathLike) -> bool:
    """A file whose name ends in .gguf, or that starts with the GGUF magic."""
    path = Path(path)
    if not path.is_file():
        return False
    if path.suffix.lower() == ".gguf":
        return True
    with open(path, "rb") as f:
        return f.read(4) == GGUF_MAGIC


# GGUF value types: id -> (struct code, size); 8 string, 9 array.
_SCALARS = {0: ("B", 1), 1: ("b", 1), 2: ("H", 2), 3: ("h", 2), 4: ("I", 4), 5: ("i", 4), 6: ("f", 4),
            7: ("?", 1), 10: ("Q", 8), 11: ("q", 8), 12: ("d", 8)}
_STRING, _ARRAY = 8, 9
_MAX_DIMS = 4


class _Truncated(Exception):
    pass


class _Cursor:
    """Reads little-endian GGUF values from a buffer, checking every read against its end."""

    def __init__(self, buf, path: Path):
        self.buf, self.path, self.pos, self.end = buf, path, 0, len(buf)
        self.what = "the header"

    def take(self, n: int) -> int:
        at = self.pos
        if n < 0 or at + n > self.end:
            raise _Truncated()
        self.pos = at + n
        return at

    def scalar(self, code: str, size: int):
        return struct.unpack_from("<" + code, self.buf, self.take(size))[0]

    def u32(self) -> int:
        return self.scalar("I", 4)

    def u64(self) -> int:
        return self.scalar("Q", 8)

    def string(self) -> str:
        n = self.u64()
        at = self.take(n)
        try:
            return bytes(self.buf[at:at + n]).decode("utf-8")
        except UnicodeDecodeError as e:
            raise FileFormatError(f"{self.path}: {self.what} holds a string that is not UTF-8 ({e.reason})",
                                  hint="the file is damaged; fetch or convert it again") from None

    def value(self, vtype: int):
        if vtype in _SCALARS:
            return self.scalar(*_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, n = self.u32(), self.u64()
            if etype in _SCALARS:
                code, size = _SCALARS[etype]
                at = self.take(n * size)
                return np.frombuffer(self.buf, np.dtype("<" + code), n, at).tolist()
            if etype == _STRING:
                if n * 8 > self.end - self.pos:  # every string takes at least its 8-byte length
                    raise _Truncated()
                return [self.string() for _ in range(n)]
            if etype == _ARRAY:
                if n * 12 > self.end - self.pos:
                    raise _Truncated()
                return [self.value(_ARRAY) for _ in range(n)]
            raise FileFormatError(f"{self.path}: {self.what} is an array of unknown value type {etype}",
                                  hint="the file is damaged, or newer than this reader")
        raise FileFormatError(f"{self.path}: {self.what} has unknown value type {vtype}",
                              hint="the file is damaged, or newer than this reader")


def _parse(path: Path) -> tuple[int, dict, dict[str, GGUFTensor]]:
    """(version, metadata, tensors) of a GGUF file. Our own reader of the header (gguf-py's
    GGUFReader builds a numpy view per string: 5.5 s for SmolLM2's 98k tokens and merges)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size >= 24 else None
    except FileNotFoundError:
        raise NotFoundError(f"no such file: {path}") from None
    except IsADirectoryError:
        raise FileFormatError(f"{path} is a folder, not a GGUF file") from None
    if buf is None:
        raise FileFormatError(f"{path}: truncated GGUF file ({size} bytes; the header alone is 24)",
                              hint="the download or conversion did not finish; fetch or convert it again")
    if buf[:4] != GGUF_MAGIC:
        raise FileFormatError(f"{path} is not a GGUF file (it starts with {bytes(buf[:4])!r}, not b'GGUF')",
                              hint="pass a .gguf model file, or a Hugging Face model folder")
    c = _Cursor(buf, path)
    c.take(4)
    version = c.u32()
    if version & 0xFFFF == 0 and version:
        raise UnsupportedError(f"{path}: a big-endian GGUF file", hint="convert it to little-endian first")
    if version not in SUPPORTED_VERSIONS:
        raise UnsupportedError(f"{path}: GGUF version {version} is not supported",
                               hint=f"supported versions: {', '.join(map(str, SUPPORTED_VERSIONS))}; "
                                    "convert the model again with a current llama.cpp")
    try:
        n_tensors, n_kv = c.u64(), c.u64()
        if n_kv * 13 > size or n_tensors * 24 > size:  # a key-value takes >= 13 bytes, a tensor info >= 24
            raise FileFormatError(f"{path}: truncated or damaged GGUF file (its header counts {n_kv} metadata keys "
                                  f"and {n_tensors} tensors, in {size} bytes)",
                                  hint="the download or conversion did not finish, or the file is damaged; "
                                       "fetch or convert it again")
        values: dict[str, object] = {}
        for i in range(n_kv):
            c.what = f"metadata entry {i}"
            key = c.string()
            c.what = f"metadata key {key}"
            if key in values:
                raise FileFormatError(f"{path}: metadata key {key} appears twice", hint="the file is damaged")
            values[key] = c.value(c.u32())
        infos = []
        for i in range(n_tensors):
            c.what = f"tensor info {i}"
            name = c.string()
            c.what = f"the info of tensor {name}"
            n_dims = c.u32()
            if not 1 <= n_dims <= _MAX_DIMS:
                raise FileFormatError(f"{path}: tensor {name} has {n_dims} dimensions (ggml allows 1 to 4)",
                                      hint="the file is damaged")
            ne = [c.u64() for _ in range(n_dims)]
            infos.append((name, ne, c.u32(), c.u64()))
    except _Truncated:
        raise FileFormatError(f"{path}: truncated GGUF file (it ends inside {c.what}, at byte {c.end})",
                              hint="the download or conversion did not finish; fetch or convert it again") from None

    alignment = values.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise FileFormatError(f"{path}: general.alignment is {alignment!r}, not a power of two",
                              hint="the file is damaged")
    data_start = -(-c.pos // alignment) * alignment
    tensors: dict[str, GGUFTensor] = {}
    for name, ne, type_id, offset in infos:
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]
        except (ValueError, KeyError):
            raise UnsupportedError(f"{path}: unknown GGML type id {type_id} in tensor {name}",
                                   hint="the file uses a tensor type newer than this reader") from None
        if name in tensors:
            raise FileFormatError(f"{path}: tensor {name} appears twice", hint="the file is damaged")
        shape = tuple(reversed(ne))
        if any(d <= 0 for d in ne) or ne[0] % block:
            raise FileFormatError(f"{path}: tensor {name} has shape {list(shape)}, which does not fit "
                                  f"{ggml_type_name(type_id)} blocks of {block}", hint="the file is damaged")
        rows = math.prod(ne[1:])
        bpr = ne[0] // block * type_size
        start = data_start + offset
        if offset % alignment or start + rows * bpr > size:
            what = "is misaligned" if offset % alignment else f"ends past the end of the file ({size} bytes)"
            raise FileFormatError(f"{path}: truncated or damaged GGUF file (the data of tensor {name} {what})",
                                  hint="the download or conversion did not finish; fetch or convert it again")
        raw = np.frombuffer(buf, np.uint8, rows * bpr, start).reshape(rows, bpr)
        tensors[name] = GGUFTensor(name, type_id, shape, raw, source=str(path))
    return version, values, tensors


def _np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    if name not in ("float32", "float16"):
        raise UnsupportedError(f"cannot dequantize to {name}", hint="use float32, bfloat16 or float16")
    return np.dtype(name)


def _native_call(op: str, inputs: list, outputs: list, attrs: dict) -> None:
    from surogate import _native

    _native.call_op(op, inputs, outputs, attrs)
