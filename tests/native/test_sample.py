"""The `sample` op on the CPU (kernels_native/cpu/sample.cpp) against numpy: greedy rows are the
argmax op's, the kept sets of top-k / top-p / min-p (ties cut by lower id), the draws' frequencies
against the filtered softmax, Philox's known answers, determinism per (seed, step) whatever the
batch, the raw logprob and rank, and the errors of bad calls."""

from __future__ import annotations

import numpy as np
import pytest

from sgtest import sampling as ref
from sgtest.ops import argmax_cases, argmax_rows, as_dtype
from surogate import _native
from surogate.errors import DTypeError, InvalidArgumentError, ShapeError

scipy_stats = pytest.importorskip("scipy.stats")


sample = ref.run


def f32(x):
    return np.asarray(x, np.float32)


def test_philox_matches_random123_known_answers():
    assert ref.philox4x32_10([0, 0, 0, 0], [0, 0]) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    assert ref.philox4x32_10([ref.M32] * 4, [ref.M32] * 2) == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    assert ref.philox4x32_10([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0]) == [
        0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]


def test_a_flat_row_reveals_the_uniform_of_each_seed_and_step():
    """With 2^16 equal logits the token is floor(u * 2^16): the op's Philox stream, counter layout
    and 53-bit uniform are the reference's."""
    V = 1 << 16
    seeds = [0, 1, 7, 2**32 - 1, 2**32, 0xDEADBEEFCAFEF00D]
    steps = [0, 1, 2, 1000, 2**31 + 5]
    cases = [(s, t) for s in seeds for t in steps]
    x = np.zeros((len(cases), V), np.float32)
    p = ref.params(len(cases), seed=[s for s, _ in cases], step=[t for _, t in cases])
    tok, lp, rank = sample(x, p)
    assert tok.tolist() == [int(ref.uniform(s, t) * V) for s, t in cases]
    np.testing.assert_allclose(lp, -np.log(V), rtol=1e-6)
    assert rank.tolist() == [t + 1 for t in tok.tolist()]  # all tied: the lower ids come first


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_greedy_rows_are_the_argmax_ops(dtype):
    x = argmax_cases(dtype)
    p = ref.params(x.shape[0], temperature=0.0, seed=3)
    tok, lp, rank = sample(x, p)
    (want,) = [np.zeros(x.shape[0], np.int32)]
    _native.call_op("argmax", [x], [want], {})
    np.testing.assert_array_equal(tok, want)
    np.testing.assert_array_equal(tok, argmax_rows(x))
    ok = tok >= 0
    assert (rank[ok] == 1).all() and (rank[~ok] == 0).all() and np.isnan(lp[~ok]).all()
    xf = f32(x)
    finite = ok & np.isfinite(xf).all(axis=1)
    np.testing.assert_allclose(lp[finite], ref.log_softmax(xf[finite])[np.arange(finite.sum()), tok[finite]],
                               rtol=1e-5, atol=1e-5)
    # A temperature just below the greedy limit is greedy too; a sampled row with a NaN is -1.
    p2 = ref.params(x.shape[0], temperature=0.9e-5)
    np.testing.assert_array_equal(sample(x, p2)[0], want)
    bad = ref.params(x.shape[0], temperature=1.0)
    assert sample(x, bad)[0][2] == -1 and sample(x, bad)[0][3] == -1


def random_rows(R, V, seed, scale=3.0, dtype="float32"):
    return as_dtype(np.random.default_rng(seed).standard_normal((R, V)).astype(np.float32) * scale, dtype)


