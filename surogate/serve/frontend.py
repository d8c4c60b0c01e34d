"""The serving frontend: requests become prompt ids and sampling parameters; token ids become text.

In: an API layer (surogate.gateway) maps each API's request onto the neutral pieces here
(template-format messages and tools, ``SamplingParams``); this module renders the chat template
with the thinking controls, tokenizes, and checks the numbers against the model (context length,
logprob and ``n`` limits), raising ``RequestError`` naming the API's own field.

Out: ``OutputProcessor`` fills one answer's engine outputs (``RequestOutput``: new token ids,
logprobs, finish reason) with their text, in place: incremental detokenization, stop strings
held back and cut, then the reasoning and tool-call parsers. It is the same pipeline for
streaming and non-streaming answers; a non-streaming answer is the sum of its outputs. The
generation API (surogate.serve.llm) runs one per answer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from surogate.errors import InvalidArgumentError
from surogate.io import Tokenizer
from surogate.serve.detokenizer import IncrementalDetokenizer
from surogate.serve.multimodal import check_rendered_images, check_rendered_videos, count_image_parts
from surogate.serve.parsers import OutputParser
from surogate.serve.stop import StopMatcher
from surogate.serve.types import RequestOutput, SamplingParams, TokenLogprob


class RequestError(InvalidArgumentError):
    """A request the model cannot serve as asked. ``param`` is the request field, in the API's spelling."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.param = param
        self.code = code


# -- requests -------------------------------------------------------------------------------------

class Prompt(msgspec.Struct):
    token_ids: list[int]
    text: str | None = None  # the rendered text, when it came from text (the reasoning parser reads its end)
    images: list[Any] = []  # PIL images, one per image placeholder in the text, in order (serve.multimodal)
    embeds: list[Any] = []  # the images' (and videos') EmbedSpans, once encoded (LLM.embed); empty: not yet
    videos: list[Any] = []  # surogate.io.videos.Video, one per video placeholder in the text, in order
    embeds_for: int = -1  # the adapter slot whose projector made ``embeds`` (-1: the model's own)


class Limits(msgspec.Struct, frozen=True):
    max_model_len: int
    max_logprobs: int = 20
    max_n: int = 16
    max_stop: int = 16
    vocab_size: int | None = None  # the tokenizer's: stop_token_ids must be token ids


def check_sampling(opts: SamplingParams, limits: Limits, names: Mapping[str, str] | None = None) -> None:
    """Ranges, in the API's field names (``names`` maps ours to theirs)."""
    names = names or {}

    def need(ok: bool, field: str, what: str) -> None:
        if not ok:
            name = names.get(field, field)
            raise RequestError(f"`{name}` {what}", param=name)

    need(1 <= opts.n <= limits.max_n, "n", f"must be between 1 and {limits.max_n}, got {opts.n}")
    need(opts.max_tokens is None or opts.max_tokens >= 1, "max_tokens", f"must be at least 1, got {opts.max_tokens}")
    need(opts.min_tokens >= 0, "min_tokens", "must not be negative")
    need(opts.max_tokens is None or opts.min_tokens <= opts.max_tokens, "min_tokens",
         "must not exceed the maximum number of tokens")
    need(opts.temperature >= 0, "temperature", f"must be at least 0, got {opts.temperature}")
    # the engine samples in float32: a positive double below its smallest normal is a 0 there
    need(1.1754944e-38 <= opts.top_p <= 1, "top_p", f"must be in (0, 1], got {opts.top_p}")
    need(opts.top_k >= -1, "top_k", f"must be -1 (off), 0 (off) or positive, got {opts.top_k}")
    need(0 <= opts.min_p <= 1, "min_p", f"must be in [0, 1], got {opts.min_p}")
    need(-2 <= opts.presence_penalty <= 2, "presence_penalty", f"must be in [-2, 2], got {opts.presence_penalty}")
    need(-2 <= opts.frequency_penalty <= 2, "frequency_penalty", f"must be in [-2, 2], got {opts.frequency_penalty}")
    need(opts.repetition_penalty > 0, "repetition_penalty", f"must be positive, got {opts.repetition_penalty}")
    need(len(opts.stop) <= limits.max_stop, "stop", f"takes at most {limits.max_stop} strings")
    if limits.vocab_size is not None:
        bad = next((t for t in opts.stop_token_ids if not 0 <= t < limits.vocab_size), None)
        need(bad is None, "stop_token_ids", f"holds {bad}, which is not a token id (0..{limits.vocab_size - 1})")
    for field in ("logprobs", "prompt_logprobs"):
        value = getattr(opts, field)
        need(value is None or 0 <= value <= limits.max_logprobs, field,
             f"must be between 0 and {limits.max_logprobs}, got {value}")


