"""The native sampler on given logits rows: penalties against the HF / OpenAI formulas, the
filters, the temperature distribution, seeds and logprobs; its draws are the `sample` op's
(Philox(seed, step), numpy's reference of the op), and which rows go to the host."""

from __future__ import annotations

import numpy as np
import pytest

from surogate import _native
from surogate.serve import SamplingParams

serve = _native.serve


def test_repetition_penalty_follows_hf_over_prompt_and_output():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=50).astype(np.float32) * 3
    prompt, output = [1, 2, 2, 7, 9], [9, 11, 11, 11]
    got = serve.apply_penalties(logits, SamplingParams(repetition_penalty=1.3), prompt, output)
    want = logits.copy()
    for t in set(prompt + output):  # once per distinct token, however often it occurs
        want[t] = want[t] / 1.3 if want[t] > 0 else want[t] * 1.3
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_frequency_and_presence_penalties_follow_openai_over_output_only():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=50).astype(np.float32)
    prompt, output = [3, 4, 5], [5, 6, 6, 6, 8]
    params = SamplingParams(frequency_penalty=0.5, presence_penalty=0.25)
    got = serve.apply_penalties(logits, params, prompt, output)
    want = logits.copy()
    counts = np.bincount(output, minlength=50)
    want -= counts * 0.5 + (counts > 0) * 0.25  # prompt tokens 3, 4 are not penalized
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_penalties_combine_repetition_first():
    logits = np.array([1.0, -1.0, 2.0, 0.5], np.float32)
    params = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.1, presence_penalty=0.2)
    got = serve.apply_penalties(logits, params, [0], [1, 1, 2])
    np.testing.assert_allclose(got, [0.5, -2.0 - 0.2 - 0.2, 1.0 - 0.1 - 0.2, 0.5], rtol=1e-6)


def test_min_tokens_masks_eos_and_stop_tokens_until_reached():
    logits = np.zeros(8, np.float32)
    params = SamplingParams(min_tokens=2, eos_token_ids=[0], stop_token_ids=[5])
    assert np.isneginf(serve.apply_penalties(logits, params, [1], [3])[[0, 5]]).all()
    assert np.isfinite(serve.apply_penalties(logits, params, [1], [3, 4])).all()
    ignore = SamplingParams(min_tokens=2, eos_token_ids=[0], stop_token_ids=[5], ignore_eos=True)
    masked = serve.apply_penalties(logits, ignore, [1], [])
    assert np.isfinite(masked[0]) and np.isneginf(masked[5])


def test_greedy_takes_the_lowest_id_on_ties():
    logits = np.array([0.0, 3.0, 1.0, 3.0], np.float32)
    assert serve.sample(logits, SamplingParams(temperature=0.0), [0], [], n=5).tolist() == [1] * 5


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_distribution(temperature):
    logits = np.array([2.0, 1.0, 0.0, -1.0, 0.5], np.float32)
    n = 20_000
    draws = serve.sample(logits, SamplingParams(temperature=temperature, seed=7), [0], [], n=n)
    freq = np.bincount(draws, minlength=5) / n
    p = np.exp(logits / temperature) / np.exp(logits / temperature).sum()
    # sd of a frequency is <= 0.0036 here; 0.015 is a loose, deterministic (seeded) bound
    np.testing.assert_allclose(freq, p, atol=0.015)


def test_top_k_top_p_min_p_keep_only_their_tokens():
    logits = np.log(np.array([0.40, 0.25, 0.15, 0.10, 0.06, 0.04], np.float32))
    n = 5000

    def kept(**kw):
        draws = serve.sample(logits, SamplingParams(seed=3, **kw), [0], [], n=n)
        return np.bincount(draws, minlength=6) / n

    f = kept(top_k=2)
    assert f[2:].sum() == 0 and f[0] == pytest.approx(0.40 / 0.65, abs=0.03)
    f = kept(top_p=0.7)  # 0.40 + 0.25 < 0.7 <= 0.80: three tokens
    assert f[3:].sum() == 0 and f[2] == pytest.approx(0.15 / 0.80, abs=0.03)
    f = kept(min_p=0.3)  # p >= 0.3 * 0.40 = 0.12: three tokens
    assert f[3:].sum() == 0 and f[0] == pytest.approx(0.40 / 0.80, abs=0.03)
    f = kept(top_k=4, top_p=0.7, min_p=0.5)  # top-k then top-p (3 left), then min-p (p >= 0.2): two
    assert f[2:].sum() == 0
    assert kept(top_p=1e-6)[0] == 1.0  # always at least the most likely token
    assert kept(top_k=1, temperature=3.0)[0] == 1.0


def test_top_p_over_a_large_vocabulary():
    # More than the sorted head (256) of candidates is needed to reach top_p.
    logits = np.zeros(5000, np.float32)
    logits[:10] = 1.0
    draws = serve.sample(logits, SamplingParams(seed=4, top_p=0.5), [0], [], n=4000)
    assert draws.max() >= 256 and np.unique(draws).size > 500
    p = np.exp(1.0) / (10 * np.exp(1.0) + 4990)
    # kept: 10 high tokens then low ones in id order until half of the mass
    kept_mass = 10 * p
    n_low = int(np.ceil((0.5 - kept_mass) * (10 * np.exp(1.0) + 4990)))
    assert draws.max() <= 10 + n_low


def test_same_seed_same_draws():
    logits = np.random.default_rng(5).normal(size=100).astype(np.float32)
    a = serve.sample(logits, SamplingParams(seed=11), [0], [], n=50)
    b = serve.sample(logits, SamplingParams(seed=11), [0], [], n=50)
    c = serve.sample(logits, SamplingParams(seed=12), [0], [], n=50)
    assert a.tolist() == b.tolist() != c.tolist()


