"""A compiled graph bound to memory: the native Program plus the names to reach its buffers.

`Executable` is what the rest of the product runs: bind parameters and gradient accumulators
(caller-owned numpy arrays, shared without copies), feed step inputs, run, read results.

On a GPU the Program reads device tensors: `bind` uploads a host array once (or takes a device
tensor another executable already holds, so weights and inputs exist once on the device),
`push` copies a host array's new contents up, `pull` brings a device buffer back into its host
array (checkpoints, outputs). On the CPU the host array is the buffer and both are no-ops.

The Program's instructions are named phases (`phases`): ``forward``, ``backward`` for a graph
with gradients, and any phase added with `add_phase` (the trainer's optimizer step). Callers
run phases by name (`run("forward", "backward")`), never by instruction index; on a GPU with
graphs on, each distinct run is one CUDA graph.

Buffers the Program derives from its weights (`Lowered.derived`: fp8_hybrid's frozen weights
quantized once) are the executable's own business: it allocates them (or takes them from a
`DerivedStore` the executables of one model share), and runs their phase before a run whenever
a source weight was bound or pushed, by it or by any executable of the store, since it last did.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from surogate import _native
from surogate.compile.buffers import Buf
from surogate.compile.fp8 import WEIGHTS_PHASE
from surogate.compile.lower import Lowered, emit, lower, lower_phase, to_program
from surogate.dsl.graph import Graph, Value
from surogate.errors import InvalidArgumentError, NotFoundError


@dataclass
class MemoryReport:
    """Bytes the program needs, by kind. Optimizer state is the trainer's (reported there)."""

    weights: int
    gradients: int
    inputs: int
    activations: int  # the arena (planned, with reuse)
    activations_unplanned: int  # what the same buffers would take without reuse

    def total(self) -> int:
        return self.weights + self.gradients + self.inputs + self.activations

    def __str__(self) -> str:
        mib = 1 << 20
        return (f"weights {self.weights / mib:.1f} MiB, gradients {self.gradients / mib:.1f} MiB, "
                f"inputs {self.inputs / mib:.2f} MiB, activations {self.activations / mib:.1f} MiB "
                f"(unplanned {self.activations_unplanned / mib:.1f} MiB)")


class DerivedStore:
    """What executables over the same weights derive from them: the tensors by name, the names
    of their sources, and a version that every bind or push of a source moves (through any of
    the executables), so that each re-derives after a shared weight changed."""

    def __init__(self) -> None:
        self.tensors: dict[str, object] = {}
        self.sources: set[str] = set()
        self.version = 0

    def clear(self) -> None:
        self.tensors.clear()
        self.version += 1


