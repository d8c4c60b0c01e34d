"""A minimal asyncio HTTP/1.1 client for streamed completions: POST a JSON body, read the
Server-Sent Events back, and time every event as it arrives.

Why not httpx: a load of hundreds of streams is tens of thousands of SSE events a second, all in
one event loop, and the client must not be what the benchmark measures. One asyncio.Protocol per
request, one timestamp per read from the socket, chunked transfer decoding and SSE framing on a
bytearray, msgspec for the JSON: the client's CPU time is printed beside the results so that a
reader can check it was not the bottleneck.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import msgspec

_json = msgspec.json.Decoder()


@dataclass
class StreamResult:
    ok: bool = False
    error: str = ""
    start: float = 0.0  # perf_counter before connecting (`vllm bench serve`'s clock)
    ttft: float | None = None  # seconds to the first event with a choice
    itl: list[float] = field(default_factory=list)  # between events with a choice
    latency: float = 0.0  # to the end of the stream
    chunks: int = 0  # events with a choice
    prompt_tokens: int | None = None  # from the usage event, when the server sends one
    output_tokens: int | None = None
    text: str = ""


class _Stream(asyncio.Protocol):
    def __init__(self, request: bytes, result: StreamResult, done: asyncio.Future):
        self.request, self.result, self.done = request, result, done
        self.raw = bytearray()  # bytes off the socket not parsed yet
        self.events = bytearray()  # the decoded body, SSE events not yet complete
        self.head = True  # still reading the status line and headers
        self.status = 0
        self.chunked = False
        self.chunk_left = -1  # bytes left in the current chunk (+2 for its CRLF); -1: read a size line
        self.last: float | None = None
        self.body_done = False  # the terminating chunk came
        self.finished = False
        self.transport = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        self.raw += data
        if self.head:
            end = self.raw.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = bytes(self.raw[:end]).decode("latin-1").split("\r\n")
            del self.raw[:end + 4]
            self.head = False
            self.status = int(lines[0].split()[1])
            headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
            self.chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        if self.chunked:
            self._dechunk()
        else:
            self.events += self.raw
            self.raw.clear()
        if self.status == 200:
            self._parse_events(now)
        if self.body_done:
            self._finish()

    def _dechunk(self) -> None:
        raw = self.raw
        while raw:
            if self.chunk_left < 0:
                eol = raw.find(b"\r\n")
                if eol < 0:
                    return
                size = int(bytes(raw[:eol]).split(b";")[0], 16)
                del raw[:eol + 2]
                if size == 0:  # the last chunk: the events before it are parsed first
                    self.body_done = True
                    raw.clear()
                    return
                self.chunk_left = size + 2
            take = min(self.chunk_left, len(raw))
            self.events += raw[:take]
            del raw[:take]
            self.chunk_left -= take
            if self.chunk_left == 0:
                del self.events[-2:]  # the CRLF after the chunk's data
                self.chunk_left = -1

    def _parse_events(self, now: float) -> None:
        buf = self.events
        if b"\r\n" in buf:
            buf[:] = buf.replace(b"\r\n", b"\n")
        start = 0
        r = self.result
        while True:
            end = buf.find(b"\n\n", start)
            if end < 0:
                break
            for line in bytes(buf[start:end]).split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    r.ok = True
                    continue
                event = _json.decode(payload)
                if "error" in event:
                    r.error = str(event["error"])
                    continue
                usage = event.get("usage")
                if usage:
                    r.prompt_tokens = usage.get("prompt_tokens")
                    r.output_tokens = usage.get("completion_tokens")
                choices = event.get("choices")
                if choices:
                    r.text += choices[0].get("text") or ""
                    r.chunks += 1
                    if self.last is None:
                        r.ttft = now - r.start
                    else:
                        r.itl.append(now - self.last)
                    self.last = now
            start = end + 2
        del buf[:start]

    def _finish(self) -> None:
        if self.finished:
            return
        self.finished = True
        r = self.result
        r.latency = time.perf_counter() - r.start
        if self.status != 200:
            r.ok = False
            r.error = f"HTTP {self.status}: {bytes(self.events + self.raw)[:300].decode('utf-8', 'replace')}"
        elif not r.error and r.chunks == 0:
            r.error = "the stream ended with no output"
        r.ok = r.ok and not r.error
        if not r.ok and not r.error:
            r.error = "the stream ended before [DONE]"
        if self.transport is not None:
            self.transport.close()
        if not self.done.done():
            self.done.set_result(r)

    def connection_lost(self, exc) -> None:
        if not self.finished and exc is not None:
            self.result.error = f"connection lost: {exc}"
        if not self.chunked and not self.head and self.status == 200:
            self._parse_events(time.perf_counter())
        self._finish()


def post_request(url: str, body: bytes, api_key: str | None = None) -> tuple[str, int, bytes]:
    """(host, port, the request's bytes) of a POST to ``url``, closing the connection after."""
    u = urlsplit(url)
    host, port = u.hostname or "127.0.0.1", u.port or 80
    auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
    head = (f"POST {u.path or '/'} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\n{auth}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return host, port, head.encode() + body


async def stream(host: str, port: int, request: bytes, timeout: float = 3600) -> StreamResult:
    """Send ``request`` (from post_request) and read its event stream to the end."""
    loop = asyncio.get_running_loop()
    result = StreamResult(start=time.perf_counter())  # TTFT counts the connection too: a user's first token does
    done = loop.create_future()
    try:
        transport, _ = await loop.create_connection(lambda: _Stream(request, result, done), host, port)
    except OSError as e:
        result.error = f"cannot connect to {host}:{port}: {e}"
        return result
    try:
        return await asyncio.wait_for(done, timeout)
    except asyncio.TimeoutError:
        transport.close()
        result.ok, result.error = False, f"no end of stream after {timeout:.0f} s"
        return result
