"""Mistral's tool calls (vLLM ``mistral``), both forms its tokenizers write after ``[TOOL_CALLS]``.

v3 - v7 (Mistral 7B v0.3, Nemo, Small 3.0 / 3.1): one JSON array of calls::

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": ...}]

v11+ (Small 3.2, Magistral, Devstral): each call is the name, ``[ARGS]``, then its arguments'
JSON; a ``[CALL_ID]id`` after the name is skipped (ids are the API layer's)::

    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"tz": "CET"}

``[TOOL_CALLS]`` and ``[ARGS]`` are special tokens; the output pipeline keeps a parser's ``tags``
in the decoded text (frontend.py). Text decoded without them (another pipeline) still parses in
the v3 form: an answer that starts with a JSON array of named objects is taken as the calls (an
array that is not is content, as written); the v11 form needs the tokens. Text before the calls is content; a call streams as the other parsers' do (tool_calls.py):
the name first, then the raw argument text as it arrives.
"""

from __future__ import annotations

import re

from surogate.serve.parsers.base import ToolCallDelta, held_prefix
from surogate.serve.parsers.json_call import JsonCallScanner
from surogate.serve.parsers.tool_calls import StepwiseToolParser, _CallStream

_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_WS = " \t\r\n"


class _ArgsStream:
    """The v11 arguments: one JSON value after ``[ARGS]``, streamed raw until it ends (the
    scanner reads it as the value of an "arguments" key, so it ends exactly where JSON says)."""

    def __init__(self, index: int):
        self.index = index
        self.scanner = JsonCallScanner()
        self.scanner.feed('{"arguments": ')
        self._sent = 0

    @property
    def done(self) -> bool:
        return self.scanner.args_text is not None or self.scanner.failed

    def feed(self, text: str) -> tuple[int, list[ToolCallDelta]]:
        used = 0
        for ch in text:  # one at a time: stop at the value's last character
            if self.done:
                break
            self.scanner.feed(ch)
            used += 1
        return used, self.deltas()

    def deltas(self) -> list[ToolCallDelta]:
        s = self.scanner
        if s.args_kind == "string":
            if s.args_text is not None and self._sent == 0:
                self._sent = 1
                return [ToolCallDelta(self.index, arguments=s.args_text)]
            return []
        if len(s.args_raw) > self._sent:
            piece, self._sent = s.args_raw[self._sent:], len(s.args_raw)
            return [ToolCallDelta(self.index, arguments=piece)]
        return []

    def close(self) -> list[ToolCallDelta]:
        return [ToolCallDelta(self.index, arguments="{}")] if self.scanner.args_kind is None else []


