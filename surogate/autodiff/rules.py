"""One derivative rule per forward op, in one table.

A rule gets the forward node and the gradients of its outputs (None where an output received
none) and adds backward nodes to the graph; it returns the gradients of the node's inputs
(None where not needed). Parameter gradients are not returned: rules write them into the
parameter's accumulator (`Graph.grad_buffer`) with ``accumulate=1``, so a parameter used twice
(tied embeddings) simply receives both contributions.
"""

from __future__ import annotations

from collections.abc import Callable

from surogate.dsl.graph import Graph, Node, Value
from surogate.errors import UnsupportedError


class RuleContext:
    def __init__(self, graph: Graph, needs_grad: set[Value]):
        self.g = graph
        self.needs_grad = needs_grad

    def needs(self, v: Value | None) -> bool:
        return v is not None and v in self.needs_grad

    def grad_spec(self, v: Value) -> tuple | None:
        """Output spec for the gradient of activation v, or None when v needs none."""
        if not self.needs(v) or v.kind != "act":
            return None
        return (v.name + ".grad", v.shape, v.dtype)

    def param_grad(self, p: Value | None) -> Value | None:
        if p is None or p.kind != "param" or not p.trainable:
            return None
        return self.g.grad_buffer(p)


Rule = Callable[[RuleContext, Node, list], list]
RULES: dict[str, Rule] = {}


def rule(op: str):
    def deco(fn: Rule) -> Rule:
        RULES[op] = fn
        return fn
    return deco


@rule("embedding_fwd")
def _embedding(c: RuleContext, n: Node, gy: list) -> list:
    ids, table = n.inputs
    dtable = c.param_grad(table)
    if dtable is not None and gy[0] is not None:
        c.g.node("embedding_bwd", [ids, gy[0]], [dtable], accumulate=1)
    return [None, None]


@rule("rmsnorm_fwd")
def _rmsnorm(c: RuleContext, n: Node, gy: list) -> list:
    x, w = n.inputs
    _, rstd = n.outputs
    dx_spec, dw = c.grad_spec(x), c.param_grad(w)
    if dx_spec is None and dw is None:
        return [None, None]
    # dx is the op's required output: when x needs no gradient it is computed and dropped.
    dx, _ = c.g.node("rmsnorm_bwd", [gy[0], x, w, rstd], [dx_spec or (x.name + ".grad_unused", x.shape, x.dtype), dw],
                     accumulate=1, **n.attrs)
    return [dx if dx_spec else None, None]


@rule("layer_norm_fwd")
def _layer_norm(c: RuleContext, n: Node, gy: list) -> list:
    x, w, b = n.inputs
    _, mean, rstd = n.outputs
    dx_spec, dw, db = c.grad_spec(x), c.param_grad(w), c.param_grad(b)
    if dx_spec is None and dw is None and db is None:
        return [None] * 3
    dx, _, _ = c.g.node("layer_norm_bwd", [gy[0], x, w, mean, rstd],
                        [dx_spec or (x.name + ".grad_unused", x.shape, x.dtype), dw, db], accumulate=1)
    return [dx if dx_spec else None, None, None]


@rule("add_rmsnorm_fwd")
def _add_rmsnorm(c: RuleContext, n: Node, gy: list) -> list:
    x, res, w = n.inputs
    _, h, rstd = n.outputs
    dw = c.param_grad(w)
    need_in = c.needs(x) or c.needs(res)
    if not need_in and dw is None:
        return [None, None, None]
    dh, _ = c.g.node("add_rmsnorm_bwd", [gy[0], gy[1], h, w, rstd], [(h.name + ".grad", h.shape, h.dtype), dw],
                     accumulate=1, **n.attrs)
    # h = x + residual: both receive the same gradient.
    return [dh if c.needs(x) else None, dh if c.needs(res) else None, None]


@rule("linear")
def _linear(c: RuleContext, n: Node, gy: list) -> list:
    x, w, b = n.inputs[:3]
    if w.dtype == "uint8" and c.param_grad(w) is not None:  # QLoRA: blocks stay frozen, adapters train
        raise UnsupportedError(f"{w.name} is kept as GGUF blocks, which have no gradient",
                               hint="train a LoRA over it (QLoRA), or load the weights dequantized for full fine-tuning")
    k = len(n.attrs.get("lora", ()))
    lora_ab = n.inputs[3:3 + 2 * k]
    rng = n.inputs[3 + 2 * k:]  # [the LoRA dropout seed] when the node has dropout
    ts = n.outputs[1:]
    dx_spec = c.grad_spec(x)
    outs: list = [dx_spec, c.param_grad(w), c.param_grad(b)]
    for i in range(0, len(lora_ab), 2):
        outs += [c.param_grad(lora_ab[i]), c.param_grad(lora_ab[i + 1])]
    if all(o is None for o in outs):
        return [None] * len(n.inputs)
    res = c.g.node("linear_bwd", [gy[0], x, w, *lora_ab, *ts, *rng], outs, **n.attrs)
    return [res[0]] + [None] * (len(n.inputs) - 1)


