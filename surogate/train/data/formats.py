"""Rows of every dataset type -> one of two samples: a ``Conversation`` (OpenAI-style messages,
plus tools) or a ``Document`` (raw text).

- messages: a list of {role, content} (roles system / user / assistant / tool; assistant
  ``tool_calls``; ``reasoning_content``), or ShareGPT's {from, value} (human -> user,
  gpt -> assistant, ...). A JSON string holding the list is decoded, as are tools and
  tool-call arguments stored as JSON strings (CSV and many hub datasets do that).
- instruction (alpaca): user = instruction, then a blank line and input when there is one;
  assistant = output; system from the row's system field or the fixed system_prompt.
- text: a ``Document``. In sft too: a text row is trained on as raw text (every token, no chat
  template), the way TRL and axolotl treat plain-text rows, so chat and text data can be mixed.
- auto decides per row: a messages field, else instruction + output, else text.
- images (TRL's / HF's vision chat rows): ``{"type": "image"}`` content parts, each taking the
  next entry of the row's ``images`` list (a path, a data: URL, or HF datasets' {"bytes", "path"}
  record), or naming its own (``"image"``, ``"url"`` or ``"path"``; OpenAI's ``{"type":
  "image_url", "image_url": {"url": ...}}``). A row with ``images`` and no image parts gets them at
  the start of its first user message, as TRL's ``prepare_multimodal_messages`` places them. The
  content of a message with images stays a list of text and image parts (the template renders
  them); ``Conversation.images`` holds the sources in the order of their parts.

A row that does not fit raises ``RowError``; the caller adds the file, the line and the key path.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from surogate.config.sft import DatasetConfig

ROLES = ("system", "user", "assistant", "tool")
_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "model": "assistant",
                   "bot": "assistant", "system": "system", "tool": "tool", "function": "tool",
                   "observation": "tool", "function_response": "tool", "ipython": "tool"}
_MESSAGES_FIELDS = ("messages", "conversations", "conversation")


class Conversation(NamedTuple):
    messages: list[dict]
    tools: list[dict] | None = None
    images: tuple = ()  # one source per image part, in order (str or {"bytes", "path"}); see the header
    image_fields: tuple = ()  # where each came from, for errors: "images[1]", "messages[0].content[2].image"
    image_crops: tuple = ()  # the pan-and-scan crops of each (set when the dataset is built; () = none)


class Document(NamedTuple):
    text: str


Sample = Conversation | Document


class RowError(Exception):
    """A row that does not match its dataset type; ``hint`` says which config key may fix it."""

    def __init__(self, problem: str, hint: str | None = None, key: str | None = None):
        super().__init__(problem)
        self.problem = problem
        self.hint = hint
        self.key = key  # the dataset key (messages_field, ...) that names the field, if one does


def normalize(record: dict, dataset: DatasetConfig) -> Sample:
    kind = dataset.type if dataset.type != "auto" else detect_type(record, dataset)
    if kind == "messages":
        return _messages(record, dataset)
    if kind == "instruction":
        return _instruction(record, dataset)
    return Document(_string(record, dataset.text_field, "text_field"))


def detect_type(record: dict, dataset: DatasetConfig) -> str:
    if _messages_field(record, dataset) is not None:
        return "messages"
    if dataset.instruction_field in record and dataset.output_field in record:
        return "instruction"
    if dataset.text_field in record:
        return "text"
    raise RowError(f"cannot tell the row's format from its fields ({_fields(record)})",
                   hint="auto looks for messages/conversations, instruction + output, or text; "
                        "set type: and the *_field keys of this dataset")


def _messages_field(record: dict, dataset: DatasetConfig) -> str | None:
    if dataset.messages_field is not None:
        return dataset.messages_field if dataset.messages_field in record else None
    return next((f for f in _MESSAGES_FIELDS if f in record), None)


def _messages(record: dict, dataset: DatasetConfig) -> Conversation:
    field = _messages_field(record, dataset)
    if field is None:
        wanted = dataset.messages_field or " or ".join(_MESSAGES_FIELDS)
        raise RowError(f"no {wanted} field (fields: {_fields(record)})", key="messages_field")
    raw = _json_value(record[field], field)
    if not isinstance(raw, list) or not raw:
        raise RowError(f"field {field!r} must be a non-empty list of messages, got {_kind(raw)}")
    inline: list = []  # each image part's own source, or None: the next of the row's images
    messages = [_message(m, f"{field}[{i}]", inline) for i, m in enumerate(raw)]
    images, fields = _images(record, messages, inline, field)
    system = _system(record, dataset)
    if system is not None and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system})
    tools = None
    if dataset.tools_field in record and record[dataset.tools_field] not in (None, "", []):
        tools = _json_value(record[dataset.tools_field], dataset.tools_field)
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise RowError(f"field {dataset.tools_field!r} must be a list of tool schemas (objects), "
                           f"got {_kind(tools)}")
    return Conversation(messages, tools, images, fields)


IMAGES_FIELD = "images"  # TRL's column of a row's images


def _images(record: dict, messages: list[dict], inline: list, field: str) -> tuple[tuple, tuple]:
    """The row's image sources in the order of its image parts (module header), and their fields."""
    row = record.get(IMAGES_FIELD)
    if row is None:
        row = []
    elif not isinstance(row, (list, tuple)):
        row = [row]
    row = list(row)
    if row and not inline:  # TRL: the images go first in the first user message
        user = next((m for m in messages if m["role"] == "user"), None)
        if user is None:
            raise RowError(f"field {IMAGES_FIELD!r} holds {len(row)} image(s) but {field!r} has no user message "
                           "to put them in")
        text = user["content"]
        user["content"] = [{"type": "image"} for _ in row] + ([{"type": "text", "text": text}] if text else [])
        return tuple(row), tuple(f"{IMAGES_FIELD}[{k}]" for k in range(len(row)))
    wanted = sum(1 for s, _ in inline if s is None)
    if wanted != len(row):
        raise RowError(f"{field!r} holds {wanted} image part(s) without an image of their own, and field "
                       f"{IMAGES_FIELD!r} holds {len(row)} image(s)",
                       hint=f"give one {IMAGES_FIELD} entry per {{\"type\": \"image\"}} part, in order")
    sources, fields, k = [], [], 0
    for s, where in inline:
        if s is None:
            s, where, k = row[k], f"{IMAGES_FIELD}[{k}]", k + 1
        sources.append(s)
        fields.append(where)
    return tuple(sources), tuple(fields)


