"""The `sample` op on CUDA (kernels_native/cuda/sample.cu: radix select and a sliced inverse CDF)
against the CPU backend and the numpy reference: the same tokens for the same seeds (the weights
are integers, so only an exp an ulp apart could move a token), greedy rows equal argmax, ties cut
by lower id, the draws' frequencies against the filtered softmax, the raw logprob and rank.

Skipped without a CUDA build and a GPU; run on the lent H200.
"""

from __future__ import annotations

import numpy as np
import pytest

from sgtest import sampling as ref
from sgtest.ops import argmax_cases, argmax_rows, as_dtype
from surogate import _native

COVERS = ("sample",)

pytestmark = pytest.mark.cuda

HAS_CUDA = bool(_native.build_info()["cuda"]) and len(_native.cuda_devices()) > 0
if not HAS_CUDA:
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)

scipy_stats = pytest.importorskip("scipy.stats")

FILTERS = ref.FILTERS


def rows(R, V, seed, scale=3.0, dtype="float32"):
    return as_dtype(np.random.default_rng(seed).standard_normal((R, V)).astype(np.float32) * scale, dtype)


def both(x, p, rank=True):
    return ref.run(x, p, rank, "cuda"), ref.run(x, p, rank, "cpu")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_greedy_rows_equal_the_argmax(dtype):
    x = argmax_cases(dtype)
    (tok, lp, rank), (ctok, clp, crank) = both(x, ref.params(x.shape[0], temperature=0.0))
    np.testing.assert_array_equal(tok, argmax_rows(x))
    np.testing.assert_array_equal(rank, crank)
    ok = np.isfinite(clp)
    np.testing.assert_allclose(lp[ok], clp[ok], rtol=1e-5, atol=1e-5)
    assert np.isnan(lp[~ok]).all()
    # Sampled rows holding a NaN / +inf are -1 as well.
    bad = ref.run(x, ref.params(x.shape[0], temperature=1.0), True, "cuda")[0]
    assert bad[2] == -1 and bad[3] == -1


