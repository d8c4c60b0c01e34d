"""Speculative decoding in the native engine (n-gram drafts, one verification span per sequence),
driven through PyModelRunner by toy runners whose outputs are known in closed form, so every
difference from plain decoding is a bug: the tokens kept, the KV rolled back (the toy reads its
own cache through the block tables, so a wrong rollback changes the tokens), the blocks freed,
the prefix cache, preemption, stop rules inside an accepted run; and a chi-square test that
sampled tokens keep the target distribution. The real model (SmolLM2) is in
test_speculative_smollm2.py."""

from __future__ import annotations

import numpy as np
import pytest

from surogate import _native
from surogate.errors import InvalidArgumentError, SurogateError
from surogate.serve import EngineClient, EngineConfig, SamplingParams

from sgtest.speculation import V, CopyRunner, prompts, reference


def client(num_blocks=64, block_size=4, spec=4, **kw):
    cfg = EngineConfig(num_blocks=num_blocks, block_size=block_size, eos_token_ids=[],
                       **({"speculative_method": "ngram", "num_speculative_tokens": spec,
                           "prompt_lookup_min": 1, "prompt_lookup_max": 3} if spec else {}), **kw)
    runner = CopyRunner(num_blocks * block_size)
    return EngineClient(runner, cfg), runner


def run_all(c, ps, params):
    ids = [c.submit(p, params) for p in ps]
    outs = [c.wait(i, timeout=60) for i in ids]
    return [([t for o in os for t in o.new_token_ids], os[-1].finish_reason) for os in outs]


GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)


def test_greedy_speculation_equals_plain_decoding_and_accepts_drafts():
    ps = prompts(12)
    want = [reference(p, 40) for p in ps]
    c, runner = client()
    with c:
        assert run_all(c, ps[:1], GREEDY) == want[:1]  # alone
        assert run_all(c, ps, GREEDY) == want  # 12 at once, one span of 1 + k tokens each
        s = c.stats()
        assert s.blocks_used == 0
    assert s.spec_num_drafts > 0 and s.spec_num_draft_tokens >= s.spec_num_drafts
    rate = s.spec_num_accepted_tokens / s.spec_num_draft_tokens
    # the toy copies 3 times in 4 (a run of j accepted drafts has probability 0.75^j): 0.37 here;
    # drafts off by one position, or random ones, are accepted ~1 time in 61
    assert rate > 0.3, rate
    assert sum(s.spec_accepted_per_pos) == s.spec_num_accepted_tokens and len(s.spec_accepted_per_pos) == 4
    assert s.generation_tokens == 13 * 40
    assert s.num_steps < 13 * 40 / 1.3  # fewer steps than tokens: more than one token per step
    assert any(r > sq for _, sq, r in runner.steps)  # verification rows: several per sequence


def test_preemption_prefix_cache_and_tight_budget_change_nothing():
    ps = prompts(16, seed=1)
    want = [reference(p, 30) for p in ps]
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    # 20 blocks of 4 hold ~1.6 of the 50-token requests: preemption; a 7-token budget cuts drafts.
    c, _ = client(num_blocks=20, max_num_batched_tokens=7, max_num_seqs=8)
    with c:
        assert run_all(c, ps, params) == want
        s = c.stats()
        assert s.num_preemptions > 0 and s.spec_num_accepted_tokens > 0 and s.blocks_used == 0
    c, _ = client(num_blocks=256)
    with c:
        assert run_all(c, ps, params) == want
        hits = c.stats().prefix_cache_hits
        # again, and with the outputs as prompts: every cached block must hold accepted tokens only
        assert run_all(c, ps, params) == want
        assert c.stats().prefix_cache_hits > hits
        longer = [p + o[:20] for p, (o, _) in zip(ps, want)]
        assert run_all(c, longer, params) == [reference(p, 30) for p in longer]


