"""Serving fusions: rewrite a serving graph's op pairs into the fused ops its kernels have.

The builder (surogate/dsl/nn.py) emits one plain graph for every use. A serving Program is
compiled from it after `fuse_serving`, which rewrites, in this order (each step makes the
pattern the next one looks for):

1. fused QKV, when the graph's KV cache asks for it (``KVCache.fuse_qkv``): a block's q, k and
   v projections reading one x, with weights that are not GGML blocks, become one linear over
   ``<prefix>.qkv_proj.weight`` (rows q, k, v: the serving runner binds that stack) and three
   ``columns`` views of its output in place of the three ``view``s; the projections' LoRA
   slices move onto the fused output's columns.
2. norm -> matmul: an ``rmsnorm_fwd`` / ``add_rmsnorm_fwd`` whose normed rows feed exactly one
   plain linear (the fused qkv, gate_up) becomes ``add_rmsnorm_matmul``.
3. activation -> matmul: a ``swiglu_fwd`` / ``geglu_fwd`` whose output feeds exactly one plain
   linear (down_proj) becomes ``gated_matmul``.

A plain linear has no LoRA slice and no dropout, and its weight is a parameter in a float dtype
(not GGML blocks): a fusion never crosses a slice or a block weight. A linear whose result is a
graph output (the head's logits) is left alone, as serving Programs have always had it. Every
fused node takes the place of the op that fed the matmul and keeps the names of the values it
replaces, so a fused graph reads as the same graph. An op the pass does not know, and any
pattern it does not match in full, is left as it is.

Training and logits graphs never come here (the pass refuses a graph built without a KV
cache): autodiff refuses the fused ops, and those graphs' numbers must not move.
"""

from __future__ import annotations

import math

from surogate.dsl.graph import Graph, Node, Value
from surogate.errors import InvalidArgumentError

QKV = ("q_proj", "k_proj", "v_proj")
GATED = {"swiglu_fwd": "silu", "geglu_fwd": "gelu_tanh"}  # op -> gated_matmul's act
NORMS = ("rmsnorm_fwd", "add_rmsnorm_fwd")


def fuse_serving(g: Graph) -> Graph:
    """Apply the serving fusions to `g` in place (and return it)."""
    if g.kv is None:
        raise InvalidArgumentError(f"{g.name}: the serving fusions apply to serving graphs only",
                                   hint="build it with CausalLM.build(mode='serve', kv=KVCache(...)); training and "
                                        "logits graphs are compiled unfused")
    if getattr(g.kv, "fuse_qkv", False):
        fuse_qkv(g)
    fuse_norm_matmul(g)
    fuse_gated_matmul(g)
    return g


def plain_linear(g: Graph, n: Node) -> bool:
    """A linear a fusion may take over: no LoRA slice, no dropout, a float weight parameter, a
    result that is not a graph output."""
    if n.op != "linear" or n.attrs.get("lora") or n.attrs.get("dropout", 0.0) > 0:
        return False
    w = n.inputs[1]
    if w.kind != "param" or w.dtype == "uint8" or "ggml_type" in w.meta:
        return False
    if n.inputs[2] is not None and n.inputs[2].kind != "param":
        return False
    return not any(v is n.outputs[0] for v in g.outputs.values())


def _only_reader(readers: dict[Value, list[Node]], v: Value) -> Node | None:
    nodes = readers.get(v, [])
    return nodes[0] if len(nodes) == 1 else None


# ---- 1. q, k and v as one matmul ------------------------------------------------------------
def fuse_qkv(g: Graph) -> None:
    readers = g.readers()
    groups: dict[tuple[Value, str], dict[str, Node]] = {}  # (x, prefix) -> part -> its linear
    for n in g.nodes:
        if n.op != "linear":
            continue
        w = n.inputs[1]
        for part in QKV:
            suffix = f".{part}.weight"
            if w.name.endswith(suffix):
                groups.setdefault((n.inputs[0], w.name[:-len(suffix)]), {})[part] = n
    for (x, prefix), parts in groups.items():
        if len(parts) == len(QKV):
            _fuse_group(g, readers, x, prefix, [parts[p] for p in QKV])


