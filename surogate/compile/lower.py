"""Lower a graph to a flat instruction list over buffers, then to a native `Program`.

Forward and backward ops map one to one onto native ops. ``view`` becomes a buffer view (no
instruction). ``linear`` / ``linear_bwd`` expand to matmuls: the base projection, then each
LoRA slice as two skinny matmuls whose result is accumulated (beta = 1) into its column slice
of the output. With LoRA dropout (training graphs only) the slices read one `dropout_fwd`
temp of x, recomputed in `linear_bwd` (the mask is a hash of the seed, never stored). A linear
tagged ``fp8`` (the fp8_hybrid recipe) has its base projection lowered by surogate/compile/fp8.py
to quantize_fp8 + matmul_fp8 instructions; its LoRA slices stay as they are.

The instructions form named phases, contiguous ranges a caller runs by name: ``forward`` and,
for a graph with a backward pass, ``backward`` (which holds the recomputed blocks). A phase
graph lowered later (`lower_phase`: the optimizer step) is appended after everything: it reads
and writes the Program's buffers by value name (parameters, gradient accumulators), brings its
own external buffers (optimizer state) and gets its temporaries planned around the ones
already placed.

With ``mlp_chunk`` (long_context) each dense MLP region is lowered by surogate/compile/tile.py
over row chunks, through this same node lowering with the region's values mapped to row views
and chunk temporaries (`_Lowering.rows_map`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from surogate import _native
from surogate.compile import fp8
from surogate.compile.buffers import Buf, Instr
from surogate.compile.planner import plan
from surogate.compile.tile import TiledMLP, find_mlps, lower_backward, lower_forward
from surogate.dsl.graph import Graph, Node, Value, bind_shape
from surogate.errors import InvalidArgumentError


@dataclass
class Lowered:
    instrs: list[Instr]
    bufs: list[Buf]  # creation order: a view always after its base
    by_value: dict[str, Buf]
    arena_bytes: int = 0
    dims: dict[str, int] = field(default_factory=dict)
    phases: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> instructions [begin, end)
    tiled_mlps: int = 0  # MLP regions lowered in row chunks (mlp_chunk)
    # Buffers the Program derives from bound weights in a phase of their own (fp8_hybrid's frozen
    # weights quantized once: surogate/compile/fp8.py): buffer name -> its source's
    derived: dict[str, str] = field(default_factory=dict)


class _Lowering:
    def __init__(self, g: Graph, dims: dict[str, int], into: Lowered | None = None):
        """into: append to an already lowered program (its buffers are found by value name)."""
        self.g, self.dims = g, dims
        self.instrs: list[Instr] = [] if into is None else into.instrs
        self.bufs: list[Buf] = [] if into is None else into.bufs
        self.by_value: dict[str, Buf] = {} if into is None else into.by_value
        self.ntemp = 0 if into is None else len(into.bufs)  # temp names stay unique
        # Recomputation: value name -> the buffer of its recomputed copy, consulted first.
        self.remap: dict[str, Buf] = {}
        self.cloning = False
        # Tiled MLPs (surogate/compile/tile.py): node -> ("forward" | "backward" | "skip", region),
        # the chunk rows, and while a chunk is lowered its value name -> chunk buffer map (consulted
        # before everything) and first row (LoRA dropout's element offset).
        self.tiles: dict[Node, tuple[str, TiledMLP]] = {}
        self.chunk = 0
        self.rows_map: dict[str, Buf] = {}
        self.row0 = 0

    def new_buf(self, b: Buf) -> Buf:
        self.bufs.append(b)
        return b

    def buf(self, v: Value | None) -> Buf | None:
        if v is None:
            return None
        if v.name in self.rows_map:
            return self.rows_map[v.name]
        if v.name in self.remap:
            return self.remap[v.name]
        if self.cloning and v.kind == "act" and v.producer is not None and v.producer in self.cloning:
            b = self.new_buf(Buf(v.name + "@recompute", bind_shape(v.shape, self.dims), v.dtype, "internal"))
            self.remap[v.name] = b
            return b
        b = self.by_value.get(v.name)
        if b is None:
            kind = "internal" if v.kind == "act" else "external"
            b = self.new_buf(Buf(v.name, bind_shape(v.shape, self.dims), v.dtype, kind,
                                 host=kind == "external" and bool(v.meta.get("host"))))
            self.by_value[v.name] = b
        return b

    def temp(self, name: str, shape: tuple[int, ...], dtype: str) -> Buf:
        self.ntemp += 1
        return self.new_buf(Buf(f"{name}~{self.ntemp}", shape, dtype, "internal"))

    def columns(self, b: Buf, offset: int, size: int) -> Buf:
        """Columns [offset, offset + size) of a 2-D buffer: itself or a strided view."""
        rows, cols = b.shape
        if offset == 0 and size == cols:
            return b
        return self.new_buf(Buf(f"{b.name}[:, {offset}:{offset + size}]", (rows, size), b.dtype, "view", base=b,
                                offset=offset, strides=(cols, 1)))

    def emit(self, op: str, ins: list, outs: list, node: Node, **attrs) -> None:
        self.instrs.append(Instr(op, ins, outs, attrs, node=repr(node)[:200]))

    # ---- nodes ------------------------------------------------------------------------------
    def recompute(self, nodes: list[Node]) -> None:
        """Emit `nodes` (one block's forward) again with fresh output buffers; later readers of
        their values get the copies, so the originals die right after the forward pass."""
        self.cloning = set(nodes)
        for n in nodes:
            self.node(n)
        self.cloning = False

    def node(self, n: Node) -> None:
        tile = self.tiles.get(n) if not self.rows_map else None
        if tile is not None:
            what, region = tile
            if what == "forward":
                lower_forward(self, region)
            elif what == "backward":
                lower_backward(self, region)
            return
        if n.op == "view":
            (x,), (y,) = n.inputs, n.outputs
            base = self.buf(x)
            name = y.name + ("@recompute" if self.cloning else "")
            b = self.new_buf(Buf(name, bind_shape(y.shape, self.dims), y.dtype, "view", base=base))
            if self.cloning:
                self.remap[y.name] = b
            else:
                self.by_value[y.name] = b
        elif n.op == "columns":  # a strided view: rows of the base, some of its columns
            (x,), (y,) = n.inputs, n.outputs
            base = self.buf(x)
            if base.kind == "view":
                raise ValueError(f"columns {y.name}: the base {base.name} is itself a view")
            shape = bind_shape(y.shape, self.dims)
            strides = [base.shape[1]]
            inner = 1
            for d in reversed(shape[1:]):
                strides.insert(1, inner)
                inner *= d
            b = self.new_buf(Buf(y.name, shape, y.dtype, "view", base=base, offset=int(n.attrs["offset"]),
                                 strides=tuple(strides)))
            self.by_value[y.name] = b
        elif n.op == "linear":
            self.linear(n)
        elif n.op == "linear_bwd":
            self.linear_bwd(n)
        else:
            self.emit(n.op, [self.buf(v) for v in n.inputs], [self.buf(v) for v in n.outputs], n, **n.attrs)

    def lora_dropout(self, n: Node) -> tuple[Buf | None, dict]:
        """(the rng buffer, dropout_fwd attrs) when this linear's LoRA input is dropped out:
        the node has dropout and the graph is lowered for training (it has a backward pass)."""
        p = n.attrs.get("dropout", 0.0)
        if p <= 0 or not hasattr(self.g, "backward_start"):
            return None, {}
        k = len(n.attrs["lora"])
        rng_at = 3 + 2 * k if n.op == "linear" else 3 + 3 * k
        # In a row chunk the mask continues at the chunk's first element of the whole input.
        x = self.buf(n.inputs[0 if n.op == "linear" else 1])
        return self.buf(n.inputs[rng_at]), {"p": p, "offset": n.attrs["dropout_offset"] + self.row0 * x.shape[1]}

    def linear(self, n: Node) -> None:
        k = len(n.attrs["lora"])
        x, w, bias = (self.buf(v) for v in n.inputs[:3])
        ab = [self.buf(v) for v in n.inputs[3:3 + 2 * k]]
        y, *ts = (self.buf(v) for v in n.outputs)
        qtype = n.inputs[1].meta.get("ggml_type")
        if n.attrs.get("fp8"):  # the fp8_hybrid recipe (surogate/compile/fp8.py)
            fp8.lower_linear(self, n, x, w, bias, y)
        elif w.dtype == "uint8" and "nf4" in n.inputs[1].meta:  # NF4 (QLoRA): x times the dequantized weight
            self.emit("matmul", [x, self.nf4_dequantized(n, n.inputs[1], x.dtype), bias], [y], n, trans_b=1)
        elif w.dtype == "uint8" and hasattr(self.g, "backward_start"):
            # Training over GGML blocks (QLoRA): x times the exactly dequantized weight, as the
            # backward multiplies it (gguf_matmul's few-row path would round x to 8 bits).
            wd = self.temp(f"{w.name}.dequant", (y.shape[1], x.shape[1]), x.dtype)
            self.emit("gguf_dequantize", [w], [wd], n, type=qtype, cols=x.shape[1])
            self.emit("matmul", [x, wd, bias], [y], n, trans_b=1)
        elif w.dtype == "uint8":  # GGML blocks, multiplied without dequantizing them first
            self.emit("gguf_matmul", [x, w], [y], n, type=qtype)
            if bias is not None:  # y += ones[N, 1] @ bias[1, Cout] (Qwen2's q/k/v biases stay f32 in GGUF)
                N, Cout = y.shape
                ones = self.temp("ones.col", (N, 1), y.dtype)
                self.emit("fill", [], [ones], n, value=1.0)
                b2 = self.new_buf(Buf(bias.name + ".row", (1, Cout), bias.dtype, "view", base=bias))
                self.emit("matmul", [ones, b2], [y], n, beta=1.0)
        else:
            self.emit("matmul", [x, w, bias], [y], n, trans_b=1)
        rng, dattrs = self.lora_dropout(n)
        xa = x  # what the adapters read: x, or dropout(x) (one temp shared by every slice)
        if rng is not None and k:
            xa = self.temp(f"{x.name}.lora_dropout", x.shape, x.dtype)
            self.emit("dropout_fwd", [x, rng], [xa], n, **dattrs)
        for i, s in enumerate(n.attrs["lora"]):
            A, B, t = ab[2 * i], ab[2 * i + 1], ts[i]
            self.emit("matmul", [xa, A], [t], n, trans_b=1)
            self.emit("matmul", [t, B], [self.columns(y, s["offset"], s["size"])], n, trans_b=1, alpha=s["scale"],
                      beta=1.0)

    def nf4_dequantized(self, n: Node, w: Value, dtype: str) -> Buf:
        """A temporary [Cout, Cin] copy of an NF4 weight (bitsandbytes' layout: its codes and
        absmax state, surogate/io/nf4.py), freed after the matmul that reads it (liveness)."""
        spec = w.meta["nf4"]
        Cout, half = self.buf(w).shape
        wd = self.temp(f"{w.name}.dequant", (Cout, 2 * half), dtype)
        state = [self.buf(self.g.values[s]) for s in w.meta["nf4_state"]]
        self.emit("nf4_dequantize", [self.buf(w), *state], [wd], n, blocksize=spec.blocksize)
        return wd

    def linear_bwd(self, n: Node) -> None:
        slices = n.attrs["lora"]
        k = len(slices)
        dy, x, w = (self.buf(v) for v in n.inputs[:3])
        ab = [self.buf(v) for v in n.inputs[3:3 + 2 * k]]
        ts = [self.buf(v) for v in n.inputs[3 + 2 * k:3 + 3 * k]]
        dx, dw, db = (self.buf(v) for v in n.outputs[:3])
        dab = [self.buf(v) for v in n.outputs[3:]]
        if n.attrs.get("fp8"):  # the fp8_hybrid recipe (surogate/compile/fp8.py)
            fp8.lower_linear_bwd(self, n, dy, x, w, dx, dw)
        else:
            self.base_bwd(n, dy, x, w, dx, dw)
        if db is not None:
            N, Cout = dy.shape
            ones = self.temp("ones", (1, N), dy.dtype)
            self.emit("fill", [], [ones], n, value=1.0)
            db2 = self.new_buf(Buf(db.name + ".2d", (1, Cout), db.dtype, "view", base=db))
            self.emit("matmul", [ones, dy], [db2], n, beta=1.0)
        # With dropout the adapters read xa = dropout(x) (recomputed from the seed, not stored):
        # dA = dt^T xa, and x's LoRA gradient is dropout(sum_i dt_i A_i) (the same mask).
        rng, dattrs = self.lora_dropout(n)
        xa, dxa = x, dx
        for i, s in enumerate(slices):
            A, B, t = ab[2 * i], ab[2 * i + 1], ts[i]
            dA, dB = dab[2 * i], dab[2 * i + 1]
            if dx is None and dA is None and dB is None:
                continue
            dys = self.columns(dy, s["offset"], s["size"])
            if dB is not None:
                self.emit("matmul", [dys, t], [dB], n, trans_a=1, alpha=s["scale"], beta=1.0)
            if dA is not None or dx is not None:
                dt = self.temp(f"{x.name}.lora_{s['name']}.dt", t.shape, t.dtype)
                self.emit("matmul", [dys, B], [dt], n, alpha=s["scale"])
                if dA is not None:
                    if rng is not None and xa is x:
                        xa = self.temp(f"{x.name}.lora_dropout", x.shape, x.dtype)
                        self.emit("dropout_fwd", [x, rng], [xa], n, **dattrs)
                    self.emit("matmul", [dt, xa], [dA], n, trans_a=1, beta=1.0)
                if dx is not None:
                    first = rng is not None and dxa is dx
                    if first:
                        dxa = self.temp(f"{x.name}.lora_dropout.grad", dx.shape, dx.dtype)
                    self.emit("matmul", [dt, A], [dxa], n, beta=0.0 if first else 1.0)
        if dxa is not dx:
            self.emit("dropout_fwd", [dxa, rng], [dxa], n, **dattrs)
            self.emit("add", [dx, dxa], [dx], n)

    def base_bwd(self, n: Node, dy: Buf, x: Buf, w: Buf, dx: Buf | None, dw: Buf | None) -> None:
        """dx = dy @ W (W dequantized first when it is NF4 or GGML blocks) and dw += dy^T @ x."""
        if dx is not None and w.dtype == "uint8" and "nf4" in n.inputs[2].meta:
            self.emit("matmul", [dy, self.nf4_dequantized(n, n.inputs[2], dy.dtype)], [dx], n)
        elif dx is not None and w.dtype == "uint8":
            # QLoRA over GGML blocks: dx = dy @ dequant(W), through a temporary dequantized copy
            # (freed right after: the planner's liveness), as bitsandbytes' backward does.
            Cout, Cin = dy.shape[1], dx.shape[1]
            wd = self.temp(f"{w.name}.dequant", (Cout, Cin), dy.dtype)
            self.emit("gguf_dequantize", [w], [wd], n, type=n.inputs[2].meta["ggml_type"], cols=Cin)
            self.emit("matmul", [dy, wd], [dx], n)
        elif dx is not None:
            self.emit("matmul", [dy, w], [dx], n)
        if dw is not None:
            self.emit("matmul", [dy, x], [dw], n, trans_a=1, beta=1.0)


def _block_of(n: Node) -> str | None:
    """The decoder block a forward node belongs to ("layers.3."), from its outputs' names."""
    names = [v.name for v in n.outputs if v is not None]
    if not names or not names[0].startswith("layers."):
        return None
    prefix = ".".join(names[0].split(".")[:2]) + "."
    return prefix if all(x.startswith(prefix) for x in names) else None


def lower(g: Graph, dims: dict[str, int], keep: list[Value] = (), recompute: bool = False,
          mlp_chunk: int = 0) -> Lowered:
    """Lower every node of g with symbolic dims bound; `keep` values stay alive to the end.

    recompute: activation checkpointing per decoder block. Only each block's inputs stay alive
    from the forward pass to the backward pass; the block's forward runs again right before
    its backward (deterministic kernels: the gradients are bit-identical).

    mlp_chunk: > 0 runs every dense MLP over chunks of that many rows, its interior recomputed
    per chunk in backward (surogate/compile/tile.py; the original's long_context)."""
    lw = _Lowering(g, dims)
    tiled = find_mlps(g) if mlp_chunk > 0 else []
    lw.chunk = int(mlp_chunk)
    for r in tiled:
        lw.tiles[r.gate_up] = ("forward", r)
        lw.tiles[r.act] = lw.tiles[r.down] = ("skip", r)
        for j, n in enumerate(r.backward):
            lw.tiles[n] = ("backward" if j == 0 else "skip", r)
    start = getattr(g, "backward_start", len(g.nodes))
    blocks: dict[str, list[Node]] = {}
    block_of_value: dict[str, str] = {}
    if recompute:
        for n in g.nodes[:start]:
            b = _block_of(n)
            if b is not None:
                blocks.setdefault(b, []).append(n)
                for v in n.outputs:
                    if v is not None:
                        block_of_value[v.name] = b
    done: set[str] = set()
    backward_at = None  # the first backward instruction, once lowered
    for i, n in enumerate(g.nodes):
        if i == start:
            backward_at = len(lw.instrs)
        if recompute and i >= start:
            for v in n.inputs:
                b = block_of_value.get(v.name) if v is not None else None
                if b is not None and b not in done:
                    done.add(b)
                    lw.recompute(blocks[b])
        lw.node(n)
    pinned = []
    for v in keep:
        b = lw.buf(v).root()
        b.pinned = True
        pinned.append(b)
    # fp8_hybrid's frozen weights, quantized once: their phase goes first (its own range)
    prep, derived = fp8.weights_phase(lw)
    k = len(prep)
    lw.instrs[:0] = prep
    arena = plan(lw.instrs, pinned)
    end = len(lw.instrs)
    phases = {fp8.WEIGHTS_PHASE: (0, k)} if k else {}
    if hasattr(g, "backward_start"):
        at = end if backward_at is None else backward_at + k
        phases |= {"forward": (k, at), "backward": (at, end)}
    else:
        phases["forward"] = (k, end)
    return Lowered(lw.instrs, lw.bufs, lw.by_value, arena, dict(dims), phases, len(tiled), derived)


def lower_phase(lowered: Lowered, name: str, g: Graph, keep: list[Value] = ()) -> tuple[int, int]:
    """Append graph g to `lowered` as the phase `name`, after every instruction it has; returns
    (first new buffer, first new instruction) for `emit`.

    A value of g that is not an activation is the buffer of that name when `lowered` has one
    (same shape and dtype: a parameter, a gradient accumulator, a kept result) and a new
    external buffer otherwise. The phase may not touch an earlier phase's temporaries: they
    are already placed for their own lifetimes."""
    if name in lowered.phases:
        raise InvalidArgumentError(f"the program already has a phase {name!r}", hint="give the phase another name")
    for v in g.values.values():
        b = lowered.by_value.get(v.name)
        if b is None:
            continue
        where = f"phase {name!r}: value {v.name}"
        if v.kind == "act":
            raise InvalidArgumentError(f"{where} is computed by the phase but the program already has a buffer of "
                                       f"that name", hint="name the phase's values apart (e.g. with a prefix)")
        shape = bind_shape(v.shape, lowered.dims)
        if shape != b.shape or v.dtype != b.dtype:
            raise InvalidArgumentError(f"{where} is {v.dtype}{list(shape)}, the program's buffer is "
                                       f"{b.dtype}{list(b.shape)}",
                                       hint="declare it with the program's shape and dtype")
        if b.root().kind == "internal" and not b.root().pinned:
            raise InvalidArgumentError(f"{where} is a temporary of an earlier phase, not kept to the end",
                                       hint="keep it when compiling (Executable keep=) or compute it in the phase")
    nbufs, begin = len(lowered.bufs), len(lowered.instrs)
    lw = _Lowering(g, lowered.dims, into=lowered)
    for n in g.nodes:
        lw.node(n)
    for v in keep:
        lw.buf(v).root().pinned = True
    lowered.arena_bytes = plan(lowered.instrs, [b for b in lowered.bufs if b.pinned])
    lowered.phases[name] = (begin, len(lowered.instrs))
    return nbufs, begin


def to_program(lowered: Lowered, device: str = "cpu") -> _native.Program:
    p = _native.Program(device)
    emit(p, lowered.bufs, lowered.instrs)
    return p


def emit(p: _native.Program, bufs: list[Buf], instrs: list[Instr]) -> None:
    """Declare bufs (bases before their views) and add instrs to the native Program."""
    for b in bufs:
        if b.kind == "external":
            b.native_id = p.external(b.name, list(b.shape), b.dtype, host=b.host)
        elif b.kind == "internal":
            if b.arena_offset < 0:  # touched by no instruction: give it memory of its own
                b.native_id = p.buffer(b.name, list(b.shape), b.dtype)
            else:
                b.native_id = p.buffer(b.name, list(b.shape), b.dtype, b.arena_offset)
        else:
            b.native_id = p.view(b.name, b.base.native_id, list(b.shape), b.offset, list(b.strides or ()))
    for ins in instrs:
        p.op(ins.op, [b.native_id if b is not None else -1 for b in ins.inputs],
             [b.native_id if b is not None else -1 for b in ins.outputs], ins.attrs)