@pytest.mark.parametrize("case", [
    dict(eos=True), dict(eos=True, min_tokens=9), dict(stop=True), dict(max_tokens=7), dict(max_tokens=1),
    dict(max_model_len=29),
])
def test_stop_rules_inside_an_accepted_run(case):
    ps = prompts(10, seed=2)
    max_tokens, min_tokens = case.get("max_tokens", 40), case.get("min_tokens", 0)
    mml = case.get("max_model_len")
    params, want = [], []
    for p in ps:  # each request's stop token is one its copy repeats: it lands inside accepted runs
        eos = [p[2]] if case.get("eos") else []
        stop = [p[2]] if case.get("stop") else []
        params.append(SamplingParams(temperature=0.0, max_tokens=max_tokens, min_tokens=min_tokens,
                                     stop_token_ids=stop, eos_token_ids=eos))
        want.append(reference(p, max_tokens, eos, stop, min_tokens, mml))
    c, _ = client(**({"max_model_len": mml} if mml else {}))
    with c:
        ids = [c.submit(p, sp) for p, sp in zip(ps, params)]
        outs = [c.wait(i, timeout=60) for i in ids]
        s = c.stats()
    assert [([t for o in os for t in o.new_token_ids], os[-1].finish_reason) for os in outs] == want
    if case.get("eos") or case.get("stop"):
        assert sum(r == "stop" for _, r in want) >= (1 if min_tokens else 5)
        assert all(os[-1].stop_token_id == (p[2] if r == "stop" else None) for os, p, (_, r) in zip(outs, ps, want))
    assert (s.spec_num_accepted_tokens > 0) == (max_tokens > 2) and s.blocks_used == 0


def test_requests_that_cannot_speculate_run_plain_beside_those_that_do():
    ps = prompts(8, seed=3)
    want = [reference(p, 40) for p in ps]
    c, _ = client()
    with c:
        budget = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, max_reasoning_tokens=100,
                                reasoning_start_token_id=V - 1, reasoning_end_token_id=V - 2,
                                reasoning_end_ids=[V - 2])
        lp = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, logprobs=2)
        ids = [c.submit(p, [GREEDY, budget, lp][i % 3]) for i, p in enumerate(ps)]
        outs = [c.wait(i, timeout=60) for i in ids]
    for i, (os, (w, _)) in enumerate(zip(outs, want)):
        toks = [t for o in os for t in o.new_token_ids]
        if i % 3 == 1 and (V - 1) in w[:1]:
            continue  # the budget request's model opened a reasoning span: other rules apply
        assert toks == w
        if i % 3 == 2:  # logprobs: one per token, of the token emitted, from its own verification row
            lps = [lp for o in os for lp in o.logprobs]
            assert [lp.token_id for lp in lps] == toks
            assert all(lp.rank == 1 for lp in lps)
            assert np.allclose([lp.logprob for lp in lps], np.log(1 / np.exp(-0.5 * np.arange(V)).sum()), atol=1e-5)


# ---- sampling: the target distribution -------------------------------------------------------

VS = 6
P_ROW = np.array([0.35, 0.25, 0.15, 0.12, 0.08, 0.05])


class FixedRunner:
    """Every row is the same known distribution, whatever the context: sampled tokens must be
    i.i.d. from it, at every position, drafts or not."""

    vocab_size = VS

    def __init__(self) -> None:
        self.first_drafts: list[int] = []  # the first draft token of every verification span

    def run(self, step) -> np.ndarray:
        cu = step.cu_q
        self.first_drafts += [int(step.token_ids[cu[s] + 1]) for s in range(step.num_seqs)
                              if cu[s + 1] - cu[s] > 1 and step.positions[cu[s]] >= 5]  # not a 5-token prompt
        return np.tile(np.log(P_ROW).astype(np.float32), (len(step.logits_rows), 1))


def fixed_client(spec: bool):
    cfg = EngineConfig(num_blocks=512, block_size=8, eos_token_ids=[], max_num_seqs=64, seed=7,
                       **({"speculative_method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
                           "prompt_lookup_max": 2} if spec else {}))
    runner = FixedRunner()
    return EngineClient(runner, cfg), runner


