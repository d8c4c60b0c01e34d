"""Anthropic Messages requests -> ``Job``s, in the template's terms.

- ``system`` (a string or text blocks) becomes the system message.
- Roles: ``user`` and ``assistant``; Claude Code's ``ctx`` / ``msg`` count as ``user`` and a
  ``system`` role as system (vLLM #44000). Anything else is a 400 naming ``messages.i.role``.
- ``image`` blocks (user turns and ``tool_result`` content; base64 or url sources) make the
  message's content a list of text and image parts (gateway/media.py); the prompt carries the
  decoded images, and a model that takes no images answers 400 naming the block.
- ``tool_result`` blocks (inside user turns) become ``tool`` messages, before the turn's text,
  as llama.cpp does; ``tool_use`` blocks become the assistant's ``tool_calls``; ``thinking`` blocks
  become its ``reasoning_content`` (a 400 on thinking history was a real complaint: llm-scaler
  #341); ``redacted_thinking`` is dropped.
- ``thinking: {type: enabled}`` / ``disabled`` set ``enable_thinking`` for the template;
  ``budget_tokens`` caps the reasoning span (the engine closes it with ``</think>`` there).
- ``tool_choice: any`` / ``tool`` force a call: the answer is generated under a JSON schema of
  the tools' ``input_schema`` (ForcedTools). ``none`` hides the tools;
  ``disable_parallel_tool_use`` keeps one call.
"""

from __future__ import annotations

from collections.abc import Sequence

from surogate.serve import SamplingParams, StructuredOutputsParams
from surogate.serve.parsers import ForcedTools, OfferedTools
from surogate.serve.frontend import Prompt, RequestError, check_sampling, fit_to_context

from .. import errors
from ..errors import ApiError
from ..media import ImageInput, image_part, load_images
from ..serving import Gateway, Job
from . import protocol as a

ROLE_ALIASES = {"ctx": "user", "msg": "user"}


def messages_job(gw: Gateway, req: a.MessagesRequest | a.CountTokensRequest) -> Job | ApiError:
    found = gw.find(req.model)
    if isinstance(found, ApiError):
        return found
    model, adapter = found
    choice = req.tool_choice
    try:
        offer = bool(req.tools) and not isinstance(choice, a.ToolChoiceNone)
        tools = [_tool(t, i) for i, t in enumerate(req.tools)] if offer else None
        thinking = req.thinking
        enable = True if isinstance(thinking, a.ThinkingEnabled) else False if isinstance(
            thinking, a.ThinkingDisabled) else None
        messages = anthropic_messages(req.system, req.messages)
        images = load_images(model, messages, gw.config)
        prompt: Prompt = model.llm.render(messages, tools, enable_thinking=enable,
                                          chat_template_kwargs=req.chat_template_kwargs, images=images)
        if isinstance(req, a.CountTokensRequest):
            return Job(model, adapter, prompt, SamplingParams())
        opts = SamplingParams(
            max_tokens=req.max_tokens, temperature=_or(req.temperature, 1.0), top_p=_or(req.top_p, 1.0),
            top_k=_or(req.top_k, 0), min_p=_or(req.min_p, 0.0), repetition_penalty=_or(req.repetition_penalty, 1.0),
            seed=req.seed, stop=list(req.stop_sequences or []),
            max_reasoning_tokens=thinking.budget_tokens if isinstance(thinking, a.ThinkingEnabled) else None)
        if isinstance(thinking, a.ThinkingEnabled) and (thinking.budget_tokens or 0) < 0:
            raise RequestError(f"thinking.budget_tokens is {thinking.budget_tokens}; use a count >= 0",
                               param="thinking.budget_tokens")
        forced = _forced(req.tools or [], choice) if offer else None
        if forced is not None:
            opts.structured_outputs = StructuredOutputsParams(json=forced.schema)
        limits = gw.models.limits(model, gw.config)
        check_sampling(opts, limits, {"stop": "stop_sequences"})
        opts = fit_to_context(opts, len(prompt.token_ids), limits, prompt_param="messages",
                              max_tokens_param="max_tokens")
    except (RequestError, errors.ApiErrorException) as e:
        return errors.from_exception(e)
    one = isinstance(choice, (a.ToolChoiceAuto, a.ToolChoiceAny)) and bool(choice.disable_parallel_tool_use)
    offered = OfferedTools({t.name: t.input_schema or {} for t in req.tools}) if offer else False
    return Job(model, adapter, prompt, opts, tools=forced or offered, max_tool_calls=1 if one else None)


def has_images(req: a.MessagesRequest | a.CountTokensRequest) -> bool:
    def image(b) -> bool:
        return isinstance(b, a.ImageBlockParam) or (isinstance(b, a.ToolResultBlockParam) and isinstance(
            b.content, list) and any(isinstance(c, a.ImageBlockParam) for c in b.content))
    return any(isinstance(m.content, list) and any(image(b) for b in m.content) for m in req.messages)


