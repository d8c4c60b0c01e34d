"""/openapi.json, generated from the msgspec wire types and the route table (OpenAPI 3.2, whose
schema dialect is the JSON Schema msgspec writes). Every operation lists its error responses in
its API's envelope, so a schema-driven fuzzer (schemathesis) can check 4xx bodies too.

Streams are described event by event with 3.2's ``itemSchema`` (one SSE event: its ``data`` is
JSON of the route's event type). A 3.1 ``schema`` on ``text/event-stream`` would describe the
whole body as one string, and schema-driven tools apply it to each event instead."""

from __future__ import annotations

import msgspec

from .errors import AnthropicErrorResponse, OpenAIErrorResponse

_REF = "#/components/schemas/{name}"
_ERRORS = {"openai": ("400", "401", "404", "413", "429", "500", "503"),
           "anthropic": ("400", "401", "404", "413", "429", "500", "529")}


def build(routes, *, secured: bool, title: str = "Surogate gateway", version: str = "0.1.0") -> dict:
    types = [OpenAIErrorResponse, AnthropicErrorResponse]
    for r in routes:
        types += [t for t in (r.request, r.response, r.events) if t is not None]
    schemas, components = msgspec.json.schema_components(types, ref_template=_REF)
    schema_of = dict(zip(types, schemas))
    error_schema = {"openai": schema_of[OpenAIErrorResponse], "anthropic": schema_of[AnthropicErrorResponse]}

    paths: dict = {}
    for r in routes:
        op: dict = {"operationId": _operation_id(r), "summary": r.summary, "responses": {}}
        if r.request is not None:
            op["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema_of[r.request]}}}
        if r.path == "/v1/models/{model}":
            op["parameters"] = [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}]
        if r.query:
            op["parameters"] = [{"name": q, "in": "query", "required": False, "schema": {"type": "string"}}
                                for q in r.query]
        ok: dict = {"description": "OK"}
        if r.response is not None:
            ok["content"] = {"application/json": {"schema": schema_of[r.response]}}
        elif r.path == "/metrics" or r.plain:
            ok["content"] = {"text/plain": {"schema": {"type": "string"}}}
        elif r.path == "/openapi.json":
            ok["content"] = {"application/json": {"schema": {"type": "object"}}}
        if r.events is not None:
            ok.setdefault("content", {})["text/event-stream"] = {"itemSchema": _event(r, schema_of[r.events],
                                                                                      error_schema[r.api])}
        op["responses"]["200"] = ok
        codes = _ERRORS[r.api] if (r.request is not None or r.path.startswith("/v1/") or r.query) else ("401",)
        for code in codes:
            if code == "401" and not (secured and r.auth):
                continue
            if code == "413" and r.request is None:
                continue
            op["responses"][code] = {"description": _DESCRIPTIONS[code],
                                     "content": {"application/json": {"schema": error_schema[r.api]}}}
        if r.path == "/health":
            op["responses"]["503"] = {"description": "A model is still loading",
                                      "content": {"application/json": {"schema": schema_of[r.response]}}}
        if secured and r.auth:
            op["security"] = [{"bearer": []}, {"apiKey": []}]
        paths.setdefault(r.path, {})[r.method.lower()] = op

    doc = {"openapi": "3.2.0", "info": {"title": title, "version": version}, "paths": paths,
           "components": {"schemas": components}}
    if secured:
        doc["components"]["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer"},
            "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"}}
    return doc


def _event(r, event_schema: dict, error_schema: dict) -> dict:
    """One SSE event of the route's stream: JSON of its event type, or, after the 200 header, the
    API's error envelope; chat and completions end with ``data: [DONE]``."""
    data: list[dict] = [{"type": "string", "contentMediaType": "application/json", "contentSchema": s}
                        for s in (event_schema, error_schema)]
    if r.api == "openai" and r.path != "/v1/responses":  # the Responses API has no [DONE] sentinel
        data.insert(0, {"const": "[DONE]"})
    return {"type": "object", "required": ["data"],
            "properties": {"event": {"type": "string"}, "data": {"anyOf": data}}}


def _operation_id(r) -> str:
    name = r.path.strip("/").replace("/", "_").replace(".", "_").replace("{", "").replace("}", "")
    return f"{r.method.lower()}_{name}"


_DESCRIPTIONS = {"400": "Invalid request (param names the field)", "401": "Missing or invalid API key",
                 "404": "Unknown model or route", "413": "Request body too large", "429": "Too many requests",
                 "500": "Internal error", "503": "Overloaded, or the model is loading",
                 "529": "Overloaded, or the model is loading"}
