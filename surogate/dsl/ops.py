"""DSL ops: each function adds one node to the graph with its output shapes and dtypes.

Forward ops carry the native op name they lower to (``rmsnorm_fwd``...), except the compound
``linear`` (a projection with optional bias and LoRA slices), which `surogate.compile` lowers
to several matmuls, and ``view`` (a reshape that costs nothing). Backward ops are added by
`surogate.autodiff`, never by model code.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from surogate.dsl.graph import Dim, Graph, Shape, Value


def _g(*vals: Value | None) -> Graph:
    for v in vals:
        if v is not None:
            return v.graph
    raise ValueError("op needs at least one tensor input")


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def _same(a: int | Dim, b: int | Dim) -> bool:
    return a == b


# ---- embedding ------------------------------------------------------------------------------
def embedding(ids: Value, table: Value, name: str = "embed") -> Value:
    (N,) = ids.shape
    V, C = table.shape
    (y,) = _g(ids).node("embedding_fwd", [ids, table], [(name, (N, C), table.dtype)])
    return y


def embed_rows(x: Value, index: Value, rows: Value, name: str = "embed_rows") -> Value:
    """x [N, C] with row index[e] replaced by rows[e] (float32 [E, C], rounded to x's dtype;
    index -1 skips): image features (or a request's embedding rows in serving) in place of the
    prompt tokens' embeddings. The rows are inputs: x's gradient is dy with the replaced rows
    zeroed, and the rows get none."""
    N, C = x.shape
    _check(rows.shape[1:] == (C,) and index.shape == rows.shape[:1],
           f"embed_rows {name}: rows {rows.shape} and index {index.shape} do not fit x {x.shape}")
    (y,) = _g(x).node("embed_rows", [x, index, rows], [(name, (N, C), x.dtype)])
    return y


def embedding_bag(ids: Value, weights: Value, table: Value, name: str = "embed_bag") -> Value:
    """y[n] = sum_k weights[n, k] table[ids[n, k]]: ids int32 [N, K], weights f32 [N, K] (graph
    inputs made on the host), summed in f32 (F.embedding_bag(mode="sum", per_sample_weights);
    Qwen3-VL's position embeddings bilinearly resampled to each image's grid). Forward only: the
    table gets no gradient."""
    N, K = ids.shape
    V, C = table.shape
    _check(weights.shape == (N, K) and weights.dtype == "float32" and ids.dtype == "int32",
           f"embedding_bag {name}: ids {ids.shape} {ids.dtype}, weights {weights.shape} {weights.dtype}")
    (y,) = _g(ids).node("embedding_bag_fwd", [ids, weights, table], [(name, (N, C), table.dtype)])
    return y


# ---- norms ----------------------------------------------------------------------------------
def rmsnorm(x: Value, w: Value, eps: float, name: str = "norm", weight_offset: float = 0.0) -> Value:
    N, C = x.shape
    _check(w.shape == (C,), f"rmsnorm {name}: weight {w.shape} does not match width {C}")
    y, _ = _g(x).node("rmsnorm_fwd", [x, w], [(name, (N, C), x.dtype), (name + ".rstd", (N,), "float32")],
                      eps=float(eps), weight_offset=float(weight_offset))
    return y


def add_rmsnorm(x: Value, residual: Value, w: Value, eps: float, name: str = "norm",
                weight_offset: float = 0.0) -> tuple[Value, Value]:
    """(norm(x + residual), x + residual): the residual add folded into the next norm."""
    N, C = x.shape
    _check(residual.shape == x.shape, f"add_rmsnorm {name}: residual {residual.shape} != {x.shape}")
    y, h, _ = _g(x).node("add_rmsnorm_fwd", [x, residual, w],
                         [(name, (N, C), x.dtype), (name + ".residual", (N, C), x.dtype),
                          (name + ".rstd", (N,), "float32")],
                         eps=float(eps), weight_offset=float(weight_offset))
    return y, h


def layer_norm(x: Value, w: Value, b: Value | None, eps: float, name: str = "norm") -> Value:
    """torch's LayerNorm over the last dim (biased variance), times w, plus b (SigLIP's)."""
    N, C = x.shape
    _check(w.shape == (C,), f"layer_norm {name}: weight {w.shape} does not match width {C}")
    _check(b is None or b.shape == (C,), f"layer_norm {name}: bias {None if b is None else b.shape} != ({C},)")
    y, _, _ = _g(x).node("layer_norm_fwd", [x, w, b],
                         [(name, (N, C), x.dtype), (name + ".mean", (N,), "float32"),
                          (name + ".rstd", (N,), "float32")], eps=float(eps))
    return y


# ---- projections ----------------------------------------------------------------------------
@dataclass
class LoRASlice:
    """An adapter on the output columns [offset, offset + size) of a (possibly fused) linear:
    y[:, offset:offset+size] += scale * (x @ A.T) @ B.T, A [R, Cin], B [size, R]."""

    name: str
    A: Value
    B: Value
    scale: float
    offset: int
    size: int


def linear(x: Value, w: Value, bias: Value | None = None, lora: list[LoRASlice] | None = None,
           name: str = "linear", dropout: float = 0.0, rng: Value | None = None) -> Value:
    """y = x @ w.T (+ bias) (+ LoRA slices). w is [Cout, Cin] (the HF layout).

    dropout > 0 (peft's lora_dropout): the LoRA slices read dropout(x), the base projection x.
    The mask is `dropout_fwd`'s hash of (the seed in `rng`, an offset unique to this linear +
    element index), never stored; `rng` (int32 [2], a graph input the trainer rewrites each
    step) is the node's last input. Applied only when the graph is lowered with a backward
    pass (training); a forward-only lowering (eval) ignores it."""
    N, Cin = x.shape
    Cout, Cin_w = w.shape
    if w.dtype == "uint8" and "nf4" in w.meta:  # NF4: two 4-bit codes per byte
        _check(Cin == 2 * Cin_w, f"linear {name}: {w.name} rows of {Cin_w} bytes do not hold {Cin} NF4 values")
    elif w.dtype == "uint8":  # GGML blocks: Cin_w is bytes per row
        from surogate.io.gguf import row_bytes

        qtype = w.meta["ggml_type"]
        _check(Cin_w == row_bytes(qtype, Cin), f"linear {name}: {w.name} rows of {Cin_w} bytes do not hold {Cin} "
                                                f"values of GGML type {qtype}")
    else:
        _check(Cin == Cin_w, f"linear {name}: input width {Cin} != weight {w.name} {w.shape}")
    lora = lora or []
    inputs: list[Value | None] = [x, w, bias]
    outs: list = [(name, (N, Cout), x.dtype)]
    slices = []
    for s in lora:
        R = s.A.shape[0]
        _check(s.A.shape == (R, Cin), f"linear {name}: LoRA A {s.A.shape} != ({R}, {Cin})")
        _check(s.B.shape == (s.size, R), f"linear {name}: LoRA B {s.B.shape} != ({s.size}, {R})")
        _check(0 <= s.offset and s.offset + s.size <= Cout, f"linear {name}: LoRA slice out of range")
        inputs += [s.A, s.B]
        outs.append((f"{name}.lora_{s.name}.t", (N, R), x.dtype))
        slices.append({"name": s.name, "scale": float(s.scale), "offset": int(s.offset), "size": int(s.size)})
    attrs: dict = {"lora": slices}
    if dropout > 0 and slices:
        _check(0 < dropout < 1, f"linear {name}: dropout {dropout} is not in [0, 1)")
        _check(rng is not None and rng.shape == (2,) and rng.dtype == "int32",
               f"linear {name}: dropout needs an int32 [2] rng input")
        inputs.append(rng)
        # A distinct 2^32-element counter range per linear: its masks never repeat another's.
        full = _g(x).scoped(name)
        attrs.update(dropout=float(dropout), dropout_offset=(zlib.crc32(full.encode()) & 0x7FFFFFFF) << 32)
    y, *_ = _g(x).node("linear", inputs, outs, **attrs)
    return y


def add_rmsnorm_matmul(x: Value, residual: Value | None, w: Value, W: Value, bias: Value | None, eps: float,
                       name: str, norm_name: str, weight_offset: float = 0.0) -> tuple[Value, Value]:
    """Serving (made by surogate/compile/fuse.py from a norm and the one linear reading it):
    (rmsnorm(x + residual) @ W.T (+ bias), x + residual) in one op, the norm made
    while the matmul loads its operand (runtime/fused_matmul.h). residual None (a first layer):
    rmsnorm(x) and x itself. Forward only: autodiff refuses it."""
    N, C = x.shape
    Cout, Cin = W.shape
    _check(w.shape == (C,), f"add_rmsnorm_matmul {name}: norm weight {w.shape} does not match width {C}")
    _check(Cin == C, f"add_rmsnorm_matmul {name}: input width {C} != weight {W.name} {W.shape}")
    _check(residual is None or residual.shape == x.shape,
           f"add_rmsnorm_matmul {name}: residual {None if residual is None else residual.shape} != {x.shape}")
    h_spec = (norm_name + ".residual", (N, C), x.dtype) if residual is not None else None
    y, h = _g(x).node("add_rmsnorm_matmul", [x, residual, w, W, bias], [(name, (N, Cout), x.dtype), h_spec],
                      eps=float(eps), weight_offset=float(weight_offset))
    return y, (h if residual is not None else x)


def gated_matmul(gu: Value, W: Value, bias: Value | None, act: str, name: str) -> Value:
    """Serving (made by surogate/compile/fuse.py from swiglu / geglu and down_proj):
    act(gate) * up @ W.T (+ bias) in one op, gu = [gate, up] as swiglu / geglu read
    it (act "silu" or "gelu_tanh"), the activation made while the matmul loads its operand.
    Forward only: autodiff refuses it."""
    N, F2 = gu.shape
    Cout, F = W.shape
    _check(act in ("silu", "gelu_tanh"), f"gated_matmul {name}: act {act!r} is not 'silu' or 'gelu_tanh'")
    _check(F2 == 2 * F, f"gated_matmul {name}: gu width {F2} != 2 x the weight {W.name} {W.shape} input width")
    (y,) = _g(gu).node("gated_matmul", [gu, W, bias], [(name, (N, Cout), gu.dtype)], act=act)
    return y


def view(x: Value, shape: Shape, name: str | None = None) -> Value:
    g = _g(x)
    if name is None:  # x.name is already scoped; node() scopes again, so strip our scope
        prefix = g.scoped("")
        name = (x.name[len(prefix):] if prefix and x.name.startswith(prefix) else x.name) + ".view"
    (y,) = g.node("view", [x], [(name, tuple(shape), x.dtype)])
    return y


def columns(x: Value, offset: int, shape: Shape, name: str) -> Value:
    """Columns [offset, offset + prod(shape[1:])) of a 2-D value, seen as ``shape`` (rows first):
    a strided view, no copy (the rows of a fused projection's parts: surogate/compile/fuse.py's
    fused QKV). Forward only."""
    rows, cols = x.shape
    size = 1
    for d in shape[1:]:
        size *= d
    _check(shape[0] == rows and 0 <= offset and offset + size <= cols,
           f"columns {name}: [{offset}, {offset + size}) of {x.shape} as {shape}")
    (y,) = _g(x).node("columns", [x], [(name, tuple(shape), x.dtype)], offset=int(offset))
    return y


# ---- positions ------------------------------------------------------------------------------
def rope(x: Value, pos: Value, rope_attrs: dict, name: str = "rope") -> Value:
    (y,) = _g(x).node("rope_fwd", [x, pos], [(name, x.shape, x.dtype)], **rope_attrs)
    return y


def _offset_attr(weight_offset: float) -> dict:
    # Only a non-zero offset is written, so that the graphs of families without one stay as pinned
    # (tests/compile/fuse_golden.json).
    return {"weight_offset": float(weight_offset)} if weight_offset else {}


def qk_norm_rope(x: Value, w: Value, pos: Value, eps: float, rope_attrs: dict, name: str = "qk",
                 weight_offset: float = 0.0) -> Value:
    """Per-head RMSNorm (times ``w + weight_offset``), then rope."""
    N, H, D = x.shape
    y, _ = _g(x).node("qk_norm_rope_fwd", [x, w, pos],
                      [(name, x.shape, x.dtype), (name + ".rstd", (N, H), "float32")],
                      eps=float(eps), **_offset_attr(weight_offset), **rope_attrs)
    return y


def rope_table(x: Value, cos: Value, sin: Value, name: str = "rope", round_products: bool = False) -> Value:
    """RoPE by given per-token angles: cos / sin f32 [N, half] (graph inputs made on the host), dims i
    and i + half of each head rotated (HF's rotate_half), dims from 2 half on passed through; f32 math,
    one rounding (Qwen3-VL's vision rotary, apply_rotary_pos_emb_vision). ``round_products``: cos /
    sin, each product and the sum rounded to x's dtype instead (HF's text rope, apply_rotary_pos_emb
    in bf16: Qwen3-VL's MRoPE)."""
    N, H, D = x.shape
    _check(cos.shape == sin.shape and cos.shape[0] == N and 0 < 2 * cos.shape[1] <= D,
           f"rope_table {name}: cos {cos.shape} / sin {sin.shape} do not fit x {x.shape}")
    _check(cos.dtype == "float32" and sin.dtype == "float32", f"rope_table {name}: cos / sin must be float32")
    (y,) = _g(x).node("rope_table_fwd", [x, cos, sin], [(name, x.shape, x.dtype)],
                      **({"round_products": 1} if round_products else {}))
    return y


# ---- attention ------------------------------------------------------------------------------
def attention(q: Value, k: Value, v: Value, cu_seqlens: Value, *, causal: bool = True, scale: float = 0.0,
              window: int = 0, softcap: float = 0.0, sinks: Value | None = None, kv_limit: Value | None = None,
              name: str = "attn") -> Value:
    """``sinks`` [Hq] (GPT-OSS): a learned logit per query head in each row's softmax denominator.
    ``kv_limit`` int32 [N] (causal only; Gemma 3's bidirectional image spans): per query token the
    last key it sees, counted from its document's start (i for a causal token, the span's last
    index for a token of an image span); a window keeps its lower bound."""
    N, Hq, D = q.shape
    _, Hkv, Dk = k.shape
    _check(D == Dk and v.shape == k.shape, f"attention {name}: q {q.shape}, k {k.shape}, v {v.shape}")
    _check(Hq % Hkv == 0, f"attention {name}: {Hq} query heads are not a multiple of {Hkv} kv heads")
    _check(sinks is None or sinks.shape == (Hq,), f"attention {name}: sinks {sinks and sinks.shape} != ({Hq},)")
    _check(kv_limit is None or (kv_limit.shape == (N,) and kv_limit.dtype == "int32"),
           f"attention {name}: kv_limit {kv_limit and (kv_limit.shape, kv_limit.dtype)} is not int32 ({N},)")
    _check(kv_limit is None or causal, f"attention {name}: kv_limit widens a causal mask; this one is not causal")
    ins = [q, k, v, cu_seqlens] + ([sinks] if sinks is not None or kv_limit is not None else [])
    ins += [kv_limit] if kv_limit is not None else []
    out, _ = _g(q).node("attention_fwd", ins,
                        [(name, (N, Hq, D), q.dtype), (name + ".lse", (N, Hq), "float32")],
                        causal=int(causal), scale=float(scale), window=int(window), softcap=float(softcap))
    return out


def kv_cache_write(k: Value, v: Value, slots: Value, k_cache: Value, v_cache: Value) -> None:
    """Store this step's K/V rows at their cache slots (slot -1: skip). The caches are graph
    inputs the node writes into."""
    _g(k).node("kv_cache_write", [k, v, slots], [k_cache, v_cache])


def qkv_rope_cache(q: Value, k: Value, v: Value, pos: Value, slots: Value, k_cache: Value, v_cache: Value,
                   rope_attrs: dict, *, q_norm: Value | None = None, k_norm: Value | None = None, eps: float = 1e-6,
                   weight_offset: float = 0.0, name: str = "q_rope") -> Value:
    """Serving: rope on q and k (each head RMS-normed first when q_norm / k_norm are given), k and
    v stored at their cache slots (slot -1: skip), all in one op. Returns the roped q. Forward
    only: autodiff refuses it (serving graphs are not differentiated)."""
    D, Dk = q.shape[2], k.shape[2]
    _check(D == Dk and v.shape == k.shape, f"qkv_rope_cache {name}: q {q.shape}, k {k.shape}, v {v.shape}")
    _check((q_norm is None) == (k_norm is None), f"qkv_rope_cache {name}: give both q_norm and k_norm or neither")
    norms = [q_norm, k_norm] if q_norm is not None else []
    q_out, _, _ = _g(q).node("qkv_rope_cache", [q, k, v, pos, slots, *norms],
                             [(name, q.shape, q.dtype), k_cache, v_cache], eps=float(eps),
                             **_offset_attr(weight_offset), **rope_attrs)
    return q_out


def paged_attention(q: Value, k_cache: Value, v_cache: Value, block_tables: Value, cu_q: Value,
                    context_lens: Value, *, scale: float = 0.0, window: int = 0, softcap: float = 0.0,
                    sinks: Value | None = None, kv_limit: Value | None = None, name: str = "attn") -> Value:
    """Attention of this step's queries over each sequence's cached context (decode, prefill
    chunks and mixed batches alike). ``kv_limit`` [N] int32: the last key position (of its
    sequence) each query may see; absent, causal (its own position). A query inside a
    bidirectional span (Gemma 3's image tokens) sees up to the span's end; the window still
    counts back from the query's own position."""
    N, Hq, D = q.shape
    attrs = {"window": int(window), "softcap": float(softcap)}
    if scale > 0:  # absent: the kernel's default, 1/sqrt(D)
        attrs["scale"] = float(scale)
    ins = [q, k_cache, v_cache, block_tables, cu_q, context_lens] + ([sinks] if sinks is not None else [])
    if kv_limit is not None:
        _check(kv_limit.shape == (N,), f"paged_attention {name}: kv_limit {kv_limit.shape} != ({N},)")
        ins = ins + ([None] if sinks is None else []) + [kv_limit]
    out, _ = _g(q).node("paged_attention", ins, [(name, (N, Hq, D), q.dtype), None], **attrs)
    return out


# ---- short convolution ----------------------------------------------------------------------
def short_conv(bcx: Value, w: Value, cu_seqlens: Value, bias: Value | None = None, name: str = "conv") -> Value:
    """LFM2's gated short convolution: bcx [N, 3C] = [B, C, x] (in_proj's output) ->
    C * causal_depthwise_conv1d(B * x) [N, C], w [C, 1, L] (HF's Conv1d layout) or [C, L], the
    window stopping at each document's start (cu_seqlens)."""
    N, C3 = bcx.shape
    C, L = w.shape[0], w.shape[-1]
    _check(C3 == 3 * C, f"short_conv {name}: bcx width {C3} != 3 x the {C} channels of {w.name} {w.shape}")
    _check(bias is None or bias.shape == (C,), f"short_conv {name}: bias {None if bias is None else bias.shape}")
    (y,) = _g(bcx).node("short_conv_fwd", [bcx, w, cu_seqlens, bias], [(name, (N, C), bcx.dtype)])
    return y


def short_conv_cache(bcx: Value, w: Value, state_slots: Value, cu_q: Value, context_lens: Value, conv_state: Value,
                     bias: Value | None = None, name: str = "conv") -> Value:
    """Serving: short_conv over each sequence's span of the step, its window continued from
    conv_state[state_slots[s]] ([slots, L-1, C], the sequence's last L-1 inputs B * x), which the
    op then rewrites (in place); a span at position 0 starts from zeros. Forward only."""
    N, C3 = bcx.shape
    (y, _) = _g(bcx).node("short_conv_cache", [bcx, w, state_slots, cu_q, context_lens, bias],
                          [(name, (N, C3 // 3), bcx.dtype), conv_state])
    return y


# ---- pooling --------------------------------------------------------------------------------
def mean_pool_2d(x: Value, height: int, width: int, kernel: int, name: str = "pool") -> Value:
    """x [B*H*W, C], B row-major H x W patch grids -> [B*(H/k)*(W/k), C]: the mean of each k x k
    block, row-major per image (Gemma 3's multimodal projector: AvgPool2d over the patch grid)."""
    N, C = x.shape
    _check(height > 0 and width > 0 and kernel > 0 and height % kernel == 0 and width % kernel == 0,
           f"mean_pool_2d {name}: kernel {kernel} does not divide the {height} x {width} patch grid")
    cells, pooled = height * width, (height // kernel) * (width // kernel)
    times = N.times if isinstance(N, Dim) else N  # rows: B images (a symbolic B: Dim("B", cells))
    _check(times % cells == 0, f"mean_pool_2d {name}: {N} rows are not whole {height} x {width} grids")
    M = Dim(N.name, times // cells * pooled) if isinstance(N, Dim) else N // cells * pooled
    (y,) = _g(x).node("mean_pool_2d_fwd", [x], [(name, (M, C), x.dtype)], height=int(height), width=int(width),
                      kernel=int(kernel))
    return y


# ---- activations ----------------------------------------------------------------------------
def swiglu(gu: Value, name: str = "act") -> Value:
    N, F2 = gu.shape
    (y,) = _g(gu).node("swiglu_fwd", [gu], [(name, (N, F2 // 2), gu.dtype)])
    return y


def swiglu_oai(gu: Value, alpha: float, limit: float, name: str = "act") -> Value:
    """GPT-OSS's clamped SwiGLU over interleaved gate / up columns (gate 2j, up 2j + 1):
    (clamp(up, -limit, limit) + 1) * g sigmoid(alpha g), g = min(gate, limit)."""
    N, F2 = gu.shape
    (y,) = _g(gu).node("swiglu_oai_fwd", [gu], [(name, (N, F2 // 2), gu.dtype)], alpha=float(alpha),
                       limit=float(limit))
    return y


def geglu(gu: Value, name: str = "act") -> Value:
    N, F2 = gu.shape
    (y,) = _g(gu).node("geglu_fwd", [gu], [(name, (N, F2 // 2), gu.dtype)])
    return y


def act_mul(a: Value, b: Value, act: str = "none", name: str = "act_mul") -> Value:
    """act(a) * b, act "none", "gelu_tanh" (geglu over two tensors) or "gelu" (the exact erf form);
    b of a's shape, or of one value (a scalar tensor: Gemma 4's layer scalar), whose gradient is
    then not available."""
    _check(act in ("none", "gelu_tanh", "gelu"), f"act_mul {name}: act {act!r} is not none, gelu_tanh or gelu")
    _check(b.shape == a.shape or b.shape in ((1,), (1, 1)), f"act_mul {name}: b {b.shape} is neither {a.shape} nor one value")
    (y,) = _g(a).node("act_mul_fwd", [a, b], [(name, a.shape, a.dtype)], act=act)
    return y


def gelu_tanh(x: Value, name: str = "act") -> Value:
    """The plain GELU, tanh approximation (gelu_pytorch_tanh: SigLIP's MLP): act_mul without b,
    the math geglu's gate uses."""
    (y,) = _g(x).node("act_mul_fwd", [x, None], [(name, x.shape, x.dtype)], act="gelu_tanh")
    return y


def gelu(x: Value, name: str = "act") -> Value:
    """The exact GELU, x Phi(x) with erf (torch's nn.GELU(): Qwen3-VL's patch mergers): act_mul
    without b."""
    (y,) = _g(x).node("act_mul_fwd", [x, None], [(name, x.shape, x.dtype)], act="gelu")
    return y


def softcap(x: Value, cap: float, name: str = "softcap") -> Value:
    """cap * tanh(x / cap) (Gemma's final logit soft-capping in inference graphs). Forward only:
    training graphs fold it into lm_head_ce."""
    _check(cap > 0, f"softcap {name}: cap must be > 0, got {cap}")
    (y,) = _g(x).node("softcap_fwd", [x], [(name, x.shape, x.dtype)], cap=float(cap))
    return y


def cast(x: Value, dtype: str, name: str = "cast") -> Value:
    """x in ``dtype`` (any float dtypes; to bf16 / f16 rounded to nearest even): an input made in
    f32 on the host rounded on the device (Qwen3-VL's pixel rows), not by a host-side astype."""
    _check(dtype in ("float32", "bfloat16", "float16") and x.dtype in ("float32", "bfloat16", "float16"),
           f"cast {name}: {x.dtype} -> {dtype}: cast takes float dtypes only")
    if x.dtype == dtype:
        return x
    (y,) = _g(x).node("cast", [x], [(name, x.shape, dtype)])
    return y


def fill(g: Graph, shape: Shape, dtype: str, value: float, name: str) -> Value:
    """A constant tensor (a norm without a weight reads ones)."""
    (y,) = g.node("fill", [], [(name, tuple(shape), dtype)], value=float(value))
    return y


def scale(x: Value, alpha: float, name: str = "scale") -> Value:
    """alpha * x, rounded to x's dtype (Gemma's embedding times sqrt(hidden))."""
    (y,) = _g(x).node("scale", [x], [(name, x.shape, x.dtype)], alpha=float(alpha))
    return y


def add(a: Value, b: Value, name: str = "add") -> Value:
    _check(a.shape == b.shape, f"add {name}: {a.shape} != {b.shape}")
    (y,) = _g(a).node("add", [a, b], [(name, a.shape, a.dtype)])
    return y


# ---- loss -----------------------------------------------------------------------------------
def lm_head_ce(h: Value, w: Value, targets: Value, *, ignore_index: int = -100, label_smoothing: float = 0.0,
               softcap: float = 0.0, chunk: int = 4096, name: str = "loss") -> Value:
    """Per-token cross-entropy of softmax(h @ w.T) against targets, fused and chunked over the
    vocabulary: the [N, V] logits are never stored."""
    N, C = h.shape
    loss, _ = _g(h).node("lm_head_ce_fwd", [h, w, targets],
                         [(name, (N,), "float32"), (name + ".lse", (N,), "float32")],
                         ignore_index=int(ignore_index), label_smoothing=float(label_smoothing),
                         softcap=float(softcap), chunk=int(chunk))
    return loss


# ---- serving --------------------------------------------------------------------------------
def argmax(x: Value, name: str = "argmax") -> Value:
    """int32 [R]: the lowest index of each row's largest value, -1 for a row with a NaN or +inf
    (the greedy token, picked on the device)."""
    R, _ = x.shape
    (y,) = _g(x).node("argmax", [x], [(name, (R,), "int32")])
    return y


def sample(logits: Value, params: Value, name: str = "sampled", rank: bool = True) -> tuple[Value, Value, Value | None]:
    """(token int32 [R], logprob f32 [R], rank int32 [R] or None): one token per logits row, on
    the device. params f32 [R, 8] per row: temperature, top_k, top_p, min_p, seed_lo, seed_hi,
    step (uint32 bit patterns), reserved. Below temperature 1e-5 the token is argmax's; otherwise
    top-k, top-p, min-p as the engine's Sampler and one Philox draw keyed by the seed at that step.
    logprob is the raw log_softmax of the row at the token, rank 1 the most likely. Serving only."""
    R, _ = logits.shape
    _check(params.shape == (R, 8) and params.dtype == "float32",
           f"sample {name}: params {params.dtype}{list(params.shape)} must be float32 [{R}, 8]")
    outs = [(name, (R,), "int32"), (name + ".logprob", (R,), "float32"),
            (name + ".rank", (R,), "int32") if rank else None]
    tok, lp, rk = _g(logits).node("sample", [logits, params], outs)
    return tok, lp, rk


def weight_fetch(src: Value, dst: Value) -> None:
    """dst <- src: a layer's packed weights (uint8 [n], host memory) copied into a staging
    buffer on the device (its parameters are bound inside it), on a copy stream that overlaps the
    nodes after it until `weight_wait(dst)`. Serving with weights in host memory: placed by
    surogate/compile/offload.py, never by model code; no derivative."""
    _check(src.dtype == dst.dtype == "uint8" and src.shape == dst.shape and len(src.shape) == 1,
           f"weight_fetch: src {src} and dst {dst} must be uint8 [n] of one size")
    _check(bool(src.meta.get("host")), f"weight_fetch: src {src.name} must be a host buffer (meta host=True)")
    _g(src).node("weight_fetch", [src], [dst])


def weight_wait(dst: Value) -> None:
    """The nodes after this one wait for the weight_fetch into dst."""
    _g(dst).node("weight_wait", [dst], [])


# ---- mixture of experts ---------------------------------------------------------------------
# The fused_moe op set (kernels_native/runtime/op_checks_moe.h): route, permute the rows into
# expert-contiguous order, one grouped GEMM per projection over all experts, un-permute with the
# routing weights. E experts, K = top_k per token; the permuted rows are N * K, a static shape.
def moe_router(logits: Value, top_k: int, norm_topk_prob: bool, name: str = "router") -> tuple[Value, Value, Value]:
    """(weights [N, K] in logits' dtype, expert indices int32 [N, K], probs f32 [N, E]): softmax
    over the experts, the K largest, renormalised to sum 1 with norm_topk_prob."""
    N, E = logits.shape
    _check(1 <= top_k <= E, f"moe_router {name}: top_k {top_k} is not in [1, {E}]")
    w, idx, p = _g(logits).node("moe_router_fwd", [logits],
                                [(name + ".weights", (N, top_k), logits.dtype), (name + ".idx", (N, top_k), "int32"),
                                 (name + ".probs", (N, E), "float32")], norm_topk_prob=int(norm_topk_prob))
    return w, idx, p


def moe_permute(x: Value, idx: Value, num_experts: int, name: str = "permute") -> tuple[Value, Value, Value]:
    """(xp [N * K, C]: x's rows grouped by expert, rows int32 [N, K]: where each (token, choice)
    went, offsets int32 [E + 1]: each expert's first row)."""
    N, C = x.shape
    _, K = idx.shape
    M = N * K
    xp, rows, off = _g(x).node("moe_permute", [x, idx],
                               [(name, (M, C), x.dtype), (name + ".rows", (N, K), "int32"),
                                (name + ".offsets", (num_experts + 1,), "int32")])
    return xp, rows, off


def moe_unpermute(yp: Value, rows: Value, weights: Value, name: str = "unpermute") -> Value:
    """y[n] = sum_k weights[n, k] yp[rows[n, k]]: the experts' outputs weighted back to their tokens."""
    N, K = rows.shape
    _, C = yp.shape
    (y,) = _g(yp).node("moe_unpermute_fwd", [yp, rows, weights], [(name, (N, C), yp.dtype)])
    return y


def moe_grouped_matmul(x: Value, w: Value, offsets: Value, name: str = "experts") -> Value:
    """Each expert's rows of x [M, Cin] (offsets from moe_permute) times its w[e].T, w [E, Cout, Cin]."""
    M, Cin = x.shape
    E, Cout, Cin_w = w.shape
    _check(Cin == Cin_w, f"moe_grouped_matmul {name}: input width {Cin} != weight {w.name} {w.shape}")
    _check(offsets.shape == (E + 1,), f"moe_grouped_matmul {name}: offsets {offsets.shape} != ({E + 1},)")
    (y,) = _g(x).node("moe_grouped_matmul", [x, w, offsets], [(name, (M, Cout), x.dtype)], trans_b=1)
    return y


def moe_bias_add(x: Value, b: Value, offsets: Value, name: str = "experts_bias") -> Value:
    """x [M, C] in moe_permute's order plus each expert's bias row b[e] [E, C] (GPT-OSS)."""
    M, C = x.shape
    E, Cb = b.shape
    _check(Cb == C and offsets.shape == (E + 1,), f"moe_bias_add {name}: x {x.shape}, b {b.shape}, offsets {offsets.shape}")
    (y,) = _g(x).node("moe_bias_add", [x, b, offsets], [(name, (M, C), x.dtype)])
    return y


def moe_aux_loss(routers: list[tuple[Value, Value]], name: str = "aux_loss") -> Value:
    """transformers' load_balancing_loss_func over the (probs, idx) of every MoE layer: f32 [1]."""
    _check(bool(routers), f"moe_aux_loss {name}: no MoE layer")
    E = routers[0][0].shape[1]
    ins = [v for pair in routers for v in pair]
    loss, _ = _g(*ins).node("moe_aux_loss_fwd", ins, [(name, (1,), "float32"), (name + ".counts", (E,), "float32")])
    return loss


def moe_z_loss(logits: list[Value], name: str = "z_loss") -> Value:
    """ST-MoE's router z-loss over every MoE layer's router logits [N, E]: the mean over the
    layers' rows of logsumexp(logits)^2 (HF's router_z_loss_func on the layers concatenated): f32 [1]."""
    _check(bool(logits), f"moe_z_loss {name}: no MoE layer")
    _check(all(v.shape == logits[0].shape for v in logits), f"moe_z_loss {name}: the layers' logits differ in shape")
    (loss,) = _g(*logits).node("moe_z_loss_fwd", list(logits), [(name, (1,), "float32")])
    return loss
