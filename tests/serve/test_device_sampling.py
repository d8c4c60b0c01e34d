"""Sampling in the serve Program (the `sample` op at its end), through the real engine on a tiny
random Qwen3: a seeded request draws the same tokens alone, in a batch with others and on the
host path (top_logprobs > 0 keeps a row on the host; both paths draw Philox(seed, step) with one
rule); the first tokens of many seeds follow softmax(logits / T) of HF transformers' logits, top-p
filtered (a chi-square test); the logprobs of device-sampled rows are log_softmax of transformers'
logits; logit_bias still reaches the tokens (its rows stay on the host); a runner step with
sample_params draws what the numpy reference of the op draws from the step's own logits."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
scipy_stats = pytest.importorskip("scipy.stats")

import surogate  # noqa: E402
from sgtest import sampling as ref  # noqa: E402
from sgtest.engine import engine  # noqa: E402
from sgtest.tiny_models import make_qwen3  # noqa: E402
from surogate import _native  # noqa: E402
from surogate.serve.model_runner import ProgramRunner  # noqa: E402
from surogate.serve.types import SamplingParams  # noqa: E402

PROMPT = [5, 17, 33, 8, 91, 12, 7]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    path = make_qwen3(tmp_path_factory.mktemp("q"), seed=5, initializer_range=0.2)
    ours = surogate.load_model(path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    return ours, hf


def hf_logits(hf, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].double().numpy()


def tokens(client, jobs):
    ids = [client.submit(p, params) for p, params in jobs]
    outs = [client.wait(i, timeout=120) for i in ids]
    return [[t for o in out for t in o.new_token_ids] for out in outs], outs


def test_a_seeded_request_draws_the_same_tokens_alone_in_a_batch_and_on_the_host_path(models):
    ours, _ = models
    knobs = dict(temperature=0.9, top_k=40, top_p=0.9, max_tokens=12, ignore_eos=True)
    plain = SamplingParams(seed=1234, **knobs)
    rng = np.random.default_rng(2)
    others = [(rng.integers(3, 300, int(n)).tolist(), SamplingParams(seed=int(s), temperature=1.1, max_tokens=9,
                                                                    ignore_eos=True))
              for n, s in zip((3, 21, 9, 30), (1, 2, 3, 4))]
    others.append(([9, 9, 9], SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)))
    with engine(ours) as client:
        (alone,), _ = tokens(client, [(PROMPT, plain)])
        batch, _ = tokens(client, others[:2] + [(PROMPT, plain)] + others[2:])
        (host,), outs = tokens(client, [(PROMPT, SamplingParams(seed=1234, logprobs=2, **knobs))])
        (other_seed,), _ = tokens(client, [(PROMPT, SamplingParams(seed=1235, **knobs))])
    assert batch[2] == alone
    assert host == alone  # the host Sampler made these draws (top_logprobs > 0): the same ones
    assert sum(len(o.logprobs or []) for o in outs[0]) == 12
    assert other_seed != alone
    assert len(set(alone)) > 3  # really sampled


@pytest.mark.parametrize("knobs", [dict(temperature=0.8, top_p=0.9), dict(temperature=1.3)], ids=["top_p", "plain"])
def test_first_tokens_of_many_seeds_follow_transformers_softmax(models, knobs):
    ours, hf = models
    x = hf_logits(hf, PROMPT)[-1]
    want = ref.probs(x.astype(np.float32), **knobs)
    N = 1500
    with engine(ours, max_num_seqs=128) as client:
        firsts, _ = tokens(client, [(PROMPT, SamplingParams(seed=s, max_tokens=1, **knobs)) for s in range(N)])
    counts = np.bincount([f[0] for f in firsts], minlength=len(x))
    assert counts[want == 0].sum() == 0
    big = want * N >= 5
    obs = np.append(counts[big], counts[~big & (want > 0)].sum())
    exp = np.append(want[big] * N, want[~big & (want > 0)].sum() * N)
    keep = exp > 0
    assert scipy_stats.chisquare(obs[keep], exp[keep]).pvalue > 1e-4, (obs, exp)


def test_device_logprobs_are_log_softmax_of_transformers_logits(models):
    ours, hf = models
    knobs = dict(temperature=1.0, max_tokens=10, ignore_eos=True, seed=77)
    with engine(ours) as client:
        (dev,), dev_out = tokens(client, [(PROMPT, SamplingParams(logprobs=0, **knobs))])
        (host,), host_out = tokens(client, [(PROMPT, SamplingParams(logprobs=3, **knobs))])
    assert dev == host
    lps = [lp for o in dev_out[0] for lp in o.logprobs]
    host_lps = [lp for o in host_out[0] for lp in o.logprobs]
    x = hf_logits(hf, PROMPT + dev)[len(PROMPT) - 1:-1]
    want = ref.log_softmax(x)[np.arange(len(dev)), dev]
    np.testing.assert_allclose([lp.logprob for lp in lps], want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose([lp.logprob for lp in lps], [lp.logprob for lp in host_lps], rtol=1e-5, atol=1e-5)
    assert [lp.rank for lp in lps] == [ref.rank(x[j], t) for j, t in enumerate(dev)]
    assert [lp.rank for lp in lps] == [lp.rank for lp in host_lps]
    assert all(not lp.top for lp in lps) and all(len(lp.top) == 3 for lp in host_lps)


def test_logit_bias_rows_keep_the_host_path(models):
    ours, _ = models
    with engine(ours) as client:
        (biased,), _ = tokens(client, [(PROMPT, SamplingParams(seed=3, temperature=1.0, max_tokens=8, ignore_eos=True,
                                                              logit_bias={42: 100.0}))])
        (banned,), _ = tokens(client, [(PROMPT, SamplingParams(seed=3, temperature=1.0, max_tokens=8, ignore_eos=True,
                                                              top_k=2, logit_bias={t: -100.0 for t in range(60)}))])
    assert biased == [42] * 8
    assert min(banned) >= 60


def test_a_runner_step_with_sample_params_draws_the_references_token_from_its_logits(models):
    ours, _ = models
    runner = ProgramRunner(ours, num_blocks=16)
    lens = [5, 9, 3]
    ids = sum(([(7 * i + n) % 200 + 3 for i in range(n)] for n in lens), [])
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    tables, slots, b0 = [], [], 0
    for n in lens:
        slots += [b0 * 16 + p for p in range(n)]
        tables.append(b0)
        b0 += 1
    knobs = [dict(temperature=0.0), dict(temperature=0.7, top_k=10), dict(temperature=1.2, top_p=0.8, min_p=0.05)]
    p = np.concatenate([ref.params(1, seed=10 + r, step=r, **k) for r, k in enumerate(knobs)])
    step = _native.serve.StepInput.make(ids, np.concatenate([np.arange(n) for n in lens]).astype(np.int32), slots, cu,
                                        lens, tables, cu[1:] - 1, block_size=16, sample_params=p)
    logits, got = runner.run(step)
    want = [int(np.argmax(logits[0]))] + [ref.token(logits[r], 10 + r, r, **knobs[r]) for r in (1, 2)]
    assert got.tolist() == want