@pytest.mark.parametrize("V", [7, 32, 33, 500, 3001, 151936])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("knobs", FILTERS, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
def test_cuda_tokens_equal_the_cpus(knobs, dtype, V):
    R = 24 if V > 10000 else 96
    x = rows(R, V, V + 1, dtype=dtype)
    seeds = np.arange(R, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(V)
    p = ref.params(R, seed=seeds, step=np.arange(R) * 7, **knobs)
    (tok, lp, rank), (ctok, clp, crank) = both(x, p)
    assert (tok != ctok).sum() <= 1, np.flatnonzero(tok != ctok)  # an exp an ulp apart, at most
    same = tok == ctok
    np.testing.assert_array_equal(rank[same], crank[same])
    np.testing.assert_allclose(lp[same], clp[same], rtol=1e-5, atol=1e-5)
    xf = np.asarray(x, np.float32)
    for r in range(R):
        assert ref.kept_mask(xf[r], **knobs)[tok[r]], r


def test_ties_at_the_cut_keep_the_lowest_ids():
    V = 3000
    x = np.full(V, -5.0, np.float32)
    top = np.array([3, 100, 700, 1500, 2200, 2999])
    x[top] = 2.0
    x[[1, 2]] = 1.0
    n = 4000
    for knobs in (dict(top_k=4), dict(top_p=0.5), dict(top_k=7, top_p=0.97)):
        tok = ref.run(np.tile(x, (n, 1)), ref.params(n, seed=5, step=np.arange(n), **knobs), False, "cuda")[0]
        assert set(tok.tolist()) == set(np.flatnonzero(ref.kept_mask(x, **knobs)).tolist()), knobs


@pytest.mark.parametrize("knobs", [dict(temperature=0.8, top_p=0.9), dict(temperature=1.5, top_k=12),
                                   dict(temperature=1.0, min_p=0.1), dict(temperature=1.0)],
                         ids=["top_p", "top_k", "min_p", "plain"])
def test_draws_follow_the_filtered_softmax(knobs):
    V, N = 700, 30000
    x = np.random.default_rng(9).standard_normal(V).astype(np.float32) * 2.0
    want = ref.probs(x, **knobs)
    tok = ref.run(np.tile(x, (N, 1)), ref.params(N, seed=77, step=np.arange(N), **knobs), False, "cuda")[0]
    counts = np.bincount(tok, minlength=V)
    assert (counts[want == 0] == 0).all()
    big = want * N >= 5  # chi-square over the tokens expected 5+ times, the rest pooled
    obs = np.append(counts[big], counts[~big & (want > 0)].sum())
    exp = np.append(want[big] * N, want[~big & (want > 0)].sum() * N)
    keep = exp > 0
    assert scipy_stats.chisquare(obs[keep], exp[keep]).pvalue > 1e-4


def test_a_full_batch_of_qwen_sized_rows_in_bf16():
    """128 rows of V = 151,936 (a decode step at 128 streams): every row's token is the CPU's."""
    R, V = 128, 151936
    x = rows(R, V, 3, scale=2.5, dtype="bfloat16")
    p = ref.params(R, temperature=0.7, top_k=np.where(np.arange(R) % 3 == 0, 20, 0),
                   top_p=np.where(np.arange(R) % 2 == 0, 0.95, 1.0), seed=np.arange(R) + 1, step=11)
    p[::5, 0] = 0.0  # greedy rows among them
    (tok, lp, rank), (ctok, clp, crank) = both(x, p)
    assert (tok != ctok).sum() <= 1
    np.testing.assert_allclose(lp, clp, rtol=1e-5, atol=1e-4)


# ---- the optional mask input (grammar bitmasks applied on the GPU, issue #20) -------------------

def masks(R, V, seed, density=0.02):
    rng = np.random.default_rng(seed)
    allowed = rng.random((R, V)) < density
    allowed[np.arange(R), rng.integers(0, V, R)] = True
    allowed[0] = True  # an unconstrained row (all ones)
    return allowed


@pytest.mark.parametrize("V", [7, 33, 3001, 151936])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("knobs", FILTERS + [dict(temperature=0.0)],
                         ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
def test_masked_cuda_tokens_equal_the_cpus(knobs, dtype, V):
    """The masked op on the GPU against the CPU's masked op and the numpy reference on the masked
    row: greedy rows bit for bit, sampled rows too but for an exp an ulp apart (at most one row,
    as unmasked); logprob and rank of the raw row."""
    R = 24 if V > 10000 else 64
    x = rows(R, V, V + 3, dtype=dtype)
    allowed = masks(R, V, V, density=0.3 if V < 100 else 0.02)
    m = ref.pack_mask(allowed)
    seeds = np.arange(R, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(V + 1)
    p = ref.params(R, seed=seeds, step=np.arange(R) * 5 + 1, **knobs)
    tok, lp, rank = ref.run(x, p, True, "cuda", mask=m)
    ctok, clp, crank = ref.run(x, p, True, "cpu", mask=m)
    if knobs.get("temperature", 1.0) < 1e-5:
        np.testing.assert_array_equal(tok, ctok)
    else:
        assert (tok != ctok).sum() <= 1, np.flatnonzero(tok != ctok)
    assert allowed[np.arange(R), tok].all()
    same = tok == ctok
    np.testing.assert_array_equal(rank[same], crank[same])
    np.testing.assert_allclose(lp[same], clp[same], rtol=1e-5, atol=1e-5)
    xf = np.asarray(x, np.float32)
    want = [ref.token(ref.masked(xf[r], allowed[r]), int(seeds[r]), int(np.arange(R)[r] * 5 + 1), **knobs)
            for r in range(R)]
    assert (tok != np.array(want)).sum() <= 1


def test_masked_cuda_rows_allowing_nothing_are_minus_two():
    V = 3001
    x = rows(4, V, 1)
    x[2, 10] = -np.inf
    x[3, 5] = np.nan
    allowed = np.zeros((4, V), bool)
    allowed[2, 10] = True
    p = ref.params(4, temperature=[0.0, 1.0, 0.8, 1.0], seed=3)
    tok, lp, rank = ref.run(x, p, True, "cuda", mask=ref.pack_mask(allowed))
    ctok, clp, crank = ref.run(x, p, True, "cpu", mask=ref.pack_mask(allowed))
    assert tok.tolist() == ctok.tolist() == [-2, -2, -2, -1]
    assert rank.tolist() == crank.tolist() == [0, 0, 0, 0]
    assert np.isneginf(lp[:3]).all() and np.isnan(lp[3])


def test_a_full_masked_batch_of_qwen_sized_rows_in_bf16():
    """128 grammar rows of V = 151,936 (a structured-output decode step at 128 streams)."""
    R, V = 128, 151936
    x = rows(R, V, 4, scale=2.5, dtype="bfloat16")
    allowed = masks(R, V, 8, density=0.05)
    m = ref.pack_mask(allowed)
    p = ref.params(R, temperature=0.7, top_k=np.where(np.arange(R) % 3 == 0, 20, 0),
                   top_p=np.where(np.arange(R) % 2 == 0, 0.95, 1.0), seed=np.arange(R) + 1, step=11)
    p[::5, 0] = 0.0
    tok = ref.run(x, p, False, "cuda", mask=m)[0]
    ctok = ref.run(x, p, False, "cpu", mask=m)[0]
    assert (tok != ctok).sum() <= 1
    assert (tok[::5] == ctok[::5]).all()
    assert allowed[np.arange(R), tok].all()
