"""The engine's decoding controls beyond the sampler, on the toy runner of test_engine: a
reasoning budget (forced end-of-span tokens), logit_bias on the engine path, and grammar masks
through a Python TokenMasker under continuous batching."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from surogate.serve import SamplingParams, StructuredOutputsParams

sys.path.insert(0, str(Path(__file__).parent))  # the toy runner and its reference live in test_engine
from test_engine import V, greedy, make_engine, prompts, reference, run_to_end  # noqa: E402

END, START = 7, 9


def budget(n, started=True, **kw) -> SamplingParams:
    return greedy(max_reasoning_tokens=n, reasoning_start_token_id=START, reasoning_end_token_id=END,
                  reasoning_started=started, reasoning_end_ids=[5, END], ignore_eos=True, **kw)


@pytest.mark.parametrize("n", [0, 1, 4])
def test_a_reasoning_budget_forces_the_end_of_the_span_then_sampling_goes_on(n):
    engine, _ = make_engine()
    prompt = [3, 4, 11, 12]
    rid = engine.submit(prompt, budget(n, max_tokens=n + 6), -1)
    tokens = run_to_end(engine)[rid]["tokens"]
    assert tokens[n:n + 2] == [5, END]
    # the sampled tokens are the model's greedy ones, on the context the forced tokens made
    free, _ = reference(prompt, max_tokens=n, ignore_eos=True)
    assert tokens[:n] == free[:n] or n == 0
    after, _ = reference(prompt + tokens[:n + 2], max_tokens=4, ignore_eos=True)
    assert tokens[n + 2:] == after


def test_without_an_open_span_the_budget_waits_for_the_start_token():
    engine, _ = make_engine()
    prompt = [3, 4, 11, 12]
    free, _ = reference(prompt, max_tokens=8, ignore_eos=True)
    assert START not in free[:1]
    rid = engine.submit(prompt, budget(2, started=False, max_tokens=8), -1)
    assert run_to_end(engine)[rid]["tokens"] == free  # no span opened: nothing forced
    # +100 on the start token makes the model open the span: two tokens, then the forced end
    rid = engine.submit(prompt, budget(2, started=False, max_tokens=8, logit_bias={START: 100.0}), -1)
    tokens = run_to_end(engine)[rid]["tokens"]
    assert tokens[0] == START and tokens[1:3] == [START, START] and tokens[3:5] == [5, END]


def test_logit_bias_on_the_engine_path():
    engine, _ = make_engine()
    prompt = [3, 4, 11, 12]
    free, _ = reference(prompt, max_tokens=1, ignore_eos=True)
    rid = engine.submit(prompt, greedy(max_tokens=1, logit_bias={free[0]: -100.0}), -1)
    assert run_to_end(engine)[rid]["tokens"] != free


class RecordingMasker:
    """Allows only the tokens of an arithmetic pattern per request, and records what it was fed."""

    def __init__(self):
        self.fed: dict[int, list[int]] = {}
        self.allowed: dict[int, set] = {}

    def fill(self, request_ids, new_tokens, rows):
        assert rows.shape == (len(request_ids), (V + 31) // 32) and rows.dtype == np.int32
        rows[:] = 0
        for i, (rid, toks) in enumerate(zip(request_ids, new_tokens)):
            self.fed.setdefault(rid, []).extend(toks)
            for t in self.allowed[rid]:
                rows[i, t // 32] |= np.int32(1 << (t % 32)) if t % 32 != 31 else np.int32(-2**31)


def test_grammar_masks_under_continuous_batching_see_every_answer_token_once():
    engine, _ = make_engine(num_blocks=24)
    masker = RecordingMasker()
    engine.set_token_masker(masker.fill)
    ids = []
    spec = StructuredOutputsParams(regex="x")
    for k, prompt in enumerate(prompts(12, seed=3)):
        rid = engine.submit(prompt, greedy(max_tokens=6 + k % 3, structured_outputs=spec, ignore_eos=True), -1)
        masker.allowed[rid] = {31, 33 + k, 40 + k} if k % 2 else {k + 1}
        ids.append(rid)
    results = run_to_end(engine)
    for rid in ids:
        tokens = results[rid]["tokens"]
        assert set(tokens) <= masker.allowed[rid]
        assert masker.fed[rid] == tokens[:-1]  # each token fed once, in order; the last one never needed


def test_a_constrained_request_needs_a_masker():
    from surogate.errors import InvalidArgumentError

    engine, _ = make_engine()
    with pytest.raises(InvalidArgumentError, match="token masker"):
        engine.submit([1, 2], greedy(structured_outputs=StructuredOutputsParams(regex="a")), -1)
