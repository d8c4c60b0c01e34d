"""OpenAI requests -> ``Job``s (prompt ids, sampling parameters, tool and reasoning settings).

Each function returns a Job or an ApiError naming the request field in OpenAI's spelling
(``messages[2].content[0].type``, ``max_completion_tokens``). Features that need machinery the
engine does not have (audio, files, predicted outputs) are refused with a 400 that says so,
instead of being ignored.

Images (chat ``image_url`` parts in user messages; Responses ``input_image`` parts in input
messages and function call outputs) make the message's content a list of text and image parts
(gateway/media.py); the prompt carries the decoded images. A model that takes no images answers
400 naming the part. Videos (chat ``video_url`` parts, vLLM's extension) likewise, for a model that
reads them (Qwen3-VL).

Constraints become a grammar (SamplingParams.structured_outputs): ``response_format`` /
``text.format`` json_object and json_schema, vLLM's ``structured_outputs``, and forced tools
(``tool_choice: "required"`` or a named function: a JSON schema over the tools' parameters, read
back by ForcedToolParser). ``max_reasoning_tokens`` (ours) or ``reasoning_effort`` set the
reasoning budget (frontend.REASONING_EFFORT_BUDGETS).
"""

from __future__ import annotations

from collections.abc import Sequence

from surogate.serve import SamplingParams, StructuredOutputsParams
from surogate.serve.frontend import (Prompt, RequestError, check_sampling, encode_prompt, fit_to_context,
                                     reasoning_budget)
from surogate.serve.parsers import ForcedTools, OfferedTools

from .. import errors
from ..errors import ApiError
from ..media import ImageInput, image_part, load_images, load_media, video_part
from ..serving import Gateway, Job, parse_logit_bias, parse_stop
from . import protocol as p

_PART_NAMES = {"input_audio": "Audio input", "file": "File input"}


def chat_job(gw: Gateway, req: p.ChatCompletionRequest) -> Job | ApiError:
    found = gw.find(req.model)
    if isinstance(found, ApiError):
        return found
    model, adapter = found
    refused = _refuse_chat(req)
    if refused is not None:
        return refused
    try:
        messages = chat_messages(req.messages)
        images, videos = load_media(model, messages, gw.config)
        offer_tools = bool(req.tools) and req.tool_choice != "none"
        tools = [{"type": "function", "function": _function(t.function)} for t in req.tools] if offer_tools else None
        continue_final = bool(req.continue_final_message)
        add_prompt = req.add_generation_prompt if req.add_generation_prompt is not None else not continue_final
        prompt = model.llm.render(messages, tools, reasoning_effort=req.reasoning_effort,
                                  chat_template_kwargs=req.chat_template_kwargs, add_generation_prompt=add_prompt,
                                  continue_final_message=continue_final, documents=req.documents, images=images,
                                  videos=videos)
        max_name = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        if req.top_logprobs is not None and not req.logprobs:
            return errors.invalid("`top_logprobs` needs `logprobs: true`", param="top_logprobs")
        opts = _sampling(req, model.tokenizer.vocab_size, max_tokens=req.max_completion_tokens or req.max_tokens,
                         logprobs=(req.top_logprobs or 0) if req.logprobs else None)
        schemas = {t.function.name: t.function.parameters or {} for t in req.tools or []}
        forced = forced_tools(schemas, req.tool_choice, req.parallel_tool_calls) if offer_tools else None
        opts.structured_outputs = constraint(req.structured_outputs, _response_format(req.response_format),
                                             forced, "response_format")
        opts.max_reasoning_tokens = reasoning_budget(req.reasoning_effort, req.max_reasoning_tokens)
        limits = gw.models.limits(model, gw.config)
        check_sampling(opts, limits, {"max_tokens": max_name, "logprobs": "top_logprobs"})
        opts = fit_to_context(opts, len(prompt.token_ids), limits, prompt_param="messages", max_tokens_param=max_name)
    except (RequestError, errors.ApiErrorException) as e:
        return errors.from_exception(e)
    return Job(model, adapter, prompt, opts, tools=forced or (OfferedTools(schemas) if offer_tools else False),
               max_tool_calls=1 if req.parallel_tool_calls is False else None)


