"""Speculative decoding (n-gram) on real Programs over the paged KV cache: greedy output equals
plain decoding on every registered family's tiny random model and on the real default model,
SmolLM2-135M-Instruct, many prompts at once, with the prefix cache warm and under preemption in
a small cache; and on SmolLM2's own continuations of repetitive text (lists, copying, code) the
drafts are really accepted."""

from __future__ import annotations

import pytest

import surogate
from sgtest.engine import draft_engine, engine, generate, prompts
from sgtest.tiny_models import make_model
from surogate.errors import InvalidArgumentError
from surogate.models import REGISTRY
from surogate.serve.types import SamplingParams

NGRAM = dict(speculative_method="ngram", num_speculative_tokens=4, prompt_lookup_min=1, prompt_lookup_max=3)


@pytest.fixture(scope="module", params=[f.name for f in REGISTRY])
def tiny(request, tmp_path_factory):
    path = make_model(request.param, tmp_path_factory.mktemp(request.param), seed=21, initializer_range=0.2)
    return surogate.load_model(path)


def test_tiny_models_greedy_speculation_equals_plain(tiny):
    # prompts repeating a short unit: the n-gram proposer has something to draft from
    ps = [(p * 3)[:40] for p in prompts(tiny.spec.vocab_size, 10, seed=4)]
    with engine(tiny) as plain:
        want = generate(plain, ps, 12)
    try:
        spec = engine(tiny, **NGRAM)
    except InvalidArgumentError as e:  # conv layers keep a per-sequence state: refused, clearly
        assert "recurrent state" in str(e) and tiny.spec.layer_kinds and "conv" in tiny.spec.layer_kinds
        return
    with spec:
        assert generate(spec, ps, 12) == want
        assert spec.stats().spec_num_draft_tokens > 0
    with engine(tiny, num_blocks=14, block_size=4, max_num_batched_tokens=9, enable_prefix_caching=False,
                **NGRAM) as small:
        assert generate(small, ps, 12) == want
        assert small.stats().num_preemptions > 0


def test_tiny_models_seeded_sampled_speculation_equals_plain(tiny):
    """Sampled rows verify on the device (a row j draws at step num_output + j, as plain decoding):
    a seeded request gives the tokens of plain decoding; low temperature, so drafts get accepted."""
    ps = [(p * 3)[:40] for p in prompts(tiny.spec.vocab_size, 6, seed=5)]
    params = [SamplingParams(seed=100 + i, temperature=0.3, top_p=0.95, max_tokens=12, ignore_eos=True)
              for i in range(len(ps))]

    def run(client):
        ids = [client.submit(p, sp) for p, sp in zip(ps, params)]
        return [[t for out in client.wait(i, timeout=120) for t in out.new_token_ids] for i in ids]

    with engine(tiny) as plain:
        want = run(plain)
    try:
        spec = engine(tiny, **NGRAM)
    except InvalidArgumentError:  # conv layers: refused (the test above checks the reason)
        return
    with spec:
        assert run(spec) == want
        assert spec.stats().spec_num_draft_tokens > 0


TEXTS = [
    "apple, banana, cherry, date, elderberry, fig, grape, apple, banana, cherry, date, elderberry, fig, grape, "
    "apple, banana,",
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,",
    "The cat sat on the mat. The cat sat on the mat. The cat sat on the mat. The cat",
    "Monday Tuesday Wednesday Thursday Friday Saturday Sunday Monday Tuesday",
    "<li>one</li>\n<li>two</li>\n<li>three</li>\n<li>four</li>\n",
]


