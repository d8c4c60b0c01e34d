"""What the output parsers emit, and the composition that runs them on generated text.

A model's answer arrives as text deltas. The reasoning parser splits them into reasoning and
content; the tool-call parser then finds calls in the content only (never in the reasoning,
as vLLM's docs require). Every parser is an incremental state machine: feeding the text in any
chunking, then calling ``finish()``, gives the same result as feeding it whole. Text that could
still be the start of a tag is held back, never emitted and retracted.

Tool-call deltas carry the call's position in the message (``index``: 0, 1, ...), the name once
(on the call's first delta) and argument fragments whose concatenation is the arguments' JSON.
Ids are the API layer's business (``call_...``, ``toolu_...``, ``fc_...``).
"""

from __future__ import annotations

from typing import Protocol

import msgspec


class ToolCallDelta(msgspec.Struct, frozen=True):
    index: int
    name: str | None = None  # set on the call's first delta only
    arguments: str = ""


class ParsedDelta(msgspec.Struct):
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallDelta] = msgspec.field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.tool_calls)

    def extend(self, other: ParsedDelta) -> None:
        self.content += other.content
        self.reasoning += other.reasoning
        self.tool_calls.extend(other.tool_calls)


class ReasoningParser(Protocol):
    @property
    def in_reasoning(self) -> bool: ...

    def feed(self, text: str) -> tuple[str, str]:
        """(reasoning, content) that can be emitted now."""

    def finish(self) -> tuple[str, str]:
        """What was held back, once the text has ended."""


class ToolParser(Protocol):
    @property
    def num_calls(self) -> int: ...

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        """(content, tool-call deltas) that can be emitted now."""

    def finish(self) -> tuple[str, list[ToolCallDelta]]: ...


class OutputParser:
    """Reasoning first, then tool calls on the content. Either may be absent. ``max_tool_calls``
    drops calls past the limit (``parallel_tool_calls: false`` means one)."""

    def __init__(self, reasoning: ReasoningParser | None = None, tools: ToolParser | None = None,
                 max_tool_calls: int | None = None):
        self.reasoning = reasoning
        self.tools = tools
        self.max_tool_calls = max_tool_calls

    @property
    def in_reasoning(self) -> bool:
        return self.reasoning is not None and self.reasoning.in_reasoning

    @property
    def tags(self) -> tuple[str, ...]:
        """The tags the parsers read: special tokens among them stay in the decoded text."""
        return (*getattr(self.reasoning, "tags", ()), *getattr(self.tools, "tags", ()))

    @property
    def num_tool_calls(self) -> int:
        if self.tools is None:
            return 0
        n = self.tools.num_calls
        return n if self.max_tool_calls is None else min(n, self.max_tool_calls)

    def feed(self, text: str) -> ParsedDelta:
        return self._step(text, final=False)

    def finish(self) -> ParsedDelta:
        return self._step("", final=True)

    def _step(self, text: str, final: bool) -> ParsedDelta:
        out = ParsedDelta()
        if self.reasoning is not None:
            out.reasoning, content = self.reasoning.finish() if final else self.reasoning.feed(text)
        else:
            content = text
        if self.tools is None:
            out.content = content
            return out
        out.content, calls = self.tools.feed(content) if content else ("", [])
        if final:
            more, last = self.tools.finish()
            out.content += more
            calls = [*calls, *last]
        if self.max_tool_calls is not None:
            calls = [c for c in calls if c.index < self.max_tool_calls]
        out.tool_calls = calls
        return out


def held_prefix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``: the part that
    must wait for more text before we know whether the tag begins there."""
    for k in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0
