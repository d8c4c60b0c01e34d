"""Server-sent events framing and the ids the APIs hand out.

``data: <json>\\n\\n`` for OpenAI chat and completions (ended by ``data: [DONE]``);
``event: <name>\\ndata: <json>\\n\\n`` for Responses and Anthropic, whose events name themselves.
One JSON encoder per process (msgspec encoders are reusable and thread-safe).
"""

from __future__ import annotations

import itertools
import secrets

import msgspec

encoder = msgspec.json.Encoder()
DONE = b"data: [DONE]\n\n"
PING = b": ping\n\n"  # an SSE comment: legal anywhere, ignored by clients (llama.cpp sends these)


def data(obj) -> bytes:
    return b"data: " + encoder.encode(obj) + b"\n\n"


def event(name: str, obj) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + encoder.encode(obj) + b"\n\n"


_MARK = "\x00surogate-sse-field\x00"  # no client-given string holds a NUL: found only where placed
_MARK_JSON = encoder.encode(_MARK)


class Template:
    """``data: <json>\n\n`` of one chunk whose string field(s) vary, encoded once: ``make(MARK)``
    builds the chunk with ``Template.MARK`` in the varying field(s); ``fill(text)`` is then the
    same bytes as ``data(make(text))`` (msgspec escapes a string the same wherever it stands),
    without building and encoding the Structs per chunk. ``None`` from ``build`` when the mark
    does not show (then encode as usual)."""

    MARK = _MARK

    def __init__(self, parts: list[bytes]):
        self._parts = parts

    @classmethod
    def build(cls, obj) -> Template | None:
        parts = data(obj).split(_MARK_JSON)
        return cls(parts) if len(parts) > 1 else None

    def fill(self, text: str) -> bytes:
        return encoder.encode(text).join(self._parts)


class Ids:
    """``chatcmpl-...``, ``call_...``, ``msg_...``: random in production; ``Ids(seed="t")`` counts
    instead, so golden transcripts are byte-stable."""

    def __init__(self, seed: str | None = None):
        self._seed = seed
        self._count = itertools.count()

    def new(self, prefix: str) -> str:
        if self._seed is not None:
            return f"{prefix}{self._seed}{next(self._count)}"
        return prefix + secrets.token_hex(12)