def _message(m: Any, where: str, inline: list | None = None) -> dict:
    """``inline``: where image parts' sources go (None: image parts are an error, text only)."""
    if not isinstance(m, dict):
        raise RowError(f"{where}: a message must be an object, got {_kind(m)}")
    if "role" not in m and "from" in m:  # ShareGPT
        role = _SHAREGPT_ROLES.get(str(m["from"]).lower())
        if role is None:
            raise RowError(f"{where}: unknown ShareGPT speaker {m['from']!r}",
                           hint=f"known: {', '.join(_SHAREGPT_ROLES)}")
        m = {"role": role, "content": m.get("value"), **{k: v for k, v in m.items() if k not in ("from", "value")}}
    role = m.get("role")
    if role not in ROLES:
        raise RowError(f"{where}: role must be one of {', '.join(ROLES)}, got {role!r}")
    out = dict(m)
    out["content"] = _content(m.get("content"), where, inline)
    if "tool_calls" in m and m["tool_calls"] is not None:
        if role != "assistant":
            raise RowError(f"{where}: only assistant messages have tool_calls, this one is {role!r}")
        out["tool_calls"] = _tool_calls(m["tool_calls"], where)
    return out


def _content(content: Any, where: str, inline: list | None) -> str | list[dict]:
    if content is None:
        return ""  # assistant turns with only tool calls; templates read content either way
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI / HF content parts: text, and images (module header)
        parts: list[dict] = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else _kind(part)
            if kind == "text" and isinstance(part.get("text"), str):
                parts.append({"type": "text", "text": part["text"]})
            elif kind in ("image", "image_url") and inline is not None:
                inline.append(_image_source(part, f"{where}.content[{j}]"))
                parts.append({"type": "image"})
            else:
                raise RowError(f"{where}: content part of type {kind!r} is not supported "
                               f"({'text and image' if inline is not None else 'text'} only)")
        if not any(p["type"] == "image" for p in parts):
            return "".join(p["text"] for p in parts)
        return parts
    if isinstance(content, dict):  # tool results given as objects
        return json.dumps(content, ensure_ascii=False)
    raise RowError(f"{where}: content must be a string or a list of text parts, got {_kind(content)}")


