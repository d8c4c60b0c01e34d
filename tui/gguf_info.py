"""A GGUF file's header for the Library: metadata and the tensor table, without the tensor data.

gguf-py's GGUFReader parses every element of every array into numpy objects, which takes
seconds for a 49k-token vocabulary; a listing needs only the scalars and the tensor table,
so this reader steps over arrays (strings included) by their lengths.
Format: magic "GGUF", version u32, tensor count u64, kv count u64, kv pairs, tensor infos.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

from surogate.errors import FileFormatError

# value type -> struct format for the fixed-size ones (8: string, 9: array)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


@dataclass
class GGUFTensor:
    name: str
    shape: tuple[int, ...]
    type: str  # e.g. Q4_1, F32

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass
class GGUFInfo:
    version: int
    metadata: dict[str, object]  # scalars and strings; arrays as "[N items]" placeholders
    tensors: list[GGUFTensor] = field(default_factory=list)

    @property
    def architecture(self) -> str | None:
        value = self.metadata.get("general.architecture")
        return str(value) if value is not None else None

    @property
    def n_params(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    @property
    def file_type(self) -> str | None:
        """The quant type (Q4_1, Q8_0, ...): general.file_type, else the most common tensor type."""
        code = self.metadata.get("general.file_type")
        if isinstance(code, int):
            try:
                from gguf import LlamaFileType

                return LlamaFileType(code).name.removeprefix("MOSTLY_").replace("ALL_", "")
            except (ImportError, ValueError):
                pass
        if not self.tensors:
            return None
        counts: dict[str, int] = {}
        for t in self.tensors:
            counts[t.type] = counts.get(t.type, 0) + t.n_elements
        return max(counts, key=counts.__getitem__)


class _Cursor:
    def __init__(self, data: bytes, path: Path):
        self.data, self.pos, self.path = data, 0, path

    def take(self, fmt: str):
        size = struct.calcsize("<" + fmt)
        if self.pos + size > len(self.data):
            raise FileFormatError(f"{self.path}: GGUF header is truncated", hint="the file is incomplete; fetch it again")
        value = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += size
        return value[0] if len(value) == 1 else value

    def string(self) -> str:
        n = self.take("Q")
        raw = self.data[self.pos:self.pos + n]
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def skip_strings(self, count: int) -> None:
        for _ in range(count):
            (n,) = struct.unpack_from("<Q", self.data, self.pos)
            self.pos += 8 + n

    def value(self, vtype: int):
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            item, count = self.take("I"), self.take("Q")
            if item == _STRING:
                if count <= 16:
                    return [self.string() for _ in range(count)]
                self.skip_strings(count)
            elif item in _SCALARS:
                size = struct.calcsize("<" + _SCALARS[item])
                if count <= 16:
                    return [self.value(item) for _ in range(count)]
                self.pos += size * count
            else:
                raise FileFormatError(f"{self.path}: nested GGUF arrays are not supported")
            return f"[{count} items]"
        raise FileFormatError(f"{self.path}: unknown GGUF value type {vtype}", hint="the file is damaged")


def read_gguf_info(path: str | Path, chunk: int = 1 << 20) -> GGUFInfo:
    """Metadata and tensor table of a GGUF file (reads the header, growing the read as needed)."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        while True:
            data = f.read(chunk) if chunk < size else f.read()
            f.seek(0)
            try:
                return _parse(data, path)
            except FileFormatError:
                if len(data) >= size:
                    raise
            except (struct.error, IndexError):
                if len(data) >= size:
                    raise FileFormatError(f"{path}: GGUF header is truncated", hint="the file is incomplete") from None
            chunk *= 4


def _parse(data: bytes, path: Path) -> GGUFInfo:
    if data[:4] != b"GGUF":
        raise FileFormatError(f"{path} is not a GGUF file (no GGUF magic)", hint="check the file")
    c = _Cursor(data, path)
    c.pos = 4
    version = c.take("I")
    n_tensors, n_kv = c.take("Q"), c.take("Q")
    meta: dict[str, object] = {}
    for _ in range(n_kv):
        key = c.string()
        meta[key] = c.value(c.take("I"))
    if c.pos > len(data):
        raise struct.error("past the end")
    info = GGUFInfo(version, meta)
    for _ in range(n_tensors):
        name = c.string()
        n_dims = c.take("I")
        dims = tuple(c.take("Q") for _ in range(n_dims))
        ttype = c.take("I")
        c.take("Q")  # offset
        info.tensors.append(GGUFTensor(name, tuple(reversed(dims)), _type_name(ttype)))
    return info


def _type_name(code: int) -> str:
    try:
        from gguf import GGMLQuantizationType

        return GGMLQuantizationType(code).name
    except (ImportError, ValueError):
        return f"type{code}"
