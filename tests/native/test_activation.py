"""swiglu/geglu forward and backward against torch (f64 autograd) and HF's activations in bf16."""

import ml_dtypes
import numpy as np
import pytest
import torch
from transformers.activations import ACT2FN

from sgtest.ops import as_dtype, assert_close, f32, finite_difference, run_op, sample_indices
from surogate.errors import DTypeError, ShapeError

OPS = {"swiglu": "silu", "geglu": "gelu_pytorch_tanh"}  # our op -> HF hidden_act
SHAPES = [(1, 64), (7, 80), (129, 128), (3, 4097)]
# exp's tails and special points among the gate values
TAILS = np.array([-200.0, -104.0, -90.0, -88.0, -20.0, -1e-30, 0.0, 1e-30, 20.0, 88.0, 90.0, 200.0])


def to_torch(a: np.ndarray) -> torch.Tensor:
    if a.dtype == np.dtype(ml_dtypes.bfloat16):
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def from_torch(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16) if t.dtype == torch.bfloat16 else t.numpy()


def inputs(n, f, dtype, seed=0, scale=3.0):
    rng = np.random.default_rng(seed)
    gu = rng.standard_normal((n, 2 * f)) * scale
    gate = gu[:, :f].reshape(-1)
    gate[: min(len(TAILS), gate.size)] = TAILS[: gate.size]
    gu[:, :f] = gate.reshape(n, f)
    dy = rng.standard_normal((n, f))
    return as_dtype(gu, dtype), as_dtype(dy, dtype)


def ref(op, gu, dy):
    """f64 torch: y = act(gate) * up and d(sum(y * dy)) / d gu."""
    g = torch.tensor(f32(gu), dtype=torch.float64, requires_grad=True)
    f = gu.shape[1] // 2
    y = ACT2FN[OPS[op]](g[:, :f]) * g[:, f:]
    (y * torch.tensor(f32(dy), dtype=torch.float64)).sum().backward()
    return y.detach().numpy(), g.grad.numpy()


