"""What the TUI asks a running gateway over HTTP: /health, /metrics (Prometheus text, read into
the Serve screen's numbers), /v1/models (models, and the LoRA adapters loaded on them),
/v1/load_lora_adapter / unload_lora_adapter, and streamed /v1/chat/completions (SSE).

The metric names are the gateway's (gateway/metrics.py: vLLM's names under ``surogate:``).
Rates (tokens/s) come from the difference of two scrapes. Every call blocks: workers only.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import httpx

P = "surogate:"


def parse_prometheus(text: str) -> dict[str, float]:
    """Sample values summed over labels, by metric name (without a ``_total`` suffix)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        # name{labels} value [timestamp]; label values may hold spaces
        if "{" in line:
            name, rest = line[:line.index("{")], line[line.rindex("}") + 1:]
        else:
            name, _, rest = line.partition(" ")
        try:
            value = float(rest.split()[0])
        except (ValueError, IndexError):
            continue
        if math.isnan(value):
            continue
        name = name.removesuffix("_total")
        out[name] = out.get(name, 0.0) + value
    return out


@dataclass
class ServerStats:
    healthy: bool = False
    models: dict[str, str] = field(default_factory=dict)  # name -> status (loaded, loading, ...)
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None  # 0 to 1
    prefix_hit_rate: float | None = None  # hits / queries, in tokens, since start
    generation_tps: float | None = None
    prompt_tps: float | None = None
    requests: float | None = None  # finished requests since start
    adapters: dict[str, str] = field(default_factory=dict)  # LoRA adapter -> its base model (from /v1/models)
    error: str | None = None


class StatsPoller:
    """One scrape per call; keeps the previous counters for rates."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 2.0):
        self.base_url = base_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout = timeout
        self._last: tuple[float, dict[str, float]] | None = None

    def poll(self) -> ServerStats:
        stats = ServerStats()
        try:
            health = httpx.get(f"{self.base_url}/health", timeout=self.timeout)
            body = health.json()
            stats.healthy = health.status_code == 200
            stats.models = dict(body.get("models") or {})
        except (httpx.HTTPError, ValueError) as e:
            stats.error = _describe_http(e)
            return stats
        try:
            r = httpx.get(f"{self.base_url}/metrics", headers=self.headers, timeout=self.timeout)
            r.raise_for_status()
        except httpx.HTTPError as e:
            stats.error = _describe_http(e)
            return stats
        try:
            stats.adapters = adapters_of(httpx.get(f"{self.base_url}/v1/models", headers=self.headers,
                                                   timeout=self.timeout).json())
        except (httpx.HTTPError, ValueError, AttributeError, TypeError):
            pass  # the numbers still show; the adapters line waits for the next poll
        now, m = time.monotonic(), parse_prometheus(r.text)
        for key in ("generation_tokens", "prompt_tokens", "request_success"):
            m.setdefault(P + key, 0.0)  # labelled counters appear only after their first request
        stats.running = m.get(P + "num_requests_running")
        stats.waiting = m.get(P + "num_requests_waiting")
        stats.kv_usage = m.get(P + "kv_cache_usage_perc")
        queries, hits = m.get(P + "prefix_cache_queries"), m.get(P + "prefix_cache_hits")
        if queries:
            stats.prefix_hit_rate = (hits or 0.0) / queries
        stats.requests = m.get(P + "request_success")
        if self._last is not None:
            t0, prev = self._last
            dt = now - t0
            if dt > 0:
                for attr, key in (("generation_tps", "generation_tokens"), ("prompt_tps", "prompt_tokens")):
                    a, b = prev.get(P + key), m.get(P + key)
                    if a is not None and b is not None:
                        setattr(stats, attr, max(b - a, 0.0) / dt)
        self._last = (now, m)
        return stats


def list_models(base_url: str, api_key: str | None = None, timeout: float = 3.0) -> list[str]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    r = httpx.get(f"{base_url.rstrip('/')}/v1/models", headers=headers, timeout=timeout)
    r.raise_for_status()
    return [m["id"] for m in r.json().get("data", [])]


def adapters_of(models: dict) -> dict[str, str]:
    """A /v1/models body's LoRA adapters: the entries that name a parent (their base model)."""
    return {m["id"]: m["parent"] for m in models.get("data", []) if m.get("parent")}


