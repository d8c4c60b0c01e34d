"""Chat templates: the Jinja programs shipped with a model that turn messages into prompt text.

Templates come from the Hub, so they are untrusted code: they run in Jinja's immutable sandbox,
and everything they see is rebuilt from plain JSON-like values first. The environment matches
the one transformers gives them (``trim_blocks``, ``lstrip_blocks``, loop controls, a
``{% generation %}`` tag, ``raise_exception``, ``strftime_now``, a ``tojson`` that keeps
non-ASCII text and takes ``indent``), and so do the message clean-ups before rendering, so a
template renders here exactly what ``tokenizer.apply_chat_template`` renders in transformers.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from datetime import datetime
from functools import lru_cache

import jinja2
import jinja2.ext
import jinja2.nodes
import numpy as np
from jinja2.sandbox import ImmutableSandboxedEnvironment

from surogate.errors import FileFormatError, InvalidArgumentError

# The names a message's reasoning arrives under; templates read the first one.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


class ChatTemplate:
    """One compiled template. ``origin`` names its source (a file) in error messages."""

    def __init__(self, source: str, origin: str = "chat template"):
        self.source = source
        self.origin = origin
        try:
            self._template = _compile(source)
        except jinja2.TemplateSyntaxError as e:
            raise FileFormatError(f"{origin}: chat template syntax error at line {e.lineno}: {e.message}",
                                  hint="fix the template, or pass chat_template= with a working one") from None

    def render(self, messages: Sequence[Mapping], *, tools: Sequence[Mapping] | None = None,
               documents: Sequence[Mapping] | None = None, add_generation_prompt: bool = False,
               continue_final_message: bool | str = False, **variables) -> str:
        """The prompt text. Extra ``variables`` (``bos_token``, ``enable_thinking``, ...) reach the template."""
        return self.render_with_generation_spans(
            messages, tools=tools, documents=documents, add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, **variables)[0]

    def render_with_generation_spans(
            self, messages: Sequence[Mapping], *, tools: Sequence[Mapping] | None = None,
            documents: Sequence[Mapping] | None = None, add_generation_prompt: bool = False,
            continue_final_message: bool | str = False, **variables) -> tuple[str, list[tuple[int, int]]]:
        """The prompt text, and the [start, end) character spans inside ``{% generation %}`` blocks
        (the assistant's own words, for templates that mark them)."""
        if continue_final_message and add_generation_prompt:
            raise InvalidArgumentError("continue_final_message and add_generation_prompt cannot both be set",
                                       hint="continue_final_message extends the last message; "
                                            "add_generation_prompt opens a new assistant turn")
        chat = _prepare_messages(messages)
        if not chat:
            raise InvalidArgumentError("cannot apply a chat template to an empty conversation")
        if tools is not None:
            for tool in tools:
                if not isinstance(tool, Mapping):
                    raise InvalidArgumentError(f"tools must be JSON-schema dicts, got {type(tool).__name__}",
                                               hint='pass {"type": "function", "function": {"name": ..., ...}}')
        continued = _tag_final_message(chat, continue_final_message, self.source) if continue_final_message else None

        blocks: list[str] = []
        spans: list[tuple[int, int]] = []
        token = _SPANS.set((blocks, spans))
        try:
            for block in self._template.generate(
                    messages=chat, tools=_plain(tools), documents=_plain(documents),
                    add_generation_prompt=add_generation_prompt, **_plain(variables)):
                blocks.append(block)
        except _TemplateRaised as e:
            # raise_exception() in the template: it refuses this conversation (wrong roles, ...)
            raise InvalidArgumentError(f"{self.origin}: the chat template rejected the conversation: {e}",
                                       hint="the model's template decides which roles and fields it accepts") from None
        except jinja2.TemplateError as e:
            raise InvalidArgumentError(f"{self.origin}: the chat template failed: {type(e).__name__}: {e}",
                                       hint="the messages lack something the template reads, "
                                            "or the template has a bug") from None
        finally:
            _SPANS.reset(token)
        text = "".join(blocks)
        if continued is not None:
            text = _cut_at_tag(text, continued)
        return text, spans


def select_template(templates: Mapping[str, str], name: str | None = None,
                    tools: Sequence | None = None) -> str:
    """The template text to use, as transformers chooses it: ``name`` (a template name, or a whole
    template), else "tool_use" when tools are given and the model has one, else "default"."""
    if name is not None:
        return templates.get(name, name)
    if tools is not None and "tool_use" in templates:
        return templates["tool_use"]
    if "default" in templates:
        return templates["default"]
    if not templates:
        raise InvalidArgumentError("this model has no chat template",
                                   hint="pass chat_template= with a Jinja template, or use a chat (instruct) model")
    raise InvalidArgumentError(f"this model has several chat templates and none is the default: {sorted(templates)}",
                               hint="pass chat_template= with one of the names")


# (rendered blocks so far, spans) for the render in progress in this thread or task.
_SPANS: ContextVar[tuple[list[str], list[tuple[int, int]]] | None] = ContextVar("chat_template_spans", default=None)


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: renders its body and records where it landed."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_record"), [], [], body).set_lineno(lineno)

    def _record(self, caller) -> str:
        text = caller()
        if (state := _SPANS.get()) is not None:
            blocks, spans = state
            start = sum(map(len, blocks))
            spans.append((start, start + len(text)))
        return text