def chat_has_media(messages: Sequence[p.ChatMessage]) -> bool:
    """Image or video parts: the request is converted in a worker thread (gateway/media.py decodes them)."""
    return any(isinstance(part, (p.ImageURLPart, p.VideoURLPart)) for m in messages
               if isinstance(getattr(m, "content", None), list) for part in m.content)


def responses_has_images(req: p.ResponsesRequest) -> bool:
    return not isinstance(req.input, str) and any(
        isinstance(content, list) and any(part.type == "input_image" for part in content)
        for item in req.input for content in (item.content, item.output))


def forced_tools(tools: dict[str, dict], choice, parallel: bool | None) -> ForcedTools | None:
    """``tool_choice`` "required" or a named function (chat's ``{"type": "function", "function":
    {"name"}}``, Responses' ``{"type": "function", "name"}``) as ForcedTools; None otherwise."""
    if choice is None or choice in ("auto", "none"):
        return None
    if choice == "required":
        return ForcedTools(tools, parallel=parallel is not False)
    name = choice.function.name if isinstance(choice, p.NamedToolChoice) else choice.name
    if choice.type != "function" or name not in tools:
        raise RequestError(f"`tool_choice` names {name!r}, which is not among the function tools "
                           f"({sorted(tools) or 'none'})", param="tool_choice")
    return ForcedTools(tools, name=name)


def constraint(ext: p.StructuredOutputs | None, fmt: StructuredOutputsParams | None, forced: ForcedTools | None,
               fmt_param: str) -> StructuredOutputsParams | None:
    """The request's one grammar: structured_outputs, the response format, or the forced tools."""
    given = [(name, v) for name, v in (("structured_outputs", ext), (fmt_param, fmt), ("tool_choice", forced))
             if v is not None]
    if len(given) > 1:
        raise RequestError(f"`{given[0][0]}` and `{given[1][0]}` each constrain the answer; send one",
                           param=given[1][0])
    if ext is not None:
        return StructuredOutputsParams(json=ext.json, json_object=ext.json_object, regex=ext.regex, choice=ext.choice,
                                       grammar=ext.grammar)
    if forced is not None:
        return StructuredOutputsParams(json=forced.schema)
    return fmt


def _response_format(fmt: p.ResponseFormat | None) -> StructuredOutputsParams | None:
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return StructuredOutputsParams(json_object=True)
    if fmt.json_schema is None or fmt.json_schema.schema is None:
        raise RequestError("`response_format` json_schema needs `json_schema.schema`",
                           param="response_format.json_schema.schema")
    return StructuredOutputsParams(json=fmt.json_schema.schema)


def _text_format(fmt: p.TextFormat | None) -> StructuredOutputsParams | None:
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return StructuredOutputsParams(json_object=True)
    if fmt.schema is None:
        raise RequestError("`text.format` json_schema needs `schema`", param="text.format.schema")
    return StructuredOutputsParams(json=fmt.schema)


def chat_messages(messages: Sequence[p.ChatMessage]) -> list[dict]:
    """Wire messages -> template messages (``developer`` is ``system`` to a template); a user
    message with images gets a content list (their sources in the parts: gateway/media.py)."""
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if isinstance(m, (p.SystemMessage, p.DeveloperMessage)):
            out.append({"role": "system", "content": text_of(m.content, f"{where}.content")})
        elif isinstance(m, p.UserMessage):
            out.append({"role": "user", "content": content_of(m.content, f"{where}.content")})
        elif isinstance(m, p.AssistantMessage):
            message = {"role": "assistant",
                       "content": text_of(m.content, f"{where}.content") if m.content is not None else ""}
            if m.tool_calls:
                message["tool_calls"] = [{"id": c.id, "type": "function",
                                          "function": {"name": c.function.name, "arguments": c.function.arguments}}
                                         for c in m.tool_calls]
            reasoning = m.reasoning_content if m.reasoning_content is not None else m.reasoning
            if reasoning is not None:
                message["reasoning_content"] = reasoning
            out.append(message)
        elif isinstance(m, p.ToolMessage):
            out.append({"role": "tool", "content": text_of(m.content, f"{where}.content"),
                        "tool_call_id": m.tool_call_id})
        else:
            raise RequestError("The deprecated `function` role is not supported; send tool results with the "
                               "`tool` role.", param=f"{where}.role")
    return out