def fwd(op, gu):
    n, f2 = gu.shape
    return run_op(f"{op}_fwd", [gu], [((n, f2 // 2), gu.dtype.name)])[0]


def bwd(op, dy, gu):
    return run_op(f"{op}_bwd", [dy, gu], [(gu.shape, gu.dtype.name)])[0]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("n,f", SHAPES)
def test_f32_matches_f64_autograd(op, n, f):
    gu, dy = inputs(n, f, "float32")
    y_ref, dgu_ref = ref(op, gu, dy)
    assert_close(fwd(op, gu), y_ref)
    assert_close(bwd(op, dy, gu), dgu_ref)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("n,f", SHAPES)
def test_bf16_forward_equals_hf(op, n, f):
    gu, _ = inputs(n, f, "bfloat16", seed=1)
    g = to_torch(gu)
    y_hf = f32(from_torch(ACT2FN[OPS[op]](g[:, :f]) * g[:, f:]))  # act rounded to bf16, then * up in bf16
    y = f32(fwd(op, gu))
    up = np.abs(f32(gu[:, f:]))
    # Same two roundings as HF; our exp and torch's (Sleef) differ in the last f32 bit at most,
    # which flips a bf16 rounding now and then: one bf16 step of act, so |up| steps of y.
    # GELU below -3: torch computes 0.5 x (1 + tanh(z)), which cancels (to exactly 0 below
    # about -7), while we compute x s(2z); there |act| < 4e-6 and we are the accurate one.
    bulk = f32(gu[:, :f]) > -3.0
    assert np.mean((y == y_hf)[bulk]) > 0.99
    step = np.spacing(np.abs(y_hf).astype(ml_dtypes.bfloat16)).astype(np.float32)
    assert np.all(np.abs(y - y_hf)[bulk] <= (step * np.maximum(1.0, up))[bulk])
    assert np.all(np.abs(y - y_hf)[~bulk] <= 1e-5 * np.maximum(1.0, up[~bulk]))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_dtypes_against_f64(op, dtype):
    n, f = 129, 80
    gu, dy = inputs(n, f, dtype, seed=2, scale=2.0)
    gu[0, :len(TAILS)] = 0  # f16 cannot hold the tails
    y_ref, dgu_ref = ref(op, gu, dy)
    assert_close(fwd(op, gu), y_ref, dtype)
    # Gradients are computed in f32 and rounded once (HF's bf16 autograd rounds on the way).
    dgu = bwd(op, dy, gu)
    assert_close(dgu, dgu_ref, dtype, rtol=1e-2 if dtype == "bfloat16" else 2e-3, atol=1e-2)


@pytest.mark.parametrize("op", OPS)
def test_bf16_backward_close_to_hf_autograd(op):
    n, f = 64, 128
    gu, dy = inputs(n, f, "bfloat16", seed=3, scale=2.0)
    g = to_torch(gu).requires_grad_(True)
    y = ACT2FN[OPS[op]](g[:, :f]) * g[:, f:]
    y.backward(to_torch(dy))
    dgu_hf = f32(from_torch(g.grad))
    dgu = f32(bwd(op, dy, gu))
    # HF rounds act(g), dy * up and dy * act to bf16 on the way, we round once at the end, so
    # about a third of the values differ by a bf16 step or two.
    assert np.mean(dgu == dgu_hf) > 0.5
    np.testing.assert_allclose(dgu, dgu_hf, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("op", OPS)
def test_backward_finite_differences(op):
    n, f = 3, 8
    gu, dy = inputs(n, f, "float32", seed=4, scale=1.5)
    gu[0, :len(TAILS)] = np.linspace(-3, 3, len(TAILS))  # smooth region for the differences
    dgu = bwd(op, dy, gu)

    def loss(x):
        return float(np.sum(fwd(op, x).astype(np.float64) * dy))

    idx = sample_indices(gu.shape, 24)
    fd = finite_difference(loss, gu.copy(), eps=1e-2, indices=idx)
    for i in idx:
        assert abs(dgu[i] - fd[i]) < 2e-3 * max(1.0, abs(fd[i])), (i, dgu[i], fd[i])


@pytest.mark.parametrize("op", OPS)
def test_backward_in_place_over_gu(op):
    gu, dy = inputs(7, 80, "bfloat16", seed=5)
    expect = bwd(op, dy, gu)
    run_op(f"{op}_bwd", [dy, gu], [gu])
    assert np.array_equal(f32(gu), f32(expect))


@pytest.mark.parametrize("op", OPS)
def test_nan_gate_stays_nan(op):
    gu = np.ones((1, 4), np.float32)
    gu[0, 0] = np.nan
    assert np.isnan(fwd(op, gu)[0, 0]) and not np.isnan(fwd(op, gu)[0, 1])
    dgu = bwd(op, np.ones((1, 2), np.float32), gu)
    assert np.isnan(dgu[0, 0]) and np.isnan(dgu[0, 2]) and np.isfinite(dgu[0, 1])


@pytest.mark.parametrize("op", OPS)
def test_errors_name_the_op(op):
    gu = np.ones((4, 6), np.float32)
    with pytest.raises(ShapeError, match=f"{op}_fwd.*gu"):
        run_op(f"{op}_fwd", [np.ones((4, 5), np.float32)], [((4, 2), "float32")])
    with pytest.raises(ShapeError, match=f"{op}_fwd.*y"):
        run_op(f"{op}_fwd", [gu], [((4, 6), "float32")])
    with pytest.raises(DTypeError, match=f"{op}_fwd.*y"):
        run_op(f"{op}_fwd", [gu], [((4, 3), "bfloat16")])
    with pytest.raises(ShapeError, match=f"{op}_bwd.*dy"):
        run_op(f"{op}_bwd", [np.ones((3, 3), np.float32), gu], [((4, 6), "float32")])
    with pytest.raises(DTypeError, match=f"{op}_bwd.*dgu"):
        run_op(f"{op}_bwd", [np.ones((4, 3), np.float32), gu], [((4, 6), "float16")])
