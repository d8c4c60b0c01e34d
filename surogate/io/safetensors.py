"""Read and write safetensors files without copying: the header is parsed here, the data is mapped.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON (tensor name ->
dtype, shape, [begin, end) byte offsets into the data that follows; an optional
``__metadata__`` of strings), then the raw little-endian tensor bytes. ``SafetensorsFile``
maps the data once with ``numpy.memmap`` and hands out read-only views, so opening a 100 GB
checkpoint costs its header. ``ShardedCheckpoint`` puts the files named by a
``model.safetensors.index.json`` behind the same interface. Every structural fault is
reported when the file is opened, naming the file and the tensor, not when a view is read.
Writing: ``save_safetensors`` (atomic) and ``save_sharded_safetensors`` (transformers' shards and
index); a ``PendingTensor`` is made only when its turn comes, so memory stays near one tensor.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import secrets
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

from surogate.errors import FileFormatError, InvalidArgumentError, NotFoundError, UnsupportedError

# safetensors dtype code -> numpy dtype (ml_dtypes supplies the ones numpy lacks).
DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "U8": np.dtype(np.uint8),
    "I8": np.dtype(np.int8),
    "I16": np.dtype("<i2"),
    "U16": np.dtype("<u2"),
    "I32": np.dtype("<i4"),
    "U32": np.dtype("<u4"),
    "I64": np.dtype("<i8"),
    "U64": np.dtype("<u8"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
    "C64": np.dtype("<c8"),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),
}
_CODES: dict[np.dtype, str] = {dtype: code for code, dtype in DTYPES.items()}

# The reference implementation refuses larger headers; a bigger number means a damaged file.
_MAX_HEADER_BYTES = 100 * 1024 * 1024
_REDOWNLOAD = "the file is damaged or was cut short (an interrupted download or copy?); fetch it again"


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: dtype code (``"BF16"``), shape, and byte range in the data section."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def numpy_dtype(self) -> np.dtype:
        return DTYPES[self.dtype]

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


class SafetensorsFile:
    """One ``.safetensors`` file, mapped read-only. ``get(name)`` returns a view, never a copy."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if sys.byteorder != "little":
            raise UnsupportedError("safetensors data is little-endian and this machine is not")
        try:
            file_size = self.path.stat().st_size
            with open(self.path, "rb") as f:
                header, data_start = _read_header(self.path, f, file_size)
        except FileNotFoundError:
            raise NotFoundError(f"no such safetensors file: {self.path}") from None
        except IsADirectoryError:
            raise NotFoundError(f"{self.path} is a folder, not a safetensors file",
                                hint="pass the .safetensors file, or open the folder with ModelFolder") from None
        meta = header.pop("__metadata__", None) or {}
        if not isinstance(meta, dict):
            raise FileFormatError(f"{self.path}: __metadata__ must be a JSON object of strings", hint=_REDOWNLOAD)
        self.metadata: dict[str, str] = meta
        data_len = file_size - data_start
        self._infos = _parse_entries(self.path, header, data_len)
        # One mapping for the whole data section; every tensor is a slice of it.
        self._data: np.ndarray | None = np.empty(0, np.uint8)
        if data_len:
            mapped = np.memmap(self.path, dtype=np.uint8, mode="r", offset=data_start, shape=(data_len,))
            self._data = mapped.view(np.ndarray)

    def keys(self) -> list[str]:
        return list(self._infos)

    def __contains__(self, name: object) -> bool:
        return name in self._infos

    def __len__(self) -> int:
        return len(self._infos)

    def __iter__(self) -> Iterator[str]:
        return iter(self._infos)

    def info(self, name: str) -> TensorInfo:
        try:
            return self._infos[name]
        except KeyError:
            raise _missing_tensor(name, self.path, self._infos) from None

    def get(self, name: str) -> np.ndarray:
        info = self.info(name)
        if self._data is None:
            raise InvalidArgumentError(f"{self.path} was closed", hint="open it again to read more tensors")
        return self._data[info.begin:info.end].view(info.numpy_dtype).reshape(info.shape)

    def close(self) -> None:
        # Views handed out keep the mapping alive; this only drops our own reference.
        self._data = None

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SafetensorsFile({str(self.path)!r}, {len(self)} tensors)"