def _image_source(part: dict, where: str):
    """(an image part's own source, or None when it takes the next of the row's images; its field)."""
    if part.get("type") == "image_url":
        url = part.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
        if not isinstance(url, str) or not url:
            raise RowError(f"{where}: an image_url part needs image_url.url (a path or a data: URL)")
        return url, f"{where}.image_url.url"
    for key in ("image", "url", "path"):
        value = part.get(key)
        if value is not None:
            if not isinstance(value, (str, dict)):
                raise RowError(f"{where}.{key}: an image must be a path, a data: URL or a {{bytes, path}} record, "
                               f"got {_kind(value)}")
            return value, f"{where}.{key}"
    return None, None


def _tool_calls(calls: Any, where: str) -> list[dict]:
    calls = _json_value(calls, f"{where}.tool_calls")
    if not isinstance(calls, list):
        raise RowError(f"{where}.tool_calls must be a list, got {_kind(calls)}")
    out = []
    for i, call in enumerate(calls):
        fn = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RowError(f"{where}.tool_calls[{i}] needs a function name",
                           hint='{"type": "function", "function": {"name": ..., "arguments": {...}}}')
        args = fn.get("arguments", {})
        if isinstance(args, str):  # OpenAI sends arguments as a JSON string; templates want the object
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError:
                pass  # keep the string: some templates print it as is
        call = dict(call) if "function" in call else {"type": "function"}
        call["function"] = {**fn, "arguments": args}
        call.setdefault("type", "function")
        out.append(call)
    return out


def _instruction(record: dict, dataset: DatasetConfig) -> Conversation:
    instruction = _string(record, dataset.instruction_field, "instruction_field")
    output = _string(record, dataset.output_field, "output_field")
    extra = record.get(dataset.input_field)
    if extra is not None and not isinstance(extra, str):
        raise RowError(f"field {dataset.input_field!r} must be a string, got {_kind(extra)}")
    user = f"{instruction}\n\n{extra}" if extra and extra.strip() else instruction
    messages = [{"role": "user", "content": user}, {"role": "assistant", "content": output}]
    system = _system(record, dataset)
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    return Conversation(messages)


def _system(record: dict, dataset: DatasetConfig) -> str | None:
    value = record.get(dataset.system_field)
    if isinstance(value, str) and value.strip():
        return value
    return dataset.system_prompt


def _string(record: dict, field: str, key: str) -> str:
    if field not in record:
        raise RowError(f"no {field!r} field (fields: {_fields(record)})", key=key)
    value = record[field]
    if not isinstance(value, str):
        raise RowError(f"field {field!r} must be a string, got {_kind(value)}")
    return value


def _json_value(value: Any, field: str) -> Any:
    if isinstance(value, str) and value.lstrip()[:1] in ("[", "{"):
        try:
            return json.loads(value)
        except json.JSONDecodeError as e:
            raise RowError(f"field {field!r} holds invalid JSON: {e.msg} at column {e.colno}") from None
    return value


def _fields(record: dict) -> str:
    names = list(record)
    return ", ".join(map(str, names[:12])) + (" ..." if len(names) > 12 else "") if names else "none"


def _kind(value: Any) -> str:
    return {list: "a list", dict: "an object", str: "a string", type(None): "null", bool: "a boolean",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)
