"""LFM2's pythonic tool calls (vLLM ``lfm2`` / ``pythonic``): a Python list of calls with keyword
arguments between LFM2's call tokens::

    <|tool_call_start|>[get_weather(city="Paris"), get_time(tz="CET")]<|tool_call_end|>

Each call's arguments are Python literals (strings, numbers, True / False / None, lists, dicts,
tuples), given as JSON (``{"city": "Paris"}``). A call section streams as a whole: its calls are
emitted (name, then the arguments' JSON) when ``<|tool_call_end|>`` arrives, or at the end of the
answer for a section cut off there when what came is already a complete list, since a Python
expression cannot be known complete before it ends. A section that is not such a list (another
expression, positional arguments, a value that is not a literal) is content, as written, the
tokens included. Text around the sections is content; whitespace next to a call is dropped.
The call tokens are special: the output pipeline keeps a parser's ``tags`` in the decoded text
while skipping the other special tokens (frontend.py).
"""

from __future__ import annotations

import ast
import json

from surogate.serve.parsers.base import ToolCallDelta, held_prefix
from surogate.serve.parsers.tool_calls import StepwiseToolParser


def parse_pythonic_calls(text: str) -> list[tuple[str, str]] | None:
    """[(name, arguments JSON)] of ``[f(a=1), g()]``, or None when ``text`` is not such a list."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError):
        return None
    if isinstance(tree, ast.Call):  # a single call without the list brackets
        tree = ast.List(elts=[tree])
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    out = []
    for call in tree.elts:
        if not isinstance(call, ast.Call) or call.args or not isinstance(call.func, (ast.Name, ast.Attribute)):
            return None
        name = ast.unparse(call.func)
        args = {}
        for kw in call.keywords:
            if kw.arg is None:  # **kwargs
                return None
            try:
                args[kw.arg] = ast.literal_eval(kw.value)
            except (ValueError, SyntaxError, TypeError, RecursionError):
                return None
        try:
            out.append((name, json.dumps(args, ensure_ascii=False)))
        except (TypeError, ValueError):  # a set, bytes or complex: no JSON for it
            return None
    return out


class Lfm2ToolParser(StepwiseToolParser):
    start_tag = "<|tool_call_start|>"
    end_tag = "<|tool_call_end|>"
    tags = (start_tag, end_tag)

    def __init__(self):
        super().__init__()
        self._in_call = False

    def _step(self, content: list[str], calls: list[ToolCallDelta]) -> bool:
        """One move; False when it must wait for more text."""
        buf = self._buf
        if not self._in_call:
            at = buf.find(self.start_tag)
            if at < 0:
                keep = held_prefix(buf, self.start_tag)
                content.append(self._content.text(buf[:len(buf) - keep]))
                self._buf = buf[len(buf) - keep:]
                return False
            content.append(self._content.text(buf[:at]))
            self._buf, self._in_call = buf[at + len(self.start_tag):], True
            return True
        at = buf.find(self.end_tag)
        if at < 0:
            return False
        self._buf, self._in_call = buf[at + len(self.end_tag):], False
        self._section(buf[:at], self.end_tag, content, calls)
        return True

    def _section(self, body: str, end: str, content: list[str], calls: list[ToolCallDelta]) -> None:
        parsed = parse_pythonic_calls(body)
        if parsed is None:  # not calls: the section is content as written
            content.append(self._content.text(self.start_tag + body + end))
            return
        self._content.call_starts()  # the whitespace held before the tag goes with the call
        for name, args in parsed:
            calls.append(ToolCallDelta(self._calls, name=name, arguments=args))
            self._calls += 1
        self._content.call_ends()

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        buf, self._buf = self._buf, ""
        content: list[str] = []
        calls: list[ToolCallDelta] = []
        if self._in_call:  # cut off before <|tool_call_end|> (max_tokens, a stop string)
            self._in_call = False
            self._section(buf, "", content, calls)
        else:
            content.append(self._content.text(buf))
        return "".join(content) + self._content.finish(self._calls > 0), calls