class Executable:
    def __init__(self, g: Graph, dims: dict[str, int], device: str = "cpu", keep: list[Value] = (),
                 recompute: bool = False, mlp_chunk: int = 0, rewrite=None, derived: DerivedStore | None = None):
        """``rewrite(g, lowered)``: a pass over the lowered instructions before the native
        Program is built from them (ZeRO-3's weight gathers, surogate/compile/gather.py).
        ``derived``: the store of derived buffers shared with other executables over the same
        weights (None: one of its own)."""
        self.graph = g
        self.device = device
        self.lowered: Lowered = lower(g, dims, keep, recompute, mlp_chunk)
        if rewrite is not None:
            rewrite(g, self.lowered)
        self.program = to_program(self.lowered, device)
        self._bound: dict[str, object] = {}  # name -> the host array (or the tensor) the caller bound
        self._tensors: dict[str, object] = {}  # name -> what the program reads (the host array on the CPU)
        self._phase_graphs: dict[str, tuple] = {}  # added phases: name -> the structure they were built from
        self._ran = False  # the native Program places its arena on the first run
        self._derived = DerivedStore() if derived is None else derived
        self._derives = bool(self.lowered.derived)
        self._derived.sources |= set(self.lowered.derived.values())
        self._derived_at = -1  # the store's version this executable's derived buffers were made at

    # ---- phases -----------------------------------------------------------------------------
    @property
    def phases(self) -> dict[str, tuple[int, int]]:
        """Phase name -> its instructions [begin, end), in program order."""
        return dict(self.lowered.phases)

    def add_phase(self, name: str, g: Graph, keep: list[Value] = ()) -> None:
        """Compile graph g into this Program as the phase `name`, after every instruction it has
        (see `lower_phase`); `keep` values stay readable after it runs. Adding the same phase
        again (an executable cached by the model, a second optimizer over it) changes nothing:
        the new owner binds its own arrays to the phase's buffers. Add phases before the first
        run: the Program places its arena then."""
        sig = _structure(g)
        if name in self._phase_graphs:
            if self._phase_graphs[name] != sig:
                raise InvalidArgumentError(f"{self.graph.name} already has a phase {name!r} built differently",
                                           hint="build a new executable for another setup of this phase")
            return
        if self._ran:
            raise InvalidArgumentError(f"phase {name!r}: {self.graph.name} has already run, its memory is placed",
                                       hint="add phases before the first run, or build a new executable")
        nbufs, ninstrs = lower_phase(self.lowered, name, g, keep)
        emit(self.program, self.lowered.bufs[nbufs:], self.lowered.instrs[ninstrs:])
        self._phase_graphs[name] = sig

    def _range(self, phases: tuple[str, ...]) -> tuple[int, int]:
        known = self.lowered.phases
        for p in phases:
            if p not in known:
                raise NotFoundError(f"{self.graph.name} has no phase {p!r}", hint=f"phases: {', '.join(known)}")
        for a, b in zip(phases, phases[1:]):
            if known[a][1] != known[b][0]:
                raise InvalidArgumentError(f"phases {a!r} and {b!r} are not adjacent in the program",
                                           hint=f"run consecutive phases, in program order: {', '.join(known)}")
        return known[phases[0]][0], known[phases[-1]][1]

    # ---- buffers ----------------------------------------------------------------------------
    def buf(self, name: str) -> Buf:
        b = self.lowered.by_value.get(name)
        if b is None:
            raise NotFoundError(f"no buffer named {name!r} in {self.graph.name}",
                                hint="names are those of the graph's values, e.g. 'input_ids' or a parameter name")
        return b

    def external_names(self, kind: str | None = None) -> list[str]:
        """Names of external buffers; kind filters by graph value kind (param, input, grad)."""
        out = []
        for name, b in self.lowered.by_value.items():
            if b.kind != "external":
                continue
            v = self.graph.values.get(name)
            if kind is None or (v is not None and v.kind == kind):
                out.append(name)
        return out

    def place(self, array):
        """What a Program on this executable's device reads for a host array: the array itself on
        the CPU, a device copy of it otherwise. Tensors pass through."""
        if self.device == "cpu" or not isinstance(array, np.ndarray):
            return array
        return _native.tensor(np.ascontiguousarray(array)).to(self.device)

    def bind(self, name: str, array, device_tensor=None) -> None:
        """Bind a host array (uploaded once on a GPU), or a host array together with the device
        tensor that already mirrors it (shared with another executable)."""
        b = self.buf(name)
        if b.kind != "external":
            raise InvalidArgumentError(f"{name} is computed by the program and cannot be bound")
        arr = array
        if isinstance(array, np.ndarray):
            if tuple(array.shape) != b.shape:
                raise InvalidArgumentError(f"{name}: expected shape {b.shape}, got {tuple(array.shape)}")
            if str(array.dtype) != b.dtype:
                raise InvalidArgumentError(f"{name}: expected dtype {b.dtype}, got {array.dtype}")
            arr = np.ascontiguousarray(array)
        tensor = device_tensor if device_tensor is not None else self.place(arr)
        self.program.bind(b.native_id, tensor)
        self._bound[name] = arr  # the native side holds a reference too; this one is for readers
        self._tensors[name] = tensor
        self._touch(name)

    def bound(self, name: str):
        return self._bound[name]

    def tensor(self, name: str):
        """What the program reads for a bound name (pass it to another executable's bind)."""
        return self._tensors[name]

    def push(self, name: str) -> None:
        """Copy the host array bound as ``name`` to its device tensor (after changing it in place)."""
        if self.device != "cpu":
            self._tensors[name].copy_from(self._bound[name])
        self._touch(name)

    def _touch(self, name: str) -> None:
        if name in self._derived.sources:  # (a weight something is derived from: every sharer re-derives)
            self._derived.version += 1

    def pull(self, name: str) -> np.ndarray:
        """The host array bound as ``name``, refreshed from the device."""
        host = self._bound[name]
        if self.device != "cpu":
            host[...] = self._tensors[name].to("cpu").numpy().reshape(host.shape)
        return host

    def use_graphs(self, on: bool = True) -> None:
        """On a GPU: replay each run range as one CUDA graph from its third run on (the first runs
        eagerly, the second is captured). Inputs must then change only in place (push), never by
        binding new tensors (that drops the graphs). A no-op on the CPU."""
        if self.device != "cpu":
            self.program.set_graphs(on)

    def run(self, *phases: str) -> None:
        """Run the named consecutive phases as one range (each distinct range is one CUDA graph),
        or the whole program."""
        if WEIGHTS_PHASE in phases:
            raise InvalidArgumentError(f"phase {WEIGHTS_PHASE!r} is run by the executable itself",
                                       hint="bind or push the weights: the copies follow")
        if self._derives and self._derived_at != self._derived.version:
            self._derive()
        begin, end = self._range(phases) if phases else (self.lowered.phases.get(WEIGHTS_PHASE, (0, 0))[1], -1)
        self._ran = True
        self.program.run(begin, end)

    def _derive(self) -> None:
        """Bind every derived buffer (the store's tensor, or a new one put there) and run their phase."""
        store = self._derived
        for name in self.lowered.derived:
            b = self.lowered.by_value[name]
            t = store.tensors.get(name)
            if t is None or tuple(t.shape) != b.shape or t.dtype != b.dtype:
                t = store.tensors[name] = _native.zeros(list(b.shape), b.dtype, self.device)
            if self._tensors.get(name) is not t:
                self.program.bind(b.native_id, t)
                self._tensors[name] = t
        begin, end = self.lowered.phases[WEIGHTS_PHASE]
        self._ran = True
        self.program.run(begin, end)
        self._derived_at = store.version

    def read(self, name: str) -> np.ndarray:
        """A buffer's contents as numpy: a view on the CPU (valid until the next run), a copy from a GPU."""
        t = self.program.get(self.buf(name).native_id)
        return t.numpy() if self.device == "cpu" else t.to("cpu").numpy()

    # ---- reports ----------------------------------------------------------------------------
    def memory(self) -> MemoryReport:
        sizes = {"param": 0, "grad": 0, "input": 0}
        internal = 0
        for name, b in self.lowered.by_value.items():
            v = self.graph.values.get(name)
            if b.kind == "external" and v is not None:
                sizes[v.kind] = sizes.get(v.kind, 0) + b.nbytes
        for b in self.lowered.bufs:
            if b.kind == "internal":
                internal += b.nbytes
        return MemoryReport(sizes["param"], sizes["grad"], sizes["input"], self.lowered.arena_bytes, internal)

    def listing(self) -> str:
        starts = {begin: name for name, (begin, end) in self.lowered.phases.items() if end > begin}
        lines = []
        for i in range(self.program.num_instrs):
            if i in starts:
                lines.append(f"# {starts[i]}")
            lines.append(f"{i:4d}  {self.program.instr(i)}")
        return "\n".join(lines)


def _structure(g: Graph) -> tuple:
    """What a phase graph compiles to: its ops, attributes and values (name, shape, dtype)."""
    def val(v: Value | None):
        return None if v is None else (v.name, tuple(str(d) for d in v.shape), v.dtype, v.kind)

    return tuple((n.op, tuple(map(val, n.inputs)), tuple(map(val, n.outputs)), repr(sorted(n.attrs.items())))
                 for n in g.nodes)
