"""attention_fwd / attention_bwd on CPU against a float64 torch reference.

Shapes: N packed tokens, Hq query heads, Hkv kv heads, D head dim; cu_seqlens delimits the
documents. The reference builds each document's masked score matrix explicitly and lets
torch.autograd take the gradients; the window semantics are checked against transformers'
own mask functions.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sgtest.ops import as_dtype, finite_difference, run_op
from surogate.errors import DTypeError, InvalidArgumentError, ShapeError


@pytest.fixture(autouse=True, scope="module")
def torch_single_thread():
    """The references are tiny: torch's thread pool only fights the native one for the cores."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def visible(L: int, causal: bool, window: int) -> torch.Tensor:
    """[L, L] bool, query i (row) sees key j (column): the semantics attention.cpp documents."""
    i = torch.arange(L)[:, None]
    j = torch.arange(L)[None, :]
    if causal:
        m = j <= i
        return m & (j > i - window) if window > 0 else m
    return (i - j).abs() <= window if window > 0 else torch.ones(L, L, dtype=torch.bool)


def reference(q, k, v, cu, dout, causal=True, window=0, softcap=0.0, scale=None, mask_fn=visible):
    """float64 out, lse and (dq, dk, dv) for arrays q[N,Hq,D], k/v[N,Hkv,D], dout[N,Hq,D]."""
    q, k, v = (torch.tensor(np.asarray(x, np.float64), requires_grad=True) for x in (q, k, v))
    N, Hq, D = q.shape
    G = Hq // k.shape[1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    outs, lses = [], []
    for a, b in zip(cu[:-1], cu[1:]):
        if b == a:
            continue
        qs = q[a:b].transpose(0, 1)  # [Hq, L, D]
        ks = k[a:b].transpose(0, 1).repeat_interleave(G, dim=0)
        vs = v[a:b].transpose(0, 1).repeat_interleave(G, dim=0)
        s = scale * qs @ ks.transpose(1, 2)
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        s = s.masked_fill(~mask_fn(b - a, causal, window), -math.inf)
        lses.append(torch.logsumexp(s, -1).transpose(0, 1))
        outs.append((torch.softmax(s, -1) @ vs).transpose(0, 1))
    out, lse = torch.cat(outs), torch.cat(lses)
    (out * torch.tensor(np.asarray(dout, np.float64))).sum().backward()
    return out.detach().numpy(), lse.detach().numpy(), q.grad.numpy(), k.grad.numpy(), v.grad.numpy()


def run_fwd(q, k, v, cu, **attrs):
    N, Hq, D = q.shape
    return run_op("attention_fwd", [q, k, v, np.asarray(cu, np.int32)],
                  [((N, Hq, D), q.dtype.name), ((N, Hq), "float32")], **attrs)


def run_bwd(dout, q, k, v, out, lse, cu, **attrs):
    return run_op("attention_bwd", [dout, q, k, v, out, lse, np.asarray(cu, np.int32)],
                  [(q.shape, q.dtype.name), (k.shape, k.dtype.name), (v.shape, v.dtype.name)], **attrs)


def make_inputs(cu, Hq, Hkv, D, dtype, seed=0):
    """q, k, v, dout rounded to `dtype` (as arrays of that dtype)."""
    rng = np.random.default_rng(seed)
    N = cu[-1]
    q, dout = (rng.standard_normal((N, Hq, D)).astype(np.float32) for _ in range(2))
    k, v = (rng.standard_normal((N, Hkv, D)).astype(np.float32) for _ in range(2))
    return [as_dtype(x, dtype) for x in (q, k, v, dout)]


def assert_rel_close(actual, expected, tol, what):
    """|actual - expected| <= tol * (|expected| + max(max|expected|, 1)): relative to the tensor's
    scale (inputs are O(1)), so that near-zero entries of a gradient are not held to a relative
    bound; dq is exactly 0 for a one-token document."""
    a = np.asarray(actual, np.float64)
    e = np.asarray(expected, np.float64)
    bound = tol * (np.abs(e) + max(np.abs(e).max(), 1.0))
    worst = np.max(np.abs(a - e) - bound)
    assert worst <= 0, f"{what}: max error {np.abs(a - e).max():.3g} exceeds tolerance {tol} (scale {np.abs(e).max():.3g})"