@rule("view")
def _view(c: RuleContext, n: Node, gy: list) -> list:
    (x,) = n.inputs
    if c.grad_spec(x) is None:
        return [None]
    (dx,) = c.g.node("view", [gy[0]], [c.grad_spec(x)])
    return [dx]


@rule("rope_fwd")
def _rope(c: RuleContext, n: Node, gy: list) -> list:
    x, pos = n.inputs
    if c.grad_spec(x) is None:
        return [None, None]
    (dx,) = c.g.node("rope_bwd", [gy[0], pos], [c.grad_spec(x)], **n.attrs)
    return [dx, None]


@rule("qk_norm_rope_fwd")
def _qk_norm_rope(c: RuleContext, n: Node, gy: list) -> list:
    x, w, pos = n.inputs
    _, rstd = n.outputs
    dx_spec, dw = c.grad_spec(x), c.param_grad(w)
    if dx_spec is None and dw is None:
        return [None, None, None]
    dx, _ = c.g.node("qk_norm_rope_bwd", [gy[0], x, w, rstd, pos],
                     [dx_spec or (x.name + ".grad_unused", x.shape, x.dtype), dw], accumulate=1, **n.attrs)
    return [dx if dx_spec else None, None, None]


@rule("attention_fwd")
def _attention(c: RuleContext, n: Node, gy: list) -> list:
    q, k, v, cu, *rest = n.inputs  # [sinks [Hq] (GPT-OSS's, or None), [kv_limit [N]]]
    sinks = rest[0] if rest else None
    kv_limit = rest[1:]
    out, lse = n.outputs
    specs = [c.grad_spec(t) or (t.name + ".grad_unused", t.shape, t.dtype) for t in (q, k, v)]
    dsinks = c.param_grad(sinks)
    if dsinks is not None:  # lse holds the sink: attention_bwd needs nothing more, the sinks their own op
        c.g.node("attention_sinks_bwd", [gy[0], out, lse, sinks], [dsinks], accumulate=1)
    if not any(c.needs(t) for t in (q, k, v)):
        return [None] * len(n.inputs)
    dq, dk, dv = c.g.node("attention_bwd", [gy[0], q, k, v, out, lse, cu, *kv_limit], specs, **n.attrs)
    return [dq if c.needs(q) else None, dk if c.needs(k) else None, dv if c.needs(v) else None, None] + \
        [None] * len(rest)


@rule("short_conv_fwd")
def _short_conv(c: RuleContext, n: Node, gy: list) -> list:
    bcx, w, cu, bias = n.inputs
    spec, dw, db = c.grad_spec(bcx), c.param_grad(w), c.param_grad(bias)
    if spec is None and dw is None and db is None:
        return [None] * 4
    dbcx, _, _ = c.g.node("short_conv_bwd", [gy[0], bcx, w, cu, bias],
                          [spec or (bcx.name + ".grad_unused", bcx.shape, bcx.dtype), dw, db], accumulate=1)
    return [dbcx if spec else None, None, None, None]


@rule("rope_table_fwd")
def _rope_table(c: RuleContext, n: Node, gy: list) -> list:
    x, cos, sin = n.inputs
    if c.grad_spec(x) is None:
        return [None, None, None]
    (dx,) = c.g.node("rope_table_bwd", [gy[0], cos, sin], [c.grad_spec(x)], **n.attrs)
    return [dx, None, None]


@rule("embedding_bag_fwd")
def _embedding_bag(c: RuleContext, n: Node, gy: list) -> list:
    table = n.inputs[2]
    if c.param_grad(table) is not None:
        raise UnsupportedError(f"embedding_bag: the table {table.name} has no gradient (node {n})",
                               hint="keep the table frozen (Qwen3-VL's vision tower is not trained)")
    return [None, None, None]


@rule("mean_pool_2d_fwd")
def _mean_pool_2d(c: RuleContext, n: Node, gy: list) -> list:
    (x,) = n.inputs
    if c.grad_spec(x) is None:
        return [None]
    (dx,) = c.g.node("mean_pool_2d_bwd", [gy[0]], [c.grad_spec(x)], **n.attrs)
    return [dx]


