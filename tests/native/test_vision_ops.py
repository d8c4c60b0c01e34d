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
from surogate.errors import ShapeError

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
    with pytest.raises(Exception, match="there is no b"):
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
    with pytest.raises(Exception, match="does not divide"):
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
