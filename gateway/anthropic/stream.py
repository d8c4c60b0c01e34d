"""Anthropic Messages stream, and the final Message built from the same state.

Order (serving-protocols.md §2.3): ``message_start`` -> per block [``content_block_start`` ->
deltas -> ``content_block_stop``] -> ``message_delta`` (stop_reason, cumulative usage) ->
``message_stop``. Thinking blocks come first (``thinking_delta``s, then one ``signature_delta``
before their stop: we sign nothing, so the signature is empty); text blocks carry
``text_delta``s; a tool call is a ``tool_use`` block whose ``input`` starts as ``{}`` and grows by
``input_json_delta`` fragments that join into the arguments' JSON.
"""

from __future__ import annotations

import json

from surogate.serve.types import RequestOutput

from ..errors import ApiError, error_body
from ..sse import Ids, event
from . import protocol as a

STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens", "abort": "end_turn"}


def stop_reason(finish_reason: str | None, stop: str | int | None) -> tuple[str | None, str | None]:
    """(stop_reason, stop_sequence) for the engine's finish reason and the stop string that matched."""
    if finish_reason == "stop" and isinstance(stop, str):
        return "stop_sequence", stop
    return STOP_REASONS.get(finish_reason or "", "end_turn" if finish_reason else None), None


class MessageStream:
    def __init__(self, *, id: str, model: str, input_tokens: int, cached_tokens: int = 0, ids: Ids | None = None):
        self.id, self.model = id, model
        self.input_tokens, self.cached_tokens = input_tokens, cached_tokens
        self.ids = ids or Ids()
        self.blocks: list[a.ContentBlock] = []  # closed blocks
        self._open: str | None = None  # "thinking" | "text" | "tool_use"
        self._tool: tuple[str, str] | None = None  # (id, name) of the open tool_use block
        self._parts: list[str] = []

    def _message(self, content, stop, sequence, output_tokens) -> a.Message:
        return a.Message(id=self.id, content=content, model=self.model, stop_reason=stop, stop_sequence=sequence,
                         usage=a.Usage(input_tokens=self.input_tokens, cache_creation_input_tokens=0,
                                       cache_read_input_tokens=self.cached_tokens, output_tokens=output_tokens))

    def start(self) -> bytes:
        return event("message_start", a.MessageStartEvent(self._message([], None, None, 0)))

    def delta(self, d: RequestOutput) -> bytes:
        out = []
        if d.reasoning:
            out.append(self._open_block("thinking", a.ThinkingBlock(thinking="", signature="")))
            out.append(self._delta(a.ThinkingDelta(d.reasoning), d.reasoning))
        if d.content:
            out.append(self._open_block("text", a.TextBlock(text="")))
            out.append(self._delta(a.TextDelta(d.content), d.content))
        for call in d.tool_calls:
            if call.name is not None:
                out.append(self._close())
                self._tool = (self.ids.new("toolu_"), call.name)
                out.append(self._open_block("tool_use", a.ToolUseBlock(id=self._tool[0], name=call.name, input={})))
            if call.arguments:
                out.append(self._delta(a.InputJSONDelta(call.arguments), call.arguments))
        return b"".join(out)

    def end(self, finish_reason: str | None, stop: str | int | None, output_tokens: int) -> bytes:
        reason, sequence = stop_reason(finish_reason, stop)
        return (self._close()
                + event("message_delta", a.MessageDeltaEvent(a.MessageDeltaBody(stop_reason=reason,
                                                                                stop_sequence=sequence),
                                                             self._delta_usage(output_tokens)))
                + event("message_stop", a.MessageStopEvent()))

    def _delta_usage(self, output_tokens: int) -> a.MessageDeltaUsage:
        # Usage here is cumulative; the prefix-cache hit is known only once generation ran.
        if self.cached_tokens:
            return a.MessageDeltaUsage(output_tokens=output_tokens, input_tokens=self.input_tokens,
                                       cache_read_input_tokens=self.cached_tokens)
        return a.MessageDeltaUsage(output_tokens=output_tokens)

    def error(self, err: ApiError) -> bytes:
        info = error_body(err, "anthropic").error
        return event("error", a.ErrorEvent(a.StreamError(type=info.type, message=info.message)))

    def message(self, finish_reason: str | None, stop: str | int | None, output_tokens: int) -> a.Message:
        self._close()
        reason, sequence = stop_reason(finish_reason, stop)
        return self._message(list(self.blocks), reason, sequence, output_tokens)

    def _index(self) -> int:
        return len(self.blocks)

    def _open_block(self, kind: str, block) -> bytes:
        if self._open == kind and kind != "tool_use":
            return b""
        out = self._close() if kind != "tool_use" else b""
        self._open, self._parts = kind, []
        return out + event("content_block_start", a.ContentBlockStartEvent(self._index(), block))

    def _delta(self, delta, text: str) -> bytes:
        self._parts.append(text)
        return event("content_block_delta", a.ContentBlockDeltaEvent(self._index(), delta))

    def _close(self) -> bytes:
        kind = self._open
        if kind is None:
            return b""
        text = "".join(self._parts)
        out = b""
        if kind == "thinking":
            out = event("content_block_delta", a.ContentBlockDeltaEvent(self._index(), a.SignatureDelta("")))
            block = a.ThinkingBlock(thinking=text, signature="")
        elif kind == "text":
            block = a.TextBlock(text=text)
        else:
            block = a.ToolUseBlock(id=self._tool[0], name=self._tool[1], input=_arguments(text))
        out += event("content_block_stop", a.ContentBlockStopEvent(self._index()))
        self.blocks.append(block)
        self._open, self._parts, self._tool = None, [], None
        return out


def _arguments(text: str) -> dict:
    """A tool call's input is always an object in the final message, whatever the model wrote."""
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