class _TemplateRaised(jinja2.TemplateError):
    pass


def _raise_exception(message: str):
    raise _TemplateRaised(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # Jinja's own tojson escapes HTML characters, which a prompt must not contain.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _Dict:
    # dict() for templates, without handing them the dict type itself.
    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    # namespace() that refuses underscore names, a way into the interpreter's internals.
    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates cannot set underscore attributes ({name!r})")


@lru_cache(maxsize=32)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, dict=_Dict(),
                       namespace=_Namespace)
    return env.from_string(source)


def _prepare_messages(messages: Sequence[Mapping]) -> list[dict]:
    """Plain-data copies; keys set to None dropped (templates print "None" or fail on them, and
    handle a missing key); reasoning under any of its names visible under all of them."""
    chat = []
    for message in getattr(messages, "messages", messages):
        message = _plain(message)
        if not isinstance(message, dict):
            raise InvalidArgumentError(f"chat messages must be dicts, got {message!r}",
                                       hint='each message looks like {"role": "user", "content": "..."}')
        message = {k: v for k, v in message.items() if v is not None}
        reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        chat.append(message)
    return chat


def _plain(value):
    """``value`` rebuilt from JSON-like types, so a template cannot call methods of rich objects
    (some write files); anything else becomes an inert ``<TypeName>`` placeholder."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, np.generic):
        return _plain(value.item())  # np.bool_(False) must stay falsy, not become a placeholder
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):  # pydantic models (the OpenAI SDK's messages)
        return _plain(value.model_dump())
    if hasattr(value, "__struct_fields__"):  # msgspec Structs (our gateway's wire types)
        return {f: _plain(getattr(value, f)) for f in value.__struct_fields__}
    return f"<{type(value).__name__}>"


def _tag_final_message(chat: list[dict], field: bool | str, source: str) -> str:
    """Mark the end of the last message so the rendered text can be cut there (the model then
    continues that message instead of starting a new one). Returns the text being continued."""
    field = field if isinstance(field, str) else "content"
    final = chat[-1].get(field)
    if final is None:
        raise InvalidArgumentError(f"continue_final_message: the final message has no '{field}' to continue")
    fields = [field]
    if field in _REASONING_FIELDS:  # reasoning is copied under several names: tag every copy
        fields = [f for f in _REASONING_FIELDS if chat[-1].get(f) == final]
    if not any(f in source for f in fields):
        raise InvalidArgumentError(f"continue_final_message: the chat template never reads '{field}'")
    if isinstance(final, (list, tuple)):
        for block in reversed(final):
            if isinstance(block, dict) and "text" in block:
                continued = block["text"]
                block["text"] = continued + _CONTINUE_TAG
                return continued
        raise InvalidArgumentError("continue_final_message: the final message has no text block to continue")
    for f in fields:
        chat[-1][f] = chat[-1][f] + _CONTINUE_TAG
    return final


def _cut_at_tag(text: str, continued: str) -> str:
    tag = _CONTINUE_TAG.strip()
    if continued.strip() not in text or tag not in text:
        raise InvalidArgumentError(
            "continue_final_message: the template dropped part of the final message, so it cannot be continued",
            hint="check that the template renders the final message's text unchanged")
    at = text.rindex(tag)
    # A template that strips the message also strips our tag's trailing space: then strip the cut too.
    return text[:at] if text[at:at + len(_CONTINUE_TAG)] == _CONTINUE_TAG else text[:at].rstrip()
