"""Anthropic endpoints: /v1/messages (JSON or stream) and /v1/messages/count_tokens."""

from __future__ import annotations

from ..context import RequestContext
from ..errors import ApiError
from ..http import JSONReply, StreamReply
from ..media import converted
from ..serving import Gateway, admit, collected, streamed, totals
from ..sse import event
from . import convert
from . import protocol as a
from .stream import MessageStream

Reply = JSONReply | StreamReply | ApiError
PING_EVENT = event("ping", a.PingEvent())


async def messages(gw: Gateway, ctx: RequestContext, req: a.MessagesRequest) -> Reply:
    job = await converted(convert.messages_job, gw, req, images=convert.has_images(req))
    if isinstance(job, ApiError):
        return job
    ctx.model, ctx.prompt_tokens, ctx.max_tokens, ctx.stream = (req.model, len(job.prompt.token_ids),
                                                                 job.opts.max_tokens, bool(req.stream))
    if isinstance(gen := await admit(gw, ctx, [job]), ApiError):
        return gen
    processors = gen.processors
    out = MessageStream(id=gw.ids.new("msg_"), model=req.model, input_tokens=ctx.prompt_tokens, ids=gw.ids)
    proc = processors[0]

    def ending():
        totals(ctx, processors)
        out.cached_tokens = ctx.cached_tokens
        return proc.finish_reason, proc.stop_reason, proc.num_tokens

    if req.stream:
        return StreamReply(streamed(ctx, gen, out.start, out.delta, lambda: out.end(*ending()), out.error,
                                    ping=PING_EVENT, ping_every=gw.config.sse_ping_seconds))
    await collected(ctx, gen, out.delta)
    return JSONReply(out.message(*ending()))


async def count_tokens(gw: Gateway, ctx: RequestContext, req: a.CountTokensRequest) -> Reply:
    job = await converted(convert.messages_job, gw, req, images=convert.has_images(req))
    if isinstance(job, ApiError):
        return job
    ctx.model = req.model
    return JSONReply(a.CountTokensResponse(input_tokens=len(job.prompt.token_ids)))
