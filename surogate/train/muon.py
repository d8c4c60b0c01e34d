"""Muon and NorMuon (``optimizer: muon | normuon``) for the 2-D matrices, AdamW for the rest,
in the training Program's one ``optimizer`` phase.

Which parameters are matrices: the projection weights that only ``linear`` nodes read (attention,
MLP, conv projections) and, under LoRA, every adapter A and B (each a 2-D matrix of a hidden
layer; neither the original Surogate's docs nor Unsloth, which ships no Muon, say otherwise, and
Muon's argument - orthogonalize the update of a hidden linear map - holds for each factor). The
embedding, the LM head (tied or not), norms, biases and MoE routers and stacked experts go to
AdamW with the adamw_* keys, as the NorMuon paper and the original Surogate do.

Per matrix W [R, C] the step is three parts (kernels_native/cpu/muon.cpp has the math):
``muon_momentum`` (clip, momentum, Nesterov for Muon, Frobenius-normalize, transposed when
R > C), ``ns_steps`` Newton-Schulz iterations as the Program's matmuls
(A = X X^T, B = b A + c A A, X = a X + B X, Muon's quintic coefficients by default), and
``muon_update`` (NorMuon: the per-neuron second moment v [R], row normalization and the
0.2 sqrt(RC) / ||.||_F RMS match; Muon: the sqrt(max(1, R/C)) factor; then cautious or plain
decoupled weight decay and the step). The state is m [R, C] f32 (and v [R] f32 for NorMuon),
checkpointed beside AdamW's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from surogate.compile import Executable
from surogate.dsl.graph import Graph, Value
from surogate.train.optimizer import AdamW, AdamWParams


@dataclass
class MuonParams:
    normuon: bool = True
    lr_scale: float = 1.0  # the matrices' lr over AdamW's (muon_learning_rate / learning_rate)
    momentum: float = 0.95
    beta2: float = 0.95
    eps: float = 1e-8
    cautious_wd: bool = True
    nesterov: bool = False  # Muon's Nesterov momentum; NorMuon's algorithm uses m itself
    ns_steps: int = 5
    ns_coefficients: tuple[float, float, float] = field(default=(3.4445, -4.7750, 2.0315))


def muon_params(cfg) -> MuonParams:
    """The config's normuon_* / muon_* keys."""
    lr = cfg.muon_learning_rate if cfg.muon_learning_rate is not None else cfg.learning_rate
    return MuonParams(normuon=cfg.optimizer == "normuon", lr_scale=lr / cfg.learning_rate,
                      momentum=cfg.normuon_momentum, beta2=cfg.normuon_beta2, eps=cfg.normuon_epsilon,
                      cautious_wd=cfg.normuon_cautious_wd, nesterov=cfg.muon_nesterov, ns_steps=cfg.muon_ns_steps,
                      ns_coefficients=tuple(cfg.muon_ns_coefficients))


def fused_parts(name_table, name: str) -> int:
    """How many checkpoint projections the weight ``name`` fuses along its rows (1: none)."""
    from surogate.models.name_table import Fuse

    r = name_table.recipe(name) if name_table is not None else None
    return len(r.hf) if isinstance(r, Fuse) and r.axis == 0 else 1


def matrix_params(g: Graph, names: list[str]) -> list[str]:
    """Of the trainable ``names``, those Muon updates (the module header says which)."""
    routers = {n.inputs[0].name for n in g.nodes if n.op.startswith("moe_router")}
    linear_w: set[str] = set()
    elsewhere: set[str] = set()
    for n in g.nodes:
        if n.op == "linear":  # a router is a linear too; it stays with AdamW
            (elsewhere if n.outputs[0].name in routers else linear_w).add(n.inputs[1].name)
        elif n.op != "linear_bwd":
            elsewhere.update(v.name for v in n.inputs if v is not None)
    out = []
    for name in names:
        v = g.values[name]
        if len(v.shape) != 2:
            continue
        if v.meta.get("lora") or (name in linear_w and name not in elsewhere):
            out.append(name)
    return out


