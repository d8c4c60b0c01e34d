"""What every generation endpoint shares: the gateway's state, the prepared ``Job``, model
lookup, and the processors that turn engine output into deltas."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing, suppress
from dataclasses import dataclass, field

import msgspec

from surogate.serve.frontend import ChoiceDelta, OutputProcessor, Prompt, SamplingOptions
from surogate.serve.parsers import make_output_parser

from . import errors
from .context import RequestContext
from .engine import EngineStep
from .errors import ApiError
from .models import GatewayConfig, ModelTable, ServedModel
from .sse import PING, Ids

log = logging.getLogger("surogate.gateway")


@dataclass
class Gateway:
    models: ModelTable
    config: GatewayConfig = field(default_factory=GatewayConfig)
    ids: Ids = field(default_factory=Ids)
    clock: Callable[[], float] = time.time  # `created` stamps; tests pin it for golden output

    def find(self, name: str) -> tuple[ServedModel, str | None] | ApiError:
        found = self.models.lookup(name)
        return found if found is not None else errors.unknown_model(name)


class Job(msgspec.Struct):
    """One request, converted: what the engine runs and how its output is read."""

    model: ServedModel
    adapter: str | None
    prompt: Prompt
    opts: SamplingOptions
    tools: bool = False  # the request offered tools: parse calls
    max_tool_calls: int | None = None
    reasoning: bool = True

    def processors(self, count: int | None = None) -> list[OutputProcessor]:
        return [OutputProcessor(self.model.tokenizer, self.opts,
                                make_output_parser(self.model.parsers, self.prompt.text, tools=self.tools,
                                                   reasoning=self.reasoning, max_tool_calls=self.max_tool_calls))
                for _ in range(self.opts.n if count is None else count)]


def ready(job: Job, config: GatewayConfig) -> ApiError | None:
    """Admission: the model loading or asleep is a 503 / 529; a full queue is a 429."""
    model = job.model
    if model.engine is None:
        return errors.model_loading(model.name)
    if model.asleep:
        return errors.model_asleep(model.name)
    if len(model.queued) >= config.max_queued_requests:
        return errors.queue_full(model.name, config.max_queued_requests)
    return None


def parse_stop(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)


def parse_logit_bias(bias: dict[str, float] | None, vocab_size: int) -> dict[int, float] | None:
    if not bias:
        return None
    out = {}
    for key, value in bias.items():
        try:
            token = int(key)
        except ValueError:
            raise errors.ApiErrorException(errors.invalid(f"logit_bias keys must be token ids, got {key!r}",
                                                          param="logit_bias")) from None
        if not 0 <= token < vocab_size:
            raise errors.ApiErrorException(errors.invalid(f"logit_bias: token id {token} is outside the vocabulary",
                                                          param="logit_bias"))
        out[token] = float(value)
    return out


# -- driving a run ----------------------------------------------------------------------------------

StepFn = Callable[[int, ChoiceDelta, EngineStep | None], bytes | None]


async def streamed(ctx: RequestContext, run: AsyncIterator, head: Callable[[], bytes], step: StepFn,
                   tail: Callable[[], bytes], fail: Callable[[ApiError], bytes], *, ping: bytes = PING,
                   ping_every: float = 0) -> AsyncIterator[bytes]:
    """An SSE body: ``head``, each step's bytes, ``tail``. An engine failure after the 200 header
    can only be told in the stream, in the API's own error event. While nothing comes for
    ``ping_every`` seconds (a long prefill, a long queue) ``ping`` is sent, so proxies and clients
    do not drop a quiet connection (llama.cpp's ``--sse-ping-interval``)."""
    yield head()
    try:
        async with aclosing(run) as outputs:
            async for item in _with_pings(outputs, ping_every):
                if item is None:
                    yield ping
                    continue
                i, delta, engine_step = item
                _note(ctx, delta)
                chunk = step(i, delta, engine_step)
                if chunk:
                    yield chunk
    except Exception as e:
        log.exception("request %s: generation failed", ctx.request_id)
        ctx.error = type(e).__name__
        yield fail(errors.from_exception(e))
        return
    yield tail()


async def _with_pings(outputs: AsyncIterator, every: float) -> AsyncIterator:
    """The items of ``outputs``, with a None whenever ``every`` seconds pass without one."""
    if not every:
        async for item in outputs:
            yield item
        return
    pending = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(outputs))
            done, _ = await asyncio.wait({pending}, timeout=every)
            if not done:
                yield None
                continue
            task, pending = pending, None
            try:
                item = task.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        if pending is not None:  # stopped while waiting: let the read finish its cancellation first
            pending.cancel()
            with suppress(BaseException):
                await pending


async def collected(ctx: RequestContext, run: AsyncIterator, step: StepFn) -> None:
    """Run to the end without streaming (an engine failure propagates: the edge answers 500)."""
    async with aclosing(run) as outputs:
        async for i, delta, engine_step in outputs:
            _note(ctx, delta)
            step(i, delta, engine_step)


def totals(ctx: RequestContext, processors) -> tuple[int, int]:
    """(completion tokens, reasoning tokens) over all answers, noted on the context for the log."""
    ctx.completion_tokens = sum(p.num_tokens for p in processors)
    return ctx.completion_tokens, sum(p.reasoning_tokens for p in processors)


def _note(ctx: RequestContext, delta: ChoiceDelta) -> None:
    if delta.finish_reason is not None:
        ctx.finish_reasons.append(delta.finish_reason)