def _serving_only(c: RuleContext, n: Node, gy: list) -> list:
    raise UnsupportedError(f"{n.op} is a serving op (the paged KV cache, a step's inputs) and has no derivative "
                           f"(node {n})", hint="differentiate a training graph: CausalLM.build(mode='train')")


RULES["qkv_rope_cache"] = _serving_only
RULES["paged_attention"] = _serving_only
RULES["short_conv_cache"] = _serving_only
RULES["weight_fetch"] = _serving_only  # weights streamed from host memory (surogate/compile/offload.py)
RULES["weight_wait"] = _serving_only


@rule("sample")
def _sample(c: RuleContext, n: Node, gy: list) -> list:
    raise UnsupportedError(f"sample draws token ids (integers) and has no derivative (node {n})",
                           hint="train on the logits (lm_head_ce, or logprobs of the sampled tokens), not on sample")


@rule("embed_rows")
def _embed_rows(c: RuleContext, n: Node, gy: list) -> list:
    # y = x with rows replaced: dx = dy with those rows zero (the rows are inputs, no gradient).
    x, index, rows = n.inputs
    spec = c.grad_spec(x)
    if spec is None or gy[0] is None:
        return [None, None, None]
    (zero,) = c.g.node("fill", [], [(rows.name + ".zero", rows.shape, rows.dtype)], value=0.0)
    (dx,) = c.g.node("embed_rows", [gy[0], index, zero], [spec])
    return [dx, None, None]


def _serving_fusion(c: RuleContext, n: Node, gy: list) -> list:
    raise UnsupportedError(f"{n.op} is a serving fusion (a matmul with the op that feeds it, forward only) and has "
                           f"no derivative (node {n})",
                           hint="differentiate a training graph: CausalLM.build(mode='train') keeps the ops apart")


RULES["gated_matmul"] = _serving_fusion
RULES["add_rmsnorm_matmul"] = _serving_fusion


def _glu(bwd_op: str):
    def fn(c: RuleContext, n: Node, gy: list) -> list:
        (gu,) = n.inputs
        if c.grad_spec(gu) is None:
            return [None]
        (dgu,) = c.g.node(bwd_op, [gy[0], gu], [c.grad_spec(gu)])
        return [dgu]
    return fn


RULES["swiglu_fwd"] = _glu("swiglu_bwd")


@rule("swiglu_oai_fwd")
def _swiglu_oai(c: RuleContext, n: Node, gy: list) -> list:
    (gu,) = n.inputs
    if c.grad_spec(gu) is None:
        return [None]
    (dgu,) = c.g.node("swiglu_oai_bwd", [gy[0], gu], [c.grad_spec(gu)], **n.attrs)
    return [dgu]


@rule("moe_bias_add")
def _moe_bias_add(c: RuleContext, n: Node, gy: list) -> list:
    x, b, offsets = n.inputs
    db = c.param_grad(b)
    if db is not None and gy[0] is not None:
        c.g.node("moe_bias_grad", [gy[0], offsets], [db], accumulate=1)
    return [gy[0] if c.needs(x) else None, None, None]
RULES["geglu_fwd"] = _glu("geglu_bwd")


@rule("act_mul_fwd")
def _act_mul(c: RuleContext, n: Node, gy: list) -> list:
    a, b = n.inputs  # b None: the plain activation (ops.gelu_tanh)
    da, db = c.grad_spec(a), c.grad_spec(b)
    if c.needs(b) and b.shape != a.shape:
        raise UnsupportedError(f"act_mul: the gradient of a broadcast b ({b.name}) is not supported (node {n})",
                               hint="keep the one-value factor frozen (a buffer, as Gemma 4's layer_scalar)")
    if da is None and db is None:
        return [None, None]
    dx, dw = c.g.node("act_mul_bwd", [gy[0], a, b], [da or (a.name + ".grad_unused", a.shape, a.dtype), db],
                      **n.attrs)
    return [dx if da else None, dw]


@rule("softcap_fwd")
def _softcap(c: RuleContext, n: Node, gy: list) -> list:
    raise UnsupportedError(f"softcap_fwd has no derivative (node {n}): soft-capped logits are an inference output",
                           hint="train through CausalLM.build(mode='train'), whose lm_head_ce applies the cap")


@rule("add")
def _add(c: RuleContext, n: Node, gy: list) -> list:
    a, b = n.inputs
    return [gy[0] if c.needs(a) else None, gy[0] if c.needs(b) else None]