class ShardedCheckpoint:
    """The shards named by a ``*.safetensors.index.json``, read as one file."""

    def __init__(self, index_path: str | os.PathLike):
        self.index_path = Path(index_path)
        index = _read_index(self.index_path)
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise FileFormatError(f"{self.index_path}: 'weight_map' must map tensor names to shard file names",
                                  hint=_REDOWNLOAD)
        self.index_metadata: dict = index.get("metadata") or {}
        folder = self.index_path.parent
        shards: dict[str, SafetensorsFile] = {}
        for shard_name in dict.fromkeys(weight_map.values()):
            if Path(shard_name).is_absolute() or ".." in Path(shard_name).parts:
                raise FileFormatError(f"{self.index_path}: shard {shard_name!r} points outside the folder")
            shard_path = folder / shard_name
            if not shard_path.is_file():
                present = sorted(p.name for p in folder.glob("*.safetensors"))
                raise NotFoundError(
                    f"shard {shard_name} listed in {self.index_path.name} is missing from {folder}",
                    hint=f"download the missing shard (present: {', '.join(present) or 'none'})")
            shards[shard_name] = SafetensorsFile(shard_path)
        for name, shard_name in weight_map.items():
            if name not in shards[shard_name]:
                raise FileFormatError(
                    f"{self.index_path.name} places tensor '{name}' in {shard_name}, which does not contain it",
                    hint="the index and the shards come from different checkpoints; download them together")
        self._shards = shards
        self._where = {name: shards[shard_name] for name, shard_name in weight_map.items()}
        self.metadata: dict[str, str] = {}
        for shard in shards.values():
            self.metadata.update(shard.metadata)

    @property
    def files(self) -> list[Path]:
        return [shard.path for shard in self._shards.values()]

    def shard_of(self, name: str) -> Path:
        return self._shard(name).path

    def keys(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: object) -> bool:
        return name in self._where

    def __len__(self) -> int:
        return len(self._where)

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def info(self, name: str) -> TensorInfo:
        return self._shard(name).info(name)

    def get(self, name: str) -> np.ndarray:
        return self._shard(name).get(name)

    def close(self) -> None:
        for shard in self._shards.values():
            shard.close()

    def __enter__(self) -> ShardedCheckpoint:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _shard(self, name: str) -> SafetensorsFile:
        try:
            return self._where[name]
        except KeyError:
            raise _missing_tensor(name, self.index_path, self._where) from None

    def __repr__(self) -> str:
        return f"ShardedCheckpoint({str(self.index_path)!r}, {len(self._shards)} shards, {len(self)} tensors)"


def open_safetensors(path: str | os.PathLike) -> SafetensorsFile | ShardedCheckpoint:
    """A ``.safetensors`` file or a ``.safetensors.index.json`` index of shards."""
    path = Path(path)
    return ShardedCheckpoint(path) if path.name.endswith(".json") else SafetensorsFile(path)


@dataclass(frozen=True)
class PendingTensor:
    """A tensor to write whose bytes are made only when the writer reaches it (``make()``), so a
    file of quantized or converted tensors is written holding one tensor in memory at a time."""

    dtype: np.dtype
    shape: tuple[int, ...]
    make: Callable[[], np.ndarray]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


