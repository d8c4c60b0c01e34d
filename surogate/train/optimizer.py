"""AdamW appended to a training Program: the optimizer step runs natively after the backward
pass, over the same external buffers (parameters and gradient accumulators).

The optimizer owns its state as numpy arrays (first and second moments, f32 master weights
for parameters stored in bf16), so a checkpoint saves and restores them directly. The
hyper-parameters live in a small f32 buffer the trainer rewrites each step (the schedule
changes lr without rebuilding the Program).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from surogate.compile import Executable


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
    def __init__(self, exe: Executable, params: dict[str, np.ndarray], hp: AdamWParams):
        self.exe, self.hp = exe, hp
        self.names = sorted(n[len("grad."):] for n in exe.external_names("grad"))
        self.m = {n: np.zeros(params[n].shape, np.float32) for n in self.names}
        self.v = {n: np.zeros(params[n].shape, np.float32) for n in self.names}
        # f32 master copies of parameters stored in a narrower dtype.
        self.master = {n: params[n].astype(np.float32) for n in self.names if params[n].dtype != np.float32}
        self.hp_buf = np.zeros(8, np.float32)
        self.norm = np.zeros(1, np.float32)
        self.step = 0
        p = exe.program
        self.begin = p.num_instrs
        hp_id = p.external("optimizer.hp", [8], "float32")
        norm_id = p.external("optimizer.grad_norm", [1], "float32")
        p.bind(hp_id, self.hp_buf)
        p.bind(norm_id, self.norm)
        grad_ids = [exe.buf("grad." + n).native_id for n in self.names]
        p.op("global_norm", grad_ids, [norm_id])
        inputs = [hp_id, norm_id]
        nd = []
        for i, n in enumerate(self.names):
            ids = []
            for kind, arr in (("m", self.m[n]), ("v", self.v[n]), ("master", self.master.get(n))):
                if arr is None:
                    ids.append(-1)
                    continue
                bid = p.external(f"optimizer.{kind}.{n}", list(arr.shape), str(arr.dtype))
                p.bind(bid, arr)
                ids.append(bid)
            m_id, v_id, master_id = ids
            inputs += [exe.buf(n).native_id, master_id, exe.buf("grad." + n).native_id, m_id, v_id]
            if no_decay(n):
                nd.append(i)
        p.op("adamw", inputs, [], {"no_decay": nd})
        # Zero the gradient accumulators for the next step's micro-batches.
        for gid in grad_ids:
            p.op("fill", [], [gid], {"value": 0.0})
        self.end = p.num_instrs

    def apply(self, lr: float) -> float:
        """One optimizer step at learning rate lr; returns the gradient norm before clipping."""
        self.step += 1
        h = self.hp
        self.hp_buf[:] = [lr, h.beta1, h.beta2, h.eps, h.weight_decay, self.step, h.max_grad_norm, 0.0]
        self.exe.program.run(self.begin, self.end)
        return float(self.norm[0])

    # ---- checkpoint state -------------------------------------------------------------------
    def state(self) -> dict[str, np.ndarray]:
        out = {"step": np.array([self.step], np.int64)}
        for n in self.names:
            out[f"m/{n}"] = self.m[n]
            out[f"v/{n}"] = self.v[n]
            if n in self.master:
                out[f"master/{n}"] = self.master[n]
        return out

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        self.step = int(state["step"][0])
        for n in self.names:
            self.m[n][...] = state[f"m/{n}"]
            self.v[n][...] = state[f"v/{n}"]
            if n in self.master:
                self.master[n][...] = state[f"master/{n}"]