def load_adapter(base_url: str, name: str, path: str, api_key: str | None = None, timeout: float = 120.0) -> str:
    """POST /v1/load_lora_adapter (vLLM's body); the gateway's "Success: ..." line, or a
    GatewayError with its message (a bad folder, a name already loaded, ...)."""
    return _admin(base_url, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path}, api_key, timeout)


def unload_adapter(base_url: str, name: str, api_key: str | None = None, timeout: float = 30.0) -> str:
    return _admin(base_url, "/v1/unload_lora_adapter", {"lora_name": name}, api_key, timeout)


def _admin(base_url: str, path: str, body: dict, api_key: str | None, timeout: float) -> str:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.post(f"{base_url.rstrip('/')}{path}", json=body, headers=headers, timeout=timeout)
    except httpx.HTTPError as e:
        raise GatewayError(_describe_http(e), hint="is the gateway running? Start it first (s)") from None
    if r.status_code != 200:
        raise GatewayError(f"HTTP {r.status_code}: {_error_message(r)}", hint=_hint_for(r.status_code))
    return r.text


@dataclass
class ChatDelta:
    """One piece of a streamed answer."""

    kind: str  # content | reasoning | tool_call | finish | usage
    text: str = ""
    index: int = 0  # tool call index
    name: str | None = None  # tool call function name (on its first delta)
    finish_reason: str | None = None
    usage: dict | None = None


class GatewayError(Exception):
    """A gateway call that failed: ``message`` says how, ``hint`` what to do."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message, self.hint = message, hint


class ChatError(GatewayError):
    pass


def stream_chat(base_url: str, body: dict, api_key: str | None = None,
                cancelled: Callable[[], bool] = lambda: False, timeout: float = 300.0,
                client: httpx.Client | None = None) -> Iterator[ChatDelta]:
    """POST /v1/chat/completions with stream=true and yield its deltas; stops early when ``cancelled()``
    (closing the stream: the gateway aborts the request and frees its KV blocks)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    url = f"{base_url.rstrip('/')}/v1/chat/completions"
    http = client or httpx
    try:
        with http.stream("POST", url, json=body, headers=headers,
                         timeout=httpx.Timeout(timeout, connect=5.0)) as r:
            if r.status_code != 200:
                r.read()
                raise ChatError(f"HTTP {r.status_code}: {_error_message(r)}", hint=_hint_for(r.status_code))
            for line in r.iter_lines():
                if cancelled():
                    return
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                try:
                    chunk = json.loads(data)
                except ValueError:
                    continue
                if "error" in chunk:
                    raise ChatError(str(chunk["error"].get("message", chunk["error"])))
                yield from _deltas(chunk)
    except httpx.HTTPError as e:
        raise ChatError(_describe_http(e), hint="is the gateway running? Start it on the Serve screen (3)") from None


def _deltas(chunk: dict) -> Iterator[ChatDelta]:
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if reasoning:
            yield ChatDelta("reasoning", reasoning)
        if delta.get("content"):
            yield ChatDelta("content", delta["content"])
        for call in delta.get("tool_calls") or []:
            fn = call.get("function") or {}
            yield ChatDelta("tool_call", fn.get("arguments") or "", index=call.get("index", 0), name=fn.get("name"))
        if choice.get("finish_reason"):
            yield ChatDelta("finish", finish_reason=choice["finish_reason"])
    if chunk.get("usage"):
        yield ChatDelta("usage", usage=chunk["usage"])


def _error_message(r: httpx.Response) -> str:
    try:
        body = r.json()
        err = body.get("error", body)
        return str(err.get("message", err)) if isinstance(err, dict) else str(err)
    except ValueError:
        return r.text[:200] or r.reason_phrase


def _hint_for(status: int) -> str | None:
    return {401: "set the API key the gateway was started with",
            404: "pick a model the gateway serves (refresh the model list)"}.get(status)


def _describe_http(e: Exception) -> str:
    if isinstance(e, httpx.ConnectError):
        return "cannot connect (not running?)"
    if isinstance(e, httpx.TimeoutException):
        return "timed out"
    return f"{type(e).__name__}: {e}"