def save_safetensors(path: str | os.PathLike, tensors: Mapping[str, np.ndarray | PendingTensor],
                     metadata: Mapping[str, str] | None = None) -> None:
    """Write ``tensors`` as a safetensors file, atomically: a reader sees the old file or the whole new one."""
    path = Path(path)
    if metadata is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise InvalidArgumentError("safetensors metadata must map strings to strings",
                                   hint="convert values with str() or json.dumps() first")
    arrays: dict[str, np.ndarray | PendingTensor] = {}
    for name, value in tensors.items():
        if not isinstance(name, str) or name == "__metadata__":
            raise InvalidArgumentError(f"invalid tensor name {name!r} for {path}")
        if isinstance(value, PendingTensor):
            _as_little_endian(name, np.empty(0, value.dtype))  # a dtype safetensors stores, checked up front
            arrays[name] = PendingTensor(np.dtype(value.dtype), tuple(value.shape), value.make)
        else:
            arrays[name] = _as_little_endian(name, np.asarray(value, order="C"))
    # Widest dtypes first, then by name (the reference library's order): every tensor starts
    # aligned to its item size, because the header is padded to a multiple of 8 bytes.
    order = sorted(arrays, key=lambda n: (-arrays[n].dtype.itemsize, n))
    header: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name in order:
        a = arrays[name]
        header[name] = {"dtype": _CODES[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    head = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    head += b" " * (-len(head) % 8)

    # O_EXCL with a random name instead of mkstemp, so the file gets the usual umask permissions.
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as f:
            f.write(len(head).to_bytes(8, "little"))
            f.write(head)
            for name in order:
                a = arrays[name]
                if isinstance(a, PendingTensor):
                    a = _made(name, a)
                f.write(a.reshape(-1).view(np.uint8).data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def save_sharded_safetensors(folder: str | os.PathLike, tensors: Mapping[str, np.ndarray | PendingTensor],
                             max_shard_bytes: int, metadata: Mapping[str, str] | None = None) -> list[Path]:
    """``tensors`` as ``model.safetensors``, or, past ``max_shard_bytes``, as transformers'
    ``model-0000k-of-0000n.safetensors`` shards (filled in the mapping's order; a tensor larger than
    a shard gets one of its own) beside ``model.safetensors.index.json``. Returns the files written."""
    folder = Path(folder)
    shards: list[dict[str, np.ndarray | PendingTensor]] = [{}]
    size = 0
    for name, value in tensors.items():
        n = value.nbytes
        if shards[-1] and size + n > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = value
        size += n
    if len(shards) == 1:
        save_safetensors(folder / "model.safetensors", shards[0], metadata)
        return [folder / "model.safetensors"]
    names = [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))]
    weight_map = {}
    for shard_name, shard in zip(names, shards):
        save_safetensors(folder / shard_name, shard, metadata)
        weight_map.update(dict.fromkeys(shard, shard_name))
    index = {"metadata": {"total_size": sum(v.nbytes for v in tensors.values())},
             "weight_map": dict(sorted(weight_map.items()))}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return [folder / n for n in names] + [folder / "model.safetensors.index.json"]


def _made(name: str, pending: PendingTensor) -> np.ndarray:
    a = _as_little_endian(name, np.asarray(pending.make(), order="C"))
    if a.dtype != pending.dtype or a.shape != pending.shape:
        raise InvalidArgumentError(f"tensor '{name}' was planned as {pending.dtype}{list(pending.shape)} but made as "
                                   f"{a.dtype}{list(a.shape)}", hint="this is a bug in the writer's caller")
    return a


def _read_header(path: Path, f, file_size: int) -> tuple[dict, int]:
    raw = f.read(8)
    if len(raw) < 8:
        raise FileFormatError(f"{path} is {file_size} bytes: too short to be a safetensors file", hint=_REDOWNLOAD)
    n = int.from_bytes(raw, "little")
    if n > _MAX_HEADER_BYTES or 8 + n > file_size:
        raise FileFormatError(
            f"{path}: the header claims {n} bytes but the file has {file_size - 8} after the length field",
            hint=_REDOWNLOAD + "; or this is not a safetensors file")
    try:
        header = json.loads(f.read(n))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FileFormatError(f"{path}: the safetensors header is not valid JSON ({e})", hint=_REDOWNLOAD) from None
    if not isinstance(header, dict):
        raise FileFormatError(f"{path}: the safetensors header is not a JSON object", hint=_REDOWNLOAD)
    return header, 8 + n


def _parse_entries(path: Path, header: dict, data_len: int) -> dict[str, TensorInfo]:
    infos: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if not isinstance(entry, dict):
            raise _bad_entry(path, name, "entry is not a JSON object")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in DTYPES:
            raise _bad_entry(path, name, f"unsupported dtype {dtype!r}",
                             hint=f"surogate reads {', '.join(DTYPES)}; convert the checkpoint to one of them")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise _bad_entry(path, name, f"shape {shape!r} is not a list of non-negative integers")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
                or not 0 <= offsets[0] <= offsets[1]):
            raise _bad_entry(path, name, f"data_offsets {offsets!r} is not an ordered [begin, end] pair")
        begin, end = offsets
        expected = math.prod(shape) * DTYPES[dtype].itemsize
        if end - begin != expected:
            raise _bad_entry(path, name, f"{dtype}{shape} needs {expected} bytes but data_offsets span {end - begin}")
        if end > data_len:
            raise _bad_entry(path, name, f"data ends at byte {end} but the file holds {data_len} bytes of data")
        infos[name] = TensorInfo(dtype, tuple(shape), begin, end)
    by_start = sorted(infos.items(), key=lambda kv: (kv[1].begin, kv[1].end))
    for (prev_name, prev), (name, cur) in zip(by_start, by_start[1:]):
        if cur.begin < prev.end and cur.nbytes and prev.nbytes:
            raise FileFormatError(
                f"{path}: tensors '{prev_name}' and '{name}' overlap "
                f"(bytes {prev.begin}-{prev.end} and {cur.begin}-{cur.end})", hint=_REDOWNLOAD)
    return infos


def _bad_entry(path: Path, name: str, what: str, hint: str = _REDOWNLOAD) -> FileFormatError:
    return FileFormatError(f"{path}: tensor '{name}': {what}", hint=hint)


def _read_index(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            index = json.load(f)
    except FileNotFoundError:
        raise NotFoundError(f"no such checkpoint index: {path}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FileFormatError(f"{path} is not valid JSON ({e})", hint=_REDOWNLOAD) from None
    if not isinstance(index, dict):
        raise FileFormatError(f"{path}: expected a JSON object with a 'weight_map'", hint=_REDOWNLOAD)
    return index


def _as_little_endian(name: str, a: np.ndarray) -> np.ndarray:
    dtype = a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype
    if dtype not in _CODES:
        raise InvalidArgumentError(f"tensor '{name}' has dtype {a.dtype}, which safetensors cannot store",
                                   hint=f"convert it to one of {', '.join(str(d) for d in _CODES)}")
    return a.astype(dtype) if dtype != a.dtype else a


def _missing_tensor(name: str, where: Path, known: Mapping[str, object]) -> NotFoundError:
    close = difflib.get_close_matches(name, list(known), n=3)
    if close:
        hint = f"did you mean {', '.join(close)}?"
    else:
        hint = f"{where.name} holds {len(known)} tensors; list them with .keys()"
    return NotFoundError(f"no tensor '{name}' in {where}", hint=hint)