def fit_to_context(opts: SamplingParams, prompt_len: int, limits: Limits, *, prompt_param: str,
                   max_tokens_param: str) -> SamplingParams:
    """Fill in ``max_tokens`` from the context left, or refuse a request that cannot fit."""
    room = limits.max_model_len - prompt_len
    if room <= 0:
        raise RequestError(f"This model's maximum context length is {limits.max_model_len} tokens. However, your "
                           f"prompt has {prompt_len} tokens. Please shorten it.",
                           param=prompt_param, code="context_length_exceeded")
    if opts.max_tokens is None:
        return msgspec.structs.replace(opts, max_tokens=room)
    if opts.max_tokens > room:
        raise RequestError(f"This model's maximum context length is {limits.max_model_len} tokens. However, you "
                           f"requested {prompt_len + opts.max_tokens} tokens ({prompt_len} in the prompt, "
                           f"{opts.max_tokens} for the completion). Please reduce `{max_tokens_param}` to at most "
                           f"{room}, or shorten the prompt.", param=max_tokens_param, code="context_length_exceeded")
    return opts


# reasoning_effort -> a reasoning budget in tokens (our mapping; OpenAI publishes none). "none"
# turns thinking off in the template instead; max_reasoning_tokens, when given, wins.
REASONING_EFFORT_BUDGETS = {"minimal": 256, "low": 1024, "medium": 4096, "high": 16384}


def reasoning_budget(reasoning_effort: str | None, max_reasoning_tokens: int | None = None) -> int | None:
    """The reasoning span's token budget for a request; None = unlimited."""
    if max_reasoning_tokens is not None:
        if max_reasoning_tokens < 0:
            raise RequestError(f"`max_reasoning_tokens` is {max_reasoning_tokens}; use a count >= 0",
                               param="max_reasoning_tokens")
        return max_reasoning_tokens
    return REASONING_EFFORT_BUDGETS.get(reasoning_effort or "")


def template_kwargs(defaults: Mapping[str, Any] | None = None, *, chat_template_kwargs: Mapping[str, Any] | None = None,
                    enable_thinking: bool | None = None, reasoning_effort: str | None = None) -> dict[str, Any]:
    """The variables a chat template sees for the thinking controls. ``reasoning_effort`` reaches
    the template as is (gpt-oss and others read it) and ``"none"`` turns thinking off (llama.cpp's
    rule); an explicit ``enable_thinking`` (Anthropic's ``thinking``) wins over that, and
    ``chat_template_kwargs`` win over everything. ``thinking`` is set alongside ``enable_thinking``
    for the templates that read that name (Granite 3.2, DeepSeek-V3.1)."""
    kw = dict(defaults or {})
    if reasoning_effort is not None:
        kw["reasoning_effort"] = reasoning_effort
        if reasoning_effort == "none":
            kw["enable_thinking"] = kw["thinking"] = False
    if enable_thinking is not None:
        kw["enable_thinking"] = kw["thinking"] = enable_thinking
    kw.update(chat_template_kwargs or {})
    return kw


def render_chat(tokenizer: Tokenizer, messages: Sequence[Mapping], tools: Sequence[Mapping] | None = None, *,
                kwargs: Mapping[str, Any] | None = None, add_generation_prompt: bool = True,
                continue_final_message: bool = False, chat_template: str | None = None,
                documents: Sequence[Mapping] | None = None, images: Sequence[Any] = (),
                image_placeholder: str | None = None, expand_images=None, videos: Sequence[Any] = (),
                video_placeholder: str | None = None, expand_videos=None) -> Prompt:
    """The conversation through the model's chat template: prompt ids and text. Tool-call
    arguments given as JSON strings (the OpenAI wire form) become objects, which is what
    templates expect (``tool_call.arguments | tojson``). ``images``: one per ``{"type": "image"}``
    part, in order; the template must write one ``image_placeholder`` for each (serve.multimodal),
    which ``expand_images(text, images)`` turns into the model's image tokens before tokenizing;
    ``videos`` the same for ``{"type": "video"}`` parts (``video_placeholder``, ``expand_videos``)."""
    chat = [_template_message(m) for m in messages]
    try:
        text = tokenizer.apply_chat_template(
            chat, tools=list(tools) if tools else None, add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, tokenize=False, chat_template=chat_template,
            documents=documents, **dict(kwargs or {}))
    except InvalidArgumentError as e:
        raise RequestError(e.message, param="messages", hint=e.hint) from None
    check_rendered_images(text, count_image_parts(chat), len(images), image_placeholder)
    check_rendered_videos(text, count_image_parts(chat, "video"), len(videos), video_placeholder)
    if images and expand_images is not None:
        text = expand_images(text, images)
    if videos and expand_videos is not None:
        text = expand_videos(text, videos)
    return Prompt(tokenizer.encode(text, add_special_tokens=False), text, list(images), videos=list(videos))


