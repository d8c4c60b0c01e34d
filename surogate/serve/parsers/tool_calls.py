"""Tool-call parsers: Hermes / Qwen (``<tool_call>{json}</tool_call>``) and Llama 3.1 JSON.

Both stream a call as soon as its name is known: a first delta with the name, then the raw
argument text as it arrives (see json_call.py). Text around the calls is content, with the
whitespace that only separates calls dropped (the templates put it back when the conversation
is rendered again). A call whose name never appears is not a call: its text is given back as
content, once that is certain.

Hermes, repeated for parallel calls (vLLM ``hermes``, SGLang ``qwen25``)::

    I'll check both.
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Rome"}}
    </tool_call>

Llama 3.1 / 3.2 JSON (vLLM ``llama3_json``): the whole answer is the call, optionally after
``<|python_tag|>``, several separated by ``;``; the key is ``parameters``::

    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}
"""

from __future__ import annotations

from surogate.serve.parsers.base import ToolCallDelta, held_prefix
from surogate.serve.parsers.json_call import ARGUMENT_KEYS, JsonCallScanner

# Keys a Llama 3 call may have before its name; any other means the JSON is an answer, not a call.
_CALL_KEYS = frozenset(("name", "type", *ARGUMENT_KEYS))


class _CallStream:
    """Turns one scanner's progress into deltas for the call at ``index``."""

    def __init__(self, index: int, keys_before_name: frozenset[str] | None = None):
        self.index = index
        self.scanner = JsonCallScanner(keys_before_name)
        self.text = ""  # everything fed, for giving it back as content
        self.raw = ""  # the part of it that belongs to the JSON object
        self.named = False
        self._sent = 0  # characters of raw argument text sent
        self._sent_text = False

    def feed(self, text: str) -> tuple[int, list[ToolCallDelta]]:
        self.text += text
        used = self.scanner.feed(text)
        self.raw += text[:used]
        return used, self.deltas()

    def deltas(self) -> list[ToolCallDelta]:
        s = self.scanner
        out = []
        if s.name is not None and not self.named:
            self.named = True
            out.append(ToolCallDelta(self.index, name=s.name))
        if not self.named:
            return out
        if s.args_kind == "raw" and len(s.args_raw) > self._sent:
            out.append(ToolCallDelta(self.index, arguments=s.args_raw[self._sent:]))
            self._sent = len(s.args_raw)
        elif s.args_kind == "string" and s.args_text is not None and not self._sent_text:
            self._sent_text = True
            out.append(ToolCallDelta(self.index, arguments=s.args_text))
        return out

    def close(self) -> list[ToolCallDelta]:
        """The call ended: a call without arguments gets ``{}``, so the arguments always parse."""
        if self.named and self.scanner.args_kind is None:
            return [ToolCallDelta(self.index, arguments="{}")]
        return []


class _Content:
    """Content between calls: whitespace next to a call is dropped, other text passes through."""

    def __init__(self):
        self._ws = ""  # trailing whitespace, held until more text shows it is not the end
        self.after_call = False

    def text(self, piece: str) -> str:
        if self.after_call:
            piece = piece.lstrip()
            if not piece:
                return ""
            self.after_call = False
        text = self._ws + piece
        body = text.rstrip()
        self._ws = text[len(body):]
        return body

    def call_starts(self) -> None:
        self._ws = ""

    def call_ends(self) -> None:
        self.after_call = True

    def finish(self, had_calls: bool) -> str:
        ws, self._ws = self._ws, ""
        return "" if had_calls else ws


class StepwiseToolParser:
    """What the tool parsers that read their text one move at a time share (Mistral's, LFM2's): the
    text held back, the content between calls, the call count, and ``feed`` moving on while there
    is text and a move can be made. A subclass calls ``super().__init__()`` and defines ``_step``."""

    def __init__(self):
        self._buf = ""
        self._content = _Content()
        self._calls = 0

    @property
    def num_calls(self) -> int:
        return self._calls

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        self._buf += text
        content: list[str] = []
        calls: list[ToolCallDelta] = []
        while self._buf and self._step(content, calls):
            pass
        return "".join(content), calls

    def _step(self, content: list[str], calls: list[ToolCallDelta]) -> bool:
        """One move; False when it must wait for more text."""
        raise NotImplementedError