class Muon(AdamW):
    def __init__(self, exe: Executable, params: dict[str, np.ndarray], hp: AdamWParams, mp: MuonParams,
                 name_table=None, owned=None, norm_input: bool = False, homes: dict | None = None):
        """name_table: the family's (surogate/models/name_table.py); a weight it fuses from several
        checkpoint projections along the rows (gate_up_proj) is that many Muon matrices. owned,
        norm_input, homes: AdamW's (ZeRO: this rank steps the matrices it owns)."""
        self.mp = mp
        names = sorted(n[len("grad."):] for n in exe.external_names("grad"))
        self.matrices = matrix_params(exe.graph, [n for n in names if owned is None or n in owned])
        self.parts = {n: fused_parts(name_table, n) for n in self.matrices}
        self.muon_hp = np.zeros(8, np.float32)
        super().__init__(exe, params, hp, bits=32, owned=owned, norm_input=norm_input, homes=homes)

    def _init_matrix_state(self, params: dict[str, np.ndarray]) -> None:
        for n in self.matrices:  # m stays (the momentum, f32 [R, C]); v is per row, or none
            if self.mp.normuon:
                self.v[n] = np.zeros(params[n].shape[0], np.float32)
            else:
                del self.v[n]

    def _adam_names(self) -> list[str]:
        mats = set(self.matrices)
        return [n for n in self.names if n not in mats]

    def _buffers(self):
        yield from super()._buffers()
        if self.matrices:  # (ZeRO: a rank may own none)
            yield "optimizer.muon_hp", self.muon_hp

    def _matrix_nodes(self, g: Graph, norm: Value, grads: dict[str, Value], state: dict[str, Value]) -> None:
        hp = state.get("optimizer.muon_hp")
        for n, k_parts in ((n, self.parts[n]) for n in self.matrices):
            for part in range(k_parts):
                self._ns_nodes(g, n, part, k_parts, hp, norm, grads, state)

    def _ns_nodes(self, g, n, part, k_parts, hp, norm, grads, state) -> None:
        """One Muon matrix: rows [row0, row0 + R) of parameter n."""
        mp = self.mp
        a, b, c = (float(x) for x in mp.ns_coefficients)
        rows_all, C = g.values[n].shape
        R = rows_all // k_parts
        rows = dict(row0=part * R, rows=R)
        t = R > C
        P, Q = (C, R) if t else (R, C)  # X is [P, Q] with P <= Q: the Gram matrix X X^T is [P, P]
        pre = f"optimizer.ns.{n}.{part}"
        (x,) = g.node("muon_momentum", [hp, norm, grads[n], state[f"optimizer.m.{n}"]],
                      [(f"{pre}.x0", (P, Q), "float32")], nesterov=bool(mp.nesterov and not mp.normuon),
                      transpose=t, **rows)
        for k in range(mp.ns_steps):
            (A,) = g.node("matmul", [x, x], [(f"{pre}.A{k}", (P, P), "float32")], trans_b=1)
            (AA,) = g.node("matmul", [A, A], [(f"{pre}.AA{k}", (P, P), "float32")])
            (B,) = g.node("add", [A, AA], [(f"{pre}.B{k}", (P, P), "float32")], alpha=b, beta=c)
            (BX,) = g.node("matmul", [B, x], [(f"{pre}.BX{k}", (P, Q), "float32")])
            (x,) = g.node("add", [x, BX], [(f"{pre}.x{k + 1}", (P, Q), "float32")], alpha=a, beta=1.0)
        g.node("muon_update", [hp, x, g.values[n], state.get(f"optimizer.master.{n}"),
                               state.get(f"optimizer.v.{n}")], [],
               transpose=t, cautious=bool(mp.cautious_wd), scale=math.sqrt(max(1.0, R / C)), **rows)

    def apply(self, lr: float) -> float:
        mp, h = self.mp, self.hp
        self.muon_hp[:] = [lr * mp.lr_scale, mp.momentum, mp.beta2, mp.eps, h.weight_decay, self.step + 1,
                           h.max_grad_norm, 0.0]
        if self.matrices:
            self.prog.push("optimizer.muon_hp")
        return super().apply(lr)
