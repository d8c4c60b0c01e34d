"""The little ASGI we need: replies as values, reading a bounded body, sending.

Handlers return a ``JSONReply``, a ``StreamReply`` (server-sent events) or an ``ApiError``; the
app (app.py) turns each into ASGI messages. No web framework: a router over the scope is a page
of code, and it leaves disconnect handling and body limits in plain sight.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from .sse import encoder


@dataclass
class JSONReply:
    body: object  # a msgspec Struct or plain JSON value
    status: int = 200
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)


@dataclass
class RawReply:
    body: bytes
    content_type: bytes
    status: int = 200


@dataclass
class StreamReply:
    chunks: AsyncIterator[bytes]
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)


class BodyTooLarge(Exception):
    pass


def header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


async def read_body(receive, limit: int) -> bytes | None:
    """The request body, or None if the client left before sending it; BodyTooLarge past ``limit``."""
    parts, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


async def send_bytes(send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    """A whole reply in two messages (the caller marks the context ``responded`` after)."""
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def json_bytes(obj) -> bytes:
    return encoder.encode(obj)
