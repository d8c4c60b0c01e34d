"""The fp8_hybrid recipe: which projections run as FP8 GEMMs, and the instructions they lower to.

TransformerEngine's hybrid scheme, as the original Surogate ran it. The decoder blocks' attention
and MLP projections (q / k / v / o, gate / up / down and their fused forms; not embeddings,
norms, the LM head, routers or LoRA adapters, which stay in the model's dtype) multiply in FP8:

    forward   y  = e4m3(x) @ e4m3(W)^T                    (+ bias)
    backward  dx = e5m2(dy) @ e4m3(W)                      dW += e4m3(x)^T @ e5m2(dy)  (full fine-tune)

each operand with a per-tensor scale (`quantize_fp8`; the rule and the NaN policy are in
kernels_native/runtime/op_checks_fp8.h), products accumulated in f32, the result in the
activation dtype (dW into the f32 gradient accumulator). Hopper's FP8 GEMMs take both operands
K-major (`matmul_fp8` is c = a @ b^T), so the backward quantizes transposed copies: W^T for dx,
dy^T and x^T for dW, each by one fused transpose + quantize. A copy's scale is its own
tensor's amax, so the transposed codes are the forward ones, moved.

`mark_fp8` runs on the forward graph before autodiff and tags each chosen `linear` node with
``fp8`` (the `linear_bwd` rule copies the attrs); surogate/compile/lower.py sends tagged nodes
here (`lower_linear` / `lower_linear_bwd`). Current scaling (each tensor's own amax, right before
it is quantized) is the default; ``amax_history`` H > 0 is delayed scaling: each quantize site
keeps, in an f32 [H + 1] graph input (``fp8_history.<weight>.<site>``, zeros to start, rewritten
by every run; the trainer owns and checkpoints them), the largest amax of this run's uses and
those of the last H runs, and takes its scale from the last H runs' (the rule:
kernels_native/runtime/op_checks_fp8.h). The site's first quantize instruction in program order
carries ``roll``, moving the history on by one run; its later uses in the run (a block recomputed
in the backward, each chunk of a tiled MLP) take the same scale as the first. Ranks make their
histories the one-rank run's by an elementwise max after each step (data_parallel.py).

Frozen weights (a LoRA's base, a DPO reference) under current scaling are quantized once, not
every micro-batch: their e4m3 copies (W, and W^T where a backward needs dx) are external
buffers of the Program (``fp8_cache.<weight>.w`` / ``.wt`` and their ``.scale_inv``) that the
phase ``fp8_weights``, placed before the forward, writes. `Executable` runs that phase itself
before the first run and again after a source weight is bound or pushed anew (`Lowered.derived`
names each copy's source). The copies cost one byte per weight each; `Fp8Recipe.cache_weights`
False (ZeRO-3, whose ranks hold a shard of each weight) quantizes in the step instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from surogate.compile.buffers import Buf, Instr
from surogate.dsl.graph import Graph, Node

E4M3, E5M2 = "float8_e4m3fn", "float8_e5m2"
HISTORY_PREFIX = "fp8_history."
CACHE_PREFIX = "fp8_cache."
WEIGHTS_PHASE = "fp8_weights"  # the frozen weights' copies, quantized before the forward
# The block projections by module name: the attention and MLP projections of every family (LFM2's
# out_proj / in_proj / w1..w3, fused gate_up_proj and w13 included).
PROJECTIONS = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "out_proj", "in_proj",
                         "gate_proj", "up_proj", "gate_up_proj", "down_proj", "w1", "w2", "w3", "w13"})
# The quantize sites of one projection: forward x and W, backward dy and W^T (dx), dy^T and x^T (dW).
SITES = ("x", "w", "dy", "wt", "dyt", "xt")
ALIGN = 16  # FP8 GEMMs want every dimension a multiple of 16 (cuBLASLt's 16-byte leading dims)
_LAYER = re.compile(r"^layers\.(\d+)\.")


@dataclass(frozen=True)
class Fp8Recipe:
    """``skip_first_layers`` / ``skip_last_layers``: decoder blocks at either end kept in the
    model's dtype (the original's skip_quant_first_layers / skip_quant_last_layers)."""

    amax_history: int = 0  # 0: current scaling; H > 0: delayed scaling over the last H amaxes
    skip_first_layers: int = 0
    skip_last_layers: int = 0
    cache_weights: bool = True  # frozen weights quantized once (the module docstring), not every step

    def key(self) -> tuple:
        return ("fp8", self.amax_history, self.skip_first_layers, self.skip_last_layers, self.cache_weights)


def projection_layer(n: Node) -> int | None:
    """The decoder block index of a linear node that is one of the block projections, else None."""
    if n.op != "linear":
        return None
    w = n.inputs[1]
    m = _LAYER.match(w.name)
    if m is None or w.dtype not in ("float32", "bfloat16", "float16") or len(w.shape) != 2:
        return None
    module = w.name.rsplit(".", 2)[-2] if w.name.endswith(".weight") else None
    return int(m[1]) if module in PROJECTIONS else None


def mark_fp8(g: Graph, recipe: Fp8Recipe) -> list[str]:
    """Tag the block projections of g (before autodiff) to lower as FP8 GEMMs; returns the tagged
    weights' names. A projection whose width is not a multiple of 16 stays in the model's dtype."""
    layers = {projection_layer(n) for n in g.nodes} - {None}
    if not layers:
        return []
    lo, hi = min(layers) + recipe.skip_first_layers, max(layers) - recipe.skip_last_layers
    marked = []
    for n in g.nodes:
        i = projection_layer(n)
        if i is None or not lo <= i <= hi:
            continue
        cout, cin = n.inputs[1].shape
        if cout % ALIGN or cin % ALIGN:
            continue
        n.attrs["fp8"] = 1
        w = n.inputs[1]
        if recipe.cache_weights and not recipe.amax_history and not w.trainable and not w.meta.get("host"):
            n.attrs["fp8_cache"] = 1
        if recipe.amax_history:
            n.attrs["amax_history"] = int(recipe.amax_history)
            for tag in SITES if w.trainable else SITES[:4]:
                g.input(f"{HISTORY_PREFIX}{w.name}.{tag}", (recipe.amax_history + 1,), "float32")
        marked.append(w.name)
    return marked


def check_rows(what: str, rows: int) -> None:
    if rows % ALIGN:
        from surogate.errors import ShapeError

        raise ShapeError(f"fp8_hybrid: {what} has {rows} token rows, not a multiple of {ALIGN} (FP8 GEMMs multiply "
                         f"over the tokens in the weight gradient)",
                         hint="make per_device_train_batch_size * sequence_len a multiple of 16")


class _Sites:
    """Quantized copies for one lowered node: (codes, scale_inv) temporaries, and with delayed
    scaling the history input of each quantize site.

    Under current scaling a copy depends only on its source buffer, format and layout, so one copy
    serves every projection that reads the same tensor (q / k / v share x, in the forward and as
    x^T in the backward): the lowering keeps them in ``lw.fp8_copies``. A source is final when
    its first reader is lowered (its producer, LoRA additions included, came before), and a
    recomputed block reads new buffers, so a kept copy never goes stale. Weights (external
    buffers) are not kept: a copy read again in the backward (a recomputed or tiled block's
    forward) would live through the whole step."""

    def __init__(self, lw, n: Node):
        self.lw, self.n = lw, n
        self.H = int(n.attrs.get("amax_history", 0))
        self.weight = (n.inputs[1] if n.op == "linear" else n.inputs[2]).name
        if not hasattr(lw, "fp8_copies"):
            lw.fp8_copies = {}
            lw.fp8_rolled = set()  # the histories whose first quantize is emitted (it carries roll)

    def quantize(self, x, fmt: str, tag: str, transpose: bool = False):
        lw = self.lw
        if self.n.attrs.get("fp8_cache") and x.root().kind == "external":
            return self.cached(x, tag, transpose)
        key = (x, fmt, transpose)
        keep = not self.H and x.root().kind != "external"
        if keep and key in lw.fp8_copies:
            return lw.fp8_copies[key]
        shape = (x.shape[1], x.shape[0]) if transpose else tuple(x.shape)
        q = lw.temp(f"{x.name}.{tag}", shape, fmt)
        s = lw.temp(f"{x.name}.{tag}.scale_inv", (1,), "float32")
        attrs = {"transpose": 1} if transpose else {}
        history = None
        if self.H:
            history = lw.buf(lw.g.values[f"{HISTORY_PREFIX}{self.weight}.{tag}"])
            if history.name not in lw.fp8_rolled:  # the site's first quantize of a run moves its history on
                lw.fp8_rolled.add(history.name)
                attrs["roll"] = 1
        lw.emit("quantize_fp8", [x], [q, s, history], self.n, **attrs)
        if keep:
            lw.fp8_copies[key] = (q, s)
        return q, s

    def cached(self, w, tag: str, transpose: bool):
        """A frozen weight's e4m3 copy as external buffers, quantized by the weights phase (one
        copy per weight and layout, whichever node reads it)."""
        lw = self.lw
        if not hasattr(lw, "fp8_weight_copies"):
            lw.fp8_weight_copies = {}
        key = (w.name, transpose)
        if key not in lw.fp8_weight_copies:
            name = f"{CACHE_PREFIX}{w.name}.{tag}"
            shape = (w.shape[1], w.shape[0]) if transpose else tuple(w.shape)
            q, s = Buf(name, shape, E4M3, "external"), Buf(f"{name}.scale_inv", (1,), "float32", "external")
            for b in (q, s):
                lw.new_buf(b)
                lw.by_value[b.name] = b
            ins = Instr("quantize_fp8", [w], [q, s, None], {"transpose": 1} if transpose else {},
                        node=f"fp8_hybrid: {w.name} quantized once (frozen)")
            lw.fp8_weight_copies[key] = (q, s, ins)
        return lw.fp8_weight_copies[key][:2]


def weights_phase(lw) -> tuple[list, dict[str, str]]:
    """The lowering's frozen-weight quantizations (the ``fp8_weights`` phase) and the source
    weight of each copy they write (the root buffer's name: a column view's whole weight)."""
    copies = getattr(lw, "fp8_weight_copies", {}).values()
    derived = {}
    for q, s, ins in copies:
        derived[q.name] = derived[s.name] = ins.inputs[0].root().name
    return [ins for _, _, ins in copies], derived


def lower_linear(lw, n: Node, x, w, bias, y) -> None:
    """y = x @ w^T (+ bias) as an FP8 GEMM (lw: the compile/lower.py lowering)."""
    check_rows(y.name, x.shape[0])
    sites = _Sites(lw, n)
    xq, xs = sites.quantize(x, E4M3, "x")
    wq, ws = sites.quantize(w, E4M3, "w")
    lw.emit("matmul_fp8", [xq, xs, wq, ws, bias], [y], n)


def lower_linear_bwd(lw, n: Node, dy, x, w, dx, dw) -> None:
    """dx = dy @ w and dw += dy^T @ x (whichever is needed) as FP8 GEMMs."""
    sites = _Sites(lw, n)
    if dx is not None:
        dyq, dys = sites.quantize(dy, E5M2, "dy")
        wtq, wts = sites.quantize(w, E4M3, "wt", transpose=True)
        lw.emit("matmul_fp8", [dyq, dys, wtq, wts], [dx], n)
    if dw is not None:
        dytq, dyts = sites.quantize(dy, E5M2, "dyt", transpose=True)
        xtq, xts = sites.quantize(x, E4M3, "xt", transpose=True)
        lw.emit("matmul_fp8", [dytq, dyts, xtq, xts], [dw], n, beta=1.0)
