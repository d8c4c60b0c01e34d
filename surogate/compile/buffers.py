"""Buffers of a compiled program, before they exist natively.

Every graph value maps to a `Buf`: external (parameters, step inputs, gradient accumulators:
memory the caller owns and binds; a value with ``meta["host"]`` is bound to host memory on any
device), internal (activations and temporaries, placed in the arena
by the planner) or a view of another buffer (reshapes, column slices of a fused projection).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(eq=False)
class Buf:
    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: str  # "external" | "internal" | "view"
    base: Buf | None = None
    offset: int = 0  # views: elements into the base
    strides: tuple[int, ...] | None = None  # views: None = contiguous
    pinned: bool = False  # internal: keep alive to the end (a result the caller reads)
    host: bool = False  # external: bound to host memory on any device (weights a weight_fetch copies up)
    native_id: int = -1
    arena_offset: int = -1

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * itemsize(self.dtype)

    def root(self) -> Buf:
        b = self
        while b.base is not None:
            b = b.base
        return b

    def __repr__(self) -> str:
        return f"Buf({self.name}, {self.dtype}{list(self.shape)}, {self.kind})"


_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int32": 4, "int64": 8, "int8": 1,
             "uint8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}


def itemsize(dtype: str) -> int:
    return _ITEMSIZE[dtype]


@dataclass
class Instr:
    op: str
    inputs: list[Buf | None]
    outputs: list[Buf | None]
    attrs: dict = field(default_factory=dict)
    node: str = ""  # the graph node it came from, for error messages and profiles
