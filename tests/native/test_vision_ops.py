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
