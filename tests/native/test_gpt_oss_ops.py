"""GPT-OSS's native CPU ops against torch written from transformers' modeling_gpt_oss.py:
attention with sinks (eager_attention_forward: the sink column concatenated, softmaxed, dropped)
forward, backward and the sink gradient, under causal, sliding window and GQA, packed documents;
paged attention with sinks against the training op; the clamped interleaved SwiGLU
(GptOssExperts._apply_gate) in f32 and bf16 with its gradient; the per-expert bias."""

from __future__ import annotations

import numpy as np
import pytest

from sgtest.ops import as_dtype, run_op
from surogate import _native

torch = pytest.importorskip("torch")


def ref_attention(q, k, v, sinks, cu, window):
    """torch: per document, HF's eager attention with sinks; q [N, Hq, D]."""
    N, Hq, D = q.shape
    G = Hq // k.shape[1]
    outs = []
    for s in range(len(cu) - 1):
        a, b = cu[s], cu[s + 1]
        L = b - a
        qs = q[a:b].transpose(0, 1)                      # [Hq, L, D]
        ks = k[a:b].repeat_interleave(G, 1).transpose(0, 1)
        vs = v[a:b].repeat_interleave(G, 1).transpose(0, 1)
        w = qs @ ks.transpose(1, 2) / D ** 0.5
        i, j = torch.arange(L)[:, None], torch.arange(L)[None]
        mask = (j <= i) & ((window == 0) | (j > i - window))
        w = w.masked_fill(~mask, float("-inf"))
        logits = torch.cat([w, sinks.reshape(-1, 1, 1).expand(-1, L, 1)], -1)
        logits = logits - logits.max(-1, keepdim=True).values
        p = torch.softmax(logits, -1)[..., :-1]
        outs.append((p @ vs).transpose(0, 1))
    return torch.cat(outs)


@pytest.mark.parametrize("window", [0, 5])
@pytest.mark.parametrize("hq,hkv", [(4, 2), (2, 2)])
def test_attention_with_sinks_matches_torch(window, hq, hkv):
    rng = np.random.default_rng(hq + window)
    cu = np.array([0, 9, 10, 31], np.int32)
    N, D = int(cu[-1]), 16
    q, k, v = (rng.standard_normal((N, h, D)).astype(np.float32) for h in (hq, hkv, hkv))
    sinks = (rng.standard_normal(hq) * 2).astype(np.float32)
    out, lse = run_op("attention_fwd", [q, k, v, cu, sinks], [((N, hq, D), "float32"), ((N, hq), "float32")],
                      window=window)
    tq, tk, tv, tz = (torch.tensor(x, requires_grad=True) for x in (q, k, v, sinks))
    want = ref_attention(tq, tk, tv, tz, cu.tolist(), window)
    np.testing.assert_allclose(out, want.detach().numpy(), atol=2e-6)
    dout = rng.standard_normal(out.shape).astype(np.float32)
    (want * torch.tensor(dout)).sum().backward()
    dq, dk, dv = run_op("attention_bwd", [dout, q, k, v, out, lse, cu],
                        [((N, hq, D), "float32"), ((N, hkv, D), "float32"), ((N, hkv, D), "float32")], window=window)
    dz = np.full(hq, 0.5, np.float32)  # accumulate: added to what is there
    (dz,) = run_op("attention_sinks_bwd", [dout, out, lse, sinks], [dz], accumulate=1)
    for got, t in ((dq, tq), (dk, tk), (dv, tv)):
        np.testing.assert_allclose(got, t.grad.numpy(), atol=1e-5)
    np.testing.assert_allclose(dz - 0.5, tz.grad.numpy(), atol=1e-5)