def text_of(content: str | list, param: str) -> str:
    """A message's text: a string, or text parts joined by newlines (vLLM's rule)."""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if isinstance(part, (p.TextPart, p.RefusalPart)):
            texts.append(part.text if isinstance(part, p.TextPart) else part.refusal)
        elif isinstance(part, (p.ImageURLPart, p.VideoURLPart)):
            kind = "image_url" if isinstance(part, p.ImageURLPart) else "video_url"
            raise RequestError(f"`{kind}` parts belong in user messages only.", param=f"{param}[{j}]")
        else:
            _refuse_part(part, f"{param}[{j}]")
    return "\n".join(texts)


def content_of(content: str | list, param: str) -> str | list[dict]:
    """A user message's content: its text (``text_of``), or with image or video parts, the text,
    image and video parts in order."""
    if isinstance(content, str) or not any(isinstance(part, (p.ImageURLPart, p.VideoURLPart)) for part in content):
        return text_of(content, param)
    parts = []
    for j, part in enumerate(content):
        if isinstance(part, p.ImageURLPart):
            url = part.image_url if isinstance(part.image_url, str) else part.image_url.url
            parts.append(image_part(ImageInput(f"{param}[{j}]", url=url)))
        elif isinstance(part, p.VideoURLPart):
            url = part.video_url if isinstance(part.video_url, str) else part.video_url.url
            parts.append(video_part(ImageInput(f"{param}[{j}]", url=url)))
        elif isinstance(part, (p.TextPart, p.RefusalPart)):
            parts.append({"type": "text", "text": part.text if isinstance(part, p.TextPart) else part.refusal})
        else:
            _refuse_part(part, f"{param}[{j}]")
    return parts


def _refuse_part(part, where: str):
    kind = type(part).__struct_config__.tag
    raise RequestError(f"{_PART_NAMES.get(kind, kind)} is not supported: this server takes text, images and "
                       "videos.",
                       param=f"{where}.type")


def completion_jobs(gw: Gateway, req: p.CompletionRequest) -> list[Job] | ApiError:
    """One Job per prompt (a list of prompts gives choices ``prompt * n + i``)."""
    found = gw.find(req.model)
    if isinstance(found, ApiError):
        return found
    model, adapter = found
    if req.suffix:
        return errors.unsupported("suffix", "`suffix` (fill-in-the-middle)")
    if req.best_of is not None and req.best_of != (req.n or 1):
        return errors.unsupported("best_of", "`best_of` other than `n`")
    try:
        prompts = completion_prompts(model.tokenizer, req.prompt, add_special_tokens=req.add_special_tokens)
        opts = _sampling(req, model.tokenizer.vocab_size, max_tokens=req.max_tokens, logprobs=req.logprobs)
        if req.echo and req.logprobs is not None:
            opts.prompt_logprobs = req.logprobs
        opts.structured_outputs = constraint(req.structured_outputs, None, None, "response_format")
        limits = gw.models.limits(model, gw.config)
        check_sampling(opts, limits)
        jobs = []
        for prompt in prompts:
            fitted = fit_to_context(opts, len(prompt.token_ids), limits, prompt_param="prompt",
                                    max_tokens_param="max_tokens")
            jobs.append(Job(model, adapter, prompt, fitted))
    except (RequestError, errors.ApiErrorException) as e:
        return errors.from_exception(e)
    return jobs


