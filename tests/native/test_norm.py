"""rmsnorm_fwd/bwd and add_rmsnorm_fwd/bwd against torch (f64 autograd) and HF's RMSNorm modules."""

import ml_dtypes
import numpy as np
import pytest
import torch
from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from sgtest.ops import as_dtype, assert_close, f32, finite_difference, run_op, sample_indices
from surogate import _native
from surogate.errors import DTypeError, InvalidArgumentError, ShapeError

EPS = 1e-6
SHAPES = [(1, 64), (7, 80), (129, 128), (7, 4097)]


def to_torch(a: np.ndarray) -> torch.Tensor:
    if a.dtype == np.dtype(ml_dtypes.bfloat16):
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def from_torch(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def inputs(n, c, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = as_dtype(rng.standard_normal((n, c)) * 2.0, dtype)
    w = as_dtype(1.0 + 0.3 * rng.standard_normal(c), dtype)
    dy = as_dtype(rng.standard_normal((n, c)), dtype)
    return x, w, dy


def ref_rmsnorm(x, w, dy, offset=0.0, dh=None):
    """f64 torch: y, rstd and the gradients of sum(y * dy) (+ sum(x * dh))."""
    xt = torch.tensor(f32(x), dtype=torch.float64, requires_grad=True)
    wt = torch.tensor(f32(w), dtype=torch.float64, requires_grad=True)
    rstd = torch.rsqrt(xt.pow(2).mean(-1, keepdim=True) + EPS)
    y = xt * rstd * (wt + offset)
    loss = (y * torch.tensor(f32(dy), dtype=torch.float64)).sum()
    if dh is not None:
        loss = loss + (xt * torch.tensor(f32(dh), dtype=torch.float64)).sum()
    loss.backward()
    return y.detach().numpy(), rstd[:, 0].detach().numpy(), xt.grad.numpy(), wt.grad.numpy()


def fwd(x, w, **attrs):
    n, c = x.shape
    return run_op("rmsnorm_fwd", [x, w], [((n, c), x.dtype.name), ((n,), "float32")], **attrs)


def bwd(dy, x, w, rstd, dw="float32", **attrs):
    """dw: a dtype name to allocate, or an array to write (accumulate) into."""
    n, c = x.shape
    dw = dw if isinstance(dw, np.ndarray) else ((c,), dw)
    return run_op("rmsnorm_bwd", [dy, x, w, rstd], [((n, c), x.dtype.name), dw], **attrs)


@pytest.mark.parametrize("n,c", SHAPES)
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_rmsnorm_f32_matches_f64_reference(n, c, offset):
    x, w, dy = inputs(n, c, "float32")
    y, rstd = fwd(x, w, eps=EPS, weight_offset=offset)
    y_ref, rstd_ref, dx_ref, dw_ref = ref_rmsnorm(x, w, dy, offset)
    assert_close(y, y_ref)
    assert_close(rstd, rstd_ref)
    dx, dw = bwd(dy, x, w, rstd, weight_offset=offset)
    assert_close(dx, dx_ref)
    assert_close(dw, dw_ref, rtol=1e-5, atol=1e-5 * np.sqrt(n))


@pytest.mark.parametrize("n,c", SHAPES)
def test_rmsnorm_bf16_forward_equals_hf_llama(n, c):
    x, w, _ = inputs(n, c, "bfloat16")
    y, rstd = fwd(x, w, eps=EPS)
    m = LlamaRMSNorm(c, eps=EPS).to(torch.bfloat16)
    m.weight.data = to_torch(w)
    y_hf = f32(from_torch(m(to_torch(x))))
    # Same rounding order as HF; only a last-bit difference of rstd (summation order) can flip
    # a bf16 rounding, which moves y by one bf16 step (two: both roundings flip) at most.
    diff = np.abs(f32(y) - y_hf)
    assert np.mean(diff == 0) > 0.99
    assert np.all(diff <= 2 * np.spacing(np.abs(y_hf).astype(ml_dtypes.bfloat16)).astype(np.float32) + 1e-30)


@pytest.mark.parametrize("n,c", [(7, 80), (129, 128)])
def test_rmsnorm_bf16_offset_equals_hf_gemma(n, c):
    x, w, _ = inputs(n, c, "bfloat16")
    w = as_dtype(f32(w) - 1.0, "bfloat16")  # Gemma stores w with the 1 taken out
    y, _ = fwd(x, w, eps=EPS, weight_offset=1.0)
    m = GemmaRMSNorm(c, eps=EPS).to(torch.bfloat16)
    m.weight.data = to_torch(w)
    y_hf = f32(from_torch(m(to_torch(x))))
    diff = np.abs(f32(y) - y_hf)
    assert np.mean(diff == 0) > 0.99
    assert np.all(diff <= np.spacing(np.abs(y_hf).astype(ml_dtypes.bfloat16)).astype(np.float32) + 1e-30)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_rmsnorm_half_dtypes_against_f64(dtype):
    n, c = 129, 80
    x, w, dy = inputs(n, c, dtype)
    y, rstd = fwd(x, w, eps=EPS)
    y_ref, rstd_ref, dx_ref, dw_ref = ref_rmsnorm(x, w, dy)
    assert_close(y, y_ref, dtype)
    assert_close(rstd, rstd_ref, rtol=1e-5)
    dx, dw = bwd(dy, x, w, rstd, dw=dtype)
    assert_close(dx, dx_ref, dtype, rtol=2e-2, atol=3e-2)
    dx32, dw32 = bwd(dy, x, w, rstd)  # f32 dw from half-precision inputs: only the sum is f32
    assert_close(dw32, dw_ref, rtol=1e-4, atol=1e-3)
    assert_close(dw, dw32, dtype)


def test_rmsnorm_bwd_finite_differences():
    n, c = 3, 16
    x, w, dy = inputs(n, c, "float32", seed=1)

    def loss_x(xv):
        return float(np.sum(fwd(xv, w, eps=EPS, weight_offset=0.5)[0].astype(np.float64) * dy))

    def loss_w(wv):
        return float(np.sum(fwd(x, wv, eps=EPS, weight_offset=0.5)[0].astype(np.float64) * dy))

    _, rstd = fwd(x, w, eps=EPS, weight_offset=0.5)
    dx, dw = bwd(dy, x, w, rstd, weight_offset=0.5)
    idx = sample_indices(x.shape, 24)
    fd = finite_difference(loss_x, x.copy(), eps=1e-2, indices=idx)
    for i in idx:
        assert abs(dx[i] - fd[i]) < 2e-3, (i, dx[i], fd[i])
    fd_w = finite_difference(loss_w, w.copy(), eps=1e-2)
    np.testing.assert_allclose(dw, fd_w, rtol=2e-3, atol=2e-3)


def test_rmsnorm_bwd_accumulate_and_absent_dw():
    n, c = 7, 80
    x, w, dy = inputs(n, c, "bfloat16")
    _, rstd = fwd(x, w)
    dx, dw = bwd(dy, x, w, rstd)
    dw_acc = np.full(c, 0.5, np.float32)
    dx2, _ = bwd(dy, x, w, rstd, accumulate=True, dw=dw_acc)
    np.testing.assert_allclose(dw_acc, dw + 0.5, rtol=1e-6)
    assert np.array_equal(f32(dx2), f32(dx))
    dw_bf = as_dtype(np.full(c, -1.0), "bfloat16")
    bwd(dy, x, w, rstd, accumulate=True, dw=dw_bf)
    assert_close(dw_bf, dw - 1.0, "bfloat16")

    dx_only = np.zeros((n, c), ml_dtypes.bfloat16)
    _native.call_op("rmsnorm_bwd", [dy, x, w, rstd], [dx_only, None], {})
    assert np.array_equal(f32(dx_only), f32(dx))


def test_add_rmsnorm_bf16_matches_hf_residual_then_norm():
    n, c = 129, 128
    x, w, _ = inputs(n, c, "bfloat16", seed=2)
    res, _, _ = inputs(n, c, "bfloat16", seed=3)
    y, h, rstd = run_op("add_rmsnorm_fwd", [x, res, w],
                        [((n, c), "bfloat16"), ((n, c), "bfloat16"), ((n,), "float32")], eps=EPS)
    h_hf = to_torch(x) + to_torch(res)  # HF: hidden_states = residual + hidden_states, in bf16
    assert np.array_equal(f32(h), f32(from_torch(h_hf)))
    m = LlamaRMSNorm(c, eps=EPS).to(torch.bfloat16)
    m.weight.data = to_torch(w)
    y_hf = f32(from_torch(m(h_hf)))
    assert np.mean(f32(y) == y_hf) > 0.99
    y_plain, rstd_plain = fwd(h, w, eps=EPS)
    assert np.array_equal(f32(y), f32(y_plain)) and np.array_equal(rstd, rstd_plain)


def test_add_rmsnorm_fwd_in_place_residual():
    n, c = 7, 64
    x, w, _ = inputs(n, c, "float32")
    res, _, _ = inputs(n, c, "float32", seed=4)
    expect = x + res
    y, h, _ = run_op("add_rmsnorm_fwd", [x, res, w], [x, res, ((n,), "float32")])
    assert y is x and h is res
    np.testing.assert_array_equal(res, expect)
    assert_close(y, ref_rmsnorm(expect, w, expect)[0])


@pytest.mark.parametrize("with_dh", [False, True])
def test_add_rmsnorm_bwd_f32_matches_autograd(with_dh):
    n, c = 129, 80
    x, w, dy = inputs(n, c, "float32", seed=5)
    res, _, dh = inputs(n, c, "float32", seed=6)
    y, h, rstd = run_op("add_rmsnorm_fwd", [x, res, w], [((n, c), "float32"), ((n, c), "float32"), ((n,), "float32")])
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    rt = torch.tensor(res, dtype=torch.float64, requires_grad=True)
    wt = torch.tensor(w, dtype=torch.float64, requires_grad=True)
    ht = xt + rt
    yt = ht * torch.rsqrt(ht.pow(2).mean(-1, keepdim=True) + EPS) * wt
    loss = (yt * torch.tensor(dy, dtype=torch.float64)).sum()
    if with_dh:  # h also feeds the next block through the residual stream
        loss = loss + (ht * torch.tensor(dh, dtype=torch.float64)).sum()
    loss.backward()
    assert_close(y, yt.detach().numpy())
    dx, dw = run_op("add_rmsnorm_bwd", [dy, dh if with_dh else None, h, w, rstd],
                    [((n, c), "float32"), ((c,), "float32")])
    assert_close(dx, xt.grad.numpy())
    assert_close(dx, rt.grad.numpy())
    assert_close(dw, wt.grad.numpy(), atol=1e-4)


def test_add_rmsnorm_bwd_finite_differences():
    n, c = 2, 16
    x, w, dy = inputs(n, c, "float32", seed=7)
    res, _, dh = inputs(n, c, "float32", seed=8)

    def loss(rv):
        y, h, _ = run_op("add_rmsnorm_fwd", [x, rv, w], [((n, c), "float32"), ((n, c), "float32"), ((n,), "float32")])
        return float(np.sum(y.astype(np.float64) * dy) + np.sum(h.astype(np.float64) * dh))

    _, h, rstd = run_op("add_rmsnorm_fwd", [x, res, w], [((n, c), "float32"), ((n, c), "float32"), ((n,), "float32")])
    dx = np.zeros((n, c), np.float32)
    _native.call_op("add_rmsnorm_bwd", [dy, dh, h, w, rstd], [dx, None], {})
    fd = finite_difference(loss, res.copy(), eps=1e-2)
    np.testing.assert_allclose(dx, fd, rtol=2e-3, atol=2e-3)


def test_add_rmsnorm_bwd_accumulate_bf16():
    n, c = 7, 80
    h, w, dy = inputs(n, c, "bfloat16", seed=9)
    _, rstd = fwd(h, w)
    _, dw = bwd(dy, h, w, rstd)
    dw_acc = np.ones(c, np.float32)
    run_op("add_rmsnorm_bwd", [dy, None, h, w, rstd], [((n, c), "bfloat16"), dw_acc], accumulate=True)
    np.testing.assert_allclose(dw_acc, dw + 1.0, rtol=1e-6)


def test_errors_name_the_op():
    x, w, dy = inputs(4, 8, "float32")
    with pytest.raises(ShapeError, match="rmsnorm_fwd.*w"):
        fwd(x, np.ones(7, np.float32))
    with pytest.raises(ShapeError, match="rmsnorm_fwd.*rstd"):
        run_op("rmsnorm_fwd", [x, w], [((4, 8), "float32"), ((3,), "float32")])
    with pytest.raises(DTypeError, match="rmsnorm_fwd.*rstd"):
        run_op("rmsnorm_fwd", [x, w], [((4, 8), "float32"), ((4,), "bfloat16")])
    with pytest.raises(DTypeError, match="rmsnorm_fwd.*y"):
        run_op("rmsnorm_fwd", [x, w], [((4, 8), "bfloat16"), ((4,), "float32")])
    _, rstd = fwd(x, w)
    with pytest.raises(ShapeError, match="rmsnorm_bwd.*dy"):
        bwd(dy[:, :4].copy(), x, w, rstd)
    with pytest.raises(DTypeError, match="rmsnorm_bwd.*dw"):
        bwd(dy, x, w, rstd, dw="float16")
    with pytest.raises(ShapeError, match="add_rmsnorm_fwd.*residual"):
        run_op("add_rmsnorm_fwd", [x, x[:2].copy(), w], [((4, 8), "float32")] * 2 + [((4,), "float32")])
    with pytest.raises(InvalidArgumentError, match="add_rmsnorm_bwd"):
        _native.call_op("add_rmsnorm_bwd", [dy, None, None, w, rstd], [np.zeros((4, 8), np.float32), None], {})


def test_backward_is_bitwise_independent_of_thread_count():
    n, c = 1000, 300
    x, w, dy = inputs(n, c, "float32", seed=10)
    _, rstd = fwd(x, w)
    before = _native.num_threads()
    try:
        results = []
        for threads in (1, 3):
            _native.set_num_threads(threads)
            results.append(bwd(dy, x, w, rstd))
    finally:
        _native.set_num_threads(before)
    assert all(np.array_equal(a, b) for a, b in zip(*results))
