"""surogate.serve.LLM, the generation API: prompts as ids, text or messages; ``n`` fanned out
with offset seeds and merged; stop strings that abort their engine request; adapters by name;
decoded logprobs; abort; sync and async reading. A counting runner over the tiny tokenizer's
vocabulary stands in for a model (next token = input token + 1), so the text is known."""

from __future__ import annotations

import asyncio
import time

import pytest
from sgtest import tiny_models

from surogate.errors import InvalidArgumentError, NotFoundError
from surogate.io import Tokenizer
from surogate.serve import LLM, EngineClient, EngineConfig, RequestOutput, SamplingParams
from surogate.serve.frontend import OutputProcessor
from surogate.serve.parsers import ParserChoice


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return Tokenizer.from_folder(tiny_models.make_tokenizer(tmp_path_factory.mktemp("llm"), "chatml"))


class CountingRunner:
    def __init__(self, vocab_size: int, delay: float = 0.0) -> None:
        self.vocab_size, self.delay = vocab_size, delay

    def run(self, step):
        import numpy as np

        if self.delay:
            time.sleep(self.delay)
        rows = step.logits_rows
        out = np.full((len(rows), self.vocab_size), -50.0, np.float32)
        out[np.arange(len(rows)), (step.token_ids[rows] + 1) % self.vocab_size] = 50.0
        return out


def make_llm(tok, delay=0.0, **kw) -> LLM:
    client = EngineClient(CountingRunner(tok.vocab_size, delay), EngineConfig(num_blocks=256, block_size=4),
                          adapters={"sql": 0})
    return LLM(client, tok, max_model_len=1024, **kw)


def spy(llm: LLM) -> list[tuple]:
    """The engine requests the LLM submits: (prompt ids, params, adapter)."""
    seen, submit = [], llm.client.submit

    def recording(prompt_ids, params=None, adapter=None, **kw):
        seen.append((list(prompt_ids), params, adapter))
        return submit(prompt_ids, params, adapter, **kw)

    llm.client.submit = recording
    return seen


def settle(client: EngineClient) -> None:
    for _ in range(300):
        s = client.stats()
        if s.num_running == 0 and s.blocks_used == 0:
            return
        time.sleep(0.01)
    raise AssertionError(f"the engine did not settle: {client.stats()}")


GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def test_n_answers_are_engine_requests_with_offset_seeds_merged_in_order(tok):
    llm = make_llm(tok)
    with llm.client:
        seen = spy(llm)
        answers = llm.generate([[300], [310]], SamplingParams(n=2, seed=7, temperature=0.0, max_tokens=4,
                                                              ignore_eos=True))
    assert [(ids, p.n, p.seed) for ids, p, _ in seen] == [([300], 1, 7), ([300], 1, 8), ([310], 1, 7), ([310], 1, 8)]
    assert [a.index for a in answers] == [0, 1, 2, 3]
    assert [a.new_token_ids for a in answers] == [[301, 302, 303, 304]] * 2 + [[311, 312, 313, 314]] * 2
    assert all(a.content == tok.decode(a.new_token_ids) and a.finish_reason == "length" for a in answers)
    assert all(isinstance(a, RequestOutput) and a.num_output_tokens == 4 for a in answers)


def test_prompts_as_text_or_messages_and_adapters_by_name(tok):
    llm = make_llm(tok)
    messages = [{"role": "user", "content": "Hello world!"}]
    with llm.client:
        seen = spy(llm)
        llm.generate("Hello world!", GREEDY, adapter="sql")
        with llm.chat(messages, GREEDY, enable_thinking=False) as gen:
            list(gen)
        with pytest.raises(NotFoundError, match="'nope'"):
            llm.submit([1], GREEDY, adapter="nope")
    assert seen[0][0] == tok.encode("Hello world!") and seen[0][2] == "sql"
    assert seen[1][0] == tok.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=False)
    with pytest.raises(InvalidArgumentError, match="loading"):
        LLM(None, tok, max_model_len=64).submit("hi")


