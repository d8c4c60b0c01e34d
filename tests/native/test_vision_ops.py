"""The ops the vision towers added, on the CPU, against torch: layer_norm (F.layer_norm), plain
gelu_tanh (act_mul without b: F.gelu(approximate="tanh")), mean_pool_2d (F.avg_pool2d over each
image's patch grid, transformers' Gemma3MultiModalProjector), and the training attention's kv_limit
(bidirectional image spans, transformers' Gemma 3 mask). Each forward and gradient is checked
against f64 torch autograd; the DSL ops through surogate.autodiff and a compiled Program too."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sgtest.ops import as_dtype, assert_close, f32, run_op
from surogate import _native
from surogate.autodiff import backward
from surogate.compile import Executable
from surogate.dsl import Graph, ops
from surogate.errors import InvalidArgumentError, ShapeError

DTYPES = ["float32", "bfloat16"]


def rand(shape, dtype="float32", seed=0, scale=1.0, shift=0.0):
    return as_dtype(np.random.default_rng(seed).standard_normal(shape) * scale + shift, dtype)


def t64(a, grad=False):
    return torch.tensor(f32(a), dtype=torch.float64, requires_grad=grad)


def close(actual, expected, dtype, scale=1.0):
    """f32 to ~1e-5; bf16 / f16 outputs (and grads computed from rounded inputs) looser."""
    if dtype == "float32":
        assert_close(actual, expected, rtol=1e-5, atol=2e-5 * scale)
    else:
        assert_close(f32(actual), expected, dtype, atol=2e-2 * scale)


def run_graph(build, params: dict, inputs: dict, seed: np.ndarray):
    """Build a graph with `build(p, i) -> y` over params (all trainable) and inputs,
    differentiate sum(y * seed), compile it on the CPU and run: (y, {param: grad})."""
    g = Graph("t")
    p = {k: g.param(k, v.shape, v.dtype.name) for k, v in params.items()}
    ins = {k: g.input(k, v.shape, v.dtype.name) for k, v in inputs.items()}
    y = build(p, ins)
    grads = backward(g, y, seed_name="dy")
    exe = Executable(g, {}, keep=[y])
    for k, v in {**params, **inputs, "dy": seed}.items():
        exe.bind(k, np.ascontiguousarray(v))
    out = {k: np.zeros(v.shape, np.float32) for k, v in params.items()}
    for k, buf in grads.items():
        exe.bind(buf.name, out[k])
    exe.run()
    return exe.read(y.name), out


def through_linear(x, P):
    """h = x @ P.T in f64 torch, P a leaf: a parameter gradient that carries the op's dx
    (a DSL parameter only receives the gradients that rules write into its accumulator)."""
    Pt = t64(P, True)
    return t64(x) @ Pt.T, Pt


# ---- layer_norm -------------------------------------------------------------------------------

LN_SHAPES = [(1, 64), (7, 80), (33, 1152), (5, 13)]


def ln_inputs(n, c, dtype, seed=0):
    x = rand((n, c), dtype, seed, scale=2.0, shift=0.5)
    w = rand(c, dtype, seed + 1, scale=0.3, shift=1.0)
    b = rand(c, dtype, seed + 2, scale=0.2)
    dy = rand((n, c), dtype, seed + 3)
    return x, w, b, dy


def ln_ref(x, w, b, dy, eps):
    xt, wt = t64(x, True), t64(w, True)
    bt = t64(b, True) if b is not None else None
    y = F.layer_norm(xt, (xt.shape[-1],), wt, bt, eps)
    (y * t64(dy)).sum().backward()
    mean = xt.detach().mean(-1)
    rstd = 1 / torch.sqrt(xt.detach().var(-1, unbiased=False) + eps)
    return (y.detach().numpy(), mean.numpy(), rstd.numpy(), xt.grad.numpy(), wt.grad.numpy(),
            None if bt is None else bt.grad.numpy())


def ln_fwd(x, w, b, eps):
    n, c = x.shape
    return run_op("layer_norm_fwd", [x, w, b], [((n, c), x.dtype.name), ((n,), "float32"), ((n,), "float32")], eps=eps)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", LN_SHAPES)
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_matches_torch(dtype, shape, bias):
    eps = 1e-6
    x, w, b, dy = ln_inputs(*shape, dtype)
    b = b if bias else None
    y_ref, mean_ref, rstd_ref, dx_ref, dw_ref, db_ref = ln_ref(x, w, b, dy, eps)
    y, mean, rstd = ln_fwd(x, w, b, eps)
    close(y, y_ref, dtype)
    assert_close(mean, mean_ref, rtol=1e-5, atol=1e-5)
    assert_close(rstd, rstd_ref, rtol=1e-5, atol=1e-5)
    n, c = shape
    outs = [np.zeros((n, c), x.dtype), np.zeros(c, np.float32), np.zeros(c, np.float32) if bias else None]
    _native.call_op("layer_norm_bwd", [dy, x, w, mean, rstd], outs, {})
    dx, dw, db = outs
    close(dx, dx_ref, dtype, scale=4.0)
    # Parameter gradients are sums over the rows, kept in f32.
    assert_close(dw, dw_ref, rtol=1e-4 if dtype == "float32" else 2e-2, atol=1e-4 * n)
    if bias:
        assert_close(db, db_ref, rtol=1e-5, atol=1e-5 * n)


def test_layer_norm_gradients_accumulate_and_may_be_absent():
    x, w, b, dy = ln_inputs(9, 24, "float32")
    y, mean, rstd = ln_fwd(x, w, b, 1e-5)
    full = [np.zeros_like(x), np.zeros(24, np.float32), np.zeros(24, np.float32)]
    _native.call_op("layer_norm_bwd", [dy, x, w, mean, rstd], full, {})
    acc = [np.zeros_like(x), np.full(24, 1.5, np.float32), np.full(24, -2.0, np.float32)]
    _native.call_op("layer_norm_bwd", [dy, x, w, mean, rstd], acc, {"accumulate": True})
    np.testing.assert_array_equal(acc[0], full[0])
    np.testing.assert_allclose(acc[1], full[1] + 1.5, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(acc[2], full[2] - 2.0, rtol=1e-6, atol=1e-6)
    only_dx = [np.zeros_like(x), None, None]
    _native.call_op("layer_norm_bwd", [dy, x, w, mean, rstd], only_dx, {})
    np.testing.assert_array_equal(only_dx[0], full[0])


def test_layer_norm_refuses_a_bias_of_the_wrong_width():
    x, w, b, _ = ln_inputs(3, 16, "float32")
    with pytest.raises(ShapeError, match="layer_norm_fwd: b"):
        ln_fwd(x, w, b[:8].copy(), 1e-6)


def test_layer_norm_dsl_op_trains_through_autodiff():
    x, w, b, dy = ln_inputs(6, 40, "float32", seed=5)
    P = rand((40, 40), seed=9, scale=0.2)
    y, grads = run_graph(lambda p, i: ops.layer_norm(ops.linear(i["x"], p["P"]), p["w"], p["b"], 1e-6),
                         {"P": P, "w": w, "b": b}, {"x": x}, dy)
    h, Pt = through_linear(x, P)
    wt, bt = t64(w, True), t64(b, True)
    y_ref = F.layer_norm(h, (40,), wt, bt, 1e-6)
    (y_ref * t64(dy)).sum().backward()
    close(y, y_ref.detach().numpy(), "float32")
    assert_close(grads["P"], Pt.grad.numpy(), rtol=1e-4, atol=1e-4)
    assert_close(grads["w"], wt.grad.numpy(), rtol=1e-4, atol=1e-4)
    assert_close(grads["b"], bt.grad.numpy(), rtol=1e-5, atol=1e-5)


# ---- gelu_tanh (act_mul without b) ----------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_tanh_matches_torch(dtype):
    x = rand((13, 77), dtype, seed=3, scale=3.0)
    dy = rand((13, 77), dtype, seed=4)
    (y,) = run_op("act_mul_fwd", [x, None], [((13, 77), dtype)], act="gelu_tanh")
    dx = np.zeros_like(x)
    _native.call_op("act_mul_bwd", [dy, x, None], [dx, None], {"act": "gelu_tanh"})
    xt = t64(x, True)
    y_ref = F.gelu(xt, approximate="tanh")
    (y_ref * t64(dy)).sum().backward()
    close(y, y_ref.detach().numpy(), dtype)
    close(dx, xt.grad.numpy(), dtype)
    if dtype == "bfloat16":  # one rounding of the f32 math, as torch's bf16 gelu: at most one ulp apart
        want = F.gelu(torch.tensor(f32(x)).to(torch.bfloat16), approximate="tanh").float().numpy()
        assert np.abs(f32(y) - want).max() <= np.abs(want).max() * 2 ** -7


def test_gelu_tanh_without_b_has_no_db():
    x = rand((4, 8))
    with pytest.raises(InvalidArgumentError, match="there is no b"):
        run_op("act_mul_bwd", [x, x, None], [((4, 8), "float32"), ((4, 8), "float32")], act="gelu_tanh")


def test_gelu_tanh_dsl_op_trains_through_autodiff():
    x, dy = rand((5, 24), seed=1), rand((5, 12), seed=2)
    P = rand((12, 24), seed=3, scale=0.5)
    y, grads = run_graph(lambda p, i: ops.gelu_tanh(ops.linear(i["x"], p["P"])), {"P": P}, {"x": x}, dy)
    h, Pt = through_linear(x, P)
    y_ref = F.gelu(h, approximate="tanh")
    (y_ref * t64(dy)).sum().backward()
    close(y, y_ref.detach().numpy(), "float32")
    assert_close(grads["P"], Pt.grad.numpy(), rtol=1e-5, atol=1e-5)


# ---- mean_pool_2d -----------------------------------------------------------------------------

def pool_ref(x, dy, B, H, W, k):
    """F.avg_pool2d over each image's [C, H, W] grid (rows row-major), back to [B*Ho*Wo, C]."""
    C = x.shape[1]
    xt = t64(x, True)
    grid = xt.reshape(B, H, W, C).permute(0, 3, 1, 2)
    y = F.avg_pool2d(grid, k, k).permute(0, 2, 3, 1).reshape(-1, C)
    (y * t64(dy)).sum().backward()
    return y.detach().numpy(), xt.grad.numpy()


