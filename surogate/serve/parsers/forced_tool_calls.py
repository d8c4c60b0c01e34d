"""Tool calls the request forced (OpenAI ``tool_choice: "required"`` or a named function,
Anthropic ``any`` / ``tool``): the answer is generated under a JSON-schema grammar, so it is not
the model's own tool-call syntax but plain JSON, read here (vLLM's scheme, independent of the
model's tool parser):

- a named function: the answer is the arguments object; its text streams as the arguments of
  call 0, whose name is known from the start;
- required / any: the answer is ``[{"name": ..., "parameters": {...}}, ...]`` (at least one call,
  one when parallel calls are off); the calls are emitted once the array is complete.

``ForcedTools.schema`` is the grammar's schema; the tools' own parameter schemas constrain the
arguments.
"""

from __future__ import annotations

import json

import msgspec

from surogate.serve.parsers.base import ToolCallDelta


class OfferedTools(msgspec.Struct, frozen=True):
    """Tools a request offered (not forced): their parameter schemas, for the parsers whose
    format leaves the arguments' JSON types to the schema (Qwen3-Coder's XML)."""

    tools: dict[str, dict]  # name -> its parameters' JSON schema

    def __bool__(self) -> bool:  # offered tools: parse calls
        return True


class ForcedTools(msgspec.Struct, frozen=True):
    tools: dict[str, dict]  # name -> its parameters' JSON schema ({} = any object)
    name: str | None = None  # a named function; None = any of them ("required")
    parallel: bool = True  # required: several calls allowed

    def __bool__(self) -> bool:  # a request with forced tools offered tools
        return True

    @property
    def schema(self) -> dict:
        def params(s: dict) -> dict:
            return s or {"type": "object"}

        if self.name is not None:
            return params(self.tools[self.name])
        call = {"anyOf": [{"type": "object", "properties": {"name": {"const": n}, "parameters": params(s)},
                           "required": ["name", "parameters"], "additionalProperties": False}
                          for n, s in self.tools.items()]}
        return {"type": "array", "items": call, "minItems": 1, **({} if self.parallel else {"maxItems": 1})}


class ForcedToolParser:
    def __init__(self, forced: ForcedTools):
        self.forced = forced
        self._text = ""
        self._started = False
        self._calls = 0

    @property
    def num_calls(self) -> int:
        return self._calls

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        if self.forced.name is None:
            self._text += text
            return "", []
        if not self._started:
            text = text.lstrip()
            if not text:
                return "", []
            self._started, self._calls = True, 1
            # a call's first delta holds its name only (the convention every parser and encoder follows)
            return "", [ToolCallDelta(0, name=self.forced.name), ToolCallDelta(0, arguments=text)]
        return "", [ToolCallDelta(0, arguments=text)] if text else []

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        if self.forced.name is not None:
            if not self._started:  # cut off before any argument: still the call the client forced
                self._calls = 1
                return "", [ToolCallDelta(0, name=self.forced.name, arguments="")]
            return "", []
        try:
            calls = json.loads(self._text)
        except ValueError:  # cut off (max_tokens) inside the array: what is there is content
            return self._text, []
        out = []
        for i, c in enumerate(calls):
            out += [ToolCallDelta(i, name=c["name"]),
                    ToolCallDelta(i, arguments=json.dumps(c.get("parameters", {}), ensure_ascii=False))]
        self._calls = len(calls)
        return "", out
