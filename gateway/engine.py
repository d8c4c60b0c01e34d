"""The engine as the gateway sees it: the narrow ``EngineClient`` protocol, and the two adapters
that are the only code to touch when the real client (``surogate.serve.engine_client``) is wired.

What the gateway needs from an engine, per named model:

- ``submit(prompt_ids, params, adapter=None) -> request_id``: queue one sequence. ``params`` is
  the engine's SamplingParams, built from the frontend's ``SamplingOptions`` by
  ``sampling_params`` below (one sequence per submit: the gateway fans ``n`` out itself);
- ``stream(request_id)``: an async iterator of ``RequestOutput`` for that request, ending after
  the output that carries a ``finish_reason``;
- ``abort(request_id)``: stop it and free its KV blocks now (client gone, stop string matched);
  idempotent, and harmless for a finished request;
- ``stats()``: the gauges and counters /metrics exports.

``submit`` and ``abort`` may be plain or async methods; the gateway awaits whatever they return
when it is awaitable, so either shape wires without a wrapper.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol, runtime_checkable

import msgspec

from surogate.serve.frontend import SamplingOptions


class RequestOutput(Protocol):
    """One engine step's news for one request."""

    new_token_ids: Sequence[int]
    # Per new token: (logprob of the chosen token, [(token_id, logprob), ...] top-N), or None
    # when the request asked for no logprobs.
    logprobs: Sequence[tuple[float, Sequence[tuple[int, float]]]] | None
    finish_reason: str | None  # None while running; "stop" (EOS / stop token), "length", "abort"
    num_cached_tokens: int  # prompt tokens served from the prefix cache
    # Same shape as logprobs, one entry per prompt token (None for the first), on the first output only.
    prompt_logprobs: Sequence[tuple[float, Sequence[tuple[int, float]]] | None] | None


class EngineStats(Protocol):
    num_requests_running: int
    num_requests_waiting: int
    kv_cache_usage: float  # 0..1
    num_preemptions: int  # counters from here on: totals since start
    prefix_cache_queries: int  # tokens looked up
    prefix_cache_hits: int  # tokens found
    engine_step_seconds: float  # engine wall time in steps
    engine_model_seconds: float  # of which in the model


@runtime_checkable
class EngineClient(Protocol):
    def submit(self, prompt_ids: Sequence[int], params: Any, adapter: str | None = None) -> str: ...

    def stream(self, request_id: str) -> AsyncIterator[RequestOutput]: ...

    def abort(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats: ...


class EngineStep(msgspec.Struct):
    """A ``RequestOutput`` read into the gateway's own type (so the engine's may differ in detail)."""

    token_ids: list[int]
    logprobs: list | None
    finish_reason: str | None
    num_cached_tokens: int = 0
    prompt_logprobs: list | None = None


# -- the adapters onto surogate's native engine (surogate.serve.engine_client) ----------------------


def sampling_params(opts: SamplingOptions) -> Any:
    """The engine's SamplingParams for one sequence (``opts.n`` is already 1, the seed already
    offset per sequence). Stop strings stay here in the frontend; stop token ids go native."""
    from surogate.serve.types import SamplingParams

    return SamplingParams(
        temperature=opts.temperature, top_k=opts.top_k, top_p=opts.top_p, min_p=opts.min_p,
        repetition_penalty=opts.repetition_penalty, presence_penalty=opts.presence_penalty,
        frequency_penalty=opts.frequency_penalty, seed=opts.seed, max_tokens=opts.max_tokens,
        min_tokens=opts.min_tokens, stop_token_ids=list(opts.stop_token_ids), ignore_eos=opts.ignore_eos,
        logprobs=opts.logprobs, prompt_logprobs=opts.prompt_logprobs,
    )


def _logprob_pair(lp) -> tuple[float, list[tuple[int, float]]] | None:
    if lp is None:
        return None
    return (float(lp.logprob), [(int(t), float(v)) for t, v in lp.top])


def read_output(out: RequestOutput) -> EngineStep:
    """The native engine's RequestOutput in the gateway's terms (logprobs as (chosen, top-N))."""
    logprobs = getattr(out, "logprobs", None)
    prompt_logprobs = getattr(out, "prompt_logprobs", None)
    return EngineStep(
        token_ids=list(out.new_token_ids),
        logprobs=[_logprob_pair(lp) for lp in logprobs] if logprobs is not None else None,
        finish_reason=out.finish_reason if out.finish_reason != "error" else "abort",
        num_cached_tokens=int(getattr(out, "num_cached_tokens", 0) or 0),
        prompt_logprobs=[_logprob_pair(lp) for lp in prompt_logprobs] if prompt_logprobs is not None else None,
    )


class NativeEngine:
    """surogate.serve.engine_client.EngineClient behind the gateway's protocol (string request
    ids, idempotent abort, the gauge names /metrics reads)."""

    def __init__(self, client: Any, adapters: dict[str, int] | None = None, runner: Any = None):
        self.client = client
        self.adapters = dict(adapters or {})  # served adapter name -> the engine's adapter slot
        self.runner = runner  # surogate.serve.model_runner.ProgramRunner: what sleep releases

    def idle(self) -> bool:
        s = self.client.stats()
        return s.num_running == 0 and s.num_waiting == 0

    def release(self) -> None:
        """Sleep, once no request runs: forget the prefix cache, give the model's memory back."""
        if self.runner is not None:
            self.client.reset_prefix_cache()
            self.runner.release()

    def restore(self) -> None:
        if self.runner is not None:
            self.runner.restore()

    def submit(self, prompt_ids: Sequence[int], params: Any, adapter: str | None = None) -> str:
        slot = None if adapter is None else self.adapters[adapter]  # the gateway routes only served names
        return str(self.client.submit(list(prompt_ids), params, slot))

    def stream(self, request_id: str) -> AsyncIterator[RequestOutput]:
        return self.client.stream(int(request_id))

    def abort(self, request_id: str) -> None:
        try:
            self.client.abort(int(request_id))
        except Exception:  # already finished and forgotten: aborting is a no-op
            pass

    def stats(self) -> Any:
        s = self.client.stats()

        class Stats:
            num_requests_running = s.num_running
            num_requests_waiting = s.num_waiting
            kv_cache_usage = s.kv_usage
            num_preemptions = s.num_preemptions
            prefix_cache_queries = s.prefix_cache_queries
            prefix_cache_hits = s.prefix_cache_hits
            engine_step_seconds = s.step_seconds
            engine_model_seconds = s.model_seconds

        return Stats()


async def resolve(value):
    """Await ``value`` if it is awaitable: lets ``submit`` / ``abort`` be plain or async."""
    return await value if inspect.isawaitable(value) else value
