"""The gated short convolution (LFM2's conv block between in_proj and out_proj): short_conv_fwd /
short_conv_bwd against torch (F.conv1d with groups = channels and causal padding, f64 autograd,
each packed document alone), and short_conv_cache (serving) against the training op over the
same tokens cut into prefill chunks and decode steps."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sgtest.ops import as_dtype, assert_close, f32, run_op
from surogate import _native
from surogate.errors import ShapeError

CASES = [  # (document lengths, channels, taps)
    ([7], 8, 3),
    ([5, 1, 9], 13, 3),
    ([2, 6], 16, 4),
    ([1], 5, 1),
    ([11, 3], 33, 2),
]


def inputs(docs, C, L, dtype="float32", seed=0, bias=False):
    rng = np.random.default_rng(seed)
    N = sum(docs)
    bcx = as_dtype(rng.standard_normal((N, 3 * C)), dtype)
    w = as_dtype(rng.standard_normal((C, 1, L)) * 0.5, dtype)
    b = as_dtype(rng.standard_normal(C), dtype) if bias else None
    cu = np.concatenate([[0], np.cumsum(docs)]).astype(np.int32)
    dy = as_dtype(rng.standard_normal((N, C)), dtype)
    return bcx, w, b, cu, dy


def reference(bcx, w, b, cu, dy):
    """f64 torch: y per document, HF's Lfm2ShortConv math, and the grads of sum(y * dy)."""
    t = torch.tensor(f32(bcx), dtype=torch.float64, requires_grad=True)
    tw = torch.tensor(f32(w), dtype=torch.float64, requires_grad=True)
    tb = None if b is None else torch.tensor(f32(b), dtype=torch.float64, requires_grad=True)
    C, L = tw.shape[0], tw.shape[-1]
    ys = []
    for s in range(len(cu) - 1):
        seg = t[cu[s]:cu[s + 1]].T[None]  # [1, 3C, n]
        B, Cg, x = seg.chunk(3, dim=-2)
        n = seg.shape[-1]
        conv = F.conv1d(B * x, tw, tb, padding=L - 1, groups=C)[..., :n]
        ys.append((Cg * conv)[0].T)
    y = torch.cat(ys)
    (y * torch.tensor(f32(dy), dtype=torch.float64)).sum().backward()
    return (y.detach().numpy(), t.grad.numpy(), tw.grad.numpy(), None if tb is None else tb.grad.numpy())