def completion_prompts(tokenizer, prompt, *, add_special_tokens: bool | None = None,
                       param: str = "prompt") -> list[Prompt]:
    """``prompt``: a string, strings, token ids, or lists of token ids (``param``: the field's
    name in errors; embeddings call it ``input``)."""
    add = True if add_special_tokens is None else add_special_tokens
    if isinstance(prompt, str):
        return [encode_prompt(tokenizer, prompt, add_special_tokens=add, param=param)]
    if not prompt:
        raise RequestError(f"`{param}` is empty", param=param)
    if all(isinstance(x, int) for x in prompt):
        return [encode_prompt(tokenizer, prompt, param=param)]
    out = []
    for i, item in enumerate(prompt):
        if isinstance(item, int):
            raise RequestError(f"`{param}` mixes token ids with strings or lists", param=f"{param}[{i}]")
        out.append(encode_prompt(tokenizer, item, add_special_tokens=add, param=f"{param}[{i}]"))
    return out


def responses_job(gw: Gateway, req: p.ResponsesRequest) -> Job | ApiError:
    found = gw.find(req.model)
    if isinstance(found, ApiError):
        return found
    model, adapter = found
    if req.previous_response_id:
        return errors.unsupported("previous_response_id", "`previous_response_id` (this server stores no responses; "
                                  "send the whole conversation in `input`)")
    if req.background:
        return errors.unsupported("background", "`background` mode")
    try:
        messages = responses_messages(req)
        images = load_images(model, messages, gw.config)
        tools = None
        if req.tools and req.tool_choice != "none":
            tools = []
            for i, t in enumerate(req.tools):
                if t.type != "function" or not t.name:
                    raise RequestError(f"Tools of type {t.type!r} are not supported; only function tools are.",
                                       param=f"tools[{i}].type")
                tools.append({"type": "function", "function": _drop_none(
                    {"name": t.name, "description": t.description, "parameters": t.parameters})})
        effort = req.reasoning.effort if req.reasoning else None
        prompt = model.llm.render(messages, tools, reasoning_effort=effort,
                                  chat_template_kwargs=req.chat_template_kwargs, images=images)
        opts = _sampling(req, model.tokenizer.vocab_size, max_tokens=req.max_output_tokens,
                         logprobs=req.top_logprobs)
        schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools or []}
        forced = forced_tools(schemas, req.tool_choice, req.parallel_tool_calls) if tools is not None else None
        text_format = _text_format(req.text.format if req.text else None)
        opts.structured_outputs = constraint(req.structured_outputs, text_format, forced, "text.format")
        opts.max_reasoning_tokens = reasoning_budget(effort, req.max_reasoning_tokens)
        limits = gw.models.limits(model, gw.config)
        check_sampling(opts, limits, {"max_tokens": "max_output_tokens", "logprobs": "top_logprobs"})
        opts = fit_to_context(opts, len(prompt.token_ids), limits, prompt_param="input",
                              max_tokens_param="max_output_tokens")
    except (RequestError, errors.ApiErrorException) as e:
        return errors.from_exception(e)
    return Job(model, adapter, prompt, opts, tools=forced or (OfferedTools(schemas) if tools is not None else False),
               max_tool_calls=1 if req.parallel_tool_calls is False else req.max_tool_calls)


def responses_messages(req: p.ResponsesRequest) -> list[dict]:
    """``instructions`` + ``input`` items -> template messages. Function calls join the assistant
    turn before them; their outputs become tool messages; a reasoning item becomes the next
    assistant turn's ``reasoning_content``."""
    out: list[dict] = []
    if req.instructions:
        out.append({"role": "system", "content": req.instructions})
    if isinstance(req.input, str):
        out.append({"role": "user", "content": req.input})
        return out
    reasoning: str | None = None
    for i, item in enumerate(req.input):
        where = f"input[{i}]"
        if item.type == "message":
            role = {"developer": "system"}.get(item.role or "", item.role)
            if role not in ("system", "user", "assistant"):
                raise RequestError(f"Unknown role {item.role!r}", param=f"{where}.role")
            message = {"role": role, "content": _input_content(item.content, f"{where}.content",
                                                               images=role != "assistant")}
            if role == "assistant" and reasoning is not None:
                message["reasoning_content"], reasoning = reasoning, None
            out.append(message)
        elif item.type == "function_call":
            if not item.call_id or not item.name:
                raise RequestError("A function_call item needs `call_id` and `name`",
                                   param=f"{where}.{'call_id' if not item.call_id else 'name'}")
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments or "{}"}}
            if out and out[-1]["role"] == "assistant" and reasoning is None:
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                message = {"role": "assistant", "content": "", "tool_calls": [call]}
                if reasoning is not None:
                    message["reasoning_content"], reasoning = reasoning, None
                out.append(message)
        elif item.type == "function_call_output":
            if not item.call_id:
                raise RequestError("A function_call_output item needs `call_id`", param=f"{where}.call_id")
            output = item.output if isinstance(item.output, str) else _input_content(item.output or [],
                                                                                     f"{where}.output", images=True)
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": output})
        elif item.type == "reasoning":
            # Our own reasoning items carry the text as reasoning_text content; OpenAI's, as a summary.
            parts = item.content if isinstance(item.content, list) else []
            texts = [c.text or "" for c in parts if c.type == "reasoning_text"] or [c.text for c in item.summary or []]
            reasoning = "\n".join(texts)
        else:
            raise RequestError(f"Input items of type {item.type!r} are not supported", param=f"{where}.type")
    return out


