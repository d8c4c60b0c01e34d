"""Tiled MLP (the original Surogate's ``long_context``): a dense MLP run over row chunks, forward
and backward, so that its [N, 2F] and [N, F] intermediates exist for one chunk at a time.

The pattern is found in the graph, not asked of the builder, so every family whose MLP is a
gated linear pair gets it: a ``linear`` (gate_up, x -> gu) whose output only a ``swiglu_fwd`` /
``geglu_fwd`` reads (gu -> a), whose output only a ``linear`` (down, a -> y) reads. Those ops
are row-wise (row n of y depends on row n of x only), so the region can be lowered chunk by
chunk over row views of x and y. A mixture-of-experts layer (grouped GEMMs over permuted rows)
does not match and runs whole, as in the original.

Forward, per chunk of rows [r0, r1): gu_c = x_c W1^T (+ LoRA), a_c = act(gu_c), y_c = a_c W2^T
(+ LoRA), into y's rows; gu_c and a_c are temporaries that die with the chunk, so nothing of the
interior is saved for the backward pass (the LoRA intermediates t = x A^T, [N, rank], are).

Backward, at the down projection's ``linear_bwd``, per chunk: recompute gu_c and a_c from x_c
(the gate_up forward again), then the down backward (da_c, dW2 += dy_c^T a_c), the activation's
backward (dgu_c) and the gate_up backward (dx_c into dx's rows, dW1 += dgu_c^T x_c). Weight
gradients accumulate over chunks (beta = 1, as they already accumulate over micro-batches), so
they equal the whole-N ones up to the order of the sum; the forward and dx are the same numbers.

The lowering (surogate/compile/lower.py) calls `find_mlps` and then emits each region through
its ordinary node lowering with the region's values mapped to chunk buffers (`_Lowering.rows`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from surogate.compile.buffers import Buf
from surogate.dsl.graph import Graph, Node, Value, bind_shape

ACTS = {"swiglu_fwd": "swiglu_bwd", "geglu_fwd": "geglu_bwd"}


@dataclass(eq=False)
class TiledMLP:
    gate_up: Node  # linear: x -> gu (+ LoRA intermediates)
    act: Node  # gu -> a
    down: Node  # linear: a -> y (+ LoRA intermediates)
    backward: list[Node]  # down's linear_bwd, then the act's backward, then gate_up's linear_bwd (a prefix)

    @property
    def x(self) -> Value:
        return self.gate_up.inputs[0]

    @property
    def interior(self) -> tuple[Value, Value]:
        """(gu, a): the values that only ever exist one chunk at a time."""
        return self.gate_up.outputs[0], self.act.outputs[0]


def find_mlps(g: Graph) -> list[TiledMLP]:
    """The graph's tileable MLP regions, in forward order."""
    start = getattr(g, "backward_start", len(g.nodes))
    fwd_readers: dict[Value, list[Node]] = {}
    bwd_readers: dict[Value, list[Node]] = {}
    for i, n in enumerate(g.nodes):
        for v in n.inputs:
            if v is not None:
                (fwd_readers if i < start else bwd_readers).setdefault(v, []).append(n)
    index = {n: i for i, n in enumerate(g.nodes)}
    kept = set(g.outputs.values())
    out = []
    for act in g.nodes[:start]:
        if act.op not in ACTS:
            continue
        (gu,), (a,) = act.inputs, act.outputs
        l1, l2 = gu.producer, fwd_readers.get(a, [])
        if l1 is None or l1.op != "linear" or l1.outputs[0] is not gu or fwd_readers.get(gu) != [act]:
            continue
        if len(l2) != 1 or l2[0].op != "linear" or l2[0].inputs[0] is not a or gu in kept or a in kept:
            continue
        (l2,) = l2
        bwd = _backward_nodes(g, l1, act, l2, bwd_readers, index)
        if bwd is None:
            continue
        out.append(TiledMLP(l1, act, l2, bwd))
    return out


