"""An incremental scanner for one JSON tool call: ``{"name": "f", "arguments": {...}}``.

It reads characters as they arrive and records the call's name (once its string is complete)
and the raw text of the arguments value (as it grows). Streaming the raw text, rather than
re-serialising a healed partial object, is what keeps streamed arguments equal to the final
ones (vLLM #10395, #19056: bracket-completion healing corrupted them). When the model writes the
arguments as a JSON string (``"arguments": "{\\"a\\": 1}"``) the decoded string is the
arguments, available once the string closes.

The scanner never looks ahead: its state after any prefix of the text is the same however the
text was chunked, which is what lets the parsers that use it stream.
"""

from __future__ import annotations

import json

ARGUMENT_KEYS = ("arguments", "parameters")  # Hermes / Qwen say arguments, Llama 3 says parameters
_WS = " \t\r\n"


class JsonCallScanner:
    """``keys_before_name``: when given, a key outside it appearing before the name means the
    object is not a call (Llama 3 answers may be plain JSON): the scan fails right there."""

    def __init__(self, keys_before_name: frozenset[str] | None = None):
        self.keys_before_name = keys_before_name
        self.name: str | None = None
        self.keys: list[str] = []  # top-level keys, in order, as each completes
        self.args_kind: str | None = None  # "raw" (object, array, scalar) or "string", once the value starts
        self.args_raw = ""  # the arguments value's text so far
        self.args_text: str | None = None  # the arguments once complete (a string value decoded)
        self.done = False  # the object closed
        self.failed = False  # not a JSON object: the caller decides what the text was
        self._state = "start"
        self._key = ""  # the key being read, raw
        self._current = ""  # the key whose value is being read
        self._value = ""  # the value being read, raw
        self._kind = ""  # "container", "string" or "scalar"
        self._depth = 0
        self._in_string = False
        self._escape = False

    def feed(self, text: str) -> int:
        """Scan ``text``; returns how many characters belong to the object (all of them until it closes)."""
        for i, ch in enumerate(text):
            if self.done or self.failed:
                return i
            self._step(ch)
        if self._kind and self._current in ARGUMENT_KEYS and self.args_kind == "raw" and self.args_text is None:
            self.args_raw = self._value
        return len(text)

    def _step(self, ch: str) -> None:
        state = self._state
        if state == "value":
            if self._value_char(ch):
                return
            state = self._state  # a scalar ended on this character, which is read again below
        if state in ("start", "key_or_end", "colon", "value_start", "after_value") and ch in _WS:
            return
        if state == "start":
            self._expect(ch == "{", "key_or_end")
        elif state == "key_or_end":
            if ch == '"':
                self._key, self._escape, self._state = "", False, "key"
            else:
                self._expect(ch == "}", "done")
        elif state == "key":
            if self._escape:
                self._key += ch
                self._escape = False
            elif ch == "\\":
                self._key += ch
                self._escape = True
            elif ch == '"':
                self._current = _loads_string(self._key)
                self.keys.append(self._current)
                self._state = "colon"
                if self.name is None and self.keys_before_name is not None and \
                        self._current not in self.keys_before_name:
                    self.failed = True
            else:
                self._key += ch
        elif state == "colon":
            self._expect(ch == ":", "value_start")
        elif state == "value_start":
            self._value, self._depth, self._in_string, self._escape = ch, 0, False, False
            if ch in "{[":
                self._kind, self._depth = "container", 1
            elif ch == '"':
                self._kind, self._in_string = "string", True
            else:
                self._kind = "scalar"
            if self._current in ARGUMENT_KEYS and self.args_kind is None:
                self.args_kind = "string" if self._kind == "string" else "raw"
            self._state = "value"
        elif state == "after_value":
            if ch == ",":
                self._state = "key_or_end"
            else:
                self._expect(ch == "}", "done")

    def _value_char(self, ch: str) -> bool:
        """Read one character of a value; False when the character ended a scalar without belonging to it."""
        if self._kind == "scalar":
            if ch in _WS or ch in ",}]":
                self._end_value()
                return False
            self._value += ch
            return True
        self._value += ch
        if self._in_string:
            if self._escape:
                self._escape = False
            elif ch == "\\":
                self._escape = True
            elif ch == '"':
                self._in_string = False
                if self._kind == "string":
                    self._end_value()
        elif ch == '"':
            self._in_string = True
        elif ch in "{[":
            self._depth += 1
        elif ch in "}]":
            self._depth -= 1
            if self._depth == 0:
                self._end_value()
        return True

    def _end_value(self) -> None:
        key, raw = self._current, self._value
        if key == "name" and self.name is None:
            try:
                name = json.loads(raw)
            except ValueError:
                name = None
            if isinstance(name, str) and name:
                self.name = name
            else:
                self.failed = True
        elif key in ARGUMENT_KEYS and self.args_text is None:
            if self.args_kind == "string":
                try:
                    self.args_text = json.loads(raw)
                except ValueError:
                    self.args_text = raw
            else:
                self.args_raw = self.args_text = raw
        self._kind, self._value, self._state = "", "", "after_value"

    def _expect(self, ok: bool, next_state: str) -> None:
        if not ok:
            self.failed = True
        elif next_state == "done":
            self.done = True
        else:
            self._state = next_state


def _loads_string(raw: str) -> str:
    try:
        return json.loads(f'"{raw}"')
    except ValueError:
        return raw
