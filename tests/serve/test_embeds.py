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
from sgtest.engine import engine, hf_greedy  # noqa: E402
from sgtest.tiny_models import make_model  # noqa: E402
from surogate.errors import InvalidArgumentError  # noqa: E402
from surogate.serve.engine_client import EngineClient  # noqa: E402
from surogate.serve.model_runner import ProgramRunner  # noqa: E402
from surogate.serve.types import EmbedSpan, EngineConfig, SamplingParams  # noqa: E402

PLACEHOLDER = 5


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = make_model("llama", tmp_path_factory.mktemp("llama"), seed=21, initializer_range=0.2)
    ours = surogate.load_model(path)
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    return ours, ref


def prompt(n: int, seed: int, vocab: int) -> list[int]:
    return np.random.default_rng(seed).integers(10, vocab, n).tolist()


def with_placeholders(ids: list[int], spans: list[tuple[int, int]]) -> list[int]:
    ids = list(ids)
    for start, n in spans:
        ids[start:start + n] = [PLACEHOLDER] * n
    return ids


def greedy(client: EngineClient, ids: list[int], n: int, embeds=()) -> tuple[list[int], int]:
    """Greedy tokens and the prompt tokens the prefix cache served."""
    rid = client.submit(ids, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True), embeds=embeds)
    outs = client.wait(rid, timeout=120)
    return [t for o in outs for t in o.new_token_ids], outs[-1].num_cached_tokens


def hf_greedy_embeds(ref, ids: list[int], spans: list[EmbedSpan], n: int) -> list[int]:
    with torch.no_grad():
        e = ref.get_input_embeddings()(torch.tensor([ids]))[0].clone()
        for s in spans:
            e[s.start:s.start + len(s.rows)] = torch.from_numpy(s.rows)
        out = ref.generate(inputs_embeds=e[None], attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                           do_sample=False, max_new_tokens=n, min_new_tokens=n, eos_token_id=None, pad_token_id=0)
    return out[0, -n:].tolist()


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


def hf_logits(ref, ids: list[int], spans: list[EmbedSpan], bidirectional: bool = True) -> np.ndarray:
    """transformers' Gemma 3 on the prompt's embeddings with the spans' rows, under the mask its
    multimodal model builds from token_type_ids: full layers OR(causal, same span), sliding ones
    AND(window, OR(causal, same span))."""
    L = len(ids)
    window = ref.config.sliding_window
    limit = torch.arange(L)
    for s in spans:
        if bidirectional and s.bidirectional:
            limit[s.start:s.start + len(s.rows)] = s.start + len(s.rows) - 1
    i, j = torch.arange(L)[:, None], torch.arange(L)[None]
    full = j <= limit[:, None]
    sliding = full & (j > i - window)

    def additive(m):
        return torch.where(m, 0.0, torch.finfo(torch.float32).min)[None, None]

    with torch.no_grad():
        e = ref.get_input_embeddings()(torch.tensor([ids]))[0].clone()
        for s in spans:
            e[s.start:s.start + len(s.rows)] = torch.from_numpy(s.rows)
        out = ref(inputs_embeds=e[None], position_ids=torch.arange(L)[None],
                  attention_mask={"full_attention": additive(full), "sliding_attention": additive(sliding)})
    return out.logits[0].float().numpy()


class Recording:
    """A ProgramRunner seen through the Python runner interface, keeping each step's positions,
    kv_limit and embedding rows' token rows (every row's logits are asked for: logprobs)."""

    def __init__(self, runner: ProgramRunner):
        self.runner, self.steps = runner, []
        self.vocab_size, self.hidden_size = runner.vocab_size, runner.model.spec.hidden_size

    def run(self, step):
        self.steps.append((step.positions.copy(), step.kv_limit.copy(), step.embed_index.copy()))
        return self.runner.run(step)[0]


def served_logprobs(ours, ids, spans, **kw):
    """(prompt logprobs of each next prompt token, the first answer token's top-5) served, and the
    runner's steps."""
    config = EngineConfig(num_blocks=32, **kw)
    rec = Recording(ProgramRunner(ours, num_blocks=32, block_size=config.block_size))
    with EngineClient(rec, config) as client:
        rid = client.submit(ids, SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0, logprobs=5),
                            embeds=spans)
        out = client.wait(rid, timeout=120)[0]
    prompt_lps = np.array([lp.logprob for lp in out.prompt_logprobs[1:]])
    top = [(t.token_id, t.logprob) for t in out.logprobs[0].top]
    return prompt_lps, top, rec.steps


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.mark.parametrize("budget", [None, 3, 6])
def test_bidirectional_span_gives_transformers_gemma3_logits_and_is_never_split(gemma3, budget):
    ours, ref = gemma3
    rng = np.random.default_rng(8)
    C = ours.spec.hidden_size
    # Spans of 4 (the tiny model's window) and 3 tokens; a budget of 3 is less than the first span
    # (taken whole), 6 would end chunks inside both (moved before them).
    ids = with_placeholders(prompt(22, 9, ours.spec.vocab_size), [(5, 4), (13, 3)])
    spans = [EmbedSpan(5, rng.normal(0, 1.0, (4, C)).astype(np.float32), b"i0", True),
             EmbedSpan(13, rng.normal(0, 1.0, (3, C)).astype(np.float32), b"i1", True)]
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
        assert any(len(pos) > 3 for pos, _, _ in steps)  # the 4-token span went past the budget
    for pos, lim, index in steps:
        assert len(index) == sum(p in range(5, 9) or p in range(13, 16) for p in pos.tolist())


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
        assert out.new_token_ids == [hf_logits(ref, ids[:11], [EmbedSpan(6, spans[0].rows[:5], b"", True)])[-1].argmax()]
