"""lm_head_ce_fwd / lm_head_ce_bwd (CPU) against torch: F.cross_entropy(h @ W.T) in float64,
its logsumexp and autograd gradients, plus finite differences of the op itself.

Shape letters: N tokens, C channels, V vocabulary.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sgtest.ops import as_dtype, finite_difference, run_op
from surogate import _native
from surogate.errors import InvalidArgumentError, ShapeError

IGNORE = -100


@pytest.fixture(autouse=True, scope="module")
def torch_single_thread():
    # The float64 references are tiny; torch's thread pool only adds wake-ups to them (hundreds
    # of milliseconds each when the cores are shared).
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def make_case(N, C, V, dtype="float32", seed=0, ignore_every=4, scale=1.0):
    rng = np.random.default_rng(seed)
    h = as_dtype(scale * rng.standard_normal((N, C)), dtype)
    W = as_dtype(rng.standard_normal((V, C)) / np.sqrt(C), dtype)
    targets = rng.integers(0, V, N).astype(np.int32)
    if ignore_every:
        targets[1::ignore_every] = IGNORE
    dloss = rng.standard_normal(N).astype(np.float32)
    return h, W, targets, dloss


def torch_ref(h, W, targets, dloss, eps=0.0, softcap=0.0, ignore_index=IGNORE):
    """loss, lse (0 on ignored rows), dh, dW in float64 from the op's (already rounded) inputs."""
    h64 = torch.tensor(h.astype(np.float64), requires_grad=True)
    W64 = torch.tensor(W.astype(np.float64), requires_grad=True)
    z = h64 @ W64.T
    if softcap:
        z = softcap * torch.tanh(z / softcap)
    t = torch.tensor(targets.astype(np.int64))
    loss = F.cross_entropy(z, t, ignore_index=ignore_index, label_smoothing=eps, reduction="none")
    (loss * torch.tensor(dloss.astype(np.float64))).sum().backward()
    lse = torch.where(t != ignore_index, torch.logsumexp(z, -1), 0.0)
    return loss.detach().numpy(), lse.detach().numpy(), h64.grad.numpy(), W64.grad.numpy()


def ce_fwd(h, W, targets, **attrs):
    N = h.shape[0]
    return run_op("lm_head_ce_fwd", [h, W, targets], [((N,), "float32"), ((N,), "float32")], **attrs)


def ce_bwd(h, W, targets, lse, dloss, dh_dtype=None, dw_dtype="float32", **attrs):
    dh_dtype = dh_dtype or h.dtype.name
    return run_op("lm_head_ce_bwd", [h, W, targets, lse, dloss], [(h.shape, dh_dtype), (W.shape, dw_dtype)], **attrs)


def close(actual, expected, rtol, atol):
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=rtol, atol=atol)


def close_grad(actual, expected, rtol):
    """Gradients are sums of terms of both signs: judge each element against the tensor's scale."""
    close(actual, expected, rtol, rtol * np.abs(expected).max())


@pytest.mark.parametrize("N,C,V,chunk", [(1, 16, 37, 4096), (7, 32, 1000, 256), (129, 64, 1000, 256),
                                         (7, 16, 37, 8)])
@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("softcap", [0.0, 30.0])
def test_f32_against_torch(N, C, V, chunk, eps, softcap):
    h, W, targets, dloss = make_case(N, C, V, ignore_every=4 if N > 1 else 0, scale=3.0)
    loss, lse = ce_fwd(h, W, targets, chunk=chunk, label_smoothing=eps, softcap=softcap)
    r_loss, r_lse, r_dh, r_dW = torch_ref(h, W, targets, dloss, eps, softcap)
    close(loss, r_loss, 1e-5, 1e-5)
    close(lse, r_lse, 1e-5, 1e-5)
    dh, dW = ce_bwd(h, W, targets, lse, dloss, chunk=chunk, label_smoothing=eps, softcap=softcap)
    close_grad(dh, r_dh, 1e-5)
    close_grad(dW, r_dW, 1e-5)


def test_large_logits_stay_finite():
    # logits of a few hundred: the online max across chunks keeps exp in range
    h, W, targets, dloss = make_case(9, 32, 300, scale=60.0)
    loss, lse = ce_fwd(h, W, targets, chunk=64)
    r_loss, r_lse, r_dh, _ = torch_ref(h, W, targets, dloss)
    close(loss, r_loss, 1e-5, 1e-4)
    close(lse, r_lse, 1e-5, 1e-4)
    dh, _ = ce_bwd(h, W, targets, lse, dloss, chunk=64)
    close_grad(dh, r_dh, 1e-5)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("eps,softcap", [(0.0, 0.0), (0.1, 30.0)])