def pool(x, H, W, k):
    B = x.shape[0] // (H * W)
    return run_op("mean_pool_2d_fwd", [x], [((B * (H // k) * (W // k), x.shape[1]), x.dtype.name)], height=H,
                  width=W, kernel=k)[0]


def pool_bwd(dy, H, W, k):
    B = dy.shape[0] // ((H // k) * (W // k))
    return run_op("mean_pool_2d_bwd", [dy], [((B * H * W, dy.shape[1]), dy.dtype.name)], height=H, width=W,
                  kernel=k)[0]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,H,W,k,C", [(1, 4, 4, 2, 8), (3, 12, 12, 3, 5), (2, 6, 9, 3, 16), (2, 4, 4, 1, 3),
                                       (1, 8, 8, 8, 7)])
def test_mean_pool_2d_matches_avg_pool2d(dtype, B, H, W, k, C):
    x = rand((B * H * W, C), dtype, seed=1)
    dy = rand((B * (H // k) * (W // k), C), dtype, seed=2)
    y_ref, dx_ref = pool_ref(x, dy, B, H, W, k)
    close(pool(x, H, W, k), y_ref, dtype)
    close(pool_bwd(dy, H, W, k), dx_ref, dtype)


def test_mean_pool_2d_rows_are_gemma3_projectors_order():
    """The rows transformers' Gemma3MultiModalProjector pools (its norm's input) are ours, in order."""
    from transformers import Gemma3Config
    from transformers.models.gemma3.modeling_gemma3 import Gemma3MultiModalProjector

    cfg = Gemma3Config(vision_config=dict(image_size=48, patch_size=4, hidden_size=8, intermediate_size=16,
                                          num_hidden_layers=1, num_attention_heads=2),
                       text_config=dict(hidden_size=16, vocab_size=64, num_hidden_layers=1, intermediate_size=32,
                                        num_attention_heads=2, num_key_value_heads=1, head_dim=8),
                       mm_tokens_per_image=16)
    proj = Gemma3MultiModalProjector(cfg)
    seen = {}
    proj.mm_soft_emb_norm.register_forward_pre_hook(lambda m, args: seen.setdefault("pooled", args[0]))
    x = rand((2 * 144, 8), seed=7)
    with torch.no_grad():
        proj(torch.tensor(x).reshape(2, 144, 8))
    want = seen["pooled"].reshape(-1, 8).numpy()
    assert_close(pool(x, 12, 12, proj.kernel_size), want, rtol=1e-6, atol=1e-6)


def test_mean_pool_2d_refuses_a_kernel_that_does_not_divide_the_grid():
    with pytest.raises(InvalidArgumentError, match="does not divide"):
        run_op("mean_pool_2d_fwd", [rand((36, 4))], [((4, 4), "float32")], height=6, width=6, kernel=4)
    with pytest.raises(ShapeError, match="whole number"):
        run_op("mean_pool_2d_fwd", [rand((30, 4))], [((4, 4), "float32")], height=6, width=6, kernel=3)


def test_mean_pool_2d_dsl_op_trains_through_autodiff():
    x, dy = rand((2 * 36, 6), seed=3), rand((2 * 4, 6), seed=4)
    P = rand((6, 6), seed=5, scale=0.5)
    y, grads = run_graph(lambda p, i: ops.mean_pool_2d(ops.linear(i["x"], p["P"]), 6, 6, 3), {"P": P}, {"x": x}, dy)
    h, Pt = through_linear(x, P)
    y_ref = F.avg_pool2d(h.reshape(2, 6, 6, 6).permute(0, 3, 1, 2), 3, 3).permute(0, 2, 3, 1).reshape(-1, 6)
    (y_ref * t64(dy)).sum().backward()
    close(y, y_ref.detach().numpy(), "float32")
    assert_close(grads["P"], Pt.grad.numpy(), rtol=1e-5, atol=1e-5)


# ---- attention with kv_limit (bidirectional image spans) --------------------------------------

def hf_mask(token_type_ids: np.ndarray, window: int) -> torch.Tensor:
    """[L, L] bool, query (row) sees key (column), built with transformers' own Gemma 3 pieces:
    get_block_sequence_ids_for_mask, then OR(causal, blockwise) and, for sliding layers,
    AND(sliding_window_overlay, that) (create_masks_for_vision_model)."""
    from transformers.masking_utils import and_masks, blockwise_overlay, causal_mask_function, or_masks, \
        sliding_window_overlay
    from transformers.models.gemma3.modeling_gemma3 import get_block_sequence_ids_for_mask

    ids = get_block_sequence_ids_for_mask(torch.tensor(token_type_ids)[None])
    fn = or_masks(causal_mask_function, blockwise_overlay(ids))
    if window > 0:
        fn = and_masks(sliding_window_overlay(window), fn)
    L = len(token_type_ids)
    qi, kj = torch.arange(L)[:, None], torch.arange(L)[None, :]
    return fn(torch.tensor(0), torch.tensor(0), qi, kj)


def kv_limit_of(token_type_ids: np.ndarray) -> np.ndarray:
    """Per token of one document: i, or the last index of its run of image tokens."""
    L = len(token_type_ids)
    lim = np.arange(L, dtype=np.int32)
    i = 0
    while i < L:
        if token_type_ids[i] == 1:
            j = i
            while j + 1 < L and token_type_ids[j + 1] == 1:
                j += 1
            lim[i:j + 1] = j
            i = j + 1
        else:
            i += 1
    return lim


def types(L: int, spans) -> np.ndarray:
    t = np.zeros(L, np.int64)
    for a, b in spans:
        t[a:b] = 1
    return t


# Documents as (length, image spans [a, b)): spans inside, at the start and end, across key tiles
# of 64, a whole image document, a document without images.
DOCS = [
    [(150, [(20, 110)])],
    [(9, [(2, 6)]), (1, []), (70, [(0, 5), (40, 70)]), (12, []), (5, [(0, 5)])],
    [(200, [(3, 4), (60, 130), (131, 190)])],
]


def attn_inputs(docs, Hq, Hkv, D, dtype, seed=0):
    cu = np.concatenate([[0], np.cumsum([L for L, _ in docs])]).astype(np.int32)
    N = int(cu[-1])
    q, dout = rand((N, Hq, D), dtype, seed), rand((N, Hq, D), dtype, seed + 1)
    k, v = rand((N, Hkv, D), dtype, seed + 2), rand((N, Hkv, D), dtype, seed + 3)
    lim = np.concatenate([kv_limit_of(types(L, sp)) for L, sp in docs]).astype(np.int32)
    return q, k, v, dout, cu, lim


def attn_ref(q, k, v, dout, docs, cu, window, scale):
    """f64 explicit masked attention per document with transformers' mask; out, lse, dq, dk, dv."""
    qt, kt, vt = t64(q, True), t64(k, True), t64(v, True)
    G = q.shape[1] // k.shape[1]
    outs, lses = [], []
    for (L, spans), a in zip(docs, cu[:-1]):
        m = hf_mask(types(L, spans), window)
        qs = qt[a:a + L].transpose(0, 1)
        ks = kt[a:a + L].transpose(0, 1).repeat_interleave(G, 0)
        vs = vt[a:a + L].transpose(0, 1).repeat_interleave(G, 0)
        s = (scale * qs @ ks.transpose(1, 2)).masked_fill(~m, -float("inf"))
        lses.append(torch.logsumexp(s, -1).transpose(0, 1))
        outs.append((torch.softmax(s, -1) @ vs).transpose(0, 1))
    out, lse = torch.cat(outs), torch.cat(lses)
    (out * t64(dout)).sum().backward()
    return out.detach().numpy(), lse.detach().numpy(), qt.grad.numpy(), kt.grad.numpy(), vt.grad.numpy()


def attn_fwd(q, k, v, cu, lim, **attrs):
    N, Hq, D = q.shape
    return run_op("attention_fwd", [q, k, v, cu, None, lim], [((N, Hq, D), q.dtype.name), ((N, Hq), "float32")],
                  **attrs)


def attn_bwd(dout, q, k, v, out, lse, cu, lim, **attrs):
    return run_op("attention_bwd", [dout, q, k, v, out, lse, cu, lim],
                  [(q.shape, q.dtype.name), (k.shape, k.dtype.name), (v.shape, v.dtype.name)], **attrs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [0, 5, 64])
@pytest.mark.parametrize("docs", range(len(DOCS)))
def test_attention_kv_limit_matches_transformers_gemma3_mask(dtype, window, docs):
    docs = DOCS[docs]
    q, k, v, dout, cu, lim = attn_inputs(docs, 4, 2, 16, dtype)
    scale = 0.25
    out_ref, lse_ref, dq_ref, dk_ref, dv_ref = attn_ref(q, k, v, dout, docs, cu, window, scale)
    out, lse = attn_fwd(q, k, v, cu, lim, window=window, scale=scale)
    close(out, out_ref, dtype)
    assert_close(lse, lse_ref, rtol=1e-5 if dtype == "float32" else 1e-2, atol=1e-5 if dtype == "float32" else 2e-2)
    dq, dk, dv = attn_bwd(dout, q, k, v, out, lse, cu, lim, window=window, scale=scale)
    close(dq, dq_ref, dtype, scale=2.0)
    close(dk, dk_ref, dtype, scale=2.0)
    close(dv, dv_ref, dtype, scale=2.0)


def test_attention_kv_limit_of_a_causal_batch_is_the_causal_attention():
    docs = [(70, []), (30, [])]
    q, k, v, dout, cu, lim = attn_inputs(docs, 2, 1, 8, "float32", seed=4)
    out, lse = attn_fwd(q, k, v, cu, lim, window=7)
    out0, lse0 = attn_fwd(q, k, v, cu, None, window=7)
    np.testing.assert_array_equal(out, out0)
    np.testing.assert_array_equal(lse, lse0)
    grads = attn_bwd(dout, q, k, v, out, lse, cu, lim, window=7)
    grads0 = attn_bwd(dout, q, k, v, out, lse, cu, None, window=7)
    for g, g0 in zip(grads, grads0):
        np.testing.assert_array_equal(g, g0)


@pytest.mark.parametrize("bad,match", [
    ([0, 0, 1, 2, 3], "kv_limit\\[1\\] = 0"),   # below its own index
    ([0, 5, 5, 5, 5], "kv_limit\\[1\\] = 5"),   # past the document
    ([2, 2, 2, 1, 4], "kv_limit\\[3\\] = 1"),   # falls below the one before (and its own index)
    ([0, 3, 3, 3, 4], None),                    # fine
])
def test_attention_kv_limit_values_are_checked(bad, match):
    q, k, v, _, cu, _ = attn_inputs([(5, [])], 2, 1, 8, "float32")
    lim = np.asarray(bad, np.int32)
    if match is None:
        attn_fwd(q, k, v, cu, lim)
        return
    with pytest.raises(InvalidArgumentError, match=match):
        attn_fwd(q, k, v, cu, lim)


def test_attention_kv_limit_needs_a_causal_mask_and_one_entry_per_token():
    q, k, v, _, cu, lim = attn_inputs([(6, [(1, 3)])], 2, 1, 8, "float32")
    with pytest.raises(InvalidArgumentError, match="not causal"):
        attn_fwd(q, k, v, cu, lim, causal=0)
    with pytest.raises(ShapeError, match="kv_limit must be \\[N\\]"):
        attn_fwd(q, k, v, cu, lim[:5].copy())


def test_attention_kv_limit_dsl_op_trains_through_autodiff():
    """ops.attention(..., kv_limit=) over q / k / v projections; the gradients of the projection
    weights against the f64 reference with transformers' mask, window 4, two documents."""
    docs = [(40, [(5, 20)]), (24, [(0, 10)])]
    cu = np.concatenate([[0], np.cumsum([L for L, _ in docs])]).astype(np.int32)
    N, C, H, D = int(cu[-1]), 16, 2, 8
    lim = np.concatenate([kv_limit_of(types(L, sp)) for L, sp in docs]).astype(np.int32)
    x, dy = rand((N, C), seed=1), rand((N, H * D), seed=2)
    Wq, Wk, Wv = (rand((H * D, C), seed=s, scale=0.3) for s in (3, 4, 5))

    def build(p, i):
        q, k, v = (ops.view(ops.linear(i["x"], p[w]), (N, H, D), name=w + ".heads") for w in ("Wq", "Wk", "Wv"))
        o = ops.attention(q, k, v, i["cu"], window=4, kv_limit=i["lim"])
        return ops.view(o, (N, H * D), name="o")

    y, grads = run_graph(build, {"Wq": Wq, "Wk": Wk, "Wv": Wv}, {"x": x, "cu": cu, "lim": lim}, dy)
    Ws = {w: t64(a, True) for w, a in (("Wq", Wq), ("Wk", Wk), ("Wv", Wv))}
    q, k, v = ((t64(x) @ Ws[w].T).reshape(N, H, D) for w in ("Wq", "Wk", "Wv"))
    outs = []
    for (L, spans), a in zip(docs, cu[:-1]):
        s = (q[a:a + L].transpose(0, 1) @ k[a:a + L].permute(1, 2, 0)) / np.sqrt(D)
        s = s.masked_fill(~hf_mask(types(L, spans), 4), -float("inf"))
        outs.append((torch.softmax(s, -1) @ v[a:a + L].transpose(0, 1)).transpose(0, 1))
    y_ref = torch.cat(outs).reshape(N, H * D)
    (y_ref * t64(dy)).sum().backward()
    close(y, y_ref.detach().numpy(), "float32")
    for w in Ws:
        assert_close(grads[w], Ws[w].grad.numpy(), rtol=1e-4, atol=1e-5)
