"""Gemma 4's tool calls (vLLM ``gemma4``), as its chat template writes them::

    <|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3,units:{metric:true},tags:[<|"|>a<|"|>]}<tool_call|>

Keys are bare (or quoted with ``<|"|>``), strings are wrapped in the ``<|"|>`` quote token and not
escaped, numbers, true / false / null are bare, objects and lists nest. The call tokens are special
tokens: the output pipeline keeps a parser's ``tags`` in the decoded text (frontend.py).

Text outside the calls is content. A call's arguments are Gemma's notation, not JSON, so a call is
held until its ``<tool_call|>`` and then emitted whole: its name and its arguments as JSON, one
delta (the same in every chunking). A call the text ends inside (max_tokens) is content, as written.
Gemma 4's thinking, ``<|channel>thought ... <channel|>``, is the reasoning parser's
(ThinkReasoningParser with those tags: registry.py).
"""

from __future__ import annotations

import json

from surogate.serve.parsers.base import ToolCallDelta, held_prefix

START, END, QUOTE, PREFIX = "<|tool_call>", "<tool_call|>", '<|"|>', "call:"


class Gemma4ToolParser:
    tags = (START, END, QUOTE)

    def __init__(self):
        self._buf = ""
        self._in_call = False
        self._calls = 0

    @property
    def num_calls(self) -> int:
        return self._calls

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        self._buf += text
        content, calls = [], []
        while self._buf:
            if not self._in_call:
                at = self._buf.find(START)
                if at < 0:
                    keep = held_prefix(self._buf, START)
                    content.append(self._buf[:len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep:]
                    break
                content.append(self._buf[:at])
                self._buf, self._in_call = self._buf[at + len(START):], True
            else:
                end = self._buf.find(END)
                if end < 0:
                    break
                body, self._buf, self._in_call = self._buf[:end], self._buf[end + len(END):], False
                call = parse_call(body)
                if call is None:  # not a call after all: keep the text as the model wrote it
                    content.append(START + body + END)
                    continue
                name, args = call
                calls.append(ToolCallDelta(self._calls, name, json.dumps(args, ensure_ascii=False)))
                self._calls += 1
        return "".join(content), calls

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        buf, self._buf = self._buf, ""
        if self._in_call:
            self._in_call = False
            return START + buf, []
        return buf, []


def parse_call(body: str) -> tuple[str, dict] | None:
    """(name, arguments) of ``call:NAME{...}``, or None when the body is not one."""
    body = body.strip()
    if not body.startswith(PREFIX):
        return None
    brace = body.find("{")
    name = body[len(PREFIX):brace if brace >= 0 else len(body)].strip()
    if not name:
        return None
    if brace < 0:
        return name, {}
    try:
        args, end = _value(body, brace)
    except (ValueError, IndexError):
        return None
    if not isinstance(args, dict) or body[end:].strip():
        return None
    return name, args


def _value(s: str, i: int):
    """The value at s[i:] and the index after it."""
    if s.startswith(QUOTE, i):
        end = s.index(QUOTE, i + len(QUOTE))
        return s[i + len(QUOTE):end], end + len(QUOTE)
    if s[i] == "{":
        out, i = {}, i + 1
        while s[i] != "}":
            if s.startswith(QUOTE, i):
                key, i = _value(s, i)
            else:
                colon = s.index(":", i)
                key, i = s[i:colon].strip(), colon
            if s[i] != ":":
                raise ValueError("expected ':'")
            out[key], i = _value(s, i + 1)
            if s[i] == ",":
                i += 1
        return out, i + 1
    if s[i] == "[":
        out, i = [], i + 1
        while s[i] != "]":
            v, i = _value(s, i)
            out.append(v)
            if s[i] == ",":
                i += 1
        return out, i + 1
    j = i
    while j < len(s) and s[j] not in ",}]":
        j += 1
    token = s[i:j].strip()
    try:
        return json.loads(token), j  # numbers, true, false, null, a JSON string
    except json.JSONDecodeError:
        return token, j  # a bare word: the text itself
