"""OpenAI endpoints: convert (first line), submit to the engine, reply as JSON or as a stream.

Every generation handler has the same shape: ``convert`` gives a Job or an error value; a model
still loading is a 503; the generation (all answers) is submitted before the reply starts; then
the stream module's encoder turns its outputs into chunks, or collects them into the final object.
"""

from __future__ import annotations

import asyncio
import base64

import numpy as np

from surogate.serve.embedder import truncate
from surogate.serve.frontend import RequestError

from .. import errors
from ..context import RequestContext
from ..errors import ApiError
from ..http import JSONReply, StreamReply
from ..media import converted
from ..serving import Gateway, admit, collected, streamed, totals
from . import convert
from . import protocol as p
from .stream import ChatStream, CompletionStream, ResponsesStream, usage

Reply = JSONReply | StreamReply | ApiError


async def chat_completions(gw: Gateway, ctx: RequestContext, req: p.ChatCompletionRequest) -> Reply:
    job = await converted(convert.chat_job, gw, req, images=convert.chat_has_media(req.messages))
    if isinstance(job, ApiError):
        return job
    _note(ctx, req.model, job.prompt.token_ids, job.opts, bool(req.stream))
    if isinstance(gen := await admit(gw, ctx, [job]), ApiError):
        return gen
    processors = gen.processors
    out = ChatStream(id=gw.ids.new("chatcmpl-"), created=int(gw.clock()), model=req.model, n=job.opts.n,
                     include_usage=bool(req.stream_options and req.stream_options.include_usage),
                     reasoning_field=gw.config.reasoning_field, logprobs=job.opts.logprobs is not None, ids=gw.ids)

    def final_usage() -> p.Usage:
        completion, reasoning = totals(ctx, processors)
        return usage(ctx.prompt_tokens, completion, ctx.cached_tokens, reasoning)

    if req.stream:
        return StreamReply(streamed(ctx, gen, out.start, lambda o: out.delta(o.index, o),
                                    lambda: out.end(final_usage()), out.error, ping_every=gw.config.sse_ping_seconds))
    await collected(ctx, gen, lambda o: out.delta(o.index, o))
    return JSONReply(out.completion(final_usage()))