def _input_content(content, param: str, *, images: bool) -> str | list[dict]:
    """An input message's (or function call output's) content: its text parts joined by newlines,
    or with ``input_image`` parts (where ``images`` allows them), the text and image parts in order."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    with_images = any(part.type == "input_image" for part in content)
    parts = []
    for j, part in enumerate(content):
        where = f"{param}[{j}]"
        if part.type in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": part.text or ""})
        elif part.type == "input_image" and not images:
            raise RequestError("`input_image` parts belong in user, system and developer messages and function "
                               "call outputs only.", param=where)
        elif part.type == "input_image":
            if part.file_id is not None:
                raise RequestError("Images by `file_id` are not supported: this server stores no files. Send the "
                                   "image as `image_url` (a data: URL).", param=f"{where}.file_id")
            if not part.image_url:
                raise RequestError("An `input_image` part needs `image_url`", param=f"{where}.image_url")
            parts.append(image_part(ImageInput(where, url=part.image_url)))
        else:
            raise RequestError(f"Content of type {part.type!r} is not supported: this server takes text and images.",
                               param=f"{where}.type")
    return parts if with_images else "\n".join(part["text"] for part in parts)


def _refuse_chat(req: p.ChatCompletionRequest) -> ApiError | None:
    if req.functions or req.function_call is not None:
        return errors.unsupported("functions", "The deprecated `functions` / `function_call` (use `tools`)")
    if req.audio is not None or (req.modalities and "audio" in req.modalities):
        return errors.unsupported("modalities", "Audio output")
    if req.prediction is not None:
        return errors.unsupported("prediction", "Predicted outputs")
    return None


def _sampling(req, vocab_size: int, *, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
    """The sampling fields every OpenAI endpoint shares (extensions included when the request has them)."""
    get = lambda name, default: default if getattr(req, name, None) is None else getattr(req, name)  # noqa: E731
    return SamplingParams(
        n=get("n", 1), max_tokens=max_tokens, min_tokens=get("min_tokens", 0),
        temperature=get("temperature", 1.0), top_p=get("top_p", 1.0), top_k=get("top_k", 0), min_p=get("min_p", 0.0),
        presence_penalty=get("presence_penalty", 0.0), frequency_penalty=get("frequency_penalty", 0.0),
        repetition_penalty=get("repetition_penalty", 1.0), seed=get("seed", None), stop=parse_stop(get("stop", None)),
        stop_token_ids=list(get("stop_token_ids", [])),
        include_stop_str_in_output=get("include_stop_str_in_output", False), ignore_eos=get("ignore_eos", False),
        logprobs=logprobs, skip_special_tokens=get("skip_special_tokens", True),
        logit_bias=parse_logit_bias(get("logit_bias", None), vocab_size))


def _function(fn: p.FunctionDefinition) -> dict:
    return _drop_none({"name": fn.name, "description": fn.description, "parameters": fn.parameters})


def _drop_none(d: dict) -> dict:
    return {k: v for k, v in d.items() if v is not None}