def encode_prompt(tokenizer: Tokenizer, prompt: str | Sequence[int], *, add_special_tokens: bool = True,
                  param: str = "prompt") -> Prompt:
    """A completion prompt: text (tokenized) or token ids (checked against the vocabulary)."""
    if isinstance(prompt, str):
        ids, text = tokenizer.encode(prompt, add_special_tokens=add_special_tokens), prompt
    else:
        ids, text = list(prompt), None
        vocab = tokenizer.vocab_size
        bad = next((i for i in ids if not 0 <= i < vocab), None)
        if bad is not None:
            raise RequestError(f"token id {bad} is outside the vocabulary (0..{vocab - 1})", param=param)
    if not ids:  # "" with a tokenizer that adds no BOS: the engine needs at least one token
        raise RequestError("the prompt is empty: it needs at least one token", param=param)
    return Prompt(ids, text)


def _template_message(message: Mapping) -> dict:
    message = dict(message)
    calls = message.get("tool_calls")
    if calls:
        fixed = []
        for call in calls:
            call = dict(call)
            fn = call.get("function")
            if isinstance(fn, Mapping) and isinstance(fn.get("arguments"), str):
                try:
                    args = json.loads(fn["arguments"])
                except ValueError:
                    args = None
                if isinstance(args, dict):
                    call["function"] = {**fn, "arguments": args}
            fixed.append(call)
        message["tool_calls"] = fixed
    return message


# -- outputs --------------------------------------------------------------------------------------

def parser_token_ids(tokenizer: Tokenizer, parser: OutputParser | None) -> frozenset[int]:
    """The special tokens in the tags ``parser`` reads: they stay in the text it is fed."""
    if parser is None:
        return frozenset()
    special = tokenizer.special_ids
    return frozenset(i for tag in parser.tags for i in tokenizer.encode(tag, add_special_tokens=False) if i in special)


