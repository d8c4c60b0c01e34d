"""Name tables: which checkpoint tensors feed which of our parameters, and back.

A table maps our parameter names (with ``{i}`` for the layer index) to a recipe over HF
checkpoint names: `Direct` (one tensor), `Fuse` (several tensors concatenated along an
axis, e.g. gate_proj and up_proj into one gate_up projection) or `Slice` (layer i's equal part
of one tensor packed over the layers, Gemma 4's per-layer input tables). Export runs the recipe
backwards (`Fuse` splits, `Slice` joins).
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


@dataclass(frozen=True)
class Slice:
    """Our per-layer parameter ``layers.{i}.X`` is part ``index`` of ``hf`` cut into as many equal
    parts along ``axis`` as there are layers (the parameters of this recipe loaded together)."""

    hf: str
    axis: int = 0
    index: int = 0


Recipe = Direct | Fuse | Slice


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
                if isinstance(r, Slice):
                    return Slice(r.hf, r.axis, int(i))
                return Fuse(tuple(h.format(i=i) for h in r.hf), r.axis)
        return None

    def load(self, names: list[str], read: Callable[[str], np.ndarray], source: str = "checkpoint") -> dict[str, np.ndarray]:
        """Our parameters `names` assembled from checkpoint tensors (read(hf_name) -> array)."""
        out = {}
        recipes = {name: self.recipe(name) for name in names}
        n_slices: dict[str, int] = {}  # a sliced tensor -> how many of our parameters share it
        for r in recipes.values():
            if isinstance(r, Slice):
                n_slices[r.hf] = n_slices.get(r.hf, 0) + 1
        for name in names:
            r = recipes[name]
            if r is None:
                raise FileFormatError(f"no checkpoint tensor is known for parameter {name}",
                                      hint="this is a gap in the model family's name table; please report it")
            if isinstance(r, Direct):
                out[name] = read(r.hf)
            elif isinstance(r, Slice):
                full = read(r.hf)
                n = n_slices[r.hf]
                if full.shape[r.axis] % n:
                    raise FileFormatError(f"{source}: {r.hf} {full.shape} does not split into {n} layers along "
                                          f"axis {r.axis}", hint="the weights and the config do not belong together")
                out[name] = np.ascontiguousarray(np.split(full, n, axis=r.axis)[r.index])
            else:
                parts = [read(h) for h in r.hf]
                out[name] = np.concatenate(parts, axis=r.axis)
        return out

    def export(self, params: dict[str, np.ndarray], sizes: Callable[[str, Fuse], list[int]]) -> dict[str, np.ndarray]:
        """Checkpoint tensors from our parameters; `sizes` gives the split sizes of a fused one."""
        out = {}
        sliced: dict[str, dict[int, np.ndarray]] = {}
        for name, arr in params.items():
            r = self.recipe(name)
            if r is None:
                continue
            if isinstance(r, Direct):
                out[r.hf] = arr
            elif isinstance(r, Slice):
                sliced.setdefault(r.hf, {})[r.index] = (arr, r.axis)
            else:
                bounds = np.cumsum(sizes(name, r))[:-1]
                for h, part in zip(r.hf, np.split(arr, bounds, axis=r.axis)):
                    out[h] = part
        for hf, got in sliced.items():  # joined only when every layer's part is there
            if sorted(got) == list(range(len(got))):
                out[hf] = np.concatenate([got[k][0] for k in range(len(got))], axis=got[0][1])
        return out
