"""AdamW appended to a training Program: the optimizer step runs natively after the backward
pass, over the same external buffers (parameters and gradient accumulators).

The optimizer owns its state as numpy arrays (first and second moments, f32 master weights
for parameters stored in bf16), so a checkpoint saves and restores them directly. The
hyper-parameters live in a small f32 buffer the trainer rewrites each step (the schedule
changes lr without rebuilding the Program). On a GPU each of these arrays has a device twin the
Program updates; `sync_to_host` / `load_state` move them across for checkpoints.

`AdamW(..., bits=8)` (`AdamW8bit`, `optimizer: adamw_8bit`) keeps the moments as uint8 codes in
blocks of 256 elements with one f32 scale per block (the native `adamw8` op; its header in
kernels_native/cpu/optimizer.cpp documents the code): ~2 bytes per parameter for m and v
together plus 8 bytes per 256 parameters, instead of 8.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from surogate.compile import Executable
from surogate.errors import ConfigError

QBLOCK = 256  # elements per quantization block of the 8-bit states


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

    def __init__(self, exe: Executable, params: dict[str, np.ndarray], hp: AdamWParams, bits: int = 32):
        if bits not in (8, 32):
            raise ValueError(f"AdamW bits must be 8 or 32, got {bits}")
        self.exe, self.hp, self.bits = exe, hp, bits
        self.names = sorted(n[len("grad."):] for n in exe.external_names("grad"))
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
        self.hp_buf = np.zeros(8, np.float32)
        self.norm = np.zeros(1, np.float32)
        self.step = 0
        self.on_device = exe.device != "cpu"
        self._twins: list[tuple[np.ndarray, object]] = []  # (host array, what the program reads)
        p = exe.program
        self.begin = p.num_instrs
        hp_id = p.external("optimizer.hp", [8], "float32")
        norm_id = p.external("optimizer.grad_norm", [1], "float32")
        self._hp_t = self._bind(hp_id, self.hp_buf)
        self._norm_t = self._bind(norm_id, self.norm)
        grad_ids = [exe.buf("grad." + n).native_id for n in self.names]
        p.op("global_norm", grad_ids, [norm_id])
        inputs = [hp_id, norm_id]
        nd = []
        for i, n in enumerate(self.names):
            ids = []
            for kind, arr in (("m", self.m[n]), ("v", self.v[n]), ("master", self.master.get(n)),
                              ("m_scale", self.m_scale.get(n)), ("v_scale", self.v_scale.get(n))):
                if arr is None:
                    ids.append(-1)
                    continue
                bid = p.external(f"optimizer.{kind}.{n}", list(arr.shape), str(arr.dtype))
                self._twins.append((arr, self._bind(bid, arr)))
                ids.append(bid)
            m_id, v_id, master_id, ms_id, vs_id = ids
            inputs += [exe.buf(n).native_id, master_id, exe.buf("grad." + n).native_id]
            inputs += [m_id, v_id] if bits == 32 else [m_id, ms_id, v_id, vs_id]
            if no_decay(n):
                nd.append(i)
        p.op("adamw" if bits == 32 else "adamw8", inputs, [], {"no_decay": nd})
        # Zero the gradient accumulators for the next step's micro-batches.
        for gid in grad_ids:
            p.op("fill", [], [gid], {"value": 0.0})
        self.end = p.num_instrs

    def _bind(self, native_id: int, arr: np.ndarray):
        t = self.exe.place(arr)
        self.exe.program.bind(native_id, t)
        return t

    def apply(self, lr: float) -> float:
        """One optimizer step at learning rate lr; returns the gradient norm before clipping."""
        self.step += 1
        h = self.hp
        self.hp_buf[:] = [lr, h.beta1, h.beta2, h.eps, h.weight_decay, self.step, h.max_grad_norm, 0.0]
        if self.on_device:
            self._hp_t.copy_from(self.hp_buf)
        self.exe.program.run(self.begin, self.end)
        if self.on_device:
            self.norm[:] = self._norm_t.to("cpu").numpy()
        return float(self.norm[0])

    def sync_to_host(self) -> None:
        """Bring the device's moments and master weights into the host arrays (no-op on the CPU)."""
        if self.on_device:
            for arr, t in self._twins:
                arr[...] = t.to("cpu").numpy().reshape(arr.shape)

    # ---- checkpoint state -------------------------------------------------------------------
    def _arrays(self):
        for n in self.names:
            yield f"m/{n}", self.m[n]
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
        if self.on_device:
            for arr, t in self._twins:
                t.copy_from(arr)

    def state_nbytes(self) -> int:
        """Bytes of moment state (m, v and their scales; master weights not counted)."""
        return sum(a.nbytes for k, a in self._arrays() if not k.startswith("master/"))


def AdamW8bit(exe: Executable, params: dict[str, np.ndarray], hp: AdamWParams) -> AdamW:
    """AdamW with blockwise 8-bit moments (`optimizer: adamw_8bit`)."""
    return AdamW(exe, params, hp, bits=8)