def _fuse_group(g: Graph, readers: dict[Value, list[Node]], x: Value, prefix: str, lins: list[Node]) -> None:
    """One block's q, k, v linears (each read by one view to [N, H, D] and nothing else) ->
    `prefix`.qkv_proj and columns views; anything else is left alone."""
    views = [_only_reader(readers, n.outputs[0]) for n in lins]
    if any(v is None or v.op != "view" for v in views):
        return
    ws = [n.inputs[1] for n in lins]
    biases = [n.inputs[2] for n in lins]
    if any(n.attrs.get("dropout", 0.0) > 0 or len(n.outputs) != 1 + len(n.attrs["lora"]) for n in lins):
        return
    if any(w.kind != "param" or w.dtype == "uint8" or "ggml_type" in w.meta for w in ws):
        return  # a GGML-block weight: the three stay apart
    if len({(w.dtype, w.shape[1], w.trainable) for w in ws}) != 1:
        return
    if not (all(b is None for b in biases) or all(b is not None and b.kind == "param" for b in biases)):
        return
    rows = [w.shape[0] for w in ws]
    for view, size in zip(views, rows):  # columns see rows of x, each row's part as the view's trailing dims
        shape = view.outputs[0].shape
        if shape[0] != x.shape[0] or math.prod(shape[1:]) != size or view.outputs[0] in g.outputs.values():
            return
    W = g.param(f"{prefix}.qkv_proj.weight", (sum(rows), ws[0].shape[1]), ws[0].dtype, trainable=ws[0].trainable)
    b = None
    if biases[0] is not None:
        b = g.param(f"{prefix}.qkv_proj.bias", (sum(rows),), biases[0].dtype, trainable=biases[0].trainable)
    name = f"{prefix}.qkv_proj"
    ins: list[Value | None] = [x, W, b]
    outs: list = [(name, (x.shape[0], sum(rows)), lins[0].outputs[0].dtype)]
    slices = []
    offset = 0
    for n, size in zip(lins, rows):
        for i, s in enumerate(n.attrs["lora"]):  # the slice's columns, shifted to its part's rows
            ins += n.inputs[3 + 2 * i:5 + 2 * i]
            t = n.outputs[1 + i]
            outs.append((f"{name}.lora_{s['name']}.t", t.shape, t.dtype))
            slices.append({**s, "offset": s["offset"] + offset})
        offset += size
    fused = g.new_node("linear", ins, outs, lora=slices)
    y = fused.outputs[0]
    cols = []
    offset = 0
    for part, view, size in zip(QKV, views, rows):
        old = view.outputs[0]
        col = g.new_node("columns", [y], [(f"{prefix}.{part[0]}", old.shape, old.dtype)], offset=offset)
        g.redirect(old, col.outputs[0])
        cols.append(col)
        offset += size
    g.replace([*lins, *views], [fused, *cols])


# ---- 2. norm -> matmul ----------------------------------------------------------------------
def fuse_norm_matmul(g: Graph) -> None:
    readers = g.readers()
    for n in list(g.nodes):
        if n.op not in NORMS:
            continue
        y, *h, rstd = n.outputs
        lin = _only_reader(readers, y)
        if lin is None or not plain_linear(g, lin) or lin.inputs[0] is not y or readers.get(rstd):
            continue
        if y in g.outputs.values() or rstd in g.outputs.values():
            continue
        x, residual, w = (n.inputs[0], None, n.inputs[1]) if n.op == "rmsnorm_fwd" else n.inputs
        fused = g.new_node("add_rmsnorm_matmul", [x, residual, w, lin.inputs[1], lin.inputs[2]],
                           [lin.outputs[0], h[0] if h else None], **n.attrs)
        g.replace([n, lin], [fused])


# ---- 3. activation -> matmul ----------------------------------------------------------------
def fuse_gated_matmul(g: Graph) -> None:
    readers = g.readers()
    for n in list(g.nodes):
        if n.op not in GATED:
            continue
        (a,) = n.outputs
        lin = _only_reader(readers, a)
        if lin is None or not plain_linear(g, lin) or lin.inputs[0] is not a or a in g.outputs.values():
            continue
        fused = g.new_node("gated_matmul", [n.inputs[0], lin.inputs[1], lin.inputs[2]], [lin.outputs[0]],
                           act=GATED[n.op])
        g.replace([n, lin], [fused])
