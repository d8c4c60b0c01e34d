"""Name tables: which checkpoint tensors feed which of our parameters, and back.

A table maps our parameter names (with ``{i}`` for the layer index) to a recipe over HF
checkpoint names: `Direct` (one tensor) or `Fuse` (several tensors concatenated along an
axis, e.g. gate_proj and up_proj into one gate_up projection). Export runs the recipe
backwards (`Fuse` splits).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from surogate.errors import FileFormatError


@dataclass(frozen=True)
class Direct:
    hf: str


@dataclass(frozen=True)
class Fuse:
    hf: tuple[str, ...]
    axis: int = 0


Recipe = Direct | Fuse


class NameTable:
    def __init__(self, entries: dict[str, Recipe]):
        self.entries = entries
        self._patterns = [(re.compile("^" + re.escape(k).replace(r"\{i\}", r"(?P<i>\d+)") + "$"), k, r)
                          for k, r in entries.items()]

    def recipe(self, name: str) -> Recipe | None:
        for pat, _, r in self._patterns:
            m = pat.match(name)
            if m:
                i = m.groupdict().get("i")
                if isinstance(r, Direct):
                    return Direct(r.hf.format(i=i))
                return Fuse(tuple(h.format(i=i) for h in r.hf), r.axis)
        return None

    def load(self, names: list[str], read: Callable[[str], np.ndarray], source: str = "checkpoint") -> dict[str, np.ndarray]:
        """Our parameters `names` assembled from checkpoint tensors (read(hf_name) -> array)."""
        out = {}
        for name in names:
            r = self.recipe(name)
            if r is None:
                raise FileFormatError(f"no checkpoint tensor is known for parameter {name}",
                                      hint="this is a gap in the model family's name table; please report it")
            if isinstance(r, Direct):
                out[name] = read(r.hf)
            else:
                parts = [read(h) for h in r.hf]
                out[name] = np.concatenate(parts, axis=r.axis)
        return out

    def export(self, params: dict[str, np.ndarray], sizes: Callable[[str, Fuse], list[int]]) -> dict[str, np.ndarray]:
        """Checkpoint tensors from our parameters; `sizes` gives the split sizes of a fused one."""
        out = {}
        for name, arr in params.items():
            r = self.recipe(name)
            if r is None:
                continue
            if isinstance(r, Direct):
                out[r.hf] = arr
            else:
                bounds = np.cumsum(sizes(name, r))[:-1]
                for h, part in zip(r.hf, np.split(arr, bounds, axis=r.axis)):
                    out[h] = part
        return out
