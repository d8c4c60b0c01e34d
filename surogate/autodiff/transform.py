"""The ahead-of-time backward transform: walk the forward graph in reverse and add the
backward nodes, only for what needs a gradient."""

from __future__ import annotations

from surogate.autodiff.rules import RULES, RuleContext
from surogate.dsl.graph import Graph, Value
from surogate.errors import NotFoundError


def needs_grad(g: Graph) -> set[Value]:
    """Values on a path from a trainable parameter: integer tensors never need gradients, and
    frozen parameters (LoRA's base weights) start none, though gradients still flow through
    activations computed from them."""
    need: set[Value] = {v for v in g.params() if v.trainable}
    for n in g.nodes:
        if any(v is not None and v in need for v in n.inputs):
            for o in n.outputs:
                if o is not None and o.kind == "act" and not o.dtype.startswith("int"):
                    need.add(o)
    return need


def backward(g: Graph, loss: Value, seed_name: str = "dloss", extra: dict[str, Value] | None = None) -> dict[str, Value]:
    """Add backward nodes for d(sum(seed * loss))/d(params). The seed is a new graph input of
    loss's shape (the trainer fills it, e.g. with 1 / number of target tokens). ``extra``: more
    losses in the objective, seed name -> loss (a MoE model's aux_loss, seeded with its
    coefficient). Returns the gradient accumulator of every trainable parameter, by name."""
    forward_nodes = list(g.nodes)
    g.backward_start = len(forward_nodes)  # where compile may insert recomputation
    need = needs_grad(g)
    if loss not in need:
        raise ValueError(f"{loss.name} does not depend on any trainable parameter")
    ctx = RuleContext(g, need)
    partial: dict[Value, list[Value]] = {loss: [g.input(seed_name, loss.shape, loss.dtype)]}
    for name, v in (extra or {}).items():
        if v in need:
            partial.setdefault(v, []).append(g.input(name, v.shape, v.dtype))

    def total(v: Value | None) -> Value | None:
        parts = partial.get(v) if v is not None else None
        if not parts:
            return None
        acc = parts[0]
        for p in parts[1:]:
            (acc,) = g.node("add", [acc, p], [(v.name + ".grad_sum", v.shape, v.dtype)])
        return acc

    for n in reversed(forward_nodes):
        if not any(o is not None and o in partial for o in n.outputs):
            continue
        if not any(v is not None and v in need for v in n.inputs):
            continue
        rule = RULES.get(n.op)
        if rule is None:
            raise NotFoundError(f"no derivative rule for op '{n.op}' (node {n})",
                                hint="add one to surogate/autodiff/rules.py")
        grads = rule(ctx, n, [total(o) for o in n.outputs])
        for inp, gin in zip(n.inputs, grads):
            if gin is not None and inp is not None and inp.kind == "act":
                partial.setdefault(inp, []).append(gin)
    return {p.name: g.grad_buffer(p) for p in g.params() if p.trainable}