class OutputProcessor:
    """One answer's pipeline: detokenize, stop strings, parsers. ``process`` fills each engine
    output's text fields in place; when ``stopped_by_string`` turns true the engine request must
    be aborted (the engine knows only stop tokens). With ``detokenize=False`` only the finish
    reason is worked out (token ids in, token ids out)."""

    def __init__(self, tokenizer: Tokenizer | None, opts: SamplingParams, parser: OutputParser | None = None):
        self.tokenizer = tokenizer
        self.opts = opts
        self.parser = parser
        self.detokenize = opts.detokenize and tokenizer is not None
        self._detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=opts.skip_special_tokens,
                                             keep=parser_token_ids(tokenizer, parser)) if self.detokenize else None
        self._stop = StopMatcher(opts.stop if self.detokenize else (), opts.include_stop_str_in_output)
        self._stop_ids = frozenset(opts.stop_token_ids)
        eos = (tokenizer.eos_token_ids if tokenizer is not None else opts.eos_token_ids) if not opts.ignore_eos else ()
        self._end_ids = self._stop_ids | frozenset(eos)
        self._eos_ids = frozenset(eos)
        self.num_tokens = 0
        self.reasoning_tokens = 0
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def stopped_by_string(self) -> bool:
        return self._stop.matched is not None

    @property
    def num_tool_calls(self) -> int:
        return self.parser.num_tool_calls if self.parser is not None else 0

    def process(self, out: RequestOutput) -> bool:
        """Fill ``out``'s content, reasoning, tool calls, stop reason, token texts of its
        logprobs, and the answer's finish reason (stop | length | tool_calls | abort). False:
        the answer had already ended (outputs still in flight after a stop string), drop it."""
        if self.finish_reason is not None:
            return False
        ids = out.new_token_ids
        finish_reason = out.finish_reason
        if finish_reason == "error":  # the client sees an aborted answer; finish_message says why
            finish_reason = "abort"
        if self.parser is not None and self.parser.in_reasoning:
            self.reasoning_tokens += len(ids)
        self.num_tokens += len(ids)
        visible = ids
        if finish_reason == "stop" and ids and ids[-1] in self._end_ids:
            if ids[-1] in self._stop_ids and ids[-1] not in self._eos_ids:
                out.stop_reason = ids[-1]
            if not self.opts.include_stop_str_in_output:
                visible = ids[:-1]
        if self._detok is not None:
            tok = self.tokenizer
            if out.logprobs is not None:
                decode_logprobs(tok, out.logprobs)
            if out.prompt_logprobs is not None:
                decode_logprobs(tok, out.prompt_logprobs)
            # Several tokens in one output (a speculative step's accepted run) and stop strings to
            # watch: one token at a time, so the answer ends at the token that completes the string
            # (the tokens after it are not the answer's, nor counted), as plain decoding ends there.
            pieces = [[t] for t in visible] if self._stop.stop and len(visible) > 1 else [visible]
            text, used = "", 0
            for k, piece in enumerate(pieces):
                delta = self._detok.push(piece)
                if finish_reason is not None and k == len(pieces) - 1:
                    delta += self._detok.flush()
                text += self._stop.push(delta)
                used += len(piece)
                if self._stop.matched is not None:
                    break
            if self._stop.matched is not None:
                finish_reason, out.stop_reason = "stop", self._stop.matched
                if used < len(ids):
                    self.num_tokens -= len(ids) - used
                    out.num_output_tokens -= len(ids) - used
                    out.new_token_ids = list(ids[:used])
                    if out.logprobs is not None:
                        out.logprobs = out.logprobs[:used]
            elif finish_reason is not None:
                text += self._stop.flush()
            if self.parser is None:
                out.content = text
            else:
                parsed = self.parser.feed(text) if text else None
                if finish_reason is not None:
                    tail = self.parser.finish()
                    if parsed is None:
                        parsed = tail
                    else:
                        parsed.extend(tail)
                if parsed is not None:
                    out.content, out.reasoning, out.tool_calls = parsed.content, parsed.reasoning, parsed.tool_calls
        if finish_reason is not None:
            if finish_reason == "stop" and self.num_tool_calls:
                finish_reason = "tool_calls"
            self.finish_reason = finish_reason
            self.stop_reason = out.stop_reason
        out.finish_reason = finish_reason
        return True

    def step(self, token_ids: Sequence[int], logprobs: list[TokenLogprob] | None = None,
             finish_reason: str | None = None) -> RequestOutput:
        """Feed token ids as the engine would (tests, replays): ``process`` on a RequestOutput
        made of them, which is returned (empty when dropped)."""
        ids = list(token_ids)
        out = RequestOutput(0, ids, logprobs, None, finish_reason, None, None, 0, 0, self.num_tokens + len(ids))
        self.process(out)
        return out


def decode_logprobs(tokenizer: Tokenizer, entries: Sequence[TokenLogprob | None]) -> Sequence[TokenLogprob | None]:
    """Fill in the text and bytes of each token and of its alternatives (``None`` entries, the
    prompt's first token, stay)."""
    for e in entries:
        if e is not None and e.bytes is None:
            e.token, e.bytes = token_text(tokenizer, e.token_id)
            for t in e.top:
                t.token, t.bytes = token_text(tokenizer, t.token_id)
    return entries


def token_text(tokenizer: Tokenizer, token_id: int) -> tuple[str, list[int]]:
    """A token's text and its UTF-8 bytes. A token that holds part of a character decodes to
    U+FFFD; its bytes then come from the byte-level vocabulary, so clients can join them."""
    text = tokenizer.decode([token_id])
    if "\ufffd" in text:
        piece = tokenizer.id_to_token(token_id) or ""
        if piece and all(c in _BYTE_DECODER for c in piece):
            return text, [_BYTE_DECODER[c] for c in piece]
    return text, list(text.encode("utf-8"))


def _bytes_to_unicode() -> dict[str, int]:
    # GPT-2's byte-level alphabet: printable bytes map to themselves, the rest to U+0100 onwards.
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + n)] = b
            n += 1
    return chars


_BYTE_DECODER = _bytes_to_unicode()