class HermesToolParser:
    start_tag = "<tool_call>"
    end_tag = "</tool_call>"
    tags = (start_tag, end_tag)

    def __init__(self):
        self._buf = ""
        self._call: _CallStream | None = None
        self._content = _Content()
        self._calls = 0

    @property
    def num_calls(self) -> int:
        return self._calls

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        self._buf += text
        content: list[str] = []
        calls: list[ToolCallDelta] = []
        while self._buf:
            if self._call is None:
                at = self._buf.find(self.start_tag)
                if at < 0:
                    keep = held_prefix(self._buf, self.start_tag)
                    content.append(self._content.text(self._buf[:len(self._buf) - keep]))
                    self._buf = self._buf[len(self._buf) - keep:]
                    break
                content.append(self._content.text(self._buf[:at]))
                self._buf = self._buf[at + len(self.start_tag):]
                self._call = _CallStream(self._calls)
                self._content.call_starts()
            else:
                at = self._buf.find(self.end_tag)
                if at < 0:
                    keep = held_prefix(self._buf, self.end_tag)
                    calls += self._body(self._buf[:len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep:]
                    break
                calls += self._body(self._buf[:at])
                self._buf = self._buf[at + len(self.end_tag):]
                content.append(self._end_call(closed=True, calls=calls))
        return "".join(content), calls

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        buf, self._buf = self._buf, ""
        calls: list[ToolCallDelta] = []
        if self._call is not None:
            calls += self._body(buf)  # cut off inside a call: the held text was call text
            content = self._end_call(closed=False, calls=calls)
        else:
            content = self._content.text(buf)
        return content + self._content.finish(self._calls > 0), calls

    def _body(self, text: str) -> list[ToolCallDelta]:
        if not text:
            return []
        _, deltas = self._call.feed(text)  # text after the object's end is ignored
        return deltas

    def _end_call(self, closed: bool, calls: list[ToolCallDelta]) -> str:
        call, self._call = self._call, None
        if call.named:
            calls += call.close()
            self._calls += 1
            self._content.call_ends()
            return ""
        # No name: it was not a call after all. Give the text back, tags included.
        raw = self.start_tag + call.text + (self.end_tag if closed else "")
        return self._content.text(raw)


class Llama3JsonToolParser:
    python_tag = "<|python_tag|>"
    tags = (python_tag,)

    def __init__(self):
        self._buf = ""
        self._state = "detect"  # detect -> call -> between -> (call | text); text passes everything
        self._call: _CallStream | None = None
        self._held = ""  # text read in detect / between, given back if no call follows
        self._content = _Content()
        self._calls = 0

    @property
    def num_calls(self) -> int:
        return self._calls

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        self._buf += text
        content: list[str] = []
        calls: list[ToolCallDelta] = []
        while self._buf:
            if self._state == "text":
                content.append(self._content.text(self._buf))
                self._buf = ""
            elif self._state in ("detect", "between"):
                head = self._buf.lstrip()
                if self._state == "detect" and not self._calls:
                    if head.startswith(self.python_tag):
                        head = head[len(self.python_tag):].lstrip()
                    elif self.python_tag.startswith(head):
                        break  # whitespace or the start of the tag: wait
                elif head.startswith(";"):
                    head = head[1:].lstrip()
                if not head:
                    break
                if head[0] == "{":
                    self._held = self._buf[:len(self._buf) - len(head)]
                    self._buf = head
                    self._call = _CallStream(self._calls, _CALL_KEYS)
                    self._state = "call"
                    self._content.call_starts()
                else:
                    self._state = "text"
                    if not self._calls:
                        head = self._buf  # nothing was a call: the answer is content, as written
                    self._buf = head
            else:
                used, deltas = self._call.feed(self._buf)
                self._buf = self._buf[used:]
                calls += deltas
                s = self._call.scanner
                if not self._call.named and (s.failed or s.done):
                    # Plain JSON, not a call: what was held is content after all.
                    content.append(self._content.text(self._held + self._call.raw + self._buf))
                    self._buf, self._call, self._state = "", None, "text"
                elif s.done or s.failed:
                    calls += self._call.close()
                    self._end_call()
                else:
                    break
        return "".join(content), calls

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        buf, self._buf = self._buf, ""
        content, calls = "", []
        if self._state == "detect" and not self._calls:
            content = self._content.text(buf)
        elif self._state == "call":
            if self._call.named:
                calls = self._call.close()
                self._end_call()
            else:
                content = self._content.text(self._held + self._call.raw + buf)
        elif self._state == "text":
            content = self._content.text(buf)
        return content + self._content.finish(self._calls > 0), calls

    def _end_call(self) -> None:
        self._call = None
        self._calls += 1
        self._state = "between"
        self._content.call_ends()

