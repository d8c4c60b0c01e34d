"""Embedding rows in place of prompt tokens' embeddings (EmbedSpan: image features, prompt
embeddings) through the serving engine: a tiny Llama given its own embedding rows answers as for
the plain prompt; given arbitrary rows it answers as transformers' generate(inputs_embeds=...),
also under chunked prefill; the prefix cache tells spans apart by their key; a bidirectional span
(Gemma 3's image tokens) gives the logits of transformers' Gemma 3 under that span mask, and no
prefill chunk ever cuts it."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import surogate  # noqa: E402
from sgtest.embeds import (greedy, hf_greedy_embeds, hf_logits, log_softmax, prompt, served_logprobs,  # noqa: E402
                           with_placeholders)
from sgtest.engine import engine, hf_greedy  # noqa: E402
from sgtest.tiny_models import make_model  # noqa: E402
from surogate.dsl.nn import LoRAConfig  # noqa: E402
from surogate.errors import InvalidArgumentError  # noqa: E402
from surogate.serve.engine_client import EngineClient  # noqa: E402
from surogate.serve.llm import LLM  # noqa: E402
from surogate.serve.model_runner import ProgramRunner  # noqa: E402
from surogate.serve.types import EmbedSpan, EngineConfig, SamplingParams  # noqa: E402


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = make_model("llama", tmp_path_factory.mktemp("llama"), seed=21, initializer_range=0.2)
    ours = surogate.load_model(path)
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    return ours, ref


def test_own_embedding_rows_answer_as_the_plain_prompt(llama):
    ours, ref = llama
    ids = prompt(30, 1, ours.spec.vocab_size)
    table = ours.params["embed_tokens.weight"]
    spans = [EmbedSpan(3, table[ids[3:11]].astype(np.float32), b"a"), EmbedSpan(15, table[ids[15:27]].copy())]
    held = with_placeholders(ids, [(3, 8), (15, 12)])
    expected = hf_greedy(ref, ids, 8)
    with engine(ours) as client:
        assert greedy(client, ids, 8)[0] == expected
        assert greedy(client, held, 8, spans)[0] == expected
        assert greedy(client, held, 8)[0] != expected  # the placeholders alone answer otherwise


@pytest.mark.parametrize("chunked", [False, True])
def test_arbitrary_rows_equal_transformers_inputs_embeds(llama, chunked):
    ours, ref = llama
    rng = np.random.default_rng(2)
    C = ours.spec.hidden_size
    ids = with_placeholders(prompt(27, 3, ours.spec.vocab_size), [(2, 7), (12, 10)])
    spans = [EmbedSpan(2, rng.normal(0, 0.3, (7, C)).astype(np.float32), b"img0"),
             EmbedSpan(12, rng.normal(0, 0.3, (10, C)).astype(np.float32), b"img1")]
    expected = hf_greedy_embeds(ref, ids, spans, 8)
    # chunked: a 5-token budget in blocks of 4 cuts the prompt (and both spans) across six steps
    kw = {"max_num_batched_tokens": 5, "block_size": 4} if chunked else {}
    with engine(ours, **kw) as client:
        assert greedy(client, ids, 8, spans)[0] == expected
        assert greedy(client, ids, 8, spans)[0] == expected  # warm: its blocks come from the prefix cache
        # beside plain requests in the same steps
        rids = [client.submit(ids, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True), embeds=spans),
                client.submit(ids, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))]
        got = [[t for o in client.wait(r, timeout=120) for t in o.new_token_ids] for r in rids]
        assert got[0] == expected and got[1] == hf_greedy(ref, ids, 8)


def test_prefix_cache_knows_spans_by_key(llama):
    ours, ref = llama
    rng = np.random.default_rng(4)
    C = ours.spec.hidden_size
    ids = with_placeholders(prompt(24, 5, ours.spec.vocab_size), [(4, 12)])
    a, b = (rng.normal(0, 0.3, (12, C)).astype(np.float32) for _ in range(2))
    with engine(ours, block_size=4) as client:
        first = greedy(client, ids, 6, [EmbedSpan(4, a, b"A")])
        assert first[1] == 0
        # The same placeholders with another image: only the block before the span is shared.
        other = greedy(client, ids, 6, [EmbedSpan(4, b, b"B")])
        assert other == (hf_greedy_embeds(ref, ids, [EmbedSpan(4, b)], 6), 4)
        # The same image (key): every full block but the last token's.
        assert greedy(client, ids, 6, [EmbedSpan(4, a, b"A")]) == (first[0], 20)
        # No key: the rows themselves tell the spans apart.
        assert greedy(client, ids, 6, [EmbedSpan(4, b)])[1] == 4
        assert greedy(client, ids, 6, [EmbedSpan(4, b)]) == (other[0], 20)
        assert greedy(client, ids, 6, [EmbedSpan(4, a)])[1] == 4


def test_bad_spans_are_refused_naming_the_field(llama):
    ours, _ = llama
    C = ours.spec.hidden_size
    rows = np.zeros((4, C), np.float32)
    params = SamplingParams(max_tokens=1)
    with engine(ours) as client:
        with pytest.raises(InvalidArgumentError, match=r"embeds\[0\]\.rows has width 3; the model's hidden size is"):
            client.submit([7] * 10, params, embeds=[EmbedSpan(0, np.zeros((4, 3), np.float32))])
        with pytest.raises(InvalidArgumentError, match=r"embeds\[0\] covers prompt positions 8\.\.11 but the prompt"):
            client.submit([7] * 10, params, embeds=[EmbedSpan(8, rows)])
        with pytest.raises(InvalidArgumentError, match=r"embeds\[0\] \(positions 2\.\.5\) overlaps embeds\[1\]"):
            client.submit([7] * 10, params, embeds=[EmbedSpan(2, rows), EmbedSpan(0, rows)])
        with pytest.raises(InvalidArgumentError, match=r"embeds\[0\] 'rows' must be 2-D"):
            client.submit([7] * 10, params, embeds=[EmbedSpan(0, np.zeros(C, np.float32))])
        with pytest.raises(InvalidArgumentError, match=r"embeds\[0\] 'key' must be bytes"):
            client.submit([7] * 10, params, embeds=[EmbedSpan(0, rows, "k")])


# ---- bidirectional spans (Gemma 3) ----------------------------------------------------------

@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    path = make_model("gemma3", tmp_path_factory.mktemp("gemma3"), seed=7, initializer_range=0.2)
    ours = surogate.load_model(path)
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32,
                                                            attn_implementation="eager").eval()
    return ours, ref


@pytest.mark.parametrize("budget", [None, 3, 6])
def test_bidirectional_span_gives_transformers_gemma3_logits_and_is_never_split(gemma3, budget):
    ours, ref = gemma3
    rng = np.random.default_rng(8)
    C = ours.spec.hidden_size
    # Spans of 6 (past the tiny model's window of 4: the window still applies inside) and 3
    # tokens; a budget of 3 is less than the first span (taken whole), 6 would end chunks inside
    # both (moved before them).
    ids = with_placeholders(prompt(22, 9, ours.spec.vocab_size), [(5, 6), (14, 3)])
    spans = [EmbedSpan(5, rng.normal(0, 1.0, (6, C)).astype(np.float32), b"i0", True),
             EmbedSpan(14, rng.normal(0, 1.0, (3, C)).astype(np.float32), b"i1", True)]
    logits = hf_logits(ref, ids, spans)
    lp = log_softmax(logits)
    expected_prompt = lp[np.arange(len(ids) - 1), ids[1:]]
    kw = {} if budget is None else {"max_num_batched_tokens": budget, "block_size": 4}
    got_prompt, top, steps = served_logprobs(ours, ids, spans, **kw)
    np.testing.assert_allclose(got_prompt, expected_prompt, rtol=1e-4, atol=1e-4)
    order = np.argsort(-lp[-1], kind="stable")[:5]
    assert [t for t, _ in top] == order.tolist()
    np.testing.assert_allclose([v for _, v in top], lp[-1][order], rtol=1e-4, atol=1e-4)
    # The mask matters: causal attention over the same rows gives other logits.
    assert not np.allclose(log_softmax(hf_logits(ref, ids, spans, bidirectional=False)), lp, atol=1e-3)
    # Each span ran whole in one step, with its kv_limit (a span's last position for its tokens,
    # the own position for the others); steps without a span carry none.
    last = {p: s.start + len(s.rows) - 1 for s in spans for p in range(s.start, s.start + len(s.rows))}
    for s in spans:
        span = set(range(s.start, s.start + len(s.rows)))
        holding = [(pos, lim) for pos, lim, _ in steps if span & set(pos.tolist())]
        assert len(holding) == 1 and span <= set(holding[0][0].tolist())
        pos, lim = holding[0]
        assert lim.tolist() == [last.get(p, p) for p in pos.tolist()]
    assert all(len(lim) == 0 for pos, lim, _ in steps if not set(last) & set(pos.tolist()))
    if budget == 3:
        assert any(len(pos) > 3 for pos, _, _ in steps)  # the 6-token span went past the budget
    for pos, lim, index in steps:
        assert len(index) == sum(p in last for p in pos.tolist())


def test_prefix_cache_hit_backs_off_to_a_bidirectional_spans_start(gemma3):
    ours, ref = gemma3
    rng = np.random.default_rng(10)
    C = ours.spec.hidden_size
    # Blocks of 4: a span over positions 6..11 crosses the block boundary at 8.
    ids = with_placeholders(prompt(18, 11, ours.spec.vocab_size), [(6, 6)])
    spans = [EmbedSpan(6, rng.normal(0, 1.0, (6, C)).astype(np.float32), b"x", True)]
    expected = hf_logits(ref, ids, spans)[-1].argmax()
    params = SamplingParams(temperature=0.0, max_tokens=1)
    with engine(ours, block_size=4) as client:
        for cached in (0, 16):  # cold, then warm: every full block (the span is in blocks 1 and 2)
            out = client.wait(client.submit(ids, params, embeds=spans), timeout=120)[-1]
            assert (out.new_token_ids, out.num_cached_tokens) == ([expected], cached)
        # A prompt that ends inside the span's second block: the hit would end at 8, inside the
        # span, and backs off to block 1 (the one holding its start).
        out = client.wait(client.submit(ids[:11], params, embeds=[EmbedSpan(6, spans[0].rows[:5], b"x5", True)]),
                          timeout=120)[-1]
        assert out.num_cached_tokens == 4
        out = client.wait(client.submit(ids[:11], params, embeds=[EmbedSpan(6, spans[0].rows[:5], b"x5", True)]),
                          timeout=120)[-1]
        assert out.num_cached_tokens == 4
        want = hf_logits(ref, ids[:11], [EmbedSpan(6, spans[0].rows[:5], b"", True)])[-1].argmax()
        assert out.new_token_ids == [want]


def test_llm_takes_embeds_and_ngram_speculation_drafts_only_decode_tokens(gemma3):
    ours, _ = gemma3
    rng = np.random.default_rng(13)
    C = ours.spec.hidden_size
    ids = with_placeholders(prompt(8, 14, ours.spec.vocab_size) * 3, [(9, 4)])
    spans = [EmbedSpan(9, rng.normal(0, 1.0, (4, C)).astype(np.float32), b"s", True)]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, detokenize=False)
    with engine(ours) as client:
        expected = greedy(client, ids, 16, spans)[0]
    spec = {"speculative_method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    with engine(ours, **spec) as client:
        (out,) = LLM(client, None).generate(ids, params, embeds=spans)
        assert out.new_token_ids == expected
        assert client.stats().spec_num_draft_tokens > 0
        with pytest.raises(InvalidArgumentError, match="embeds for 1 prompts, but 2 prompts"):
            LLM(client, None).generate([ids, ids], params, embeds=[spans])


def test_preemption_and_chunking_with_spans_change_nothing(llama, gemma3):
    # 8 blocks of 4 and a 7-token budget: prompts are chunked, sequences preempted and recomputed
    # (their spans with them); a bidirectional span is recomputed whole.
    for (ours, ref), bidirectional in ((llama, False), (gemma3, True)):
        rng = np.random.default_rng(15)
        C = ours.spec.hidden_size
        reqs = []
        for k in range(6):
            ids = with_placeholders(prompt(14, 20 + k, ours.spec.vocab_size), [(3 + k, 5)])
            reqs.append((ids, [EmbedSpan(3 + k, rng.normal(0, 0.5, (5, C)).astype(np.float32), b"p%d" % k,
                                         bidirectional)]))
        if bidirectional:  # greedy under the span mask, one transformers forward per token
            expected = []
            for ids, spans in reqs:
                out = list(ids)
                for _ in range(10):
                    out.append(int(hf_logits(ref, out, spans)[-1].argmax()))
                expected.append(out[len(ids):])
        else:
            expected = [hf_greedy_embeds(ref, ids, spans, 10) for ids, spans in reqs]
        with engine(ours, num_blocks=8, block_size=4, max_num_batched_tokens=7, enable_prefix_caching=False) as client:
            params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
            rids = [client.submit(ids, params, embeds=spans) for ids, spans in reqs]
            assert [[t for o in client.wait(r, timeout=120) for t in o.new_token_ids] for r in rids] == expected
            assert client.stats().num_preemptions > 0


def test_a_runner_without_a_hidden_size_refuses_embeds():
    class Toy:
        vocab_size = 16

        def run(self, step):
            return np.zeros((len(step.logits_rows), 16), np.float32)

    with EngineClient(Toy(), EngineConfig(num_blocks=4)) as client:
        with pytest.raises(InvalidArgumentError, match="embeds: this model runner takes no embedding rows"):
            client.submit([1, 2, 3], SamplingParams(max_tokens=1), embeds=[EmbedSpan(0, np.zeros((1, 4), np.float32))])
        client.wait(client.submit([1, 2, 3], SamplingParams(max_tokens=1)), timeout=30)  # plain requests run


def test_rows_follow_their_sequence_into_an_adapters_sub_step(llama):
    # A step of base-model and adapter sequences runs one sub-step per adapter: each sequence's
    # rows (and token rows) go with it. The adapter's B is zero, so its answers are the base's.
    ours, ref = llama
    rng = np.random.default_rng(16)
    C = ours.spec.hidden_size
    cfg = LoRAConfig(rank=2, alpha=4.0, targets=("q_proj", "v_proj"))
    g = ours.arch.build(mode="logits", dtype=ours.dtype, lora=cfg, quant=ours.quant)
    lora = {p.name: (rng.normal(0, 0.1, p.shape) if p.meta["lora"] == "A" else np.zeros(p.shape)).astype(np.float32)
            for p in g.params() if p.meta.get("lora")}
    runner = ProgramRunner(ours, num_blocks=64)
    runner.add_adapter(0, cfg, lora)
    reqs = []
    for k in range(4):
        ids = with_placeholders(prompt(16 + 3 * k, 30 + k, ours.spec.vocab_size), [(2 + k, 6)])
        reqs.append((ids, [EmbedSpan(2 + k, rng.normal(0, 0.3, (6, C)).astype(np.float32), b"r%d" % k)]))
    expected = [hf_greedy_embeds(ref, ids, spans, 6) for ids, spans in reqs]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    with EngineClient(runner, EngineConfig(num_blocks=64), adapters={"zero": 0}) as client:
        with client.held():  # one first step for all four
            rids = [client.submit(ids, params, "zero" if k % 2 else None, embeds=spans)
                    for k, (ids, spans) in enumerate(reqs)]
        assert [[t for o in client.wait(r, timeout=120) for t in o.new_token_ids] for r in rids] == expected


def test_position_shift_moves_the_rope_positions_of_later_tokens():
    # Qwen3-VL's MRoPE: a span's position_shift moves every later token's rope position (the
    # prompt's rest and the answer: HF's rope_deltas); kv_limit keeps the sequence positions.
    class Toy:
        vocab_size, hidden_size = 16, 4

        def __init__(self):
            self.steps = []

        def run(self, step):
            self.steps.append((step.positions.tolist(), step.kv_limit.tolist(), step.embed_index.tolist()))
            return np.zeros((len(step.logits_rows), 16), np.float32)

    toy = Toy()
    rows = np.zeros((3, 4), np.float32)
    spans = [EmbedSpan(2, rows, b"a", False, position_shift=-2), EmbedSpan(6, rows[:2], b"b", False, position_shift=5)]
    with EngineClient(toy, EngineConfig(num_blocks=8, block_size=4, max_num_batched_tokens=6)) as client:
        client.wait(client.submit(list(range(1, 11)), SamplingParams(max_tokens=3, ignore_eos=True), embeds=spans),
                    timeout=30)
    positions = [p for pos, _, _ in toy.steps for p in pos]
    # prompt 0..9: 0 1 | span 2 3 4 | 5 (shift -2 from here) | span 6 7 | 8 9 (shift +3), then two answer tokens
    assert positions == [0, 1, 2, 3, 4, 3, 4, 5, 11, 12, 13, 14]
    assert toy.steps[0] == ([0, 1, 2, 3, 4, 3], [0, 1, 2, 3, 4, 5], [2, 3, 4])  # chunk of 6: sequence positions
    assert toy.steps[1][1] == [6, 7, 8, 9] and toy.steps[2][1] == []  # rows in the step: kv_limit; decode: none
    with EngineClient(Toy(), EngineConfig(num_blocks=8, block_size=4)) as client:  # never a negative position
        with pytest.raises(InvalidArgumentError, match=r"embeds\[0\]\.position_shift -6 puts the rope position "
                                                       r"after it at -1"):
            client.submit(list(range(1, 11)), SamplingParams(max_tokens=1),
                          embeds=[EmbedSpan(2, rows, b"a", False, position_shift=-6)])
