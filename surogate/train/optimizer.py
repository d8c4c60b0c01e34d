"""AdamW as the training Program's `optimizer` phase: the step is a small graph (global grad
norm, the multi-tensor `adamw` / `adamw8` op, zeroing the gradient accumulators) that the
compiler lowers after the backward pass, over the same buffers (parameters and gradient
accumulators, found by name).

The optimizer owns its state as numpy arrays (first and second moments, f32 master weights
for parameters stored in bf16), bound as the phase's external buffers, so a checkpoint saves
and restores them directly. The hyper-parameters live in a small f32 buffer rewritten each
step (the schedule changes lr without rebuilding the Program). On a GPU each of these arrays
has a device twin the Program updates (the executable's bound tensors); `sync_to_host` /
`load_state` move them across for checkpoints.

`AdamW(..., bits=8)` (`AdamW8bit`, `optimizer: adamw_8bit`) keeps the moments as uint8 codes in
blocks of 256 elements with one f32 scale per block (the native `adamw8` op; its header in
kernels_native/cpu/optimizer.cpp documents the code): ~2 bytes per parameter for m and v
together plus 8 bytes per 256 parameters, instead of 8.

Data parallel with ZeRO (`data_parallel.py`): ``owned`` names the parameters this rank steps;
its state (moments, masters) exists for those only, while the norm and the zeroing still cover
every gradient. ``norm_input`` (ZeRO-2, where a rank holds only its own reduced gradients):
the step reads the global norm from a bound buffer the caller fills (`set_norm`) instead of
computing it, and a phase of its own (`partial_norm`) gives the norm over the owned gradients.
``homes`` (ZeRO-3, which shards the weights too): the step is a Program of its own over the
arrays this rank keeps its parameters in, not a phase of the training Program (`_place_own`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from surogate.compile import Executable
from surogate.dsl.graph import Graph, Value
from surogate.errors import ConfigError

QBLOCK = 256  # elements per quantization block of the 8-bit states
PHASE = "optimizer"  # the training Program's phase that runs one step
NORM = "optimizer.grad_norm"  # the phase's result: the gradient norm before clipping
PART_PHASE, PART_NORM = "optimizer_norm", "optimizer.grad_norm_part"  # norm_input: the owned gradients' norm


@dataclass
class AdamWParams:
    lr: float = 2e-4
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0


def no_decay(name: str) -> bool:
    """Norm weights and biases get no weight decay (the common convention, as in HF Trainer)."""
    return name.endswith(".bias") or "norm" in name


class AdamW:
    """bits=32: f32 moments (op `adamw`); bits=8: blockwise 8-bit moments (op `adamw8`)."""

    def __init__(self, exe: Executable, params: dict[str, np.ndarray], hp: AdamWParams, bits: int = 32,
                 owned=None, norm_input: bool = False, homes: dict | None = None):
        if bits not in (8, 32):
            raise ValueError(f"AdamW bits must be 8 or 32, got {bits}")
        self.exe, self.hp, self.bits = exe, hp, bits
        self.homes = homes  # ZeRO-3: the arrays the stepped parameters live in (`_place_own`)
        self.all_names = sorted(n[len("grad."):] for n in exe.external_names("grad"))  # norm and zeroing
        self.names = [n for n in self.all_names if owned is None or n in owned]  # stepped here
        self.norm_input = norm_input
        self.norm_buf = np.zeros(1, np.float32)
        if bits == 32:
            self.m = {n: np.zeros(params[n].shape, np.float32) for n in self.names}
            self.v = {n: np.zeros(params[n].shape, np.float32) for n in self.names}
            self.m_scale, self.v_scale = {}, {}
        else:  # codes and scales all 0: the zero state
            self.m = {n: np.zeros(params[n].size, np.uint8) for n in self.names}
            self.v = {n: np.zeros(params[n].size, np.uint8) for n in self.names}
            nb = {n: -(-params[n].size // QBLOCK) for n in self.names}
            self.m_scale = {n: np.zeros(nb[n], np.float32) for n in self.names}
            self.v_scale = {n: np.zeros(nb[n], np.float32) for n in self.names}
        # f32 master copies of parameters stored in a narrower dtype.
        self.master = {n: params[n].astype(np.float32) for n in self.names if params[n].dtype != np.float32}
        self._init_matrix_state(params)
        self.hp_buf = np.zeros(8, np.float32)
        self.step = 0
        self.prog = self._place(*self._graph())  # the Program that runs the step (HostAdamW: its own)

    def _place(self, g: Graph, norm: Value) -> Executable:
        """Compile the step as the training Program's `optimizer` phase and bind its state."""
        if self.homes is not None:
            return self._place_own(g, norm)
        exe = self.exe
        if self.norm_input:
            part_graph, part = self._part_graph()
            exe.add_phase(PART_PHASE, part_graph, keep=[part])
        exe.add_phase(PHASE, g, keep=[norm])
        if self.norm_input:
            exe.bind(NORM, self.norm_buf)
        self._hp_used = "optimizer.hp" in exe.lowered.by_value  # not when every parameter is a Muon matrix
        for key, arr in ((("optimizer.hp", self.hp_buf),) if self._hp_used else ()) + tuple(self._buffers()):
            exe.bind(key, arr)
            assert exe.bound(key) is arr  # pull / push move data through these very arrays
        return exe

    def _place_own(self, g: Graph, norm: Value) -> Executable:
        """ZeRO-3: the step as a Program of its own, over the arrays that keep this rank's
        parameters (``homes``; the training Program reads the sharded ones from staging buffers,
        under the same names) and the training Program's gradient accumulators."""
        exe = self.exe
        own = Executable(g, {}, exe.device, keep=[norm])
        own.lowered.phases = {PHASE: own.lowered.phases["forward"]}  # the whole Program is the step
        if self.norm_input:
            part_graph, part = self._part_graph()
            own.add_phase(PART_PHASE, part_graph, keep=[part])
            own.bind(NORM, self.norm_buf)
        for n in self.names:
            own.bind(n, self.homes[n])
        for n in self.all_names:
            own.bind("grad." + n, exe.bound("grad." + n), exe.tensor("grad." + n))
        self._hp_used = "optimizer.hp" in own.lowered.by_value
        for key, arr in ((("optimizer.hp", self.hp_buf),) if self._hp_used else ()) + tuple(self._buffers()):
            own.bind(key, arr)
        return own

    # Hooks for an optimizer that takes some parameters off AdamW (surogate/train/muon.py).
    def _init_matrix_state(self, params: dict[str, np.ndarray]) -> None:
        pass

    def _adam_names(self) -> list[str]:
        return self.names

    def _matrix_nodes(self, g: Graph, norm: Value, grads: dict[str, Value], state: dict[str, Value]) -> None:
        pass

    def _buffers(self):
        """(buffer name, host array) of every state array the phase reads and updates."""
        for n in self.names:
            for kind, arrays in (("m", self.m), ("v", self.v), ("master", self.master), ("m_scale", self.m_scale),
                                 ("v_scale", self.v_scale)):
                if n in arrays:
                    yield f"optimizer.{kind}.{n}", arrays[n]

    def _graph(self) -> tuple[Graph, Value]:
        """The step as graph nodes over the training graph's values (by name): one global norm,
        one multi-tensor update (params and masters, m and v in place), then the accumulators
        zeroed for the next step's micro-batches."""
        exe = self.exe
        g = Graph(f"{exe.graph.name}.{PHASE}")
        hp = g.input("optimizer.hp", (8,), "float32")
        grads = self._grad_values(g, self.all_names)
        if self.norm_input:
            norm = g.input(NORM, (1,), "float32")
        else:
            (norm,) = g.node("global_norm", [grads[n] for n in self.all_names], [(NORM, (1,), "float32")])
        state = {key: g.input(key, arr.shape, str(arr.dtype)) for key, arr in self._buffers()}
        inputs, nd = [hp, norm], []
        for i, n in enumerate(self._adam_names()):
            kinds = ("m", "v") if self.bits == 32 else ("m", "m_scale", "v", "v_scale")
            inputs += [g.values[n], state.get(f"optimizer.master.{n}"), grads[n]]
            inputs += [state[f"optimizer.{k}.{n}"] for k in kinds]
            if no_decay(n):
                nd.append(i)
        if len(inputs) > 2:
            g.node("adamw" if self.bits == 32 else "adamw8", inputs, [], no_decay=nd)
        self._matrix_nodes(g, norm, grads, state)
        for n in self.all_names:
            g.node("fill", [], [grads[n]], value=0.0)
        return g, norm

    def _grad_values(self, g: Graph, names: list[str]) -> dict[str, Value]:
        """The gradient accumulators of ``names`` as values of phase graph g (by the buffers' names)."""
        grads = {}
        for n in names:
            b, gb = self.exe.buf(n), self.exe.buf("grad." + n)
            grads[n] = g.grad_buffer(g.param(n, b.shape, b.dtype), gb.dtype)
        return grads

    def _part_graph(self) -> tuple[Graph, Value]:
        """norm_input: the phase that gives the norm over the owned gradients."""
        g = Graph(f"{self.exe.graph.name}.{PART_PHASE}")
        grads = self._grad_values(g, self.names)
        (part,) = g.node("global_norm", [grads[n] for n in self.names], [(PART_NORM, (1,), "float32")])
        return g, part

    def partial_norm(self) -> float:
        """norm_input: the norm over this rank's owned gradients (the global norm's share)."""
        self.prog.run(PART_PHASE)
        return float(self.prog.read(PART_NORM)[0])

    def set_norm(self, norm: float) -> None:
        """norm_input: the global gradient norm the next `apply` clips with."""
        self.norm_buf[0] = norm
        self.prog.push(NORM)

    def apply(self, lr: float) -> float:
        """One optimizer step at learning rate lr; returns the gradient norm before clipping."""
        self.step += 1
        h = self.hp
        self.hp_buf[:] = [lr, h.beta1, h.beta2, h.eps, h.weight_decay, self.step, h.max_grad_norm, 0.0]
        if self._hp_used:
            self.prog.push("optimizer.hp")
        self.prog.run(PHASE)
        return float(self.prog.read(NORM)[0])

    def sync_to_host(self) -> None:
        """Bring the device's moments and master weights into the host arrays (no-op on the CPU)."""
        for key, _ in self._buffers():
            self.prog.pull(key)

    # ---- checkpoint state -------------------------------------------------------------------
    def _arrays(self):
        for n in self.names:
            yield f"m/{n}", self.m[n]
            if n in self.v:  # (Muon keeps no second moment)
                yield f"v/{n}", self.v[n]
            if n in self.m_scale:
                yield f"m_scale/{n}", self.m_scale[n]
                yield f"v_scale/{n}", self.v_scale[n]
            if n in self.master:
                yield f"master/{n}", self.master[n]

    def state(self) -> dict[str, np.ndarray]:
        self.sync_to_host()
        out = {"step": np.array([self.step], np.int64)}
        out.update(self._arrays())
        return out

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        arrays = list(self._arrays())
        for key, arr in arrays:  # check everything before changing anything
            got = state.get(key)
            if got is None or got.dtype != arr.dtype or got.size != arr.size:
                what = "missing" if got is None else f"{got.dtype}[{got.size}]"
                raise ConfigError(f"optimizer state {key} is {what}, expected {arr.dtype}[{arr.size}]: the "
                                  f"checkpoint was written by another optimizer setup",
                                  where="optimizer", hint="resume with the optimizer the checkpoint was written with")
        self.step = int(state["step"][0])
        for key, arr in arrays:
            arr[...] = state[key].reshape(arr.shape)
        for key, _ in self._buffers():
            self.prog.push(key)

    def state_nbytes(self) -> int:
        """Bytes of moment state (m, v and their scales; master weights not counted)."""
        return sum(a.nbytes for k, a in self._arrays() if not k.startswith("master/"))


def AdamW8bit(exe: Executable, params: dict[str, np.ndarray], hp: AdamWParams) -> AdamW:
    """AdamW with blockwise 8-bit moments (`optimizer: adamw_8bit`)."""
    return AdamW(exe, params, hp, bits=8)
