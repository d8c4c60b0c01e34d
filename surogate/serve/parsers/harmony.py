"""OpenAI's harmony format (GPT-OSS; vLLM ``openai_gptoss``): the answer is a stream of messages,
each a header then ``<|message|>`` then a body ending at ``<|end|>`` (more follows), ``<|call|>``
(a tool call: generation stops) or ``<|return|>`` (the final answer: generation stops). The
generation prompt ends with ``<|start|>assistant``, so the first header has no ``<|start|>``::

    <|channel|>analysis<|message|>The user asks for the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>

    <|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>42<|return|>

A header names the channel (``<|channel|>analysis`` / ``commentary`` / ``final``) and maybe a
recipient (``to=functions.NAME``, before or after the channel). ``HarmonyReasoningParser`` turns
analysis bodies into reasoning, bodies without a recipient into content, and passes a message
with a recipient on to the tool parser in one canonical form,
``<|channel|>commentary to=functions.NAME<|message|>ARGS<|call|>``, which
``HarmonyToolParser`` turns into a call (the name, then the arguments as they stream). Both are
incremental: text that may be the start of a special token is held back. The special tokens are
the parsers' ``tags``: the output pipeline keeps them in the decoded text while skipping the other
special tokens (frontend.py).
"""

from __future__ import annotations

import re

from surogate.serve.parsers.base import ToolCallDelta, held_prefix
from surogate.serve.parsers.tool_calls import StepwiseToolParser

MESSAGE, START, CHANNEL = "<|message|>", "<|start|>", "<|channel|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
CALL_HEAD = CHANNEL + "commentary to="  # the canonical form the tool parser reads
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([A-Za-z_]+)")
_SPECIAL = re.compile(r"<\|[a-z_]+\|>")


def _held(text: str, tags: tuple[str, ...]) -> int:
    return max(held_prefix(text, t) for t in tags)


def _first(text: str, tags: tuple[str, ...]) -> tuple[int, str]:
    """(position, tag) of the earliest of tags in text, (-1, "") when none is."""
    best = (-1, "")
    for t in tags:
        at = text.find(t)
        if at >= 0 and (best[0] < 0 or at < best[0]):
            best = (at, t)
    return best


class HarmonyReasoningParser:
    tags = (START, CHANNEL, MESSAGE, "<|constrain|>", *ENDS)  # kept in the decoded text (frontend.py)

    def __init__(self):
        self._buf = ""
        self._state = "header"  # header: reading up to <|message|>; body: a message's text
        self._kind = "content"  # the body's: reasoning, content or call
        self._content_started = False

    @classmethod
    def for_prompt(cls, prompt_text: str | None = None) -> HarmonyReasoningParser:
        return cls()

    @property
    def in_reasoning(self) -> bool:
        return self._state == "body" and self._kind == "reasoning"

    def feed(self, text: str) -> tuple[str, str]:
        self._buf += text
        reasoning, content = [], []
        while self._buf:
            if self._state == "header":
                at = self._buf.find(MESSAGE)
                if at < 0:
                    break  # a header is never emitted: wait for its <|message|>
                self._open(self._buf[:at], content)
                self._buf = self._buf[at + len(MESSAGE):]
                continue
            at, tag = _first(self._buf, ENDS + (START,))
            if at < 0:
                keep = _held(self._buf, ENDS + (START,))
                self._emit(self._buf[:len(self._buf) - keep], reasoning, content)
                self._buf = self._buf[len(self._buf) - keep:]
                break
            self._emit(self._buf[:at], reasoning, content)
            if self._kind == "call":
                content.append("<|call|>")
            self._buf = self._buf[at + (0 if tag == START else len(tag)):]
            self._state = "header"
        return "".join(reasoning), "".join(content)

    def finish(self) -> tuple[str, str]:
        buf, self._buf = self._buf, ""
        reasoning, content = [], []
        if self._state == "body":
            self._emit(buf, reasoning, content)  # cut off inside a message (max_tokens)
        else:  # no <|message|>: not a header after all; its words are content
            content.append(_SPECIAL.sub("", buf.removeprefix(START).removeprefix("assistant")))
        return "".join(reasoning), "".join(content)

    def _open(self, header: str, content: list[str]) -> None:
        recipient = _RECIPIENT.search(header)
        channel = _CHANNEL.search(header)
        self._state = "body"
        if recipient is not None:
            self._kind = "call"
            content.append(f"{CALL_HEAD}{recipient.group(1)}{MESSAGE}")
        elif channel is not None and channel.group(1) == "analysis":
            self._kind = "reasoning"
        else:
            self._kind = "content"

    def _emit(self, piece: str, reasoning: list[str], content: list[str]) -> None:
        if not piece:
            return
        if self._kind == "reasoning":
            reasoning.append(piece)
        else:
            content.append(piece)


class HarmonyToolParser(StepwiseToolParser):
    """Calls in the canonical form HarmonyReasoningParser writes; ``functions.`` is dropped from the
    name (the template adds it). Other recipients (``browser.search``, ``python``: built-in tools)
    are calls by their full name."""

    tags = (CHANNEL, "<|call|>")

    def __init__(self):
        super().__init__()
        self._in_call = False
        self._named = False

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        content, calls = super().feed(text)
        return content, _merge(calls)

    def _step(self, content: list[str], calls: list[ToolCallDelta]) -> bool:
        buf = self._buf
        if not self._in_call:
            at = buf.find(CALL_HEAD)
            if at < 0:
                keep = held_prefix(buf, CALL_HEAD)
                content.append(buf[:len(buf) - keep])
                self._buf = buf[len(buf) - keep:]
                return False
            content.append(buf[:at])
            self._buf, self._in_call, self._named = buf[at + len(CALL_HEAD):], True, False
            return True
        if not self._named:
            at = buf.find(MESSAGE)
            if at < 0:
                return False
            calls.append(ToolCallDelta(self._calls, name=buf[:at].strip().removeprefix("functions.")))
            self._buf, self._named = buf[at + len(MESSAGE):], True
            return True
        at = buf.find("<|call|>")
        if at < 0:
            keep = held_prefix(buf, "<|call|>")
            if len(buf) > keep:
                calls.append(ToolCallDelta(self._calls, arguments=buf[:len(buf) - keep]))
            self._buf = buf[len(buf) - keep:]
            return False
        if at:
            calls.append(ToolCallDelta(self._calls, arguments=buf[:at]))
        self._buf, self._in_call = buf[at + len("<|call|>"):], False
        self._calls += 1
        return True

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        buf, self._buf = self._buf, ""
        if not self._in_call:
            return buf, []
        self._in_call = False
        if not self._named:  # cut off inside the name: not a call
            return CALL_HEAD + buf, []
        self._calls += 1
        return "", [ToolCallDelta(self._calls - 1, arguments=buf)] if buf else []


def _merge(calls: list[ToolCallDelta]) -> list[ToolCallDelta]:
    """Adjacent argument fragments of one call as one delta."""
    out: list[ToolCallDelta] = []
    for c in calls:
        if out and c.name is None and out[-1].index == c.index and (out[-1].name is None or not out[-1].arguments):
            prev = out.pop()
            c = ToolCallDelta(c.index, name=prev.name, arguments=prev.arguments + c.arguments)
        out.append(c)
    return out