FILTERS = ref.FILTERS


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("knobs", FILTERS, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
def test_tokens_equal_the_numpy_reference_token_for_token(knobs, dtype):
    R, V = 64, 3001
    x = random_rows(R, V, 4, dtype=dtype)
    seeds = np.arange(R, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(17)
    steps = np.arange(R) * 3 + 1
    tok, lp, rank = sample(x, ref.params(R, seed=seeds, step=steps, **knobs))
    xf = f32(x)
    want = [ref.token(xf[r], int(seeds[r]), int(steps[r]), **knobs) for r in range(R)]
    assert tok.tolist() == want
    for r in range(R):
        assert ref.kept_mask(xf[r], **knobs)[tok[r]]
        assert rank[r] == ref.rank(xf[r], tok[r])
    np.testing.assert_allclose(lp, ref.log_softmax(xf)[np.arange(R), tok], rtol=1e-5, atol=1e-5)


def test_ties_at_the_cut_keep_the_lowest_ids():
    """bf16-like rows with many equal logits: top-k and top-p cut inside a group of ties, and only
    that group's lowest ids are ever drawn."""
    V = 64
    x = np.full(V, -5.0, np.float32)
    x[[3, 10, 20, 30, 40, 50]] = 2.0  # six tied at the top
    x[[1, 2]] = 1.0
    draws = 4000
    cases = {"top_k=4": dict(top_k=4), "top_p=0.5": dict(top_p=0.5)}
    for name, knobs in cases.items():
        keep = ref.kept_mask(x, **knobs)
        tok, _, _ = sample(np.tile(x, (draws, 1)), ref.params(draws, seed=5, step=np.arange(draws), **knobs))
        assert set(tok.tolist()) == set(np.flatnonzero(keep).tolist()), name
    assert np.flatnonzero(ref.kept_mask(x, top_k=4)).tolist() == [3, 10, 20, 30]


@pytest.mark.parametrize("knobs", [dict(temperature=0.8, top_p=0.9), dict(temperature=1.5, top_k=12),
                                   dict(temperature=1.0, min_p=0.1), dict(temperature=1.0)],
                         ids=["top_p", "top_k", "min_p", "plain"])
def test_draws_follow_the_filtered_softmax(knobs):
    """20,000 draws of one row (one seed, steps 0..N-1; then one step, N seeds): the frequencies
    against numpy's filtered softmax(x / T), a chi-square test."""
    V, N = 40, 20000
    x = np.random.default_rng(9).standard_normal(V).astype(np.float32) * 1.5
    want = ref.probs(x, **knobs)
    for p in (ref.params(N, seed=123, step=np.arange(N), **knobs),
              ref.params(N, seed=np.arange(N, dtype=np.uint64) * np.uint64(2654435761), step=7, **knobs)):
        tok, _, _ = sample(np.tile(x, (N, 1)), p, rank=False)
        counts = np.bincount(tok, minlength=V)
        assert (counts[want == 0] == 0).all()
        live = want > 0
        assert scipy_stats.chisquare(counts[live], want[live] * N).pvalue > 1e-4, (counts, want * N)


def test_a_row_gives_the_same_token_for_its_seed_and_step_in_any_batch():
    V = 1000
    x = random_rows(1, V, 2)[0]
    knobs = dict(temperature=0.9, top_k=100, top_p=0.9)
    alone = sample(x[None], ref.params(1, seed=42, step=5, **knobs))[0][0]
    batch = random_rows(7, V, 3)
    batch[4] = x
    seeds, steps = [1, 2, 3, 4, 42, 6, 7], [5, 5, 5, 5, 5, 9, 9]
    got = sample(batch, ref.params(7, seed=seeds, step=steps, **knobs))[0]
    assert got[4] == alone
    assert sample(batch, ref.params(7, seed=seeds, step=steps, **knobs))[0].tolist() == got.tolist()
    # Another step or seed: another draw (in general); over 50 steps the token varies.
    many = sample(np.tile(x, (50, 1)), ref.params(50, seed=42, step=np.arange(50), **knobs))[0]
    assert len(set(many.tolist())) > 5


def test_strided_rows_and_the_rank_output_left_out():
    base = random_rows(3, 500, 8)
    x = base[:, :300]
    p = ref.params(3, temperature=1.0, seed=[1, 2, 3])
    tok, lp, none = sample(x, p, rank=False)
    assert none is None
    want = [ref.token(x[r], r + 1, 0) for r in range(3)]
    assert tok.tolist() == want


def test_bad_calls_say_what_is_wrong():
    x = np.zeros((2, 10), np.float32)
    p = ref.params(2)
    outs = [np.zeros(2, np.int32), np.zeros(2, np.float32), None]
    with pytest.raises(ShapeError, match=r"params \[2, 7\] must be \[R, 8\]"):
        _native.call_op("sample", [x, np.zeros((2, 7), np.float32)], outs, {})
    with pytest.raises(ShapeError, match=r"params \[3, 8\] must be \[R, 8\] = \[2, 8\]"):
        _native.call_op("sample", [x, ref.params(3)], outs, {})
    with pytest.raises(DTypeError, match="params has dtype float16"):
        _native.call_op("sample", [x, p.astype(np.float16)], outs, {})
    with pytest.raises(DTypeError, match="logits has dtype int32"):
        _native.call_op("sample", [x.astype(np.int32), p], outs, {})
    with pytest.raises(ShapeError, match="logits must have 2 dims"):
        _native.call_op("sample", [np.zeros(10, np.float32), p[:1]],
                        [np.zeros(1, np.int32), np.zeros(1, np.float32), None], {})
    with pytest.raises(DTypeError, match="token has dtype float32"):
        _native.call_op("sample", [x, p], [np.zeros(2, np.float32), np.zeros(2, np.float32), None], {})
    with pytest.raises(ShapeError, match=r"logprob \[3\] must be \[R\] = \[2\]"):
        _native.call_op("sample", [x, p], [np.zeros(2, np.int32), np.zeros(3, np.float32), None], {})
    with pytest.raises(InvalidArgumentError, match="output 1 is required"):
        _native.call_op("sample", [x, p], [np.zeros(2, np.int32), None, None], {})


# ---- the optional mask input (a grammar's bitmask, applied on the device) ----------------------

def random_masks(R, V, seed, density=0.02):
    """bool [R, V]: sparse allowed sets (grammar-like), each row with a few allowed tokens."""
    rng = np.random.default_rng(seed)
    allowed = rng.random((R, V)) < density
    allowed[np.arange(R), rng.integers(0, V, R)] = True
    return allowed


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("knobs", FILTERS + [dict(temperature=0.0)],
                         ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
def test_masked_tokens_equal_the_numpy_reference_on_the_masked_row(knobs, dtype):
    """The choice is the reference's on the row with disallowed tokens at -inf (what the host
    Sampler draws from); the logprob and rank stay those of the raw row."""
    R, V = 48, 3001
    x = random_rows(R, V, 9, dtype=dtype)
    xf = f32(x)
    allowed = random_masks(R, V, 1)
    allowed[:4] = True  # unconstrained rows (all ones) draw as without a mask
    allowed[4, :] = False
    allowed[4, [7, 2900]] = True  # two allowed tokens, one past the last full word
    seeds = np.arange(R, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(5)
    steps = np.arange(R) * 7 + 2
    p = ref.params(R, seed=seeds, step=steps, **knobs)
    tok, lp, rank = sample(x, p, mask=ref.pack_mask(allowed))
    want = [ref.token(ref.masked(xf[r], allowed[r]), int(seeds[r]), int(steps[r]), **knobs) for r in range(R)]
    assert tok.tolist() == want
    assert allowed[np.arange(R), tok].all()
    assert tok[:4].tolist() == sample(x[:4], p[:4])[0].tolist()
    assert rank.tolist() == [ref.rank(xf[r], tok[r]) for r in range(R)]
    np.testing.assert_allclose(lp, ref.log_softmax(xf)[np.arange(R), tok], rtol=1e-5, atol=1e-5)


def test_masked_rows_equal_the_host_samplers_masked_draws():
    """The op with a mask and the host Sampler's masked path (serve/sampler.cpp through the toy
    runner's engine) share their row code; here the host's masking rule itself: -inf then the
    unmasked op on that row gives the masked op's tokens for any knobs."""
    R, V = 32, 700
    x = random_rows(R, V, 3)
    allowed = random_masks(R, V, 2, density=0.1)
    for knobs in FILTERS:
        p = ref.params(R, seed=np.arange(R) + 11, step=3, **knobs)
        assert sample(x, p, mask=ref.pack_mask(allowed))[0].tolist() == sample(ref.masked(x, allowed), p)[0].tolist()


def test_a_mask_allowing_nothing_gives_token_minus_two():
    """No allowed token (or only -inf ones): token -2, logprob -inf, rank 0, whatever the
    temperature; a NaN row is still -1 (NaN is checked first, as on the host)."""
    V = 100
    x = random_rows(4, V, 5)
    x[2, 10] = -np.inf
    x[3, 0] = np.nan
    allowed = np.ones((4, V), bool)
    allowed[0] = False
    allowed[1] = False
    allowed[2] = False
    allowed[2, 10] = True
    allowed[3] = False
    p = ref.params(4, temperature=[0.0, 1.0, 0.7, 1.0], seed=1)
    tok, lp, rank = sample(x, p, mask=ref.pack_mask(allowed))
    assert tok.tolist() == [-2, -2, -2, -1]
    assert np.isneginf(lp[:3]).all() and np.isnan(lp[3])
    assert rank.tolist() == [0, 0, 0, 0]


def test_bad_masks_say_what_is_wrong():
    x = np.zeros((2, 40), np.float32)
    p = ref.params(2)
    outs = [np.zeros(2, np.int32), np.zeros(2, np.float32), None]
    with pytest.raises(ShapeError, match=r"mask \[2, 1\] must be \[R, ceil\(V / 32\)\] = \[2, 2\]"):
        _native.call_op("sample", [x, p, np.zeros((2, 1), np.int32)], outs, {})
    with pytest.raises(DTypeError, match="mask has dtype"):
        _native.call_op("sample", [x, p, np.zeros((2, 2), np.float32)], outs, {})

