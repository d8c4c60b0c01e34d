"""Qwen3-Coder's XML tool calls (vLLM ``qwen3_coder``; Qwen3-Coder, Qwen3-Next and Qwen3.5 templates)::

    I'll look it up.
    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

A parameter's value is raw text (one newline after the opening tag and one before the closing tag
belong to the layout, not to the value); the template writes strings as they are, numbers and
booleans with ``str()`` and objects / arrays as JSON. So the value's JSON type comes from the
tool's schema, as vLLM reads it: ``string`` stays text, ``integer`` / ``number`` / ``boolean``
are parsed, ``object`` / ``array`` are parsed as JSON (or a Python literal), ``null`` is null where the schema allows it; a
parameter the schema does not type stays text. Without schemas every value is text.

A call streams its name once ``<function=NAME>`` is complete, then one argument fragment per
parameter as each closes, so the fragments join into a JSON object. A ``<tool_call>`` wrapper is
optional (models drop it), a missing ``</parameter>`` ends at the next parameter or at
``</function>``, and a call cut off by the end of the answer keeps the parameters that closed
(plus the last one, as far as it got). ``<tool_call>`` followed by anything but ``<function=`` is
not this format's call: it is content, as written. Text around calls is content; whitespace next
to a call is dropped.
"""

from __future__ import annotations

import ast
import json

from surogate.serve.parsers.base import ToolCallDelta, held_prefix
from surogate.serve.parsers.tool_calls import StepwiseToolParser

WRAP_OPEN, WRAP_CLOSE = "<tool_call>", "</tool_call>"
FN_OPEN, FN_CLOSE = "<function=", "</function>"
PARAM_OPEN, PARAM_CLOSE = "<parameter=", "</parameter>"
_WS = " \t\r\n"


def _json_type(schema: dict | None, param: str) -> str | None:
    if not isinstance(schema, dict):
        return None
    props = schema.get("properties")
    spec = props.get(param) if isinstance(props, dict) else None
    if not isinstance(spec, dict):
        return None
    kind = spec.get("type")
    if isinstance(kind, list):  # ["integer", "null"]: the first that is not null
        kind = next((k for k in kind if k != "null"), None)
    if kind is None and "enum" in spec:
        return "string" if all(isinstance(v, str) for v in spec["enum"]) else None
    return kind.lower() if isinstance(kind, str) else ("any" if spec else None)


_TEXT = ("string", "str", "text", "varchar", "char", "enum")


def _nullable(schema: dict, param: str) -> bool:
    kind = schema["properties"][param].get("type")
    return kind == "null" or (isinstance(kind, list) and "null" in kind)


def convert_value(text: str, schema: dict | None, param: str):
    """A parameter's raw text as the JSON value its schema types it as (see the module notes)."""
    kind = _json_type(schema, param)
    if text.strip().lower() == "null" and kind is not None and (_nullable(schema, param) or kind not in _TEXT):
        return None
    if kind is None or kind in _TEXT:
        return text
    value = text.strip()
    try:
        if kind.startswith(("int", "uint", "long", "short", "unsigned")):
            return int(value)
        if kind.startswith(("num", "float", "double", "decimal")):
            number = float(value)
            return int(value) if number.is_integer() and value.lstrip("+-").isdigit() else number
        if kind in ("boolean", "bool", "binary"):
            if value.lower() in ("true", "false"):
                return value.lower() == "true"
            return text
    except ValueError:
        return text  # not what the schema says: keep what the model wrote
    try:  # object, array, or a type we do not name: JSON, then a Python literal (True, None, '...')
        return json.loads(value)
    except ValueError:
        try:
            return ast.literal_eval(value)
        except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
            return text