def test_sampled_tokens_keep_the_target_distribution():
    from scipy.stats import chisquare

    n_req, n_tok = 400, 12
    c, runner = fixed_client(spec=True)
    with c:
        got = run_all(c, [[0, 1, 0, 1, 0]] * n_req, SamplingParams(temperature=1.0, max_tokens=n_tok, ignore_eos=True))
        s = c.stats()
    tokens = np.array([t for toks, _ in got for t in toks])
    assert len(tokens) == n_req * n_tok
    assert s.spec_num_draft_tokens > 1000  # speculation really ran
    counts = np.bincount(tokens, minlength=VS)
    assert chisquare(counts, P_ROW * len(tokens)).pvalue > 1e-3, counts / len(tokens)
    # A point-mass draft t is accepted with probability p(t): the first draft of each span (the
    # runner saw them all) is accepted sum p(d) times, give or take binomial noise.
    d = np.array(runner.first_drafts)
    assert len(d) == s.spec_num_drafts
    expected, sd = P_ROW[d].sum(), np.sqrt((P_ROW[d] * (1 - P_ROW[d])).sum())
    assert abs(s.spec_accepted_per_pos[0] - expected) < 4 * sd, (s.spec_accepted_per_pos[0], expected, sd)
    by_pos = np.array(s.spec_accepted_per_pos, dtype=float)
    assert by_pos[0] > by_pos[1] > by_pos[2] > 0


def test_a_seeded_sampled_request_gives_the_tokens_of_plain_decoding():
    # One draw per emitted token, in order, from the request's own generator: verification
    # reproduces plain sampling token for token (top-k and a penalty included).
    params = [SamplingParams(temperature=0.8, top_k=4, presence_penalty=0.3, max_tokens=30, ignore_eos=True,
                             seed=100 + i) for i in range(20)]
    outs = {}
    for spec in (False, True):
        c, _ = fixed_client(spec)
        with c:
            ids = [c.submit([0, 1, 0, 1, 0, 1], p) for p in params]
            outs[spec] = [[t for o in c.wait(i, timeout=60) for t in o.new_token_ids] for i in ids]
            if spec:
                assert c.stats().spec_num_accepted_tokens > 0
    assert outs[True] == outs[False]


# ---- configuration -----------------------------------------------------------------------------

@pytest.mark.parametrize("kw, field", [
    ({"speculative_method": "medusa", "num_speculative_tokens": 3}, "speculative_method"),
    ({"speculative_method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"speculative_method": "ngram"}, "num_speculative_tokens"),
    ({"num_speculative_tokens": 3}, "speculative_method"),
    ({"speculative_method": "ngram", "num_speculative_tokens": 99}, "num_speculative_tokens"),
    ({"speculative_method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
     "prompt_lookup_min"),
    ({"speculative_method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 0}, "prompt_lookup_min"),
])
def test_bad_speculative_config_names_the_field(kw, field):
    with pytest.raises(SurogateError, match=field):
        EngineClient(CopyRunner(64), EngineConfig(num_blocks=16, block_size=4, **kw))


def test_ngram_defaults_follow_vllm():
    assert (EngineConfig(num_blocks=1, speculative_method="ngram").prompt_lookup_min,
            EngineConfig(num_blocks=1, speculative_method="ngram").prompt_lookup_max) == (5, 5)
    c = EngineConfig(num_blocks=1, speculative_method="ngram", prompt_lookup_max=3)
    assert (c.prompt_lookup_min, c.prompt_lookup_max) == (3, 3)


@pytest.mark.parametrize("kw, what", [
    ({"speculative_method": "medusa", "num_speculative_tokens": 3}, "--speculative-method 'medusa'"),
    ({"speculative_method": "ngram"}, "go together"),
    ({"num_speculative_tokens": 3}, "go together"),
    ({"prompt_lookup_min": 2}, "are for --speculative-method ngram"),
    ({"speculative_method": "draft", "num_speculative_tokens": 3}, "--speculative-model go together"),
    ({"speculative_method": "ngram", "num_speculative_tokens": 3, "speculative_model": "x"}, "go together"),
])
def test_bad_serve_flags_are_clear_errors(kw, what):
    from surogate.serve.launch import launch

    with pytest.raises(InvalidArgumentError, match=what):
        launch("no/such/model", **kw)  # checked before the model loads


def test_speculation_pauses_while_the_batch_is_larger_than_disable_by_batch_size():
    ps = prompts(6, seed=5)
    want = [reference(p, 40) for p in ps]
    drafts = {}
    for limit in (0, 2):
        c, _ = client(speculative_disable_by_batch_size=limit)
        with c:
            assert run_all(c, ps, GREEDY) == want
            drafts[limit] = c.stats().spec_num_drafts
    # 6 run together to the end (same lengths): with the limit at 2 almost no step drafts
    assert drafts[0] > 30 and drafts[2] < drafts[0] / 4, drafts