def test_a_stop_string_ends_the_answer_and_aborts_its_engine_request(tok):
    ids = list(range(301, 321))
    text = tok.decode(ids)
    stop = text[9:13]  # spans tokens: the engine cannot see it
    assert len(tok.decode(ids[:3])) < 9
    llm = make_llm(tok, delay=0.002)
    with llm.client:
        params = SamplingParams(temperature=0.0, max_tokens=5000, ignore_eos=True, stop=[stop])
        with llm.submit([300], params) as gen:
            outs = list(gen)
        assert "".join(o.content for o in outs) == text[:text.find(stop)]
        assert (outs[-1].finish_reason, outs[-1].stop_reason) == ("stop", stop)
        settle(llm.client)  # the engine request was aborted, not run to 5000 tokens
        assert llm.client.stats().generation_tokens < 1000
        assert llm.client._streams == {} and not llm.queued


def test_logprobs_are_decoded_and_token_ids_only_skips_the_text(tok):
    llm = make_llm(tok)
    with llm.client:
        (a,) = llm.generate([300], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, logprobs=2,
                                                  prompt_logprobs=1))
        (raw,) = llm.generate([300], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True,
                                                    detokenize=False, stop=["x"]))
    assert [lp.token_id for lp in a.logprobs] == [301, 302, 303]
    assert [lp.token for lp in a.logprobs] == [tok.decode([i]) for i in (301, 302, 303)]
    assert a.logprobs[0].top[0].token_id == 301 and a.logprobs[0].top[0].token == tok.decode([301])
    assert a.logprobs[0].top[1].rank == 2 and a.prompt_logprobs == [None]
    assert raw.new_token_ids == [301, 302, 303] and raw.content == "" and raw.finish_reason == "length"


def test_async_reading_a_step_at_a_time_and_abort(tok):
    llm = make_llm(tok, delay=0.002)

    async def main():
        gen = llm.submit([[300], [200]], SamplingParams(temperature=0.0, max_tokens=5000, ignore_eos=True))
        assert len(llm.queued) <= 2
        got = []
        async with gen:
            while len(got) < 6:
                batch = await gen.next_batch()
                assert batch and all(o.finish_reason is None for o in batch)
                got += batch
            assert not llm.queued  # both have output
            gen.abort()
            gen.abort()  # idempotent
            async for out in gen:  # each answer still ends, with "abort"
                got.append(out)
        assert gen.done
        assert sorted(o.index for o in got if o.finished) == [0, 1]
        assert all(o.finish_reason == "abort" for o in got if o.finished)
        assert await gen.next_batch() == []

    with llm.client:
        asyncio.run(main())
        settle(llm.client)


def test_leaving_early_aborts_and_a_processing_error_reaches_the_consumer(tok, monkeypatch):
    llm = make_llm(tok, delay=0.002)
    with llm.client:
        params = SamplingParams(temperature=0.0, max_tokens=5000, ignore_eos=True)
        with llm.submit([300], params) as gen:
            assert gen.next_batch_sync(10)
        settle(llm.client)  # closed: aborted, its KV blocks freed
        assert llm.client._streams == {}

        def broken(self, out):
            raise ValueError("parser bug")

        monkeypatch.setattr(OutputProcessor, "process", broken)
        with llm.submit([300], params) as gen:
            with pytest.raises(ValueError, match="parser bug"):
                gen.next_batch_sync(10)
        settle(llm.client)


def test_tool_calls_and_reasoning_are_parsed(tok):
    """The answer's text goes through the model's parsers (here fed by ``OutputProcessor.step``:
    the same path as the engine's outputs)."""
    text = '<think>\nhm\n</think>\n\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    llm = make_llm(tok, parsers=ParserChoice("qwen3", "hermes"))
    with llm.client:
        gen = llm.submit(llm.render([{"role": "user", "content": "hi"}]), GREEDY, tools=True)
        gen.close()
    proc = gen.processors[0]
    outs = [proc.step([t]) for t in tok.encode(text, add_special_tokens=False)] + [proc.step([], None, "stop")]
    assert "".join(o.reasoning for o in outs) == "hm"
    assert [c.name for o in outs for c in o.tool_calls if c.name] == ["f"]
    assert outs[-1].finish_reason == "tool_calls"