class MistralToolParser(StepwiseToolParser):
    tag = "[TOOL_CALLS]"
    args_tag = "[ARGS]"
    id_tag = "[CALL_ID]"
    tags = (tag, args_tag, id_tag)

    def __init__(self):
        super().__init__()
        # detect -> (text | array) ; text -> after_tag -> (array | name) ; array <-> call ;
        # name -> args -> text ; plain passes everything (a bare array that held no calls)
        self._state = "detect"
        self._bare = False  # in an array that came without [TOOL_CALLS]
        self._held = ""  # the text of a bare array so far, given back if it holds no call
        self._call: _CallStream | _ArgsStream | None = None

    def _step(self, content: list[str], calls: list[ToolCallDelta]) -> bool:
        """One move of the state machine; False when it must wait for more text."""
        state, buf = self._state, self._buf
        if state == "plain":
            content.append(self._content.text(buf))
            self._buf = ""
        elif state == "detect":
            head = buf.lstrip(_WS)
            if not head or (self.tag.startswith(head) and head != self.tag):
                return False
            if head.startswith("["):
                if not head.startswith(self.tag):  # the tag decoded away: maybe the bare v3 array
                    self._bare, self._held = True, buf[:len(buf) - len(head) + 1]
                    self._buf, self._state = head[1:], "array"
                    self._content.call_starts()
                    return True
            self._state = "text"
        elif state == "text":
            at = buf.find(self.tag)
            if at < 0:
                keep = held_prefix(buf, self.tag)
                content.append(self._content.text(buf[:len(buf) - keep]))
                self._buf = buf[len(buf) - keep:]
                return False
            content.append(self._content.text(buf[:at]))
            self._buf, self._state = buf[at + len(self.tag):], "after_tag"
            self._content.call_starts()
        elif state == "after_tag":
            head = buf.lstrip(_WS)
            if not head:
                self._buf = ""
                return False
            self._buf = head[1:] if head[0] == "[" else head
            self._state = "array" if head[0] == "[" else "name"
            self._held = self.tag + buf[:len(buf) - len(head) + (head[0] == "[")]
        elif state == "array":
            head = buf.lstrip(_WS)
            if not head:
                self._held += buf
                self._buf = ""
                return False
            self._held += buf[:len(buf) - len(head)]
            if head[0] == "," and (self._calls or not self._bare):
                self._held += ","
                self._buf = head[1:]
            elif head[0] == "]" and (self._calls or not self._bare):
                self._buf, self._state, self._bare, self._held = head[1:], "text", False, ""
                self._content.call_ends()
            elif head[0] == "{":
                self._buf, self._state = head, "call"
                self._call = _CallStream(self._calls)
            else:
                self._not_calls(content, head)
        elif state == "call":
            used, deltas = self._call.feed(buf)
            self._held += buf[:used]
            self._buf = buf[used:]
            calls += deltas
            s = self._call.scanner
            if not (s.done or s.failed):
                return False
            if not self._call.named:
                self._not_calls(content, self._buf)
                return True
            calls += self._call.close()
            self._end_call("array")
            self._held = ""
        elif state == "name":
            at = buf.find(self.args_tag)
            m = _NAME.match(buf)
            name = m.group(0) if m else ""
            if at < 0 and self._may_follow_name(buf[len(name):]):
                return False  # still a name, maybe [CALL_ID]..., maybe the start of [ARGS]
            between = buf[len(name):at].lstrip(_WS) if at >= 0 else None
            if not name or between is None or not (between == "" or between.startswith(self.id_tag)):
                self._not_calls(content, buf)  # not a call: the text as written, the tag included
                return True
            calls.append(ToolCallDelta(self._calls, name=name))
            self._call = _ArgsStream(self._calls)
            self._buf, self._state = buf[at + len(self.args_tag):].lstrip(_WS), "args"
        elif state == "args":
            used, deltas = self._call.feed(buf)
            self._buf = buf[used:]
            calls += deltas
            if not self._call.done:
                return False
            self._end_call("text")
        return True

    def _may_follow_name(self, rest: str) -> bool:
        """Text after a v11 name that can still become [ARGS], or [CALL_ID] with an id then [ARGS]."""
        rest = rest.lstrip(_WS)
        if self.args_tag.startswith(rest) or self.id_tag.startswith(rest):
            return True
        if rest.startswith(self.id_tag):
            after = rest[len(self.id_tag):]
            return "[" not in after or self.args_tag.startswith(after[after.find("["):])
        return False

    def _not_calls(self, content: list[str], rest: str) -> None:
        """What began as calls is not: its text is content as written (from the tag, or from the
        bare array's start, or from the end of the last call); a bare array ends the parsing."""
        self._state = "plain" if self._bare and not self._calls else "text"
        if self._calls:
            self._content.call_ends()
        content.append(self._content.text(self._held + rest))
        self._buf, self._held, self._call, self._bare = "", "", None, False

    def _end_call(self, then: str) -> None:
        self._call = None
        self._calls += 1
        self._state = then
        if then == "text":
            self._content.call_ends()

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        buf, self._buf = self._buf, ""
        content, calls = [], []
        state = self._state
        if state in ("detect", "text", "plain"):
            content.append(self._content.text(buf))
        elif (state == "call" and self._call.named) or state == "args":
            calls += self._call.close()  # cut off inside a call (max_tokens)
            self._end_call("text")
        elif state in ("name", "call") or (state == "array" and self._bare and not self._calls):
            content.append(self._content.text(self._held + buf))  # it never became a call
        return "".join(content) + self._content.finish(self._calls > 0), calls
