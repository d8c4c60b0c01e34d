"""surogate.serve.EngineClient: async streams per request, abort when the consumer leaves,
shutdown, and errors. A tiny counting runner stands in for a model (engine unit test)."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from surogate.errors import InvalidArgumentError, NotFoundError
from surogate.serve import EngineClient, EngineConfig, RequestOutput, SamplingParams, TokenLogprob

V = 32


class CountingRunner:
    """Next token = (input token + 1) % V; optionally slow, so that requests stay in flight."""

    vocab_size = V

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay

    def run(self, step) -> np.ndarray:
        if self.delay:
            time.sleep(self.delay)
        rows = step.logits_rows
        out = np.full((len(rows), V), -5.0, np.float32)
        out[np.arange(len(rows)), (step.token_ids[rows] + 1) % V] = 5.0
        return out


def config(**kw) -> EngineConfig:
    return EngineConfig(num_blocks=64, block_size=4, **kw)


def test_async_streams_of_concurrent_requests():
    async def main(client):
        async def one(start, n):
            outs = [o async for o in client.generate([start], SamplingParams(temperature=0, max_tokens=n))]
            assert all(isinstance(o, RequestOutput) for o in outs)
            assert [o.finish_reason for o in outs] == [None] * (len(outs) - 1) + ["length"]
            return [t for o in outs for t in o.new_token_ids]

        return await asyncio.gather(*(one(s, 3 + s) for s in range(8)))

    with EngineClient(CountingRunner(), config()) as client:
        results = asyncio.run(main(client))
    assert results == [[(s + 1 + i) % V for i in range(3 + s)] for s in range(8)]


def test_leaving_the_stream_early_aborts_and_frees_blocks():
    async def main(client):
        got = []
        async for out in client.generate([1, 2, 3], SamplingParams(temperature=0)):
            got += out.new_token_ids
            if len(got) >= 2:
                break
        return got

    with EngineClient(CountingRunner(delay=0.002), config()) as client:
        got = asyncio.run(main(client))
        assert got[:2] == [4, 5]
        for _ in range(200):
            stats = client.stats()
            if stats.num_running == 0 and stats.blocks_used == 0:
                break
            time.sleep(0.01)
        assert stats.num_running == 0 and stats.blocks_used == 0 and stats.num_finished == 1
        assert client._streams == {}


def test_abort_by_id_ends_the_stream_with_abort():
    with EngineClient(CountingRunner(delay=0.002), config()) as client:
        rid = client.submit([1], SamplingParams(temperature=0))
        time.sleep(0.02)
        client.abort(rid)
        outs = client.wait(rid, timeout=10)
        assert outs[-1].finish_reason == "abort"
        with pytest.raises(NotFoundError):
            client.wait(rid)


def test_close_aborts_requests_in_flight():
    client = EngineClient(CountingRunner(delay=0.002), config())
    rid = client.submit([1], SamplingParams(temperature=0))
    client.close()
    outs = client.wait(rid, timeout=10)
    assert outs[-1].finish_reason == "abort" and outs[-1].finish_message == "the engine shut down"
    with pytest.raises(InvalidArgumentError, match="closed"):
        client.submit([1])
    client.close()  # idempotent


def test_outputs_carry_logprobs_and_usage():
    with EngineClient(CountingRunner(), config(eos_token_ids=[9])) as client:
        rid = client.submit([5, 6], SamplingParams(temperature=0, logprobs=2, prompt_logprobs=1))
        outs = client.wait(rid, timeout=10)
    tokens = [t for o in outs for t in o.new_token_ids]
    assert tokens == [7, 8, 9] and outs[-1].finish_reason == "stop" and outs[-1].stop_token_id == 9
    assert outs[0].prompt_logprobs[0] is None and outs[0].prompt_logprobs[1].token_id == 6
    assert all(o.prompt_logprobs is None for o in outs[1:])
    lp = outs[0].logprobs[0]
    assert isinstance(lp, TokenLogprob) and lp.token_id == 7 and lp.rank == 1 and len(lp.top) == 2
    assert (outs[-1].num_prompt_tokens, outs[-1].num_output_tokens) == (2, 3)


def test_bad_requests_raise_at_submit():
    with EngineClient(CountingRunner(), config()) as client:
        with pytest.raises(InvalidArgumentError, match="'top_p'"):
            client.submit([1], SamplingParams(top_p=2.0))
        with pytest.raises(InvalidArgumentError, match="prompt token"):
            client.submit([V])
    with pytest.raises(InvalidArgumentError, match="not a model runner"):
        EngineClient(object(), config())


def test_n_and_stop_strings_belong_to_the_generation_api():
    with EngineClient(CountingRunner(), config()) as client:
        with pytest.raises(InvalidArgumentError, match="SamplingParams.n") as e:
            client.submit([1], SamplingParams(n=2))
        assert "LLM" in e.value.hint
        with pytest.raises(InvalidArgumentError, match="SamplingParams.stop"):
            client.submit([1], SamplingParams(stop=["x"]))


class ShapeRecorder(CountingRunner):
    """CountingRunner that notes each step's number of sequences."""

    def __init__(self) -> None:
        super().__init__()
        self.seqs: list[int] = []

    def run(self, step) -> np.ndarray:
        self.seqs.append(len(step.context_lens))
        return super().run(step)


def test_held_engine_takes_a_batch_of_submits_in_its_first_step():
    """Inside ``held`` the engine takes no step; released, its first step runs every request
    submitted there (GRPO's rollouts), not the first one alone."""
    runner = ShapeRecorder()
    with EngineClient(runner, config(max_num_seqs=16)) as client:
        with client.held():
            ids = [client.submit([k], SamplingParams(temperature=0, max_tokens=3)) for k in range(12)]
            time.sleep(0.2)  # an engine that steps on the first submit would have run by now
            assert client.stats().num_steps == 0
        outs = [client.wait(i, timeout=10) for i in ids]
    assert runner.seqs[0] == 12, runner.seqs
    assert [[t for o in out for t in o.new_token_ids] for out in outs] == [[(k + j) % V for j in (1, 2, 3)]
                                                                           for k in range(12)]


def test_idle_counts_a_request_from_its_submit_to_its_last_output():
    """``idle`` (what the gateway's sleep waits for) is False from the submit on, before the
    engine's first step publishes stats that hold the request (here: the engine is held, so it has
    taken none), and inside a ``weights_held`` block; True once the request's last output is out."""
    with EngineClient(CountingRunner(), config()) as client:
        assert client.idle()
        with client.weights_held():
            assert not client.idle()
        with client.held():
            rid = client.submit([3], SamplingParams(temperature=0, max_tokens=2))
            assert client.stats().num_waiting == 0 and not client.idle()
        client.wait(rid, timeout=10)
        assert client.idle()
        aborted = client.submit([3], SamplingParams(temperature=0, max_tokens=1000))
        client.abort(aborted)
        deadline = time.monotonic() + 10
        while not client.idle() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert client.idle()  # an aborted request's "abort" output ends it too, read or not