async def completions(gw: Gateway, ctx: RequestContext, req: p.CompletionRequest) -> Reply:
    jobs = convert.completion_jobs(gw, req)
    if isinstance(jobs, ApiError):
        return jobs
    first = jobs[0]
    _note(ctx, req.model, [t for j in jobs for t in j.prompt.token_ids], first.opts, bool(req.stream))
    if isinstance(gen := await admit(gw, ctx, jobs), ApiError):
        return gen
    n = first.opts.n
    processors = gen.processors
    want_logprobs = first.opts.logprobs is not None
    out = CompletionStream(id=gw.ids.new("cmpl-"), created=int(gw.clock()), model=req.model,
                           num_choices=len(processors),
                           include_usage=bool(req.stream_options and req.stream_options.include_usage),
                           logprobs=want_logprobs)
    echoed: set[int] = set()

    def step(o) -> bytes:
        i, head = o.index, b""
        if req.echo and i not in echoed:
            echoed.add(i)
            job = jobs[i // n]
            text = job.prompt.text if job.prompt.text is not None else job.model.tokenizer.decode(job.prompt.token_ids)
            entries = o.prompt_logprobs if want_logprobs and o.prompt_logprobs is not None else []
            head = out.echo(i, text, entries)
        return head + out.delta(i, o)

    def final_usage() -> p.Usage:
        completion, _ = totals(ctx, processors)
        return usage(ctx.prompt_tokens, completion, ctx.cached_tokens)

    if req.stream:
        return StreamReply(streamed(ctx, gen, lambda: b"", step, lambda: out.end(final_usage()), out.error,
                                    ping_every=gw.config.sse_ping_seconds))
    await collected(ctx, gen, step)
    return JSONReply(out.completion(final_usage()))


async def responses(gw: Gateway, ctx: RequestContext, req: p.ResponsesRequest) -> Reply:
    job = await converted(convert.responses_job, gw, req, images=convert.responses_has_images(req))
    if isinstance(job, ApiError):
        return job
    _note(ctx, req.model, job.prompt.token_ids, job.opts, bool(req.stream))
    if isinstance(gen := await admit(gw, ctx, [job]), ApiError):
        return gen
    processors = gen.processors
    base = p.Response(id=gw.ids.new("resp_"), created_at=int(gw.clock()), instructions=req.instructions,
                      metadata=req.metadata or {}, model=req.model, status="in_progress",
                      parallel_tool_calls=req.parallel_tool_calls is not False, temperature=req.temperature,
                      tool_choice=req.tool_choice or "auto", tools=list(req.tools or []), top_p=req.top_p,
                      max_output_tokens=req.max_output_tokens, reasoning=req.reasoning, text=req.text,
                      top_logprobs=req.top_logprobs, user=req.user)
    out = ResponsesStream(base, gw.ids)

    def ending() -> tuple[str, p.ResponseUsage, str | None]:
        completion, reasoning = totals(ctx, processors)
        final = p.ResponseUsage(input_tokens=ctx.prompt_tokens,
                                input_tokens_details=p.InputTokensDetails(cached_tokens=ctx.cached_tokens),
                                output_tokens=completion,
                                output_tokens_details=p.OutputTokensDetails(reasoning_tokens=reasoning),
                                total_tokens=ctx.prompt_tokens + completion)
        if processors[0].finish_reason == "length":
            return "incomplete", final, "max_output_tokens"
        return "completed", final, None

    if req.stream:
        return StreamReply(streamed(ctx, gen, out.start, out.delta, lambda: out.end(*ending()),
                                    out.error, ping_every=gw.config.sse_ping_seconds))
    await collected(ctx, gen, out.delta)
    return JSONReply(out.response(*ending()))


async def embeddings(gw: Gateway, ctx: RequestContext, req: p.EmbeddingRequest) -> Reply:
    """Each input's pooled final hidden state (the model's ``Embedder``), as floats or as base64
    of little-endian float32; ``dimensions`` keeps the first components, renormalised."""
    found = gw.find(req.model)
    if isinstance(found, ApiError):
        return found
    model, adapter = found
    if adapter is not None:
        return errors.invalid(f"`{req.model}` is a LoRA adapter; embeddings come from its base model "
                              f"`{model.name}`.", param="model")
    embedder = model.embedder
    if embedder is None:
        return errors.invalid(f"The model `{model.name}` does not serve embeddings.", param="model")
    if not model.ready:
        return errors.model_loading(model.name)
    if model.asleep:
        return errors.model_asleep(model.name)
    if req.dimensions is not None and not 1 <= req.dimensions <= embedder.dimensions:
        return errors.invalid(f"`dimensions` must be in 1..{embedder.dimensions} for `{model.name}`, "
                              f"got {req.dimensions}", param="dimensions")
    try:
        prompts = convert.completion_prompts(model.tokenizer, req.input, add_special_tokens=req.add_special_tokens,
                                             param="input")
    except RequestError as e:
        return errors.from_exception(e)
    for i, prompt in enumerate(prompts):
        if len(prompt.token_ids) > model.max_model_len:
            return errors.invalid(f"input {i} has {len(prompt.token_ids)} tokens, more than the model's context "
                                  f"({model.max_model_len})", param="input" if len(prompts) == 1 else f"input[{i}]")
    ids = [prompt.token_ids for prompt in prompts]
    ctx.model, ctx.prompt_tokens = req.model, sum(len(x) for x in ids)
    vectors = await asyncio.to_thread(embedder.embed, ids)
    if req.dimensions is not None:
        vectors = truncate(vectors, req.dimensions, embedder.normalize)
    if req.encoding_format == "base64":
        data = [p.Embedding(embedding=base64.b64encode(v.astype("<f4").tobytes()).decode("ascii"), index=i)
                for i, v in enumerate(vectors)]
    else:
        data = [p.Embedding(embedding=v.tolist(), index=i) for i, v in enumerate(np.asarray(vectors, np.float32))]
    return JSONReply(p.EmbeddingList(data=data, model=req.model,
                                     usage=p.EmbeddingUsage(prompt_tokens=ctx.prompt_tokens,
                                                            total_tokens=ctx.prompt_tokens)))


async def list_models(gw: Gateway, ctx: RequestContext) -> Reply:
    data = []
    for m in gw.models:
        data.append(p.Model(id=m.name, created=m.created, owned_by=m.owned_by, root=m.name, parent=None,
                            max_model_len=m.max_model_len))
        data.extend(p.Model(id=a, created=m.created, owned_by=m.owned_by, root=a, parent=m.name,
                            max_model_len=m.max_model_len) for a in m.adapters)
    return JSONReply(p.ModelList(data=data))


async def get_model(gw: Gateway, ctx: RequestContext, name: str) -> Reply:
    found = gw.find(name)
    if isinstance(found, ApiError):
        return found
    model, adapter = found
    return JSONReply(p.Model(id=name, created=model.created, owned_by=model.owned_by, root=name,
                             parent=model.name if adapter else None, max_model_len=model.max_model_len))


def _note(ctx: RequestContext, model: str, prompt_ids, opts, stream: bool) -> None:
    ctx.model, ctx.prompt_tokens, ctx.stream = model, len(prompt_ids), stream
    ctx.n, ctx.max_tokens = opts.n, opts.max_tokens

