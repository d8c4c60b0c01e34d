"""What every generation endpoint shares: the gateway's state, the prepared ``Job``, model
lookup, admission, and driving a generation (``surogate.serve.LLM.submit``) to an SSE body or
a collected answer."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

import msgspec

from surogate.serve import Generation, RequestOutput, SamplingParams
from surogate.serve.frontend import Prompt
from surogate.serve.parsers import ForcedTools, OfferedTools

from . import errors
from .context import RequestContext
from .errors import ApiError
from .media import embedded
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
    opts: SamplingParams
    tools: bool | OfferedTools | ForcedTools = False  # offered tools: parse calls (ForcedTools: forced, as JSON)
    max_tool_calls: int | None = None
    reasoning: bool = True


def ready(job: Job, config: GatewayConfig) -> ApiError | None:
    """Admission: the model loading or asleep is a 503 / 529; a full queue is a 429."""
    model = job.model
    if not model.generates:
        return errors.invalid(f"The model `{model.name}` is an embedding model: it answers POST /v1/embeddings "
                              "and generates nothing.", param="model")
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
        if not -100.0 <= value <= 100.0:  # OpenAI's range (NaN fails too)
            raise errors.ApiErrorException(errors.invalid(f"logit_bias[{key}] = {value} is outside [-100, 100]",
                                                          param="logit_bias"))
        out[token] = float(value)
    return out


# -- driving a run ----------------------------------------------------------------------------------

StepFn = Callable[[RequestOutput], bytes | None]


async def admit(gw: Gateway, ctx: RequestContext, jobs: Sequence[Job]) -> Generation | ApiError:
    """``ready``, the prompts' images encoded (``media.embedded``), then ``start``. From the
    admission to the submit the engine counts the request as running (``LLM.weights_held``):
    a ``POST /sleep`` that comes while an image encodes waits for the request, which runs to its
    end, instead of releasing the engine between the encode and the submit."""
    first = jobs[0]
    if (err := ready(first, gw.config)) is not None:
        return err
    with first.model.llm.weights_held():
        for job in jobs:
            if (err := await embedded(job)) is not None:
                return err
        return start(ctx, jobs)


def start(ctx: RequestContext, jobs: Sequence[Job]) -> Generation:
    """Submit every answer of ``jobs`` (one model and adapter; ``n`` each) before any reply byte
    is sent, so the engine refusing one is still an HTTP error; the context aborts them if the
    client goes away. Answers are indexed ``job * n + answer``."""
    first = jobs[0]
    gen = first.model.llm.submit([j.prompt for j in jobs], [j.opts for j in jobs], adapter=first.adapter,
                                 tools=first.tools, max_tool_calls=first.max_tool_calls, reasoning=first.reasoning)
    ctx.track(gen)
    return gen


async def streamed(ctx: RequestContext, gen: Generation, head: Callable[[], bytes], step: StepFn,
                   tail: Callable[[], bytes], fail: Callable[[ApiError], bytes], *, ping: bytes = PING,
                   ping_every: float = 0) -> AsyncIterator[bytes]:
    """An SSE body: ``head``, the bytes of the outputs, ``tail``. Everything that arrived since
    the last read goes out as one body message (one send per engine step, not per answer). An
    engine failure after the 200 header can only be told in the stream, in the API's own error
    event. While nothing comes for ``ping_every`` seconds (a long prefill, a long queue) ``ping``
    is sent, so proxies and clients do not drop a quiet connection (llama.cpp's
    ``--sse-ping-interval``)."""
    yield head()
    try:
        while not gen.done:
            outs = await gen.next_batch(ping_every or None)
            if not outs:
                if not gen.done:
                    yield ping
                continue
            chunk = b"".join(filter(None, [step(out) for out in coalesce(_noted(ctx, outs))]))
            if chunk:
                yield chunk
    except Exception as e:
        log.exception("request %s: generation failed", ctx.request_id)
        ctx.error = type(e).__name__
        yield fail(errors.from_exception(e))
        return
    finally:
        gen.close()
    yield tail()


async def collected(ctx: RequestContext, gen: Generation, step: StepFn) -> None:
    """Run to the end without streaming (an engine failure propagates: the edge answers 500)."""
    try:
        while not gen.done:
            for out in _noted(ctx, await gen.next_batch()):
                step(out)
    finally:
        gen.close()


def coalesce(outs: list[RequestOutput]) -> list[RequestOutput]:
    """A consumer that fell behind reads several steps of an answer at once: each run of one
    answer's text-only outputs becomes one (one chunk on the wire, not one per step). Tool calls
    and a finished output end a run, and reasoning never follows content in one, so the chunks
    keep their order."""
    if len(outs) < 2:
        return outs
    merged: list[RequestOutput] = []
    last: dict[int, RequestOutput] = {}  # answer -> its output still open for merging
    for out in outs:
        acc = last.get(out.index)
        if (acc is not None and not out.tool_calls and not (acc.content and out.reasoning)
                and (acc.logprobs is None) == (out.logprobs is None)):
            acc.merge(out)
        else:
            merged.append(out)
            acc = out
        if acc.finish_reason is not None or acc.tool_calls:
            last.pop(out.index, None)
        else:
            last[out.index] = acc
    return merged


def totals(ctx: RequestContext, processors) -> tuple[int, int]:
    """(completion tokens, reasoning tokens) over all answers, noted on the context for the log."""
    ctx.completion_tokens = sum(p.num_tokens for p in processors)
    return ctx.completion_tokens, sum(p.reasoning_tokens for p in processors)


def _noted(ctx: RequestContext, outs: list[RequestOutput]) -> list[RequestOutput]:
    """The request's timings, cached tokens and finish reasons, as its outputs are read."""
    for out in outs:
        ctx.on_tokens(out.num_tokens)
        if out.num_cached_tokens > ctx.cached_tokens:
            ctx.cached_tokens = out.num_cached_tokens
        if out.finish_reason is not None:
            ctx.finish_reasons.append(out.finish_reason)
    return outs
