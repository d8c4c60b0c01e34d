"""DeepSeek's tool calls (vLLM ``deepseek_v3`` and ``deepseek_v31``), between its call tokens.

V3 and R1-0528 write the type, the name, and the arguments in a fenced JSON block::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

V3.1 and later drop the type and the fence::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>

One parser reads both (the V3 form is known by its ``function`` type before the separator and the
fence after the name). A call is emitted whole, name then arguments, when its end token arrives (or
the answer ends inside it, with the arguments as far as they got). A call body without the
separator is content, as written, tokens included. Text around the calls section is content;
whitespace next to a call is dropped. The tokens are special in DeepSeek's tokenizer: the output
pipeline keeps a parser's ``tags`` in the text while skipping other special tokens (frontend.py).
"""

from __future__ import annotations

from surogate.serve.parsers.base import ToolCallDelta, held_prefix
from surogate.serve.parsers.tool_calls import StepwiseToolParser

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"
_WS = " \t\r\n"


def split_call(body: str) -> tuple[str, str] | None:
    """(name, arguments JSON text) of one call's body, or None when it is not a call."""
    head, sep, rest = body.partition(SEP)
    if not sep:
        return None
    if head.strip() == "function":  # V3: NAME, newline, ```json ... ```
        name, _, args = rest.partition("\n")
        args = args.strip(_WS)
        if args.startswith("```"):
            args = args[3:]
            args = args[4:] if args.startswith("json") else args
            args = args.rstrip(_WS)
            args = args[:-3] if args.endswith("```") else args
    else:
        name, args = head, rest
    name, args = name.strip(), args.strip(_WS)
    if not name or any(c in name for c in "<>\n"):
        return None
    return name, args or "{}"


class DeepSeekToolParser(StepwiseToolParser):
    tags = (CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP)

    def __init__(self):
        super().__init__()
        self._state = "text"  # text | section | call

    def _step(self, content: list[str], calls: list[ToolCallDelta]) -> bool:
        buf = self._buf
        if self._state == "text":
            starts = [(at, tag) for tag in (CALLS_BEGIN, CALL_BEGIN) if (at := buf.find(tag)) >= 0]
            if not starts:
                keep = max(held_prefix(buf, CALLS_BEGIN), held_prefix(buf, CALL_BEGIN))
                content.append(self._content.text(buf[:len(buf) - keep]))
                self._buf = buf[len(buf) - keep:]
                return False
            at, tag = min(starts)
            content.append(self._content.text(buf[:at]))
            self._content.call_starts()
            self._buf = buf[at + len(tag):]
            self._state = "section" if tag == CALLS_BEGIN else "call"
            return True
        if self._state == "section":  # between calls: the next call, or the section's end
            head = buf.lstrip(_WS)
            for tag, state in ((CALL_BEGIN, "call"), (CALLS_END, "text")):
                if head.startswith(tag):
                    self._buf, self._state = head[len(tag):], state
                    return True
                if tag.startswith(head):
                    self._buf = head
                    return False
            self._state = "text"  # anything else ends the section: it is content
            self._buf = head
            return True
        at = buf.find(CALL_END)
        if at < 0:
            return False
        self._buf, self._state = buf[at + len(CALL_END):], "section"
        self._call(buf[:at], CALL_END, content, calls)
        return True

    def _call(self, body: str, end: str, content: list[str], calls: list[ToolCallDelta]) -> None:
        parsed = split_call(body)
        if parsed is None:
            content.append(self._content.text(CALL_BEGIN + body + end))
            return
        name, args = parsed
        calls.append(ToolCallDelta(self._calls, name=name))
        calls.append(ToolCallDelta(self._calls, arguments=args))
        self._calls += 1
        self._content.call_ends()

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        buf, self._buf = self._buf, ""
        content: list[str] = []
        calls: list[ToolCallDelta] = []
        if self._state == "call":  # cut off before the call's end token
            self._call(buf[:len(buf) - held_prefix(buf, CALL_END)], "", content, calls)
        elif self._state == "text":
            content.append(self._content.text(buf))
        self._state = "text"
        return "".join(content) + self._content.finish(self._calls > 0), calls
