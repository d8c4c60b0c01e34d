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
fused node is made by its op's function in surogate.dsl.ops (its shape checks, its attrs), takes
the place of the op that fed the matmul and keeps the names of the values it replaces, so a
fused graph reads as the same graph. An op the pass does not know, and any pattern it does not
match in full, is left as it is.

Training and logits graphs never come here (the pass refuses a graph built without a KV
cache): autodiff refuses the fused ops, and those graphs' numbers must not move.
"""

from __future__ import annotations

import math

from surogate.dsl import ops
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
    if g.kv.fuse_qkv:
        fuse_qkv(g)
    fuse_norm_matmul(g)
    fuse_gated_matmul(g)
    return g


def plain_weights(n: Node) -> bool:
    """A linear's weight (and bias) are parameters in a float dtype, not GGML blocks, and no
    dropout reads its input."""
    w, b = n.inputs[1], n.inputs[2]
    return (w.kind == "param" and w.dtype != "uint8" and "ggml_type" not in w.meta
            and (b is None or b.kind == "param") and n.attrs.get("dropout", 0.0) == 0)


def plain_linear(g: Graph, n: Node) -> bool:
    """A linear a fusion may take over: plain weights, no LoRA slice, a result that is not a
    graph output."""
    return (n.op == "linear" and plain_weights(n) and not n.attrs.get("lora")
            and not any(v is n.outputs[0] for v in g.outputs.values()))


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
    edits, redirects = [], {}
    for (x, prefix), parts in groups.items():
        if len(parts) == len(QKV):
            _fuse_group(g, readers, x, prefix, [parts[p] for p in QKV], edits, redirects)
    g.rewrite(edits, redirects)


def _fuse_group(g: Graph, readers: dict[Value, list[Node]], x: Value, prefix: str, lins: list[Node],
                edits: list, redirects: dict) -> None:
    """One block's q, k, v linears (each read by one view to [N, H, D] and nothing else) ->
    `prefix`.qkv_proj and columns views; anything else is left alone."""
    views = [_only_reader(readers, n.outputs[0]) for n in lins]
    if any(v is None or v.op != "view" for v in views):
        return
    if any(r.op != "qkv_rope_cache" for v in views for r in readers.get(v.outputs[0], [])):
        return  # only qkv_rope_cache reads column slices (Gemma 4's value norm reads v whole)
    if not all(plain_weights(n) and len(n.outputs) == 1 + len(n.attrs["lora"]) for n in lins):
        return  # a GGML-block weight: the three stay apart
    ws = [n.inputs[1] for n in lins]
    biases = [n.inputs[2] for n in lins]
    if len({(w.dtype, w.shape[1], w.trainable) for w in ws}) != 1 or len({b is None for b in biases}) != 1:
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
    slices = []
    offset = 0
    for n, size in zip(lins, rows):
        for i, s in enumerate(n.attrs["lora"]):  # the slice's columns, shifted to its part's rows
            A, B = n.inputs[3 + 2 * i:5 + 2 * i]
            slices.append(ops.LoRASlice(s["name"], A, B, s["scale"], s["offset"] + offset, s["size"]))
        offset += size
    start = len(g.nodes)
    y = ops.linear(x, W, b, slices, name=f"{prefix}.qkv_proj")
    offset = 0
    for part, view, size in zip(QKV, views, rows):
        redirects[view.outputs[0]] = ops.columns(y, offset, view.outputs[0].shape, name=f"{prefix}.{part[0]}")
        offset += size
    edits.append(([*lins, *views], g.pop_nodes(start)))


# ---- 2. norm -> matmul ----------------------------------------------------------------------
def fuse_norm_matmul(g: Graph) -> None:
    readers = g.readers()
    edits, redirects = [], {}
    for n in g.nodes:
        if n.op not in NORMS:
            continue
        y, *h, rstd = n.outputs
        lin = _only_reader(readers, y)
        if lin is None or not plain_linear(g, lin) or lin.inputs[0] is not y or readers.get(rstd):
            continue
        if y in g.outputs.values() or rstd in g.outputs.values():
            continue
        x, residual, w = (n.inputs[0], None, n.inputs[1]) if n.op == "rmsnorm_fwd" else n.inputs
        out, res = lin.outputs[0], h[0] if h else None
        g.forget(y, rstd, out, res)  # the fused node's values take these names
        start = len(g.nodes)
        redirects[out], res2 = ops.add_rmsnorm_matmul(x, residual, w, lin.inputs[1], lin.inputs[2], n.attrs["eps"],
                                                      out.name, norm_name=y.name,
                                                      weight_offset=n.attrs["weight_offset"])
        if res is not None:
            redirects[res] = res2
        edits.append(([n, lin], g.pop_nodes(start)))
    g.rewrite(edits, redirects)


# ---- 3. activation -> matmul ----------------------------------------------------------------
def fuse_gated_matmul(g: Graph) -> None:
    readers = g.readers()
    edits, redirects = [], {}
    for n in g.nodes:
        if n.op not in GATED:
            continue
        (a,) = n.outputs
        lin = _only_reader(readers, a)
        if lin is None or not plain_linear(g, lin) or lin.inputs[0] is not a or a in g.outputs.values():
            continue
        out = lin.outputs[0]
        g.forget(a, out)
        start = len(g.nodes)
        redirects[out] = ops.gated_matmul(n.inputs[0], lin.inputs[1], lin.inputs[2], GATED[n.op], out.name)
        edits.append(([n, lin], g.pop_nodes(start)))
    g.rewrite(edits, redirects)