@pytest.mark.slow
def test_smollm2_greedy_speculation_equals_plain_and_accepts_drafts():
    from sgtest.smollm2 import smollm2_path

    model = surogate.load_model(smollm2_path())
    ps = [model.tokenizer.encode(t) for t in TEXTS]
    n = 24
    with engine(model, num_blocks=64) as plain:
        want = generate(plain, ps, n)
    ngram = dict(NGRAM, prompt_lookup_min=2, prompt_lookup_max=4)
    with engine(model, num_blocks=64, **ngram) as spec:
        assert generate(spec, ps, n) == want  # 6 at once
        s = spec.stats()
        hits = s.prefix_cache_hits
        # warm: the prefix cache now holds the blocks the verification spans accepted
        assert generate(spec, [p + w[:8] for p, w in zip(ps, want)], n - 8) == [w[8:] for w in want]
        assert spec.stats().prefix_cache_hits > hits
    rate = s.spec_num_accepted_tokens / s.spec_num_draft_tokens
    # SmolLM2 continues these lists and copies (0.6 to 0.8 measured); drafts of random vocabulary
    # tokens, or ones off by a position, are accepted ~never
    print(f"SmolLM2 n-gram acceptance: {rate:.3f} ({s.spec_num_accepted_tokens} of {s.spec_num_draft_tokens} draft "
          f"tokens, {s.spec_num_accepted_tokens / s.spec_num_drafts:.2f} per draft)")
    assert rate > 0.4, (rate, s.spec_num_accepted_tokens, s.spec_num_draft_tokens)
    assert s.num_steps < len(ps) * n  # fewer steps than one per token per request
    # preemption in a small cache, and a mixed batch: logprobs requests verify with their rows
    with engine(model, num_blocks=14, block_size=8, max_num_batched_tokens=32, enable_prefix_caching=False,
                **ngram) as small:
        assert generate(small, ps, n) == want
        assert small.stats().num_preemptions > 0


# ---- a draft model (speculative_method "draft") ---------------------------------------------

@pytest.mark.parametrize("target_family, draft_family", [
    ("llama", "llama"), ("qwen3", "qwen2"), ("qwen3_moe", "qwen3"), ("gemma3", "gemma3"), ("gpt_oss", "qwen3"),
])
def test_a_tiny_draft_model_changes_no_greedy_output(target_family, draft_family, tmp_path):
    """A one-layer random draft of the target's tokenizer (a dense Qwen3 drafting for a MoE, as
    Qwen3-0.6B does for Qwen3-30B-A3B; vocabularies padded differently are taken): greedy output
    equals plain decoding, many prompts at once, in a roomy cache and under preemption in a small
    one with a budget that splits the draft's catch-up."""
    target = surogate.load_model(make_model(target_family, tmp_path / "t", seed=21, initializer_range=0.2))
    draft = surogate.load_model(make_model(draft_family, tmp_path / "d", seed=5, initializer_range=0.2,
                                           num_hidden_layers=1))
    ps = prompts(min(target.spec.vocab_size, draft.spec.vocab_size), 8, seed=6)
    longer = [(p * 24)[:24] for p in ps]  # 24 + 12 tokens: 9 blocks of 4, where the small cache holds 14
    with engine(target) as plain:
        want, want_longer = generate(plain, ps, 12), generate(plain, longer, 12)
    with draft_engine(target, draft) as spec:
        assert generate(spec, ps, 12) == want
        s = spec.stats()
        assert s.spec_num_draft_tokens > 0 and s.last_error is None
    with draft_engine(target, draft, num_blocks=14, block_size=4, max_num_batched_tokens=9,
                      enable_prefix_caching=False) as small:
        assert generate(small, longer, 12) == want_longer
        assert small.stats().num_preemptions > 0


def test_a_model_drafting_for_itself_is_accepted_nearly_always(tmp_path):
    """The target as its own draft (its own runner and KV cache): the draft's argmax is the
    target's but where batch shapes reorder a sum and a near-tie flips, so nearly every draft is
    accepted; a draft KV that is stale or misplaced anywhere would show here as rejections."""
    model = surogate.load_model(make_model("qwen3", tmp_path / "m", seed=3, initializer_range=0.2))
    ps = prompts(model.spec.vocab_size, 8, seed=8)
    with engine(model) as plain:
        want = generate(plain, ps, 20)
    with draft_engine(model, model) as spec:
        assert generate(spec, ps, 20) == want
        again = generate(spec, [p + w[:10] for p, w in zip(ps, want)], 10)  # prefix-cache hits, drafted blocks
        s = spec.stats()
    assert again == [w[10:] for w in want]
    assert s.prefix_cache_hits > 0
    assert s.spec_num_accepted_tokens >= 0.95 * s.spec_num_draft_tokens > 0, (s.spec_num_accepted_tokens,
                                                                               s.spec_num_draft_tokens)
