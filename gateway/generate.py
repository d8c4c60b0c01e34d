"""Run one prompt on the engine for ``n`` answers and merge their outputs as they come.

Each answer is its own engine request (``fan_out``: seed offset by its index, so ``n`` samples
differ), read by its own task through the frontend's ``OutputProcessor``. Whatever ends the iteration (all
answers finished, an error, the consumer stopping, the client going away) every engine request
still running is aborted: a stop string the engine cannot see, or a client that left, must free
the KV blocks at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import msgspec

from surogate.serve.frontend import ChoiceDelta, OutputProcessor, SamplingOptions

from .context import RequestContext
from .engine import EngineClient, EngineStep, read_output, resolve, sampling_params
from .models import ServedModel


async def start(ctx: RequestContext, model: ServedModel, requests: Sequence[tuple[Sequence[int], SamplingOptions]],
                processors: Sequence[OutputProcessor], adapter: str | None = None
                ) -> AsyncIterator[tuple[int, ChoiceDelta, EngineStep | None]]:
    """Submit one engine request per ``(prompt ids, options)`` to ``model``'s engine before any
    reply byte is sent (so the engine refusing one is still an HTTP error); each counts in the
    model's queue until its first output. Returns the merged outputs, ``(index of the request,
    delta, engine step)``, to be read under ``contextlib.aclosing``."""
    assert len(requests) == len(processors)
    engine = model.engine
    request_ids = []
    try:
        for prompt_ids, opts in requests:
            request_id = await resolve(engine.submit(list(prompt_ids), sampling_params(opts), adapter))
            ctx.track(engine, request_id, model.queued)
            request_ids.append(request_id)
    except BaseException:
        await ctx.abort_all()
        raise
    return _merge(ctx, engine, request_ids, processors)


def fan_out(prompt_ids: Sequence[int], opts: SamplingOptions) -> list[tuple[Sequence[int], SamplingOptions]]:
    """``n`` answers as ``n`` one-sequence requests; seeds offset by the answer's index so they differ."""
    return [(prompt_ids, msgspec.structs.replace(opts, n=1, seed=None if opts.seed is None else opts.seed + i))
            for i in range(opts.n)]


async def _merge(ctx: RequestContext, engine: EngineClient, request_ids: list[str],
                 processors: Sequence[OutputProcessor]) -> AsyncIterator[tuple[int, ChoiceDelta, EngineStep | None]]:
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, request_id: str) -> None:
        proc = processors[i]
        try:
            async for out in engine.stream(request_id):
                ctx.dequeue(request_id)
                step = read_output(out)
                queue.put_nowait((i, proc.step(step.token_ids, step.logprobs, step.finish_reason), step))
                if proc.finished:
                    break
            if not proc.finished:  # the stream ended without saying why
                queue.put_nowait((i, proc.step([], None, "abort"), None))
            if proc.stopped_by_string:
                await ctx.abort(request_id)
            ctx.untrack(request_id)
        except Exception as e:  # the engine failed this request: the consumer decides what the client sees
            queue.put_nowait((i, e, None))
        finally:
            queue.put_nowait((i, None, None))

    tasks = [asyncio.create_task(pump(i, rid)) for i, rid in enumerate(request_ids)]
    try:
        running = len(tasks)
        while running:
            i, item, step = await queue.get()
            if item is None:
                running -= 1
                continue
            if isinstance(item, Exception):
                raise item
            ctx.on_tokens(item.num_tokens)
            if step is not None and step.num_cached_tokens:
                ctx.cached_tokens = max(ctx.cached_tokens, step.num_cached_tokens)
            yield i, item, step
    finally:
        for task in tasks:
            task.cancel()
        await ctx.abort_all()