def _backward_nodes(g: Graph, l1: Node, act: Node, l2: Node, readers: dict[Value, list[Node]],
                    index: dict[Node, int]) -> list[Node] | None:
    """The region's backward nodes, consecutive in the graph and chained (down's linear_bwd,
    the act's backward, gate_up's linear_bwd, as many as exist); None when the backward pass
    reads gu or a anywhere else (the region then runs whole)."""
    gu, a = l1.outputs[0], act.outputs[0]
    touching = set(readers.get(gu, [])) | set(readers.get(a, []))
    if not touching:
        return []  # a forward-only graph, or no gradient flows through this MLP
    b2 = [n for n in readers.get(a, []) if n.op == "linear_bwd" and n.inputs[1] is a and n.inputs[2] is l2.inputs[1]]
    if len(b2) != 1:
        return None
    chain = [b2[0]]
    da = b2[0].outputs[0]
    if da is not None:
        bact = [n for n in readers.get(da, []) if n.op == ACTS[act.op] and n.inputs[1] is gu]
        if len(bact) != 1:
            return None
        chain.append(bact[0])
        b1 = [n for n in readers.get(bact[0].outputs[0], [])
              if n.op == "linear_bwd" and n.inputs[1] is l1.inputs[0] and n.inputs[2] is l1.inputs[1]]
        if len(b1) != 1:
            return None
        chain.append(b1[0])
    at = [index[n] for n in chain]
    if at != list(range(at[0], at[0] + len(at))) or touching - set(chain):
        return None
    return chain


# ---- lowering -------------------------------------------------------------------------------
def row_view(lw, b: Buf, r0: int, r1: int) -> Buf:
    """Rows [r0, r1) of a 2-D buffer, as a view (of its base's rows when b is a column view)."""
    shape = (r1 - r0, *b.shape[1:])
    name = f"{b.name}[{r0}:{r1}]"
    if b.kind == "view" and b.strides is not None:
        return lw.new_buf(Buf(name, shape, b.dtype, "view", base=b.base, offset=b.offset + r0 * b.strides[0],
                              strides=b.strides))
    return lw.new_buf(Buf(name, shape, b.dtype, "view", base=b, offset=r0 * int(np.prod(b.shape[1:]))))


def _chunks(lw, n_rows: int):
    c = lw.chunk
    for r0 in range(0, n_rows, c):
        yield r0, min(n_rows, r0 + c)


def _lower_chunk(lw, nodes: list[Node], whole: dict[Value, Buf], interior: list[Value], r0: int, r1: int) -> None:
    """Lower `nodes` over rows [r0, r1): the `whole` values through row views of their buffers,
    the `interior` ones into fresh chunk temporaries."""
    lw.rows_map = {v.name: row_view(lw, b, r0, r1) for v, b in whole.items()}
    for v in interior:
        shape = (r1 - r0, *bind_shape(v.shape, lw.dims)[1:])
        lw.rows_map[v.name] = lw.temp(f"{v.name}[{r0}:{r1}]", shape, v.dtype)
    lw.row0 = r0
    try:
        for n in nodes:
            lw.node(n)
    finally:
        lw.rows_map, lw.row0 = {}, 0


def _row_values(n: Node) -> list[Value]:
    """A region node's per-row activations (inputs and outputs): everything but weights, biases,
    LoRA A/B, gradient accumulators and the dropout seed."""
    out = []
    for v in [*n.inputs, *n.outputs]:
        if v is not None and v.kind == "act" and v not in out:
            out.append(v)
    return out


def lower_forward(lw, r: TiledMLP) -> None:
    nodes = [r.gate_up, r.act, r.down]
    interior = list(r.interior)
    whole = {v: lw.buf(v) for n in nodes for v in _row_values(n) if v not in interior}
    n_rows = lw.buf(r.x).shape[0]
    for r0, r1 in _chunks(lw, n_rows):
        _lower_chunk(lw, nodes, whole, interior, r0, r1)


def lower_backward(lw, r: TiledMLP) -> None:
    """The region's backward nodes per chunk, each chunk after recomputing its gu and a."""
    nodes = [r.gate_up, r.act, *r.backward]
    gu, a = r.interior
    interior = [gu, a] + [n.outputs[0] for n in r.backward[:-1]]  # da, dgu: chunk-local gradients
    interior = [v for v in interior if v is not None]
    whole = {}
    for n in nodes:
        for v in _row_values(n):
            if v not in interior and v not in whole:
                whole[v] = lw.buf(v)
    n_rows = lw.buf(r.x).shape[0]
    for r0, r1 in _chunks(lw, n_rows):
        _lower_chunk(lw, nodes, whole, interior, r0, r1)
