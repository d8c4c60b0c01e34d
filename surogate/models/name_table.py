"""Name tables: which checkpoint tensors feed which of our parameters, and back.

A table maps our parameter names (with ``{i}`` for the layer index) to a recipe over HF
checkpoint names: `Direct` (one tensor), `Fuse` (several tensors concatenated along an
axis, e.g. gate_proj and up_proj into one gate_up projection), `Slice` (layer i's equal part
of one tensor packed over the layers, Gemma 4's per-layer input tables), `Rows` (one of the equal
row blocks of one tensor: Qwen3-VL's fused vision qkv held as q, k, v) or `Experts` (a
mixture-of-experts layer's per-expert tensors stacked into one [E, ...] tensor). Export runs
the recipe backwards (`Fuse` splits, `Slice` and `Rows` join; `Experts` writes the stacked tensor
under transformers 5's name).
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


@dataclass(frozen=True)
class Rows:
    """Our parameter is row block ``index`` of ``hf`` cut into ``parts`` equal blocks along axis 0
    (the inverse of `Fuse`: Qwen3-VL's vision attn.qkv as q, k and v)."""

    hf: str
    index: int
    parts: int


@dataclass(frozen=True)
class Experts:
    """One [E, ...] tensor of a mixture-of-experts layer: ``hf`` is transformers 5's name of the
    stacked tensor (``mlp.experts.gate_up_proj``), read as it is when the checkpoint has it;
    otherwise (the per-expert layout the hub's checkpoints and transformers' save_pretrained
    write) each expert e's ``parts`` (names with ``{e}``) are concatenated along ``axis`` and the
    experts stacked, for e = 0, 1, ... while the checkpoint has them."""

    hf: str
    parts: tuple[str, ...]
    axis: int = 0
    # The stacked tensor is [E, in, out] in the checkpoint (GPT-OSS's GptOssExperts) and ours
    # [E, out, in]: its last two axes are swapped at load and at export.
    transposed: bool = False
    # (the layer's stacked gate_up_proj name, its down_proj name): the orientation is then each
    # checkpoint's, read off the two tensors' shapes at load (`experts_transposed`: Qwen3-VL-MoE's
    # hub files hold [E, in, out], transformers 5's save_pretrained writes [E, out, in], and
    # transformers reads both); ``transposed`` is what export writes.
    layer: tuple[str, ...] = ()


@dataclass(frozen=True)
class Transposed:
    """One 2-D tensor held transposed (Gemma 3's mm_input_projection_weight, [in, out] in the
    checkpoint, is an ordinary [out, in] linear weight here)."""

    hf: str


Recipe = Direct | Fuse | Slice | Rows | Experts | Transposed


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
                if isinstance(r, Transposed):
                    return Transposed(r.hf.format(i=i))
                if isinstance(r, Slice):
                    return Slice(r.hf, r.axis, int(i))
                if isinstance(r, Rows):
                    return Rows(r.hf.format(i=i), r.index, r.parts)
                if isinstance(r, Experts):
                    return Experts(r.hf.format(i=i), tuple(h.replace("{i}", str(i)) for h in r.parts), r.axis,
                                   r.transposed, tuple(h.format(i=i) for h in r.layer))
                return Fuse(tuple(h.format(i=i) for h in r.hf), r.axis)
        return None

    def load(self, names: list[str], read: Callable[[str], np.ndarray], source: str = "checkpoint",
             has: Callable[[str], bool] | None = None) -> dict[str, np.ndarray]:
        """Our parameters `names` assembled from checkpoint tensors (read(hf_name) -> array);
        `has(hf_name)` says whether the checkpoint holds a tensor (None: every name asked for)."""
        out = {}
        recipes = {name: self.recipe(name) for name in names}
        stash: dict[str, np.ndarray] = {}  # a layer's other expert tensor, read for its shape (Experts.layer)
        shapes: dict[str, tuple] = {}
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
            elif isinstance(r, Transposed):
                out[name] = np.ascontiguousarray(read(r.hf).T)
            elif isinstance(r, Slice):
                full = read(r.hf)
                n = n_slices[r.hf]
                if full.shape[r.axis] % n:
                    raise FileFormatError(f"{source}: {r.hf} {full.shape} does not split into {n} layers along "
                                          f"axis {r.axis}", hint="the weights and the config do not belong together")
                out[name] = np.ascontiguousarray(np.split(full, n, axis=r.axis)[r.index])
            elif isinstance(r, Rows):
                full = read(r.hf)
                if full.shape[0] % r.parts:
                    raise FileFormatError(f"{source}: {r.hf} {full.shape} does not split into {r.parts} equal row "
                                          "blocks", hint="the weights and the config do not belong together")
                out[name] = np.ascontiguousarray(np.split(full, r.parts, axis=0)[r.index])
            elif isinstance(r, Experts) and r.layer and (has is None or has(r.hf)):
                mine = stash.pop(r.hf) if r.hf in stash else read(r.hf)
                shapes[r.hf] = mine.shape
                for other in r.layer:
                    if other not in shapes:
                        stash[other] = read(other)
                        shapes[other] = stash[other].shape
                flip = experts_transposed(*(shapes[h] for h in r.layer), f"{source}: {r.hf}")
                out[name] = np.ascontiguousarray(np.swapaxes(mine, 1, 2)) if flip else mine
            elif isinstance(r, Experts):
                out[name] = _stack_experts(r, read, has, source)
            else:
                parts = [read(h) for h in r.hf]
                out[name] = np.concatenate(parts, axis=r.axis)
        return out

    def export(self, params: dict[str, np.ndarray], sizes: Callable[[str, Fuse], list[int]]) -> dict[str, np.ndarray]:
        """Checkpoint tensors from our parameters; `sizes` gives the split sizes of a fused one."""
        out = {}
        sliced: dict[str, dict[int, np.ndarray]] = {}
        blocks: dict[tuple[str, int], dict[int, np.ndarray]] = {}  # Rows: (hf, parts) -> index -> block
        for name, arr in params.items():
            r = self.recipe(name)
            if r is None:
                continue
            if isinstance(r, Experts) and r.transposed:
                out[r.hf] = np.ascontiguousarray(np.swapaxes(arr, 1, 2))
            elif isinstance(r, (Direct, Experts)):
                out[r.hf] = arr
            elif isinstance(r, Transposed):
                out[r.hf] = np.ascontiguousarray(arr.T)
            elif isinstance(r, Slice):
                sliced.setdefault(r.hf, {})[r.index] = (arr, r.axis)
            elif isinstance(r, Rows):
                blocks.setdefault((r.hf, r.parts), {})[r.index] = arr
            else:
                bounds = np.cumsum(sizes(name, r))[:-1]
                for h, part in zip(r.hf, np.split(arr, bounds, axis=r.axis)):
                    out[h] = part
        for hf, got in sliced.items():  # joined only when every layer's part is there
            if sorted(got) == list(range(len(got))):
                out[hf] = np.concatenate([got[k][0] for k in range(len(got))], axis=got[0][1])
        for (hf, parts), got in blocks.items():  # joined only when every block is there
            if sorted(got) == list(range(parts)):
                out[hf] = np.concatenate([got[k] for k in range(parts)], axis=0)
        return out


def experts_transposed(gate_up: tuple, down: tuple, where: str = "the checkpoint") -> bool:
    """Whether a layer's stacked experts are [E, in, out] (gate_up_proj [E, C, 2F], down_proj
    [E, F, C]) rather than [E, out, in] ([E, 2F, C], [E, C, F]), from their shapes: the hidden size
    C is gate_up's input and down's output, on axes 2 and 1 in the one layout, 1 and 2 in the other
    (both at once would need F = 2F), whatever C and F are."""
    if len(gate_up) != 3 or len(down) != 3:
        raise FileFormatError(f"{where}: stacked experts of shapes {tuple(gate_up)} and {tuple(down)} are not [E, ., .]",
                              hint="the weights and the config do not belong together")
    if gate_up[2] == down[1]:
        return False
    if gate_up[1] == down[2]:
        return True
    raise FileFormatError(f"{where}: stacked experts gate_up_proj {tuple(gate_up)} and down_proj {tuple(down)} share "
                          "no hidden size", hint="the weights and the config do not belong together")


def transposed_experts(table: NameTable) -> bool:
    """Whether the table's stacked expert tensors are [E, in, out] in the checkpoint (GPT-OSS)."""
    return any(isinstance(r, Experts) and r.transposed for r in table.entries.values())


def _stack_experts(r: Experts, read: Callable[[str], np.ndarray], has: Callable[[str], bool] | None,
                   source: str) -> np.ndarray:
    if has is None or has(r.hf):
        return np.ascontiguousarray(np.swapaxes(read(r.hf), 1, 2)) if r.transposed else read(r.hf)
    experts = []
    while all(has(p.format(e=len(experts))) for p in r.parts):
        e = len(experts)
        parts = [read(p.format(e=e)) for p in r.parts]
        experts.append(parts[0] if len(parts) == 1 else np.concatenate(parts, axis=r.axis))
    if not experts:
        raise FileFormatError(f"{source}: no tensor {r.hf} and no per-expert {r.parts[0].format(e=0)}",
                              hint="the checkpoint lacks this mixture-of-experts layer's expert weights")
    return np.stack(experts)
