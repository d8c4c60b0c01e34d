"""POST /tokenize and /detokenize, in vLLM's shapes (OpenAI error envelope).

``/tokenize`` takes a ``prompt`` (encoded as a completion prompt would be) or chat ``messages``
(rendered by the chat template, ``tools`` and ``chat_template_kwargs`` included, exactly as
/v1/chat/completions would), and answers the ids, their count and the context length.
"""

from __future__ import annotations

from typing import Any

from msgspec import UNSET, Struct, UnsetType

from surogate.serve.frontend import RequestError

from . import errors
from .context import RequestContext
from .errors import ApiError
from .http import JSONReply
from .media import converted, load_media
from .openai import convert
from .openai import protocol as p
from .serving import Gateway


class TokenizeRequest(Struct, kw_only=True):
    model: str
    prompt: str | None = None
    messages: list[p.ChatMessage] | None = None
    add_special_tokens: bool | None = None  # default: true for a prompt, false for messages (the template adds them)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[p.ChatTool] | None = None
    return_token_strs: bool = False


class TokenizeResponse(Struct, kw_only=True):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | UnsetType = UNSET


class DetokenizeRequest(Struct, kw_only=True):
    model: str
    tokens: list[int]


class DetokenizeResponse(Struct, kw_only=True):
    prompt: str


async def tokenize(gw: Gateway, ctx: RequestContext, req: TokenizeRequest) -> JSONReply | ApiError:
    found = gw.find(req.model)
    if isinstance(found, ApiError):
        return found
    model, _ = found
    ctx.model = req.model
    if (req.prompt is None) == (req.messages is None):
        return errors.invalid("Send exactly one of `prompt` and `messages`", param="prompt")
    tok = model.tokenizer
    try:
        if req.prompt is not None:
            ids = model.llm.encode(req.prompt, add_special_tokens=req.add_special_tokens is not False).token_ids
        else:
            tools = [{"type": "function", "function": convert._function(t.function)} for t in req.tools or []]
            messages = convert.chat_messages(req.messages)
            images, videos = await converted(load_media, model, messages, gw.config,
                                             images=convert.chat_has_media(req.messages))
            ids = model.llm.render(messages, tools or None, chat_template_kwargs=req.chat_template_kwargs,
                                   add_generation_prompt=req.add_generation_prompt and not req.continue_final_message,
                                   continue_final_message=req.continue_final_message, images=images,
                                   videos=videos).token_ids
    except RequestError as e:
        return errors.from_exception(e)
    strs = [tok.id_to_token(i) or "" for i in ids] if req.return_token_strs else UNSET
    return JSONReply(TokenizeResponse(count=len(ids), max_model_len=model.max_model_len, tokens=ids, token_strs=strs))


async def detokenize(gw: Gateway, ctx: RequestContext, req: DetokenizeRequest) -> JSONReply | ApiError:
    found = gw.find(req.model)
    if isinstance(found, ApiError):
        return found
    model, _ = found
    ctx.model = req.model
    try:
        ids = model.llm.encode(req.tokens, param="tokens").token_ids if req.tokens else []
    except RequestError as e:
        return errors.from_exception(e)
    return JSONReply(DetokenizeResponse(prompt=model.tokenizer.decode(ids)))