def _forced(tools: Sequence[a.Tool], choice: a.ToolChoice | None) -> ForcedTools | None:
    schemas = {t.name: t.input_schema or {} for t in tools}
    if isinstance(choice, a.ToolChoiceAny):
        return ForcedTools(schemas, parallel=not choice.disable_parallel_tool_use)
    if isinstance(choice, a.ToolChoiceTool):
        if choice.name not in schemas:
            raise RequestError(f"tool_choice names {choice.name!r}, which is not among the tools ({sorted(schemas)})",
                               param="tool_choice.name")
        return ForcedTools(schemas, name=choice.name)
    return None


def anthropic_messages(system: str | list[a.TextBlockParam] | None, messages: Sequence[a.MessageParam]) -> list[dict]:
    out: list[dict] = []
    if system:
        out.append({"role": "system", "content": system if isinstance(system, str) else
                    "\n".join(b.text for b in system)})
    for i, m in enumerate(messages):
        role = ROLE_ALIASES.get(m.role, m.role)
        if role not in ("user", "assistant", "system"):
            raise RequestError(f"Unknown role {m.role!r}: use user or assistant", param=f"messages.{i}.role")
        if isinstance(m.content, str):
            out.append({"role": role, "content": m.content})
        elif role == "assistant":
            out.append(_assistant(m.content, i))
        else:
            out.extend(_user(role, m.content, i))
    return out


def _user(role: str, blocks: Sequence, i: int) -> list[dict]:
    out, parts = [], []
    for j, b in enumerate(blocks):
        where = f"messages.{i}.content.{j}"
        if isinstance(b, a.TextBlockParam):
            parts.append({"type": "text", "text": b.text})
        elif isinstance(b, a.ImageBlockParam):
            parts.append(_image(b, where))
        elif isinstance(b, a.ToolResultBlockParam):
            content = _result_content(b.content, f"{where}.content")
            if b.is_error:
                content = f"Error: {content}" if isinstance(content, str) else [
                    {"type": "text", "text": "Error:"}, *content]
            out.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": content})
        else:
            raise RequestError(_refusal(b), param=f"{where}.type")
    if parts or not out:
        out.append({"role": role, "content": _joined(parts)})
    return out


def _joined(parts: list[dict]) -> str | list[dict]:
    """Text blocks alone are one string, joined by newlines; with images, the parts in order."""
    if any(part["type"] == "image" for part in parts):
        return parts
    return "\n".join(part["text"] for part in parts)


def _image(b: a.ImageBlockParam, where: str) -> dict:
    source = b.source
    if isinstance(source, a.FileImageSource):
        raise RequestError("Images by `file_id` are not supported: this server stores no files. Send a base64 "
                           "source.", param=f"{where}.source")
    if isinstance(source, a.Base64ImageSource):
        return image_part(ImageInput(where, base64=source.data, media_type=source.media_type))
    return image_part(ImageInput(where, url=source.url))


def _assistant(blocks: Sequence, i: int) -> dict:
    texts, reasoning, calls = [], [], []
    for j, b in enumerate(blocks):
        if isinstance(b, a.TextBlockParam):
            texts.append(b.text)
        elif isinstance(b, a.ThinkingBlockParam):
            reasoning.append(b.thinking)
        elif isinstance(b, a.RedactedThinkingBlockParam):
            continue
        elif isinstance(b, a.ToolUseBlockParam):
            calls.append({"id": b.id, "type": "function", "function": {"name": b.name, "arguments": b.input}})
        else:
            raise RequestError(_refusal(b), param=f"messages.{i}.content.{j}.type")
    message: dict = {"role": "assistant", "content": "".join(texts)}
    if reasoning:
        message["reasoning_content"] = "\n".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return message


def _result_content(content, param: str) -> str | list[dict]:
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for k, b in enumerate(content):
        if isinstance(b, a.TextBlockParam):
            parts.append({"type": "text", "text": b.text})
        elif isinstance(b, a.ImageBlockParam):
            parts.append(_image(b, f"{param}.{k}"))
        else:
            raise RequestError(_refusal(b), param=f"{param}.{k}.type")
    return _joined(parts)


def _tool(t: a.Tool, i: int) -> dict:
    if t.type not in (None, "custom"):
        raise RequestError(f"Server tool {t.type!r} is not supported; only client tools (name, description, "
                           "input_schema) are.", param=f"tools.{i}.type")
    schema = t.input_schema if t.input_schema is not None else {"type": "object", "properties": {}}
    fn = {"name": t.name, "description": t.description, "parameters": schema}
    return {"type": "function", "function": {k: v for k, v in fn.items() if v is not None}}


def _refusal(block) -> str:
    kind = type(block).__struct_config__.tag
    if kind == "document":
        return "Document blocks are not supported: this server takes text and images."
    if kind == "image":
        return "Image blocks belong in user turns and tool results only."
    return f"A {kind!r} block cannot appear here."


def _or(value, default):
    return default if value is None else value