def test_host_draws_are_the_sample_ops_at_each_step():
    """serve.sample's k-th draw is step k under the request's seed: the numpy reference of the
    `sample` op predicts every one, so a row sampled on the host and one sampled by the op on the
    device draw the same token."""
    from sgtest import sampling as ref

    logits = np.random.default_rng(6).normal(size=300).astype(np.float32) * 2
    for kw in (dict(temperature=0.7), dict(temperature=1.2, top_k=30, top_p=0.85), dict(min_p=0.1)):
        draws = serve.sample(logits, SamplingParams(seed=2**40 + 9, **kw), [0], [], n=40)
        assert draws.tolist() == [ref.token(logits, 2**40 + 9, k, **kw) for k in range(40)]
        later = serve.sample(logits, SamplingParams(seed=2**40 + 9, **kw), [0], [1, 2, 3], n=5)  # 3 generated
        assert later.tolist() == draws[3:8].tolist()


def test_which_rows_need_their_logits_on_the_host():
    def host(device=True, out=(), **kw):
        return serve.needs_logits(SamplingParams(**kw), [5, 6], list(out), device)

    # a runner that samples on its device: plain rows stay there, with their own logprob and rank
    assert not host() and not host(temperature=0.0) and not host(logprobs=0) and not host(top_k=5, top_p=0.5, min_p=0.1)
    assert host(logprobs=1) and host(logit_bias={3: 1.0}) and host(repetition_penalty=1.1)
    assert host(presence_penalty=0.5) and host(frequency_penalty=0.5)
    assert host(min_tokens=2, eos_token_ids=[0]) and not host(min_tokens=2, eos_token_ids=[0], out=[7, 8])
    # without: every sampled row and every logprob, as before
    assert host(device=False) and host(device=False, temperature=0.0, logprobs=0)
    assert not host(device=False, temperature=0.0)


def test_masked_tokens_are_never_drawn():
    logits = np.zeros(4, np.float32)
    draws = serve.sample(logits, SamplingParams(seed=1, min_tokens=5, eos_token_ids=[0], stop_token_ids=[2]),
                         [1], [], n=2000)
    assert set(draws.tolist()) == {1, 3}


def test_logprob_is_log_softmax_with_rank_and_top():
    logits = np.array([0.5, 2.0, -1.0, 2.0, 0.0], np.float32)
    token, lp, rank, top = serve.logprob(logits, 3, top_n=3)
    ref = logits - np.logaddexp.reduce(logits.astype(np.float64))
    assert token == 3 and lp == pytest.approx(ref[3], abs=1e-6)
    assert rank == 2  # tie with token 1, which ranks first (lower id)
    assert [t for t, _ in top] == [1, 3, 0]
    assert [v for _, v in top] == pytest.approx(ref[[1, 3, 0]], abs=1e-6)
    assert serve.logprob(logits, 2)[2:] == (5, [])


def test_logit_bias_is_added_after_the_min_tokens_mask_and_before_the_penalties():
    logits = np.array([1.0, 2.0, -1.0, 0.5], np.float32)
    params = SamplingParams(logit_bias={1: -100.0, 3: 2.5}, repetition_penalty=2.0, min_tokens=1, eos_token_ids=[0])
    got = serve.apply_penalties(logits, params, [3], [])
    # eos masked; 1 biased; 3 biased then divided by the repetition penalty (it is in the prompt)
    np.testing.assert_allclose(got, [-np.inf, -98.0, -1.0, (0.5 + 2.5) / 2.0], rtol=1e-6)


def test_logit_bias_changes_greedy_and_forces_a_token():
    logits = np.array([0.0, 3.0, 1.0, 2.0], np.float32)
    assert serve.sample(logits, SamplingParams(temperature=0.0, logit_bias={1: -100.0}), [0], []).tolist() == [3]
    forced = SamplingParams(temperature=1.0, seed=3, logit_bias={2: 100.0})
    assert set(serve.sample(logits, forced, [0], [], n=200).tolist()) == {2}


@pytest.mark.parametrize("bias", [{7: 1.0}, {-1: 1.0}, {1: 100.5}, {1: float("nan")}])
def test_bad_logit_bias_is_refused_naming_the_field(bias):
    from surogate.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="logit_bias"):
        serve.sample(np.zeros(4, np.float32), SamplingParams(logit_bias=bias), [0], [])


def bitmask(allowed, V):
    words = np.zeros((V + 31) // 32, np.uint32)
    for t in allowed:
        words[t // 32] |= np.uint32(1) << np.uint32(t % 32)
    return words.view(np.int32)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_grammar_bitmask_limits_greedy_and_sampled_tokens(temperature):
    V = 70  # three words, the last one partly used
    logits = np.random.default_rng(4).normal(size=V).astype(np.float32)
    allowed = [3, 33, 64, 69]
    got = serve.sample(logits, SamplingParams(temperature=temperature, seed=5), [0], [], n=300,
                       allowed_mask=bitmask(allowed, V))
    assert set(got.tolist()) <= set(allowed)
    if temperature == 0.0:
        assert got[0] == max(allowed, key=lambda t: logits[t])
    else:
        assert len(set(got.tolist())) > 1


def test_a_bitmask_that_allows_nothing_sampleable_is_an_error():
    from surogate.errors import InvalidArgumentError

    params = SamplingParams(temperature=0.0, min_tokens=1, eos_token_ids=[2])
    with pytest.raises(InvalidArgumentError, match="grammar allows only"):
        serve.sample(np.zeros(8, np.float32), params, [0], [], allowed_mask=bitmask([2], 8))
