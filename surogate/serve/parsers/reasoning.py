"""The ``<think>`` ... ``</think>`` reasoning parser (Qwen3, QwQ, DeepSeek-R1, GLM-4.5, MiniMax).

Where generation starts matters (serving-protocols.md, takeaway 4). Three cases:

- the prompt opened the block (Qwen3-Thinking-2507 and DeepSeek-R1-0528 templates end the
  generation prompt with ``<think>\\n``): the model's first words are reasoning, it only emits
  ``</think>``;
- the prompt closed it (Qwen3 with ``enable_thinking: false`` ends with ``<think>\\n\\n</think>``):
  everything is content, and a parser that assumed reasoning would put the whole answer in the
  wrong field (vLLM #17349, #53284);
- neither: the model may open the block itself, so a ``<think>`` at the very start (after
  whitespace) switches to reasoning; anything else is content. ``force_reasoning`` makes this case
  start in reasoning (DeepSeek-R1 style models that may omit the opening tag).

``initial_state(prompt_text)`` picks the case from the rendered prompt. Whitespace around the
block is dropped: reasoning is stripped, content after ``</think>`` loses its leading newlines,
matching what the templates put back when the conversation is rendered again.
"""

from __future__ import annotations

from typing import Literal

from surogate.serve.parsers.base import held_prefix

State = Literal["detect", "reasoning", "content"]


class ThinkReasoningParser:
    def __init__(self, state: State = "detect", *, start_tag: str = "<think>", end_tag: str = "</think>"):
        assert state in ("detect", "reasoning", "content")
        self.start_tag = start_tag
        self.end_tag = end_tag
        self._state: State = state
        self._buf = ""  # text not yet emitted: a possible tag start, or undecided leading text
        self._strip = True  # drop leading whitespace of the section being emitted
        self._ws = ""  # trailing whitespace of the reasoning, emitted only if more reasoning follows

    @property
    def tags(self) -> tuple[str, ...]:
        return self.start_tag, self.end_tag

    @classmethod
    def for_prompt(cls, prompt_text: str | None, *, force_reasoning: bool = False,
                   start_tag: str = "<think>", end_tag: str = "</think>") -> ThinkReasoningParser:
        return cls(initial_state(prompt_text, force_reasoning=force_reasoning, start_tag=start_tag, end_tag=end_tag),
                   start_tag=start_tag, end_tag=end_tag)

    @property
    def in_reasoning(self) -> bool:
        return self._state == "reasoning"

    @property
    def state(self) -> State:
        return self._state

    def feed(self, text: str) -> tuple[str, str]:
        self._buf += text
        reasoning, content = [], []
        while self._buf:
            if self._state == "detect":
                head = self._buf.lstrip()
                if head.startswith(self.start_tag):
                    self._buf = head[len(self.start_tag):]
                    self._state, self._strip = "reasoning", True
                elif self.start_tag.startswith(head):
                    break  # only whitespace or the start of "<think>" so far: wait
                else:
                    self._state, self._strip = "content", False
            elif self._state == "reasoning":
                end = self._buf.find(self.end_tag)
                if end >= 0:
                    reasoning.append(self._reasoning(self._buf[:end]))
                    self._buf = self._buf[end + len(self.end_tag):]
                    self._ws = ""
                    self._state, self._strip = "content", True
                else:
                    keep = held_prefix(self._buf, self.end_tag)
                    reasoning.append(self._reasoning(self._buf[:len(self._buf) - keep]))
                    self._buf = self._buf[len(self._buf) - keep:]
                    break
            else:
                piece, self._buf = self._buf, ""
                if self._strip:
                    piece = piece.lstrip()
                    self._strip = not piece
                content.append(piece)
        return "".join(reasoning), "".join(content)

    def finish(self) -> tuple[str, str]:
        buf, self._buf = self._buf, ""
        if self._state == "reasoning":
            # Cut off inside the block (max_tokens): what was held back is reasoning, not a tag.
            out = self._reasoning(buf)
            self._ws = ""
            return out, ""
        if self._state == "detect":
            self._state = "content"
        return "", buf

    def _reasoning(self, piece: str) -> str:
        if self._strip:
            piece = piece.lstrip()
            if not piece:
                return ""
            self._strip = False
        text = self._ws + piece
        body = text.rstrip()
        self._ws = text[len(body):]
        return body


def initial_state(prompt_text: str | None, *, force_reasoning: bool = False,
                  start_tag: str = "<think>", end_tag: str = "</think>") -> State:
    """Where the model starts, from the rendered prompt: inside a block the prompt opened, after
    one it closed, or undecided."""
    if prompt_text:
        opened, closed = prompt_text.rfind(start_tag), prompt_text.rfind(end_tag)
        tail = prompt_text[max(opened, closed):]
        # Only the end of the prompt counts: earlier turns' closed blocks say nothing about this one.
        if opened > closed and not tail[len(start_tag):].strip(" \n"):
            return "reasoning"
        if closed > opened and not tail[len(end_tag):].strip(" \n"):
            return "content"
    return "reasoning" if force_reasoning else "detect"