# (bound for out and the gradients, bound for lse), see assert_rel_close; measured errors are 3-10x
# below. f32: accumulation order only. bf16 / f16: out and the gradients are rounded to the
# storage dtype (2^-9 / 2^-12 relative), and the backward reads the rounded `out` for
# Delta = dout . out, which the float64 reference does not. lse stays f32 in every dtype.
TOL = {"float32": (1e-5, 1e-5), "bfloat16": (8e-3, 1e-5), "float16": (1e-3, 1e-5)}

CASES = [
    # dtype,     cu_seqlens,            Hq, Hkv, D,  causal, window, softcap
    ("float32", [0, 1], 4, 4, 64, True, 0, 0.0),
    ("float32", [0, 7], 8, 2, 80, True, 0, 3.0),
    ("float32", [0, 129], 4, 1, 128, True, 16, 0.0),
    ("float32", [0, 3, 10, 139], 8, 1, 64, True, 5, 3.0),
    ("float32", [0, 3, 10, 139], 2, 2, 80, False, 0, 0.0),
    ("float32", [0, 70, 70, 139], 4, 2, 64, False, 20, 0.0),
    ("float32", [0, 129], 16, 2, 64, False, 0, 3.0),
    ("float32", [0, 3, 10, 139], 16, 4, 64, True, 100, 0.0),
    ("float32", [0, 1, 2, 5, 5, 13, 21, 34, 55, 89, 144], 4, 2, 64, True, 4, 0.0),
    ("bfloat16", [0, 3, 10, 139], 8, 2, 64, True, 0, 0.0),
    ("bfloat16", [0, 129], 4, 4, 128, True, 32, 3.0),
    ("bfloat16", [0, 7], 8, 1, 80, False, 3, 0.0),
    ("float16", [0, 3, 10, 139], 4, 1, 64, True, 0, 3.0),
    # Gemma 4's global heads (head dim 512): causal GQA; a window with softcap.
    ("float32", [0, 3, 70], 4, 2, 512, True, 0, 0.0),
    ("bfloat16", [0, 40, 100], 8, 1, 512, True, 16, 3.0),
]


@pytest.mark.parametrize("dtype,cu,Hq,Hkv,D,causal,window,softcap", CASES)
def test_forward_and_backward_match_torch(dtype, cu, Hq, Hkv, D, causal, window, softcap):
    q, k, v, dout = make_inputs(cu, Hq, Hkv, D, dtype)
    attrs = dict(causal=causal, window=window, softcap=softcap)
    out, lse = run_fwd(q, k, v, cu, **attrs)
    dq, dk, dv = run_bwd(dout, q, k, v, out, lse, cu, **attrs)
    r_out, r_lse, r_dq, r_dk, r_dv = reference(q, k, v, cu, dout, causal, window, softcap)
    tol, lse_tol = TOL[dtype]
    assert_rel_close(out, r_out, tol, "out")
    assert_rel_close(lse, r_lse, lse_tol, "lse")
    for name, got, want in (("dq", dq, r_dq), ("dk", dk, r_dk), ("dv", dv, r_dv)):
        assert_rel_close(got, want, tol, name)


def test_explicit_scale():
    cu = [0, 5, 40]
    q, k, v, dout = make_inputs(cu, 4, 2, 64, "float32", seed=1)
    out, lse = run_fwd(q, k, v, cu, scale=0.3)
    dq, dk, dv = run_bwd(dout, q, k, v, out, lse, cu, scale=0.3)
    for got, want in zip((out, lse, dq, dk, dv), reference(q, k, v, cu, dout, scale=0.3)):
        assert_rel_close(got, want, 1e-5, "scale=0.3")