def fwd(bcx, w, b, cu):
    return run_op("short_conv_fwd", [bcx, w, cu, b], [((bcx.shape[0], bcx.shape[1] // 3), bcx.dtype.name)])[0]


def bwd(dy, bcx, w, b, cu, dw=None, db=None, **attrs):
    """(dbcx, dw f32, dbias f32 or None); dw / db given: written into (accumulate)."""
    outs = [np.zeros(bcx.shape, bcx.dtype), dw if dw is not None else np.zeros(w.shape, np.float32),
            db if db is not None else (np.zeros(w.shape[0], np.float32) if b is not None else None)]
    _native.call_op("short_conv_bwd", [dy, bcx, w, cu, b], outs, attrs)
    return outs


@pytest.mark.parametrize("docs,C,L", CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_matches_torch_conv1d_per_document(docs, C, L, bias):
    bcx, w, b, cu, dy = inputs(docs, C, L, bias=bias)
    y_ref, dbcx_ref, dw_ref, db_ref = reference(bcx, w, b, cu, dy)
    assert_close(fwd(bcx, w, b, cu), y_ref)
    dbcx, dw, db = bwd(dy, bcx, w, b, cu)
    assert_close(dbcx, dbcx_ref)
    assert_close(dw, dw_ref, rtol=1e-5, atol=1e-4)
    if bias:
        assert_close(db, db_ref, rtol=1e-5, atol=1e-4)


def test_two_dim_weight_and_accumulate():
    bcx, w, _, cu, dy = inputs([4, 6], 9, 3)
    w2 = np.ascontiguousarray(w[:, 0, :])
    assert np.array_equal(fwd(bcx, w, None, cu), fwd(bcx, w2, None, cu))
    _, dw_ref, _ = bwd(dy, bcx, w2, None, cu)[:3]
    start = np.full(w2.shape, 0.25, np.float32)
    _, dw, _ = bwd(dy, bcx, w2, None, cu, dw=start.copy(), accumulate=1)
    np.testing.assert_allclose(dw, dw_ref + 0.25, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_dtypes_round_where_hf_rounds(dtype):
    bcx, w, b, cu, dy = inputs([6, 5], 24, 3, dtype=dtype, bias=True)
    tb = torch.tensor(f32(bcx)).to(getattr(torch, dtype))
    B, Cg, x = tb.T[None].chunk(3, dim=-2)
    tw, tbias = torch.tensor(f32(w)).to(tb.dtype), torch.tensor(f32(b)).to(tb.dtype)
    ys = []
    for s in range(2):
        u = (B * x)[..., cu[s]:cu[s + 1]]
        conv = F.conv1d(u.float(), tw.float(), tbias.float(), padding=2, groups=24)[..., :u.shape[-1]].to(tb.dtype)
        ys.append((Cg[..., cu[s]:cu[s + 1]] * conv)[0].T)
    ref = torch.cat(ys).float().numpy()
    assert_close(f32(fwd(bcx, w, b, cu)), ref, dtype)


def test_refuses_a_weight_of_other_channels():
    bcx, w, _, cu, _ = inputs([4], 8, 3)
    with pytest.raises(ShapeError, match="short_conv_fwd: w .* does not have the 8 channels"):
        fwd(bcx, np.zeros((7, 3), np.float32), None, cu)


def cache_step(bcx, w, b, state, slots, cu_q, ctx):
    y = np.zeros((bcx.shape[0], bcx.shape[1] // 3), bcx.dtype)
    run_op("short_conv_cache", [bcx, w, np.asarray(slots, np.int32), np.asarray(cu_q, np.int32),
                                np.asarray(ctx, np.int32), b], [y, state])
    return y


@pytest.mark.parametrize("L", [1, 2, 3, 4])
def test_cache_chunks_and_decodes_equal_the_whole_sequence(L):
    """Two sequences in slots 2 and 0: a prefill in chunks (3 then 2 tokens, beside the other's
    first chunk), then decode steps of one token each; a padding row at the end."""
    C = 10
    lens = [8, 6]
    bcx, w, b, cu, _ = inputs(lens, C, L, bias=True, seed=3)
    full = fwd(bcx, w, b, cu)
    state = np.full((3, L - 1, C), 7.0, np.float32)  # stale values: a span at position 0 must not read them
    seqs = [bcx[:8], bcx[8:]]
    done = [0, 0]
    out = [[], []]
    for take in ([3, 4], [2, 1], [1, 1], [1, 0], [1, 0]):
        rows = [seqs[s][done[s]:done[s] + take[s]] for s in range(2)]
        step = np.concatenate(rows + [np.ones((1, 3 * C), np.float32)])  # + one padding row
        y = cache_step(step, w, b, state, [2, 0], [0, take[0], take[0] + take[1]],
                       [done[0] + take[0], done[1] + take[1]])
        assert not y[-1].any()
        out[0].append(y[:take[0]])
        out[1].append(y[take[0]:take[0] + take[1]])
        done = [done[0] + take[0], done[1] + take[1]]
    got = np.concatenate([np.concatenate(out[0]), np.concatenate(out[1])])
    n0 = done[0]
    np.testing.assert_allclose(got[:n0], full[:n0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got[n0:], full[8:8 + done[1]], rtol=1e-6, atol=1e-6)
    assert (state[1] == 7.0).all()  # slot 1 is nobody's


def test_cache_refuses_a_slot_outside_the_state():
    bcx, w, _, _, _ = inputs([2], 4, 3)
    with pytest.raises(Exception, match="state slot 5 of 2"):
        cache_step(bcx, w, None, np.zeros((2, 2, 4), np.float32), [5], [0, 2], [2])