def test_half_inputs(dtype, eps, softcap):
    # h and W are widened exactly and multiplied in f32, so loss, lse and an f32 dW are as tight
    # as in f32; dh (and a dW kept in the half dtype) carry one rounding of the output.
    N, C, V, chunk = 129, 64, 1000, 256
    h, W, targets, dloss = make_case(N, C, V, dtype, seed=1)
    loss, lse = ce_fwd(h, W, targets, chunk=chunk, label_smoothing=eps, softcap=softcap)
    r_loss, r_lse, r_dh, r_dW = torch_ref(h, W, targets, dloss, eps, softcap)
    close(loss, r_loss, 1e-5, 1e-5)
    close(lse, r_lse, 1e-5, 1e-5)
    rtol = 2**-8 if dtype == "bfloat16" else 2**-10
    dh, dW = ce_bwd(h, W, targets, lse, dloss, chunk=chunk, label_smoothing=eps, softcap=softcap)
    close_grad(dh, r_dh, rtol)
    close_grad(dW, r_dW, 1e-5)
    _, dW_half = ce_bwd(h, W, targets, lse, dloss, dw_dtype=dtype, chunk=chunk, label_smoothing=eps,
                        softcap=softcap)
    close_grad(dW_half, r_dW, rtol)


def test_finite_differences():
    N, C, V = 3, 4, 5
    h, W, targets, dloss = make_case(N, C, V, ignore_every=0, seed=2)
    attrs = dict(chunk=2, label_smoothing=0.2, softcap=2.0)

    def objective_h(x):
        loss, _ = ce_fwd(x, W, targets, **attrs)
        return float(np.dot(loss.astype(np.float64), dloss))

    def objective_w(x):
        loss, _ = ce_fwd(h, x, targets, **attrs)
        return float(np.dot(loss.astype(np.float64), dloss))

    _, lse = ce_fwd(h, W, targets, **attrs)
    dh, dW = ce_bwd(h, W, targets, lse, dloss, **attrs)
    close(dh, finite_difference(objective_h, h.copy(), eps=1e-2), 1e-2, 2e-3)
    close(dW, finite_difference(objective_w, W.copy(), eps=1e-2), 1e-2, 2e-3)


def test_frozen_head_and_accumulate():
    h, W, targets, dloss = make_case(33, 16, 100, seed=3)
    _, lse = ce_fwd(h, W, targets, chunk=32)
    _, _, r_dh, r_dW = torch_ref(h, W, targets, dloss)
    # dW absent: only dh
    dh = np.zeros_like(h)
    _native.call_op("lm_head_ce_bwd", [h, W, targets, lse, dloss], [dh, None], {"chunk": 32})
    close_grad(dh, r_dh, 1e-5)
    # accumulate adds into dW (f32 and bf16); dh is overwritten either way
    for dw_dtype, rtol in (("float32", 1e-5), ("bfloat16", 2**-8)):
        dW = as_dtype(np.ones(W.shape), dw_dtype)
        dh = np.full_like(h, 7.0)
        run_op("lm_head_ce_bwd", [h, W, targets, lse, dloss], [dh, dW], chunk=32, accumulate=True)
        close_grad(dW, 1.0 + r_dW, rtol)
        close_grad(dh, r_dh, 1e-5)


def test_ignored_rows():
    h, W, targets, dloss = make_case(6, 8, 20, seed=4, ignore_every=0)
    targets[:] = [3, -1, 5, -1, -1, 0]
    loss, lse = ce_fwd(h, W, targets, ignore_index=-1)
    r_loss, r_lse, r_dh, r_dW = torch_ref(h, W, targets, dloss, ignore_index=-1)
    close(loss, r_loss, 1e-5, 1e-5)
    assert np.all(loss[[1, 3, 4]] == 0) and np.all(lse[[1, 3, 4]] == 0)
    dh, dW = ce_bwd(h, W, targets, lse, dloss, ignore_index=-1)
    close_grad(dh, r_dh, 1e-5)
    close_grad(dW, r_dW, 1e-5)
    # every row ignored: zero loss and zero gradients
    targets[:] = -1
    loss, lse = ce_fwd(h, W, targets, ignore_index=-1)
    dh, dW = run_op("lm_head_ce_bwd", [h, W, targets, lse, dloss], [np.ones_like(h), np.ones_like(W)],
                    ignore_index=-1)
    assert not loss.any() and not dh.any() and not dW.any()


def test_errors():
    h, W, targets, dloss = make_case(5, 8, 20, ignore_every=0)
    targets[3] = 20
    with pytest.raises(InvalidArgumentError, match=r"lm_head_ce_fwd: targets\[3\] = 20"):
        ce_fwd(h, W, targets)
    targets[3] = -7
    with pytest.raises(InvalidArgumentError, match=r"lm_head_ce_bwd: targets\[3\] = -7"):
        ce_bwd(h, W, targets, np.zeros(5, np.float32), dloss)
    targets[3] = 0
    with pytest.raises(ShapeError, match="lm_head_ce_fwd"):
        ce_fwd(h, W[:, :4].copy(), targets)
    with pytest.raises(InvalidArgumentError, match="chunk"):
        ce_fwd(h, W, targets, chunk=0)