class Qwen3CoderToolParser(StepwiseToolParser):
    uses_schemas = True  # the registry passes the request's tool schemas
    tags = (WRAP_OPEN, WRAP_CLOSE)

    def __init__(self, schemas: dict[str, dict] | None = None):
        super().__init__()
        self.schemas = schemas or {}
        self._state = "text"  # text | wrapped | name | body | param | after
        self._held = ""  # the call's text so far, given back if it turns out not to be a call
        self._wrapped = False
        self._name: str | None = None
        self._param: str | None = None
        self._params = 0

    def _step(self, content: list[str], calls: list[ToolCallDelta]) -> bool:
        return getattr(self, f"_on_{self._state}")(content, calls)

    # -- outside a call --

    def _on_text(self, content, calls) -> bool:
        buf = self._buf
        starts = [(at, tag) for tag in (WRAP_OPEN, FN_OPEN) if (at := buf.find(tag)) >= 0]
        if not starts:
            keep = max(held_prefix(buf, WRAP_OPEN), held_prefix(buf, FN_OPEN))
            content.append(self._content.text(buf[:len(buf) - keep]))
            self._buf = buf[len(buf) - keep:]
            return False
        at, tag = min(starts)
        content.append(self._content.text(buf[:at]))
        self._buf = buf[at + len(tag):]
        self._held = tag
        self._wrapped = tag == WRAP_OPEN
        self._state = "wrapped" if self._wrapped else "name"
        return True

    def _on_wrapped(self, content, calls) -> bool:
        """After ``<tool_call>``: whitespace, then ``<function=`` or it was not a call."""
        head = self._buf.lstrip(_WS)
        if not head or (len(head) < len(FN_OPEN) and FN_OPEN.startswith(head)):
            return False
        if not head.startswith(FN_OPEN):
            content.append(self._content.text(self._held))  # not ours: the tag is content
            self._state = "text"
            return True
        self._held += self._buf[:len(self._buf) - len(head) + len(FN_OPEN)]
        self._buf = head[len(FN_OPEN):]
        self._state = "name"
        return True

    def _on_name(self, content, calls) -> bool:
        at = self._buf.find(">")
        if at < 0:
            if "\n" in self._buf or "<" in self._buf:  # a name never spans lines or tags
                return self._not_a_call(content)
            return False
        name = self._buf[:at].strip()
        if not name or any(c in name for c in "<\n"):
            return self._not_a_call(content)
        self._buf = self._buf[at + 1:]
        self._name, self._params = name, 0
        self._content.call_starts()
        calls.append(ToolCallDelta(self._calls, name=name))
        self._state = "body"
        return True

    def _not_a_call(self, content) -> bool:
        content.append(self._content.text(self._held))
        self._state = "text"
        return True

    # -- inside a function --

    def _on_body(self, content, calls) -> bool:
        head = self._buf.lstrip(_WS)
        self._buf = head
        if not head:
            return False
        if head.startswith(PARAM_OPEN):
            at = head.find(">", len(PARAM_OPEN))
            if at < 0:
                return False
            self._param = head[len(PARAM_OPEN):at].strip()
            self._buf = head[at + 1:]
            self._state = "param"
            return True
        if head.startswith(FN_CLOSE):
            self._buf = head[len(FN_CLOSE):]
            self._close_call(calls)
            self._state = "after" if self._wrapped else "text"
            return True
        if any(tag.startswith(head) for tag in (PARAM_OPEN, FN_CLOSE)):
            return False
        # stray text between parameters: skip to the next tag
        nxt = [at for tag in (PARAM_OPEN, FN_CLOSE) if (at := head.find(tag)) >= 0]
        if not nxt:
            self._buf = head[len(head) - max(held_prefix(head, PARAM_OPEN), held_prefix(head, FN_CLOSE)):]
            return False
        self._buf = head[min(nxt):]
        return True

    def _on_param(self, content, calls) -> bool:
        buf = self._buf
        ends = [(at, tag) for tag in (PARAM_CLOSE, PARAM_OPEN, FN_CLOSE) if (at := buf.find(tag)) >= 0]
        if not ends:
            return False
        at, tag = min(ends)
        self._emit_param(buf[:at], calls)
        self._buf = buf[at + len(PARAM_CLOSE):] if tag == PARAM_CLOSE else buf[at:]
        self._state = "body"
        return True

    def _on_after(self, content, calls) -> bool:
        """After ``</function>`` of a wrapped call: its ``</tool_call>``, if it comes."""
        head = self._buf.lstrip(_WS)
        if not head or (len(head) < len(WRAP_CLOSE) and WRAP_CLOSE.startswith(head)):
            return False
        if head.startswith(WRAP_CLOSE):
            head = head[len(WRAP_CLOSE):]
        self._buf = head
        self._state = "text"
        return True

    def _emit_param(self, raw: str, calls: list[ToolCallDelta]) -> None:
        if raw.startswith("\n"):
            raw = raw[1:]
        if raw.endswith("\n"):
            raw = raw[:-1]
        value = convert_value(raw, self.schemas.get(self._name), self._param)
        piece = json.dumps(self._param, ensure_ascii=False) + ": " + json.dumps(value, ensure_ascii=False)
        calls.append(ToolCallDelta(self._calls, arguments=("{" if self._params == 0 else ", ") + piece))
        self._params += 1
        self._param = None

    def _close_call(self, calls: list[ToolCallDelta]) -> None:
        calls.append(ToolCallDelta(self._calls, arguments="}" if self._params else "{}"))
        self._calls += 1
        self._name = None
        self._content.call_ends()

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        content: list[str] = []
        calls: list[ToolCallDelta] = []
        buf, self._buf = self._buf, ""
        if self._state == "text":
            content.append(self._content.text(buf))
        elif self._state in ("wrapped", "name"):  # never named: not a call
            content.append(self._content.text(self._held + buf))
        elif self._state in ("body", "param"):  # cut off inside the call: close what it has
            if self._state == "param":  # a closing tag begun at the very end is not the value
                keep = max(held_prefix(buf, tag) for tag in (PARAM_CLOSE, PARAM_OPEN, FN_CLOSE))
                self._emit_param(buf[:len(buf) - keep], calls)
            self._close_call(calls)
        self._state = "text"
        return "".join(content) + self._content.finish(self._calls > 0), calls