@pytest.mark.parametrize("window", [0, 6])
def test_paged_attention_with_sinks_equals_the_training_op(window):
    """One sequence prefilled in chunks: each chunk's rows over the cache equal the training op's."""
    rng = np.random.default_rng(3)
    T, Hq, Hkv, D, BS = 21, 4, 2, 16, 4
    q, k, v = (rng.standard_normal((T, h, D)).astype(np.float32) for h in (Hq, Hkv, Hkv))
    sinks = (rng.standard_normal(Hq) * 2).astype(np.float32)
    want, _ = run_op("attention_fwd", [q, k, v, np.array([0, T], np.int32), sinks],
                     [((T, Hq, D), "float32"), ((T, Hq), "float32")], window=window)
    nb = (T + BS - 1) // BS
    perm = rng.permutation(nb).astype(np.int32)
    kc = np.zeros((nb, BS, Hkv, D), np.float32)
    vc = np.zeros_like(kc)
    for t in range(T):
        kc[perm[t // BS], t % BS], vc[perm[t // BS], t % BS] = k[t], v[t]
    for lo, hi in ((0, 7), (7, 8), (8, 21)):
        out = np.zeros((hi - lo, Hq, D), np.float32)
        _native.call_op("paged_attention", [q[lo:hi], kc, vc, perm[None], np.array([0, hi - lo], np.int32),
                                            np.array([hi], np.int32), sinks], [out, None], {"window": window})
        np.testing.assert_allclose(out, want[lo:hi], atol=2e-6)


def ref_gate(gu, alpha=1.702, limit=7.0):
    gate, up = gu[..., ::2], gu[..., 1::2]
    gate = gate.clamp(min=None, max=limit)
    up = up.clamp(min=-limit, max=limit)
    glu = gate * torch.sigmoid(gate * alpha)
    return (up + 1) * glu


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_swiglu_oai_matches_transformers(dtype):
    rng = np.random.default_rng(1)
    gu = as_dtype(rng.standard_normal((37, 2 * 24)).astype(np.float32) * 6, dtype)  # many past the limit
    tgu = torch.tensor(gu.astype(np.float32)).to(getattr(torch, dtype)).requires_grad_(True)
    want = ref_gate(tgu)
    (y,) = run_op("swiglu_oai_fwd", [gu], [((37, 24), dtype)], alpha=1.702, limit=7.0)
    got, w = y.astype(np.float32), want.detach().float().numpy()
    if dtype == "float32":
        np.testing.assert_allclose(got, w, rtol=1e-6, atol=1e-6)
    else:  # torch's roundings, each op: equal but for an exp's last bit flipping a rounding
        assert (got != w).mean() < 0.01 and np.abs(got - w).max() <= 0.0625 * np.abs(w).max()
    dy = as_dtype(rng.standard_normal((37, 24)).astype(np.float32), dtype)
    t32 = torch.tensor(gu.astype(np.float32), requires_grad=True)
    (ref_gate(t32) * torch.tensor(dy.astype(np.float32))).sum().backward()
    (dgu,) = run_op("swiglu_oai_bwd", [dy, gu], [((37, 48), dtype)], alpha=1.702, limit=7.0)
    tol = 1e-5 if dtype == "float32" else 2e-2
    np.testing.assert_allclose(dgu.astype(np.float32), t32.grad.numpy(), rtol=tol, atol=tol)
    assert (t32.grad.numpy() == 0).mean() > 0.1  # the clamps cut gradients here


def test_moe_bias_add_and_grad():
    rng = np.random.default_rng(2)
    off = np.array([0, 3, 3, 10, 12], np.int32)
    x = rng.standard_normal((12, 5)).astype(np.float32)
    b = rng.standard_normal((4, 5)).astype(np.float32)
    (y,) = run_op("moe_bias_add", [x, b, off], [((12, 5), "float32")])
    experts = np.repeat(np.arange(4), np.diff(off))
    np.testing.assert_array_equal(y, x + b[experts])
    db = np.ones((4, 5), np.float32)
    (db,) = run_op("moe_bias_grad", [x, off], [db], accumulate=1)
    want = np.stack([x[off[e]:off[e + 1]].sum(0) for e in range(4)]) + 1
    np.testing.assert_allclose(db, want, rtol=1e-6)
