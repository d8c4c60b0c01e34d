"""ZeRO-3 (``zero_level: 3``): the decoder layers' weights sharded among the data-parallel ranks,
each layer gathered into a staging buffer just before a Program reads it (the design:
data_parallel.py's header; the gathers: surogate/compile/gather.py).

`Zero3` is the run's split, the same on every rank: built from the first rank's training Program
as it is lowered (its decoder layers' parameters, in the order the Program first reads them; who
keeps each). A trained layer parameter's keeper is its ZeRO owner, the rank that steps it; the
trained layer weights, the trained weights outside the layers and the frozen layer weights (a
LoRA run's base) are each split on their own by `shard_owners` (whole tensors, largest first to
the least loaded rank), so each rank keeps about 1/R of the layers' bytes. `Zero3Rank` is one rank's
share: the two staging buffers, the gather pass for each of its Programs (training, evaluation,
reference), their bindings (the layer parameters to their bytes in a staging buffer, this rank's
pieces to their homes) and the communicator they gather through.
"""

from __future__ import annotations

import numpy as np

from surogate import _native
from surogate.compile.gather import HOME_NAME, LAYER, SLOT_NAME, SLOTS, ShardedLayer, gather_weights, pack
from surogate.compile.lower import Lowered
from surogate.dsl.graph import Graph
from surogate.errors import UnsupportedError
from surogate.model import _np_dtype
from surogate.train.data_parallel import shard_owners


class Zero3:
    """The split of the decoder layers' weights among ``world`` ranks (`plan` fills it once)."""

    def __init__(self, world: int):
        self.world = world
        self.layers: list[ShardedLayer] = []
        self.owner: dict[str, int] = {}  # every sharded parameter -> the rank that keeps it
        self.trained_owners: dict[str, int] = {}  # every trained parameter -> the rank that steps it

    @property
    def planned(self) -> bool:
        return bool(self.layers)

    def plan(self, g: Graph, lowered: Lowered) -> None:
        """The split, from the training Program ``g`` lowered (its gradient accumulators say what trains)."""
        first: dict[str, int] = {}  # layer parameter -> the first instruction reading it
        for at, ins in enumerate(lowered.instrs):
            for b in ins.inputs:
                name = b.root().name if b is not None else None
                if name is not None and name not in first and LAYER.match(name) and _is_param(g, name):
                    first[name] = at
        if not first:
            raise UnsupportedError(f"zero_level: 3: {g.name} reads no decoder layer weights (layers.N.*) to shard",
                                   hint="use zero_level: 2")
        grads = {v.name[len("grad."):]: int(np.prod(lowered.by_value[v.name].shape, dtype=np.int64))
                 for v in g.values.values()
                 if v.kind == "grad" and v.name in lowered.by_value and lowered.by_value[v.name].kind == "external"}
        # Three splits, each balanced on its own: the trained layer weights, the trained ones
        # outside the layers (whole on every rank, stepped by their owner), the frozen layer weights.
        self.trained_owners = shard_owners({n: k for n, k in grads.items() if n in first}, self.world)
        self.trained_owners.update(shard_owners({n: k for n, k in grads.items() if n not in first}, self.world))
        self.owner = {n: self.trained_owners[n] for n in first if n in grads}
        self.owner.update(shard_owners({n: _nbytes(lowered, n) for n in first if n not in grads}, self.world))
        by_layer: dict[int, list[str]] = {}
        for n in sorted(first, key=first.get):
            by_layer.setdefault(int(LAYER.match(n).group(1)), []).append(n)
        self.layers = [pack(i, [(n, lowered.by_value[n].shape, lowered.by_value[n].dtype, _nbytes(lowered, n),
                                 self.owner[n]) for n in names]) for i, names in sorted(by_layer.items())]

    @property
    def slot_bytes(self) -> int:
        return max(layer.nbytes for layer in self.layers)

    def pieces(self, rank: int) -> list[str]:
        """The sharded parameters rank ``rank`` keeps."""
        return [p.name for layer in self.layers for p in layer.pieces if p.owner == rank]

    def sharded(self, name: str) -> bool:
        return name in self.owner

    def rank(self, r: int) -> Zero3Rank:
        return Zero3Rank(self, r)


class Zero3Rank:
    """Rank ``rank``'s share of a `Zero3` split: its staging buffers and gathering Programs."""

    def __init__(self, zero3: Zero3, rank: int):
        self.zero3, self.rank = zero3, rank
        self.slots: list[np.ndarray] = []
        self.programs: list = []  # the Executables that gather (their communicator: `connect`)
        self.comm = None

    def rewrite(self, g: Graph, lowered: Lowered) -> None:
        """`Executable`'s pass: plan the split from the first Program (rank 0's training
        Program), then put this rank's gathers into every Program."""
        if not self.zero3.planned:
            self.zero3.plan(g, lowered)
        gather_weights(lowered, self.zero3.layers, self.rank, {v.name for v in g.params()})

    def owns(self, name: str) -> bool:
        return self.zero3.owner.get(name) == self.rank

    def keeps(self, name: str) -> bool:
        """Whether this rank holds ``name`` (a parameter not sharded, or one of its pieces)."""
        return not self.zero3.sharded(name) or self.owns(name)

    def _staging(self) -> list[np.ndarray]:
        if not self.slots:  # 64-byte aligned host memory, as the CPU allocator's
            n = min(SLOTS, len(self.zero3.layers))
            self.slots = [_native.host_empty([self.zero3.slot_bytes], "uint8").numpy() for _ in range(n)]
        return self.slots

    def bind(self, exe, homes: dict[str, np.ndarray]) -> None:
        """Bind a rewritten Program: the staging buffers, each layer parameter it reads to its
        bytes in its layer's buffer, and ``homes`` (this rank's pieces: the arrays it keeps) to
        the gathers' inputs."""
        slots = self._staging()
        for s, arr in enumerate(slots):
            exe.bind(SLOT_NAME.format(s), arr)
        by_value = exe.lowered.by_value
        for layer in self.zero3.layers:
            slot = slots[layer.slot]
            for p in layer.pieces:
                if p.name in by_value:
                    view = slot[p.offset:p.offset + p.nbytes].view(_np_dtype(p.dtype)).reshape(p.shape)
                    exe.bind(p.name, view)
                if p.owner == self.rank:
                    exe.bind(HOME_NAME.format(p.name), homes[p.name])
        self.programs.append(exe)
        if self.comm is not None:
            exe.program.set_communicator(self.comm)

    def connect(self, comm) -> None:
        """The rank's communicator into every gathering Program (and the ones bound later)."""
        self.comm = comm
        for exe in self.programs:
            exe.program.set_communicator(comm)

    def staging_bytes(self) -> int:
        return sum(a.nbytes for a in self.slots)

    def report(self, homes: dict[str, np.ndarray]) -> dict:
        """The start record's account of this rank's layer weights (the Program's memory report
        counts every parameter at its full size, the sharded ones being views of the staging buffers)."""
        return {"layers": len(self.zero3.layers), "layer_bytes": sum(layer.nbytes for layer in self.zero3.layers),
                "kept_bytes": int(sum(a.nbytes for a in homes.values())), "staging_bytes": self.staging_bytes()}


def _is_param(g: Graph, name: str) -> bool:
    v = g.values.get(name)
    return v is not None and v.kind == "param"


def _nbytes(lowered: Lowered, name: str) -> int:
    return lowered.by_value[name].nbytes