@rule("scale")
def _scale(c: RuleContext, n: Node, gy: list) -> list:
    (x,) = n.inputs
    if c.grad_spec(x) is None:
        return [None]
    (dx,) = c.g.node("scale", [gy[0]], [c.grad_spec(x)], **n.attrs)
    return [dx]


@rule("lm_head_ce_fwd")
def _lm_head_ce(c: RuleContext, n: Node, gy: list) -> list:
    h, w, targets = n.inputs
    _, lse = n.outputs
    dh_spec, dw = c.grad_spec(h), c.param_grad(w)
    if dh_spec is None and dw is None:
        return [None, None, None]
    dh, _ = c.g.node("lm_head_ce_bwd", [h, w, targets, lse, gy[0]],
                     [dh_spec or (h.name + ".grad_unused", h.shape, h.dtype), dw], accumulate=1, **n.attrs)
    return [dh if dh_spec else None, None, None]


# ---- mixture of experts ---------------------------------------------------------------------
@rule("moe_router_fwd")
def _moe_router(c: RuleContext, n: Node, gy: list) -> list:
    (logits,) = n.inputs
    w, idx, probs = n.outputs
    spec = c.grad_spec(logits)
    if spec is None or (gy[0] is None and gy[2] is None):
        return [None]
    dw = gy[0]
    if dw is None:  # only the load-balancing loss reads this router
        (dw,) = c.g.node("fill", [], [(w.name + ".grad_zero", w.shape, w.dtype)], value=0.0)
    (dl,) = c.g.node("moe_router_bwd", [dw, probs, idx, gy[2]], [spec], **n.attrs)
    return [dl]


@rule("moe_permute")
def _moe_permute(c: RuleContext, n: Node, gy: list) -> list:
    x, _ = n.inputs
    _, rows, _ = n.outputs
    if c.grad_spec(x) is None or gy[0] is None:
        return [None, None]
    (dx,) = c.g.node("moe_unpermute_fwd", [gy[0], rows, None], [c.grad_spec(x)])  # a sum over the K copies
    return [dx, None]


@rule("moe_unpermute_fwd")
def _moe_unpermute(c: RuleContext, n: Node, gy: list) -> list:
    yp, rows, w = n.inputs
    need_yp, need_w = c.needs(yp), c.needs(w)
    if not (need_yp or need_w):
        return [None, None, None]
    dyp_spec = c.grad_spec(yp) or (yp.name + ".grad_unused", yp.shape, yp.dtype)
    dyp, dw = c.g.node("moe_unpermute_bwd", [gy[0], rows, yp, w], [dyp_spec, c.grad_spec(w) if need_w else None])
    return [dyp if need_yp else None, None, dw if need_w else None]


@rule("moe_grouped_matmul")
def _moe_grouped_matmul(c: RuleContext, n: Node, gy: list) -> list:
    x, w, offsets = n.inputs
    dx = None
    if c.grad_spec(x) is not None:
        (dx,) = c.g.node("moe_grouped_matmul", [gy[0], w, offsets], [c.grad_spec(x)], trans_b=0)
    dw = c.param_grad(w)
    if dw is not None:
        c.g.node("moe_grouped_matmul_wgrad", [gy[0], x, offsets], [dw], accumulate=1)
    return [dx, None, None]


@rule("moe_z_loss_fwd")
def _moe_z_loss(c: RuleContext, n: Node, gy: list) -> list:
    if gy[0] is None:
        return [None] * len(n.inputs)
    out: list = []
    for x in n.inputs:
        dx = None
        if c.needs(x):
            # Its own name: the router's backward gives these logits their other gradient part.
            (dx,) = c.g.node("moe_z_loss_bwd", [gy[0], x], [(x.name + ".dz", x.shape, x.dtype)],
                             num_layers=len(n.inputs))
        out.append(dx)
    return out


@rule("moe_aux_loss_fwd")
def _moe_aux_loss(c: RuleContext, n: Node, gy: list) -> list:
    loss, counts = n.outputs
    probs = n.inputs[0::2]
    if gy[0] is None or not any(c.needs(p) for p in probs):
        return [None] * len(n.inputs)
    # The same gradient reaches every layer's probs: counts (from the top-k choice) have none.
    (dp,) = c.g.node("moe_aux_loss_bwd", [gy[0], counts], [(loss.name + ".dprobs", probs[0].shape, "float32")],
                     num_layers=len(probs))
    out: list = []
    for p in probs:
        out += [dp if c.needs(p) else None, None]
    return out
