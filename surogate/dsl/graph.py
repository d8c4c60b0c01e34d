"""The symbolic graph: tensors with shapes, nodes with ops. Building a graph computes nothing.

A `Graph` is an ordered list of `Node`s (topological by construction: a node only consumes
values that exist). Each `Value` has a shape made of ints and symbolic `Dim`s (the token count
`N` of a step, bound when the graph is compiled), a dtype name and a kind:

- ``param``: a weight the model owns (trainable or frozen),
- ``input``: fed per step (token ids, positions, targets, cu_seqlens, the loss seed),
- ``act``: produced by a node.

Shape letters used throughout the DSL: N tokens of a packed step, C model width, H heads,
D head dim, F MLP width, V vocabulary, R LoRA rank.

Passes rewrite a built graph (surogate/compile/fuse.py) with `readers`, `pop_nodes`, `forget` and
`rewrite`: the nodes stay topological and no value is left that no node touches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Dim:
    """A symbolic dimension, bound to an int at compile time; ``times`` a fixed multiple of it
    (the N * top_k rows a mixture-of-experts layer sends to its experts)."""

    name: str
    times: int = 1

    def __mul__(self, k: int) -> Dim:
        return Dim(self.name, self.times * int(k))

    def __repr__(self) -> str:
        return self.name if self.times == 1 else f"{self.name}*{self.times}"


Shape = tuple[int | Dim, ...]


def bind_shape(shape: Shape, dims: dict[str, int]) -> tuple[int, ...]:
    out = []
    for d in shape:
        if isinstance(d, Dim):
            if d.name not in dims:
                raise KeyError(f"symbolic dimension {d.name} is not bound (bound: {sorted(dims)})")
            out.append(dims[d.name] * d.times)
        else:
            out.append(int(d))
    return tuple(out)


@dataclass(eq=False)
class Value:
    graph: Graph
    name: str
    shape: Shape
    dtype: str
    kind: str  # "param" | "input" | "act" | "grad"
    producer: Node | None = None
    trainable: bool = False  # params only: gets a gradient
    meta: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"{self.name}: {self.dtype}{list(self.shape)}"


@dataclass(eq=False)
class Node:
    op: str
    inputs: list[Value | None]
    outputs: list[Value | None]
    attrs: dict[str, Any]

    def __repr__(self) -> str:
        ins = ", ".join(v.name if v is not None else "-" for v in self.inputs)
        outs = ", ".join(v.name if v is not None else "-" for v in self.outputs)
        return f"{self.op}({ins}) -> ({outs}) {self.attrs or ''}"


class Graph:
    def __init__(self, name: str = "graph"):
        self.name = name
        self.nodes: list[Node] = []
        self.values: dict[str, Value] = {}
        self.outputs: dict[str, Value] = {}
        self._scope: list[str] = []
        # Projection weights kept as GGML blocks (full parameter name -> ggml type id): they are
        # uint8 [rows, bytes per row] parameters that `linear` multiplies with gguf_matmul.
        self.quant: dict[str, int] = {}
        # Serving graphs: the KV cache descriptor they were built over (surogate.dsl.nn.KVCache),
        # which also carries the serving options the fusion pass reads; None otherwise.
        self.kv: Any = None
        # Mixture-of-experts layers: each router's (probs, idx), in layer order, for the
        # load-balancing loss (surogate.dsl.nn.MoE appends them).
        self.moe_routers: list[tuple[Value, Value]] = []
        self.moe_logits: list[Value] = []  # each MoE layer's router logits [N, E] (the z-loss)
        self.moe_offsets: list[Value] = []  # each MoE layer's expert row offsets [E + 1] (expert load)

    # ---- naming ---------------------------------------------------------------------------
    def scoped(self, name: str) -> str:
        return ".".join([*self._scope, name]) if self._scope else name

    def unique(self, name: str) -> str:
        if name not in self.values:
            return name
        i = 1
        while f"{name}#{i}" in self.values:
            i += 1
        return f"{name}#{i}"

    class _Scope:
        def __init__(self, g: Graph, name: str):
            self.g, self.name = g, name

        def __enter__(self):
            self.g._scope.append(self.name)

        def __exit__(self, *exc):
            self.g._scope.pop()

    def scope(self, name: str) -> Graph._Scope:
        return Graph._Scope(self, name)

    # ---- values ---------------------------------------------------------------------------
    def _add_value(self, name: str, shape: Shape, dtype: str, kind: str, **kw) -> Value:
        v = Value(self, self.unique(name), tuple(shape), dtype, kind, **kw)
        self.values[v.name] = v
        return v

    def param(self, name: str, shape: Shape, dtype: str, trainable: bool = True, **meta) -> Value:
        full = self.scoped(name)
        if full in self.values:
            raise ValueError(f"parameter {full} declared twice")
        return self._add_value(full, shape, dtype, "param", trainable=trainable, meta=dict(meta))

    def input(self, name: str, shape: Shape, dtype: str) -> Value:
        return self._add_value(name, shape, dtype, "input")

    def grad_buffer(self, param: Value, dtype: str = "float32") -> Value:
        """The gradient accumulator of a parameter: written (accumulated) by every backward node
        that touches the parameter, zeroed by the trainer between optimizer steps."""
        name = "grad." + param.name
        if name in self.values:
            return self.values[name]
        return self._add_value(name, param.shape, dtype, "grad", meta={"param": param.name})

    def node(self, op: str, inputs: list[Value | None], out_specs: list[tuple[str, Shape, str] | Value | None],
             **attrs) -> list[Value | None]:
        """Add a node. Each output spec is (name, shape, dtype) for a new value, None for an absent
        optional output, or an existing Value the node writes into (a gradient accumulator)."""
        for v in inputs:
            if v is not None and v.graph is not self:
                raise ValueError(f"{op}: input {v.name} belongs to another graph")
        n = Node(op, list(inputs), [], attrs)
        for spec in out_specs:
            if spec is None or isinstance(spec, Value):
                n.outputs.append(spec)
                continue
            name, shape, dtype = spec
            n.outputs.append(self._add_value(self.scoped(name), shape, dtype, "act", producer=n))
        self.nodes.append(n)
        return n.outputs

    def mark_output(self, key: str, v: Value) -> None:
        self.outputs[key] = v

    # ---- rewriting (passes) -----------------------------------------------------------------
    def readers(self) -> dict[Value, list[Node]]:
        """Each value -> the nodes that read it, in graph order (a node reading it twice, twice)."""
        out: dict[Value, list[Node]] = {}
        for n in self.nodes:
            for v in n.inputs:
                if v is not None:
                    out.setdefault(v, []).append(n)
        return out

    def pop_nodes(self, start: int) -> list[Node]:
        """The nodes added since the graph had `start` nodes, taken off its end: a pass makes a
        node with its op's function (surogate.dsl.ops, which checks its shapes) to `rewrite`
        others with."""
        made = self.nodes[start:]
        del self.nodes[start:]
        return made

    def forget(self, *values: Value) -> None:
        """Drop values from the name table, so that a node made now may take their names (a pass's
        fused node, for the values of the nodes it replaces: `rewrite` redirects their readers)."""
        for v in values:
            if v is not None and self.values.get(v.name) is v:
                del self.values[v.name]

    def rewrite(self, edits: list[tuple[list[Node], list[Node]]], redirects: dict[Value, Value]) -> None:
        """A pass's edits, all at once (one walk of the nodes): each (old, new) puts `new`, in
        order, where the first of `old` stands and drops the rest of `old`; every reader of a
        key of `redirects` (a new node too, and the graph outputs) then reads its value; the
        values the old nodes touched that no node touches now and that are no output are
        forgotten. The caller makes sure each new node's inputs are made before its place."""
        pos = {n: i for i, n in enumerate(self.nodes)}
        at: dict[Node, list[Node]] = {}
        gone: set[Node] = set()
        for old, new in edits:
            gone.update(old)
            at[min(old, key=pos.__getitem__)] = new
        nodes: list[Node] = []
        for n in self.nodes:
            if n in at:
                nodes += at[n]
            elif n not in gone:
                nodes.append(n)
        for n in nodes:
            if any(v in redirects for v in n.inputs if v is not None):
                n.inputs = [redirects.get(v, v) if v is not None else None for v in n.inputs]
        self.outputs = {k: redirects.get(v, v) for k, v in self.outputs.items()}
        self.nodes = nodes
        touched = {v for n in nodes for v in (*n.inputs, *n.outputs) if v is not None}
        touched |= set(self.outputs.values())
        self.forget(*(v for n in gone for v in (*n.inputs, *n.outputs)
                      if v is not None and v not in touched and v.kind in ("act", "param")))

    # ---- queries --------------------------------------------------------------------------
    def params(self) -> list[Value]:
        return [v for v in self.values.values() if v.kind == "param"]

    def inputs(self) -> list[Value]:
        return [v for v in self.values.values() if v.kind == "input"]

    def __repr__(self) -> str:
        lines = [f"Graph {self.name}: {len(self.nodes)} nodes"]
        lines += [f"  {n}" for n in self.nodes]
        return "\n".join(lines)