def test_packed_documents_match_separate_runs():
    cu = [0, 3, 10, 139]
    q, k, v, dout = make_inputs(cu, 8, 2, 64, "float32", seed=2)
    out, lse = run_fwd(q, k, v, cu)  # defaults: causal, scale 1/sqrt(D), no window, no softcap
    dq, dk, dv = run_bwd(dout, q, k, v, out, lse, cu)
    for a, b in zip(cu[:-1], cu[1:]):
        one = [0, b - a]
        o1, l1 = run_fwd(q[a:b], k[a:b], v[a:b], one)
        g1 = run_bwd(dout[a:b], q[a:b], k[a:b], v[a:b], o1, l1, one)
        np.testing.assert_allclose(out[a:b], o1, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(lse[a:b], l1, rtol=1e-6, atol=1e-6)
        for g, g_one in zip((dq, dk, dv), g1):
            np.testing.assert_allclose(g[a:b], g_one, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("causal", [True, False])
def test_window_matches_transformers_masks(causal):
    masking = pytest.importorskip("transformers.masking_utils")

    def hf_mask(L, causal, window):
        i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
        if causal:
            return masking.sliding_window_overlay(window)(0, 0, i, j) & masking.causal_mask_function(0, 0, i, j)
        return masking.sliding_window_bidirectional_overlay(window)(0, 0, i, j)

    cu = [0, 9, 139]
    q, k, v, dout = make_inputs(cu, 4, 2, 64, "float32", seed=3)
    for window in (1, 4, 70):
        out, lse = run_fwd(q, k, v, cu, causal=causal, window=window)
        r_out, r_lse, *_ = reference(q, k, v, cu, dout, causal, window, mask_fn=hf_mask)
        assert_rel_close(out, r_out, 1e-5, f"out, window={window}")
        assert_rel_close(lse, r_lse, 1e-5, f"lse, window={window}")


def test_backward_matches_finite_differences():
    cu = [0, 2, 5]
    q, k, v, _ = make_inputs(cu, 2, 1, 8, "float32", seed=4)
    r = np.random.default_rng(5).standard_normal(q.shape).astype(np.float32)
    attrs = dict(causal=True, window=2, softcap=2.0)
    out, lse = run_fwd(q, k, v, cu, **attrs)
    grads = run_bwd(r, q, k, v, out, lse, cu, **attrs)
    inputs = [q, k, v]
    for which, grad in enumerate(grads):
        def loss(x):
            args = list(inputs)
            args[which] = x
            return float(np.sum(run_fwd(*args, cu, **attrs)[0].astype(np.float64) * r))

        fd = finite_difference(loss, inputs[which].copy(), eps=1e-2)
        np.testing.assert_allclose(grad, fd, rtol=1e-2, atol=2e-3, err_msg=f"input {which}")


def test_errors_name_the_op_and_argument():
    cu = np.array([0, 3, 8], np.int32)
    q = np.zeros((8, 6, 16), np.float32)
    k = np.zeros((8, 4, 16), np.float32)
    with pytest.raises(ShapeError, match="attention_fwd: Hq = 6 .* not a multiple of Hkv = 4"):
        run_fwd(q, k, k, cu)
    k = np.zeros((8, 2, 16), np.float32)
    with pytest.raises(InvalidArgumentError, match="attention_fwd: cu_seqlens ends at 7 but q has N = 8"):
        run_fwd(q, k, k, [0, 3, 7])
    with pytest.raises(InvalidArgumentError, match="attention_fwd: cu_seqlens is not nondecreasing"):
        run_fwd(q, k, k, [0, 5, 3, 8])
    with pytest.raises(DTypeError, match="attention_fwd: cu_seqlens"):
        run_op("attention_fwd", [q, k, k, np.array([0, 8], np.int64)], [(q.shape, "float32"), ((8, 6), "float32")])
    with pytest.raises(ShapeError, match="attention_fwd: k .* does not fit q"):
        run_fwd(q, np.zeros((8, 2, 8), np.float32), np.zeros((8, 2, 8), np.float32), cu)
    with pytest.raises(DTypeError, match="attention_fwd: k is bfloat16 but q is float32"):
        run_fwd(q, as_dtype(k, "bfloat16"), as_dtype(k, "bfloat16"), cu)
    with pytest.raises(InvalidArgumentError, match="attention_fwd: window = -1"):
        run_fwd(q, k, k, cu, window=-1)
    out, lse = run_fwd(q, k, k, cu)
    with pytest.raises(ShapeError, match="attention_bwd: dk"):
        run_op("attention_bwd", [q, q, k, k, out, lse, cu],
               [(q.shape, "float32"), ((8, 6, 16), "float32"), (k.shape, "float32")])
