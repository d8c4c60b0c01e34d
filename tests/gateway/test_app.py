"""The ASGI app through the official SDKs (``openai`` / ``anthropic`` clients over an in-process
ASGI transport): auth, error envelopes parsed into the SDKs' exception types with the right
status, body limits, 400s naming the field, models, count_tokens, tokenize, metrics, the OpenAPI
document, request ids and the access log.

No engine: models are served with ``engine=None`` (a model still loading), and where the edge's
engine handling is under test (what is submitted, abort on disconnect) with ``IdleEngine``, an
``EngineClient`` with no native engine behind it, which never produces a token.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

import anthropic
import openai
import pytest
from openapi_spec_validator import validate

from surogate.gateway.app import GatewayApp
from surogate.gateway.models import GatewayConfig, ServedModel
from surogate.gateway.sse import Ids
from surogate.serve import EngineClient, EngineStats

try:
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx

KEY = "sk-test"
CREATED = 1_700_000_000


class IdleEngine(EngineClient):
    """An ``EngineClient`` that accepts requests and never answers: it records what the gateway
    submits and aborts (the calls the generation API makes) and starts no native engine. It
    generates nothing; generation is tested against the real engine."""

    def __init__(self):
        self.submitted: list[tuple[str, list[int], object, str | None]] = []
        self.aborted: list[str] = []

    @property
    def max_model_len(self) -> int:
        return 512

    def submit(self, prompt_ids, params=None, adapter=None, *, stream=None, index=0) -> str:
        request_id = f"r{len(self.submitted)}"
        self.submitted.append((request_id, list(prompt_ids), params, adapter))
        return request_id

    def abort(self, request_id) -> None:
        self.aborted.append(request_id)

    def forget(self, request_id) -> None:
        pass

    def weights_held(self):  # what the gateway's admission holds: this engine has no weights
        return contextlib.nullcontext()

    def stats(self) -> EngineStats:
        return EngineStats(num_running=len(self.submitted) - len(self.aborted), num_waiting=3, num_blocks=64,
                           blocks_used=16, blocks_free=48, blocks_cached=0, kv_usage=0.25, prefix_cache_queries=100,
                           prefix_cache_hits=40, prompt_tokens=0, generation_tokens=0, num_preemptions=0,
                           num_steps=0, num_finished=0, step_seconds=2.5, model_seconds=2.25, last_error=None)

    def close(self) -> None:
        pass


def make_app(tiny_tokenizers, engine=None, **config) -> GatewayApp:
    qwen = ServedModel.from_tokenizer("qwen-tiny", tiny_tokenizers["chatml"], engine, 512,
                                      adapters=("qwen-tiny-lora",), model_type="qwen3")
    llama = ServedModel.from_tokenizer("llama-tiny", tiny_tokenizers["llama3"], engine, 512)
    config.setdefault("api_keys", (KEY,))
    return GatewayApp([qwen, llama], GatewayConfig(**config), ids=Ids("x"), clock=lambda: CREATED)


def transport(app):
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")


def oai(app, key=KEY) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(api_key=key, base_url="http://gw/v1", http_client=transport(app), max_retries=0)


def claude(app, key=KEY) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(api_key=key, base_url="http://gw", http_client=transport(app), max_retries=0)


def run(coro):
    return asyncio.run(coro)


async def raised(coro):
    try:
        await coro
    except Exception as e:  # noqa: BLE001 - the test inspects it
        return e
    raise AssertionError("no error raised")


MESSAGES = [{"role": "user", "content": "Hello world!"}]


# -- health, auth ---------------------------------------------------------------------------------


def test_health_is_open_and_reports_loading(tiny_tokenizers):
    async def check():
        async with transport(make_app(tiny_tokenizers)) as c:
            r = await c.get("/health")
            assert r.status_code == 503
            assert r.json() == {"status": "loading", "models": {"qwen-tiny": "loading", "llama-tiny": "loading"}}
        async with transport(make_app(tiny_tokenizers, IdleEngine())) as c:
            r = await c.get("/health")
            assert (r.status_code, r.json()["status"]) == (200, "ok")
    run(check())


def test_api_keys_in_both_apis_shapes(tiny_tokenizers):
    app = make_app(tiny_tokenizers)

    async def check():
        e = await raised(oai(app, key="wrong").models.list())
        assert isinstance(e, openai.AuthenticationError) and e.status_code == 401
        assert e.code == "invalid_api_key" and e.body["type"] == "invalid_request_error"
        e = await raised(claude(app, key="wrong").messages.create(model="qwen-tiny", max_tokens=5, messages=MESSAGES))
        assert isinstance(e, anthropic.AuthenticationError) and e.status_code == 401
        assert e.body["type"] == "error" and e.body["error"]["type"] == "authentication_error"
        assert e.body["request_id"].startswith("req_")
        assert [m.id for m in (await oai(app).models.list()).data] == ["qwen-tiny", "qwen-tiny-lora", "llama-tiny"]
        async with transport(app) as c:
            assert (await c.get("/v1/models")).status_code == 401
            assert (await c.get("/v1/models", headers={"x-api-key": KEY})).status_code == 200
            assert (await c.get("/v1/models", headers={"authorization": f"bearer {KEY}"})).status_code == 200
            assert (await c.get("/v1/models", headers={"authorization": KEY})).status_code == 401
        async with transport(make_app(tiny_tokenizers, api_keys=())) as c:
            assert (await c.get("/v1/models")).status_code == 200  # no keys configured: open
    run(check())


# -- models, unknown model, routes ----------------------------------------------------------------


def test_models_list_adapters_with_their_parent(tiny_tokenizers):
    app = make_app(tiny_tokenizers)

    async def check():
        models = {m.id: m for m in (await oai(app).models.list()).data}
        assert models["qwen-tiny-lora"].model_extra["parent"] == "qwen-tiny"
        assert models["qwen-tiny"].model_extra["max_model_len"] == 512
        assert models["llama-tiny"].owned_by == "surogate" and models["llama-tiny"].created > 0
        assert (await oai(app).models.retrieve("qwen-tiny-lora")).model_extra["parent"] == "qwen-tiny"
        e = await raised(oai(app).models.retrieve("nope"))
        assert isinstance(e, openai.NotFoundError) and e.code == "model_not_found"
    run(check())


def test_unknown_model_is_404_in_each_api(tiny_tokenizers):
    app = make_app(tiny_tokenizers)

    async def check():
        e = await raised(oai(app).chat.completions.create(model="gpt-9", messages=MESSAGES))
        assert isinstance(e, openai.NotFoundError) and e.status_code == 404
        assert (e.code, e.param) == ("model_not_found", "model")
        assert e.message.startswith("Error code: 404") and "The model `gpt-9` does not exist" in e.message
        e = await raised(claude(app).messages.create(model="gpt-9", max_tokens=5, messages=MESSAGES))
        assert isinstance(e, anthropic.NotFoundError) and e.body["error"]["type"] == "not_found_error"
        e = await raised(claude(app).messages.count_tokens(model="gpt-9", messages=MESSAGES))
        assert isinstance(e, anthropic.NotFoundError)
    run(check())


def test_unknown_route_and_wrong_method(tiny_tokenizers):
    async def check():
        async with transport(make_app(tiny_tokenizers)) as c:
            r = await c.get("/v1/nothing", headers={"x-api-key": KEY})
            assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_url"
            r = await c.get("/v1/chat/completions", headers={"x-api-key": KEY})
            assert r.status_code == 405 and r.headers["allow"] == "POST"
            r = await c.get("/v1/messages", headers={"x-api-key": KEY})
            assert r.status_code == 405 and r.json()["type"] == "error"  # Anthropic's envelope on its routes
    run(check())


# -- bad bodies ------------------------------------------------------------------------------------


def test_bad_json_and_wrong_types_are_400_naming_the_field(tiny_tokenizers):
    app = make_app(tiny_tokenizers)

    async def check():
        client = oai(app)
        e = await raised(client.chat.completions.create(model="qwen-tiny", messages=MESSAGES, max_tokens="many"))
        assert isinstance(e, openai.BadRequestError) and e.param == "max_tokens"
        assert "Expected `int | null`, got `str`" in e.message
        e = await raised(client.chat.completions.create(model="qwen-tiny", messages=[{"role": "wizard",
                                                                                     "content": "x"}]))
        assert isinstance(e, openai.BadRequestError) and e.param == "messages[0].role"
        e = await raised(client.chat.completions.create(model="qwen-tiny", messages=[{"role": "user"}]))
        assert e.param == "messages[0].content"
        e = await raised(client.completions.create(model="qwen-tiny", prompt=[1, "x"]))
        assert isinstance(e, openai.BadRequestError) and e.param == "prompt[0]"
        e = await raised(client.completions.create(model="qwen-tiny", prompt=[[1, 10**7]]))
        assert e.param == "prompt[0]" and "outside the vocabulary" in e.message
        e = await raised(claude(app).messages.create(model="qwen-tiny", max_tokens=5, messages=MESSAGES,
                                                     extra_body={"temperature": "hot"}))
        assert isinstance(e, anthropic.BadRequestError) and "temperature" in e.body["error"]["message"]
        e = await raised(claude(app).messages.create(model="qwen-tiny", max_tokens=5,
                                                     messages=[{"role": "robot", "content": "x"}]))
        assert "messages.0.role" in e.body["error"]["message"]
        async with transport(app) as c:
            h = {"x-api-key": KEY, "content-type": "application/json"}
            r = await c.post("/v1/chat/completions", content=b'{"model": "qwen-tiny", "messages": [', headers=h)
            assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
            r = await c.post("/v1/chat/completions", content=b'{"messages": [{"role": "user", "content": "x"}]}',
                             headers=h)
            assert (r.status_code, r.json()["error"]["param"]) == (400, "model")
            r = await c.post("/v1/chat/completions", content=b'{"model": "qwen-tiny", "messages": []}', headers=h)
            assert (r.status_code, r.json()["error"]["param"]) == (400, "messages")
            r = await c.post("/v1/completions", content=b'{"model": "qwen-tiny", "prompt": ""}', headers=h)
            assert (r.status_code, r.json()["error"]["param"]) == (400, "prompt")
            r = await c.post("/v1/completions", content=b'{"model": "qwen-tiny", "prompt": "x", '
                                                         b'"stop_token_ids": [4294967296]}', headers=h)
            assert (r.status_code, r.json()["error"]["param"]) == (400, "stop_token_ids")
            r = await c.post("/v1/completions", content=b'{"model": "qwen-tiny", "prompt": "x", "top_p": 5e-324}',
                             headers=h)
            assert (r.status_code, r.json()["error"]["param"]) == (400, "top_p")
            r = await c.post("/v1/chat/completions", content=b"", headers=h)
            assert r.status_code == 400 and "empty" in r.json()["error"]["message"]
            r = await c.post("/v1/messages", content=b"[1, 2]", headers=h)
            assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    run(check())


def test_body_size_limit_is_413(tiny_tokenizers):
    app = make_app(tiny_tokenizers, max_body_bytes=2000)
    big = [{"role": "user", "content": "x" * 5000}]

    async def chunked(body: bytes):
        for i in range(0, len(body), 1000):
            yield body[i:i + 1000]

    async def check():
        e = await raised(oai(app).chat.completions.create(model="qwen-tiny", messages=big))
        assert isinstance(e, openai.APIStatusError) and e.status_code == 413 and e.code == "request_too_large"
        e = await raised(claude(app).messages.create(model="qwen-tiny", max_tokens=5, messages=big))
        assert isinstance(e, anthropic.RequestTooLargeError) and e.body["error"]["type"] == "request_too_large"
        async with transport(app) as c:  # no Content-Length: counted while reading
            body = json.dumps({"model": "qwen-tiny", "messages": big}).encode()
            r = await c.post("/v1/chat/completions", content=chunked(body), headers={"x-api-key": KEY})
            assert r.status_code == 413 and "transfer-encoding" in r.request.headers
    run(check())


def test_unsupported_features_and_bad_constraints_are_refused_by_name(tiny_tokenizers):
    app = make_app(tiny_tokenizers)

    async def check():
        client = oai(app)
        tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
        cases = [
            (client.chat.completions.create(model="qwen-tiny", messages=MESSAGES, tools=[tool], tool_choice={
                "type": "function", "function": {"name": "g"}}), "tool_choice"),
            (client.chat.completions.create(model="qwen-tiny", messages=MESSAGES, response_format={
                "type": "json_object"}, extra_body={"structured_outputs": {"regex": "a+"}}), "response_format"),
            (client.chat.completions.create(model="qwen-tiny", messages=MESSAGES, response_format={
                "type": "json_schema", "json_schema": {"name": "x"}}), "response_format.json_schema.schema"),
            (client.chat.completions.create(model="qwen-tiny", messages=[{"role": "user", "content": [
                {"type": "text", "text": "what is this"},
                {"type": "image_url", "image_url": {"url": "http://x/a.png"}}]}]), "messages[0].content[1]"),
            (client.chat.completions.create(model="qwen-tiny", messages=MESSAGES, top_logprobs=2), "top_logprobs"),
            (client.chat.completions.create(model="qwen-tiny", messages=MESSAGES, max_completion_tokens=10_000),
             "max_completion_tokens"),
            (client.completions.create(model="qwen-tiny", prompt="x", suffix="y"), "suffix"),
            (client.completions.create(model="qwen-tiny", prompt="x", best_of=3), "best_of"),
            (client.responses.create(model="qwen-tiny", input="x", previous_response_id="resp_1"),
             "previous_response_id"),
            (client.responses.create(model="qwen-tiny", input="x", tools=[{"type": "web_search"}]), "tools[0].type"),
        ]
        for call, param in cases:
            e = await raised(call)
            assert isinstance(e, openai.BadRequestError) and e.param == param, (param, e)
        e = await raised(client.chat.completions.create(model="qwen-tiny", messages=MESSAGES, max_tokens=10_000))
        assert e.code == "context_length_exceeded" and "maximum context length is 512" in e.message
        c = claude(app)
        for call, where in [
            (c.messages.create(model="qwen-tiny", max_tokens=5, messages=MESSAGES, tools=[
                {"name": "f", "input_schema": {"type": "object"}}], tool_choice={"type": "tool", "name": "g"}),
             "tool_choice"),
            (c.messages.create(model="qwen-tiny", max_tokens=5, messages=[{"role": "user", "content": [
                {"type": "image", "source": {"type": "url", "url": "http://x/a.png"}}]}]), "messages.0.content.0"),
        ]:
            e = await raised(call)
            assert isinstance(e, anthropic.BadRequestError) and where in e.body["error"]["message"]
    run(check())


def test_generation_while_loading_is_503_or_529(tiny_tokenizers):
    app = make_app(tiny_tokenizers)

    async def check():
        e = await raised(oai(app).chat.completions.create(model="qwen-tiny", messages=MESSAGES))
        assert isinstance(e, openai.InternalServerError) and e.status_code == 503
        assert e.response.headers["retry-after"] == "5"
        e = await raised(claude(app).messages.create(model="qwen-tiny", max_tokens=5, messages=MESSAGES))
        assert isinstance(e, anthropic.OverloadedError) and e.status_code == 529
        assert e.body["error"]["type"] == "overloaded_error"
    run(check())


# -- what reaches the engine ----------------------------------------------------------------------


def test_chat_request_reaches_the_engine_as_the_template_renders_it(tiny_tokenizers):
    engine = IdleEngine()
    assert isinstance(engine, EngineClient)
    app = make_app(tiny_tokenizers, engine)
    tok = tiny_tokenizers["chatml"]
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}

    async def check():
        client = oai(app)
        with pytest.raises(asyncio.TimeoutError):  # the idle engine never answers: the client gives up
            await asyncio.wait_for(client.chat.completions.create(
                model="qwen-tiny-lora", messages=MESSAGES, tools=[tool], n=2, seed=7, temperature=0.2,
                max_completion_tokens=30, stop=["\n\n"], logprobs=True, top_logprobs=3,
                extra_body={"top_k": 5, "chat_template_kwargs": {"enable_thinking": False}}), 0.5)
        assert len(engine.submitted) == 2 and sorted(engine.aborted) == ["r0", "r1"]  # n answers, then cleaned up
        (_, ids, params, adapter), (_, ids2, params2, _) = engine.submitted
        assert ids == ids2 == tok.apply_chat_template(MESSAGES, tools=[tool], add_generation_prompt=True,
                                                      enable_thinking=False)
        assert adapter == "qwen-tiny-lora"
        # One engine sequence each (n is the gateway's fan-out), with different seeds; stop strings
        # stay in the frontend, the rest reaches the engine's SamplingParams.
        from surogate.serve.types import SamplingParams

        assert isinstance(params, SamplingParams) and (params.seed, params2.seed) == (7, 8)
        assert (params.max_tokens, params.temperature, params.top_k, params.logprobs) == (30, 0.2, 5, 3)
    run(check())


class _Client:
    """A hand-driven ASGI connection: the body, then a disconnect when the test says so."""

    def __init__(self, app, path: str, body: dict):
        self.app, self.sent, self.gone = app, [], asyncio.Event()
        self.scope = {"type": "http", "method": "POST", "path": path, "query_string": b"",
                      "headers": [(b"content-type", b"application/json"), (b"x-api-key", KEY.encode())]}
        self.body = json.dumps(body).encode()
        self.read = False

    async def receive(self):
        if not self.read:
            self.read = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message):
        self.sent.append(message)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"model": "qwen-tiny", "messages": MESSAGES, "n": 2}),
    ("/v1/completions", {"model": "llama-tiny", "prompt": ["a", "b"]}),
    ("/v1/responses", {"model": "qwen-tiny", "input": "hi"}),
    ("/v1/messages", {"model": "qwen-tiny", "max_tokens": 9, "messages": MESSAGES}),
], ids=["chat", "completions", "responses", "messages"])
def test_client_disconnect_aborts_engine_requests(tiny_tokenizers, path, body, stream):
    """Streaming or not, a client that leaves gets its engine requests aborted. A quiet stream
    (here: one that never gets a token) carries keep-alive pings in the meantime."""
    engine = IdleEngine()
    app = make_app(tiny_tokenizers, engine, sse_ping_seconds=0.02)

    async def check():
        client = _Client(app, path, {**body, "stream": stream})
        task = asyncio.create_task(app(client.scope, client.receive, client.send))
        for _ in range(200):
            await asyncio.sleep(0.005)
            if len(engine.submitted) == 2 or (len(engine.submitted) == 1 and "n" not in body
                                              and "prompt" not in body):
                break
        assert engine.submitted and not engine.aborted
        if stream:
            assert client.sent[0]["status"] == 200  # the stream had started
            ping = b"event: ping\ndata: {\"type\":\"ping\"}\n\n" if path == "/v1/messages" else b": ping\n\n"
            for _ in range(200):
                if any(m.get("body") == ping for m in client.sent):
                    break
                await asyncio.sleep(0.01)
            assert any(m.get("body") == ping for m in client.sent)
        client.gone.set()
        await asyncio.wait_for(task, 5)
        assert sorted(engine.aborted) == sorted(r[0] for r in engine.submitted)
    run(check())


# -- count_tokens, tokenize -----------------------------------------------------------------------


def test_count_tokens_matches_the_rendered_prompt(tiny_tokenizers):
    app = make_app(tiny_tokenizers)
    tok = tiny_tokenizers["chatml"]

    async def check():
        result = await claude(app).messages.count_tokens(
            model="qwen-tiny", system="Be brief.",
            tools=[{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}}],
            messages=[{"role": "user", "content": "Weather in Paris?"},
                      {"role": "assistant", "content": [
                          {"type": "thinking", "thinking": "Call the tool.", "signature": "s"},
                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                    "content": "sunny"}]}])
        expected = tok.apply_chat_template(
            [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
             {"role": "assistant", "content": "", "reasoning_content": "Call the tool.", "tool_calls": [
                 {"id": "toolu_1", "type": "function",
                  "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
             {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"}],
            tools=[{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                                     "parameters": {"type": "object"}}}],
            add_generation_prompt=True)
        assert result.input_tokens == len(expected)
    run(check())


def test_tokenize_and_detokenize(tiny_tokenizers):
    app = make_app(tiny_tokenizers)
    tok = tiny_tokenizers["llama3"]

    async def check():
        async with transport(app) as c:
            h = {"x-api-key": KEY}
            r = (await c.post("/tokenize", json={"model": "llama-tiny", "prompt": "Hello world!",
                                                 "return_token_strs": True}, headers=h)).json()
            assert r["tokens"] == tok.encode("Hello world!") and r["count"] == len(r["tokens"])
            assert r["max_model_len"] == 512 and len(r["token_strs"]) == r["count"]
            r = (await c.post("/tokenize", json={"model": "llama-tiny", "messages": MESSAGES}, headers=h)).json()
            assert r["tokens"] == tok.apply_chat_template(MESSAGES, add_generation_prompt=True)
            r = (await c.post("/detokenize", json={"model": "llama-tiny", "tokens": tok.encode("Hi 🙂")},
                              headers=h)).json()
            assert r == {"prompt": tok.decode(tok.encode("Hi 🙂"))}
            r = await c.post("/tokenize", json={"model": "llama-tiny"}, headers=h)
            assert r.status_code == 400
    run(check())


# -- metrics, openapi, request ids, log ------------------------------------------------------------


def test_metrics(tiny_tokenizers):
    app = make_app(tiny_tokenizers, IdleEngine())

    async def check():
        async with transport(app) as c:
            assert (await c.get("/metrics")).status_code == 401
            await c.get("/v1/models", headers={"x-api-key": KEY})
            text = (await c.get("/metrics", headers={"x-api-key": KEY})).text
        for name in ("surogate:num_requests_running", "surogate:num_requests_waiting", "surogate:kv_cache_usage_perc",
                     "surogate:prefix_cache_queries_total", "surogate:prefix_cache_hits_total",
                     "surogate:prompt_tokens_total", "surogate:generation_tokens_total",
                     "surogate:time_to_first_token_seconds", "surogate:inter_token_latency_seconds",
                     "surogate:e2e_request_latency_seconds", "surogate:request_success_total"):
            assert f"# TYPE {name.removesuffix('_total')}" in text, name
        assert 'surogate:num_requests_waiting{model_name="qwen-tiny"} 3.0' in text
        assert 'surogate:kv_cache_usage_perc{model_name="llama-tiny"} 0.25' in text
        assert 'surogate:engine_model_seconds_total{model_name="qwen-tiny"} 2.25' in text
        assert 'surogate:http_requests_total{route="/v1/models",status="200"} 1.0' in text
        async with transport(make_app(tiny_tokenizers, metrics_need_key=False)) as c:
            assert (await c.get("/metrics")).status_code == 200
    run(check())


def test_openapi_document_is_valid(tiny_tokenizers):
    async def check():
        async with transport(make_app(tiny_tokenizers)) as c:
            r = await c.get("/openapi.json")
        assert r.status_code == 200
        doc = r.json()
        validate(doc)
        assert {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages",
                "/v1/messages/count_tokens", "/v1/models", "/v1/models/{model}", "/tokenize", "/detokenize",
                "/health", "/metrics"} <= set(doc["paths"])
        chat = doc["components"]["schemas"]["ChatCompletionRequest"]
        assert set(chat["required"]) == {"messages", "model"} and "chat_template_kwargs" in chat["properties"]
        op = doc["paths"]["/v1/messages"]["post"]
        assert op["responses"]["529"]["content"]["application/json"]["schema"]["$ref"].endswith(
            "AnthropicErrorResponse")
        assert "text/event-stream" in op["responses"]["200"]["content"]
        assert op["security"] == [{"bearer": []}, {"apiKey": []}]
    run(check())


def test_request_ids_and_one_json_log_line_per_request(tiny_tokenizers, caplog):
    app = make_app(tiny_tokenizers)

    async def check():
        async with transport(app) as c:
            r = await c.get("/v1/models", headers={"x-api-key": KEY, "x-request-id": "abc-123"})
            assert r.headers["x-request-id"] == r.headers["request-id"] == "abc-123"
            r = await c.get("/v1/models", headers={"x-api-key": KEY, "x-request-id": "bad id\n"})
            assert r.headers["x-request-id"].startswith("req_")
            await c.post("/v1/chat/completions", json={"model": "qwen-tiny", "messages": MESSAGES},
                         headers={"x-api-key": KEY})

    with caplog.at_level(logging.INFO, logger="surogate.gateway.access"):
        run(check())
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "surogate.gateway.access"]
    assert len(lines) == 3
    assert lines[0]["request_id"] == "abc-123" and lines[0]["status"] == 200 and lines[0]["path"] == "/v1/models"
    assert lines[2]["status"] == 503 and lines[2]["model"] == "qwen-tiny" and lines[2]["error"] == "overloaded"
    assert lines[2]["prompt_tokens"] > 0


def test_lora_admin_routes_name_the_model_and_need_the_key(tiny_tokenizers):
    """vLLM's adapter routes on a two-model server with no engine yet: the key, the model to act
    on (several are served), its loading state, unknown adapters; the OpenAPI document has them."""
    app = make_app(tiny_tokenizers)
    body = {"lora_name": "x", "lora_path": "/nowhere"}

    async def check():
        async with transport(app) as c:
            auth = {"x-api-key": KEY}
            assert (await c.post("/v1/load_lora_adapter", json=body)).status_code == 401
            r = await c.post("/v1/load_lora_adapter", json=body, headers=auth)
            assert r.status_code == 400 and r.json()["error"]["param"] == "model"  # which of the two?
            r = await c.post("/v1/load_lora_adapter?model=nope", json=body, headers=auth)
            assert r.status_code == 404
            r = await c.post("/v1/load_lora_adapter?model=qwen-tiny", json=body, headers=auth)
            assert r.status_code == 503 and "loading" in r.json()["error"]["message"]
            r = await c.post("/v1/load_lora_adapter", json={**body, "model": "qwen-tiny-lora"}, headers=auth)
            assert r.status_code == 400 and "is an adapter" in r.json()["error"]["message"]
            r = await c.post("/v1/load_lora_adapter", json={**body, "lora_name": ""}, headers=auth)
            assert r.status_code == 400 and r.json()["error"]["param"] == "lora_name"
            r = await c.post("/v1/load_lora_adapter", json={"lora_name": "x"}, headers=auth)
            assert r.status_code == 400 and r.json()["error"]["param"] == "lora_path"
            r = await c.post("/v1/unload_lora_adapter", json={"lora_name": "nope"}, headers=auth)
            assert r.status_code == 404 and "cannot be found" in r.json()["error"]["message"]
            r = await c.post("/v1/unload_lora_adapter", json={"lora_name": "qwen-tiny-lora"}, headers=auth)
            assert r.status_code == 503  # found on its base model, whose engine is still loading
            r = await c.post("/v1/embeddings", json={"model": "qwen-tiny", "input": "hi"}, headers=auth)
            assert r.status_code == 400 and "does not serve embeddings" in r.json()["error"]["message"]
            doc = (await c.get("/openapi.json")).json()
            for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
                op = doc["paths"][path]["post"]
                assert "text/plain" in op["responses"]["200"]["content"] and "400" in op["responses"]
            assert "EmbeddingRequest" in doc["components"]["schemas"]
    run(check())
