"""The gateway as an ASGI application: a route table, auth, bounded JSON bodies, disconnects.

One request, end to end (see also ARCHITECTURE.md §4):

1. ``__call__`` picks the route by path and method (404 / 405 in the envelope of the API the
   path belongs to: ``/v1/messages*`` speaks Anthropic, everything else OpenAI).
2. API keys, when configured, are checked on every route but /health and /openapi.json
   (``Authorization: Bearer`` or ``x-api-key``; /metrics too unless configured open). The admin
   routes (``POST /sleep?model=``, ``POST /wake_up?model=``, ``POST /v1/load_lora_adapter`` and
   ``/v1/unload_lora_adapter``, as vLLM names them) take the same keys.
3. The body is read up to ``max_body_bytes`` (413 beyond, from Content-Length when it is given)
   and decoded by the route's msgspec decoder, built once; a malformed body or a wrong type is a
   400 whose ``param`` names the field.
4. The handler runs while a watcher waits for ``http.disconnect``: if the client leaves, the
   handler is cancelled and every engine request it started is aborted, streaming or not
   (non-streaming handlers leaking KV cache is a known bug elsewhere: ROCm/ATOM PR #1562).
5. The reply (JSON, SSE or an error value) is sent with ``x-request-id`` / ``request-id``
   headers; one JSON line per request goes to the ``surogate.gateway.access`` logger and the
   request's numbers to /metrics.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import re
import time
import urllib.parse
from collections.abc import Callable, Sequence
from contextlib import aclosing, suppress
from dataclasses import dataclass

import msgspec

from . import errors, tokenize
from .adapters import admin_target, load_lora_adapter, unload_lora_adapter
from .anthropic import handlers as anthropic_handlers
from .anthropic import protocol as a
from .context import RequestContext
from .errors import ApiError, Kind
from .http import BodyTooLarge, JSONReply, RawReply, header, json_bytes, read_body, send_bytes
from .metrics import Metrics
from .models import GatewayConfig, ModelTable, ServedModel
from .openai import handlers as openai_handlers
from .openai import protocol as p
from .serving import Gateway
from .sse import Ids

log = logging.getLogger("surogate.gateway")
access_log = logging.getLogger("surogate.gateway.access")


class HealthResponse(msgspec.Struct, kw_only=True):
    status: str  # "ok" once no model is loading (an asleep one is there, on purpose), "loading" before
    models: dict[str, str]  # name -> "loaded" | "loading" | "sleeping"


class SleepResponse(msgspec.Struct, kw_only=True):
    model: str
    status: str  # the model's status after the call: "sleeping" or "loaded"


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Callable
    api: str = "openai"  # whose error envelope
    request: type | None = None
    response: type | None = None
    events: object | None = None  # the SSE event type, for routes that can stream
    auth: bool = True
    summary: str = ""
    query: tuple[str, ...] = ()  # query parameters the handler takes, in order (None when absent)
    plain: bool = False  # the 200 body is text/plain (vLLM's adapter routes)


async def _health(gw: Gateway, ctx: RequestContext):
    states = {m.name: m.status for m in gw.models}
    ok = all(s != "loading" for s in states.values())
    return JSONReply(HealthResponse(status="ok" if ok else "loading", models=states), status=200 if ok else 503)


async def _sleep(gw: Gateway, ctx: RequestContext, name: str | None):
    """Pause a model: new requests get 503 / 529 until it wakes; requests already running finish,
    then the engine gives its memory back (``EngineClient.release``): KV cache, Programs and the
    weights' device copies (vLLM's sleep level 1; the weights stay in host memory). The reply
    comes once that is done. Idempotent."""
    model = admin_target(gw, name)
    if isinstance(model, ApiError):
        return model
    if not model.generates:
        return errors.invalid(f"`{model.name}` is an embedding model without an engine: nothing to put to sleep.",
                              param="model")
    if model.engine is None:
        return errors.model_loading(model.name)
    model.asleep = True
    engine = model.engine
    async with model.transition:  # a wake-up waits for this sleep to finish, then undoes it
        if not model.released:
            while not engine.idle():  # requests admitted before the sleep finish first
                await asyncio.sleep(0.02)
            await asyncio.to_thread(engine.release)
            model.released = True
    return JSONReply(SleepResponse(model=model.name, status=model.status))


async def _wake_up(gw: Gateway, ctx: RequestContext, name: str | None):
    model = admin_target(gw, name)
    if isinstance(model, ApiError):
        return model
    async with model.transition:
        if model.released:
            await asyncio.to_thread(model.engine.restore)
            model.released = False
        model.asleep = False
    return JSONReply(SleepResponse(model=model.name, status=model.status))


ROUTES: tuple[Route, ...] = (
    Route("POST", "/v1/chat/completions", openai_handlers.chat_completions, request=p.ChatCompletionRequest,
          response=p.ChatCompletion, events=p.ChatCompletionChunk, summary="Chat completion (OpenAI)"),
    Route("POST", "/v1/completions", openai_handlers.completions, request=p.CompletionRequest,
          response=p.Completion, events=p.Completion, summary="Text completion (OpenAI)"),
    Route("POST", "/v1/responses", openai_handlers.responses, request=p.ResponsesRequest, response=p.Response,
          events=p.ResponseStreamEvent, summary="Response (OpenAI Responses API, stateless)"),
    Route("POST", "/v1/messages", anthropic_handlers.messages, api="anthropic", request=a.MessagesRequest,
          response=a.Message, events=a.MessageStreamEvent, summary="Message (Anthropic)"),
    Route("POST", "/v1/messages/count_tokens", anthropic_handlers.count_tokens, api="anthropic",
          request=a.CountTokensRequest, response=a.CountTokensResponse, summary="Count prompt tokens (Anthropic)"),
    Route("GET", "/v1/models", openai_handlers.list_models, response=p.ModelList, summary="List models"),
    Route("GET", "/v1/models/{model}", openai_handlers.get_model, response=p.Model, summary="Retrieve a model"),
    Route("POST", "/tokenize", tokenize.tokenize, request=tokenize.TokenizeRequest,
          response=tokenize.TokenizeResponse, summary="Tokenize a prompt or a conversation"),
    Route("POST", "/detokenize", tokenize.detokenize, request=tokenize.DetokenizeRequest,
          response=tokenize.DetokenizeResponse, summary="Token ids to text"),
    Route("POST", "/v1/embeddings", openai_handlers.embeddings, request=p.EmbeddingRequest,
          response=p.EmbeddingList, summary="Embeddings (OpenAI): pooled final hidden states, normalised"),
    Route("POST", "/v1/load_lora_adapter", load_lora_adapter, request=p.LoadLoRAAdapterRequest, query=("model",),
          plain=True, summary="Load a PEFT LoRA adapter at run time (vLLM); then served as model=<lora_name>"),
    Route("POST", "/v1/unload_lora_adapter", unload_lora_adapter, request=p.UnloadLoRAAdapterRequest,
          query=("model",), plain=True, summary="Unload a LoRA adapter (vLLM); its running requests finish"),
    Route("POST", "/sleep", _sleep, response=SleepResponse, query=("model",),
          summary="Put a model to sleep: new requests get 503 (OpenAI) / 529 (Anthropic) until it wakes"),
    Route("POST", "/wake_up", _wake_up, response=SleepResponse, query=("model",), summary="Wake a sleeping model"),
    Route("GET", "/health", _health, auth=False, response=HealthResponse, summary="Readiness (no key needed)"),
    Route("GET", "/metrics", None, summary="Prometheus metrics"),
    Route("GET", "/openapi.json", None, auth=False, summary="This document"),
)

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class GatewayApp:
    """``GatewayApp(models, config)`` is the ASGI callable granian serves."""

    def __init__(self, models: Sequence[ServedModel], config: GatewayConfig | None = None, *,
                 ids: Ids | None = None, clock: Callable[[], float] | None = None):
        self.gw = Gateway(ModelTable(list(models)), config or GatewayConfig(), ids or Ids(), clock or time.time)
        self.config = self.gw.config
        self.metrics = Metrics(self.gw.models)
        self.routes: dict[str, dict[str, Route]] = {}
        for route in ROUTES:
            self.routes.setdefault(route.path, {})[route.method] = route
        self._decoders = {r.request: msgspec.json.Decoder(r.request) for r in ROUTES if r.request is not None}
        self._keys = [k.encode() for k in self.config.api_keys]
        self._openapi: bytes | None = None
        self._inflight: set[RequestContext] = set()
        self.draining = False  # shutting down: new requests get 503, those in flight finish

    @property
    def in_flight(self) -> int:
        return len(self._inflight)

    async def drain(self, grace: float) -> None:
        """Graceful shutdown: refuse new requests; give those in flight ``grace`` seconds to
        finish, then abort their generations (streams end with finish_reason "abort" and their
        closing events) and give them a moment to send that."""
        self.draining = True
        deadline = time.monotonic() + grace
        while self._inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for ctx in list(self._inflight):
            ctx.abort_all()
        deadline = time.monotonic() + 5.0
        while self._inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await _lifespan(receive, send)

    # -- one request --

    async def _http(self, scope, receive, send) -> None:
        path, method = scope["path"], scope["method"]
        given = header(scope, b"x-request-id")
        request_id = given if given and _REQUEST_ID.match(given) else self.gw.ids.new("req_")
        ctx = RequestContext(request_id, "anthropic" if path.startswith("/v1/messages") else "openai", path)
        route, params = self._route(path, method)
        if self.draining and not (isinstance(route, Route) and route.path == "/health"):
            route = errors.shutting_down()
        self._inflight.add(ctx)
        try:
            await self._handle(scope, receive, send, ctx, route, params)
        except OSError:  # the connection closed under a send: the client is gone
            ctx.disconnected = True
        except Exception:  # a bug: say so without a traceback to the client; the log has it
            log.exception("request %s: unhandled error", request_id)
            ctx.error = "internal"
            if ctx.status == 0:
                with suppress(Exception):
                    await self._send_error(send, ctx, ApiError(Kind.internal,
                                                               f"Internal error (request id {request_id})."))
        finally:
            self._inflight.discard(ctx)
            ctx.abort_all()
            self.metrics.observe(ctx, route.path if isinstance(route, Route) else "unmatched")
            if self.config.log_requests:
                access_log.info(json_bytes(_log_line(ctx, method)).decode())

    def _route(self, path: str, method: str) -> tuple[Route | ApiError, dict]:
        params = {}
        methods = self.routes.get(path)
        if methods is None and path.startswith("/v1/models/") and len(path) > len("/v1/models/"):
            methods, params = self.routes["/v1/models/{model}"], {"name": path[len("/v1/models/"):]}
        if methods is None:
            return ApiError(Kind.not_found, f"Unknown route: {method} {path}", code="unknown_url"), params
        if method not in methods:
            return ApiError(Kind.method_not_allowed,
                            f"{method} is not allowed on {path}; use {', '.join(sorted(methods))}"), params
        return methods[method], params

    async def _handle(self, scope, receive, send, ctx: RequestContext, route, params: dict) -> None:
        if isinstance(route, ApiError):
            return await self._send_error(send, ctx, route)
        if route.auth and self._keys and not (route.path == "/metrics" and not self.config.metrics_need_key):
            if not self._authorized(scope):
                return await self._send_error(send, ctx, ApiError(
                    Kind.authentication, "Invalid or missing API key: send it as `Authorization: Bearer <key>` "
                                         "or `x-api-key: <key>`."))
        if route.path == "/metrics":
            body, content_type = self.metrics.render()
            return await self._send(send, ctx, RawReply(body, content_type))
        if route.path == "/openapi.json":
            return await self._send(send, ctx, RawReply(self.openapi(), b"application/json"))
        request = None
        if route.request is not None:
            request = await self._read(scope, receive, ctx, route.request)
            if request is None:  # the client left while sending
                return
            if isinstance(request, ApiError):
                return await self._send_error(send, ctx, request)
        args = (request,) if request is not None else tuple(params.values())
        if route.query:
            given = urllib.parse.parse_qs(scope.get("query_string", b"").decode("latin-1"))
            args += tuple(given[name][-1] if name in given else None for name in route.query)
        await self._watched(receive, ctx, self._respond(send, ctx, route, args))

    async def _read(self, scope, receive, ctx: RequestContext, request_type: type):
        limit = self.config.max_body_bytes
        too_large = ApiError(Kind.too_large, f"The request body is larger than {limit} bytes.")
        length = header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            return too_large
        try:
            body = await read_body(receive, limit)
        except BodyTooLarge:
            return too_large
        if body is None:
            ctx.disconnected = True
            return None
        if not body.strip():
            return errors.invalid("The request body is empty: send a JSON object.")
        try:
            return self._decoders[request_type].decode(body)
        except msgspec.DecodeError as e:
            return errors.from_decode_error(e)

    async def _respond(self, send, ctx: RequestContext, route: Route, args: tuple) -> None:
        try:
            reply = await route.handler(self.gw, ctx, *args)
        except Exception as e:
            if not isinstance(e, (errors.ApiErrorException, msgspec.DecodeError)):
                log.exception("request %s: handler failed", ctx.request_id)
            ctx.error = type(e).__name__
            reply = errors.from_exception(e)
        await self._send(send, ctx, reply)

    async def _watched(self, receive, ctx: RequestContext, work) -> None:
        """Run ``work`` (handler and reply) unless the client disconnects first; then cancel it and
        abort its engine requests."""
        task = asyncio.ensure_future(work)
        watcher = asyncio.ensure_future(_disconnected(receive))
        try:
            done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if task in done or ctx.responded:  # some servers report a disconnect once the reply is complete
                return await task
            ctx.disconnected = True
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task
        finally:
            watcher.cancel()
            task.cancel()
            ctx.abort_all()

    # -- sending --

    def _headers(self, ctx: RequestContext) -> list[tuple[bytes, bytes]]:
        rid = ctx.request_id.encode()
        return [(b"x-request-id", rid), (b"request-id", rid)]

    async def _send_error(self, send, ctx: RequestContext, err: ApiError) -> None:
        status, headers, body = errors.render(err, ctx.api, ctx.request_id)
        if err.kind is Kind.method_not_allowed:
            allowed = self.routes.get(ctx.path, {})
            headers.append((b"allow", ", ".join(sorted(allowed)).encode()))
        ctx.status = status
        ctx.error = ctx.error or err.kind.value
        await send_bytes(send, status, [*headers, *self._headers(ctx)], body)
        ctx.responded = True

    async def _send(self, send, ctx: RequestContext, reply) -> None:
        if isinstance(reply, ApiError):
            return await self._send_error(send, ctx, reply)
        if isinstance(reply, (JSONReply, RawReply)):
            ctx.status = reply.status
            if isinstance(reply, JSONReply):
                headers, body = [(b"content-type", b"application/json"), *reply.headers], json_bytes(reply.body)
            else:
                headers, body = [(b"content-type", reply.content_type)], reply.body
            await send_bytes(send, reply.status, [*headers, *self._headers(ctx)], body)
            ctx.responded = True
            return
        ctx.status = 200
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                                (b"x-accel-buffering", b"no"), *reply.headers, *self._headers(ctx)]})
        try:
            async with aclosing(reply.chunks) as chunks:
                async for chunk in chunks:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            ctx.responded = True
        except OSError:  # ASGI servers raise an OSError subclass on a send to a closed connection
            ctx.disconnected = True

    def _authorized(self, scope) -> bool:
        given = []
        auth = header(scope, b"authorization")
        if auth and auth[:7].lower() == "bearer ":
            given.append(auth[7:].strip().encode())
        key = header(scope, b"x-api-key")
        if key:
            given.append(key.strip().encode())
        return any(hmac.compare_digest(g, k) for g in given for k in self._keys)

    def openapi(self) -> bytes:
        if self._openapi is None:
            from .openapi import build

            self._openapi = json_bytes(build(ROUTES, secured=bool(self._keys)))
        return self._openapi


async def _disconnected(receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def _lifespan(receive, send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def _log_line(ctx: RequestContext, method: str) -> dict:
    line = {"request_id": ctx.request_id, "method": method, "path": ctx.path, "status": ctx.status,
            "ms": round(ctx.elapsed * 1000, 2)}
    if ctx.model is not None:
        line.update(model=ctx.model, stream=ctx.stream, prompt_tokens=ctx.prompt_tokens,
                    completion_tokens=ctx.completion_tokens, cached_tokens=ctx.cached_tokens)
    if ctx.finish_reasons:
        line["finish_reasons"] = ctx.finish_reasons
    if ctx.first_token_at is not None:
        line["ttft_ms"] = round((ctx.first_token_at - ctx.started) * 1000, 2)
    if ctx.disconnected:
        line["disconnected"] = True
    if ctx.error:
        line["error"] = ctx.error
    return line


def create_app(models: Sequence[ServedModel], config: GatewayConfig | None = None) -> GatewayApp:
    return GatewayApp(models, config)
