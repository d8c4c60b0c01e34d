"""OpenAI streams: chat chunks, completion chunks, Responses events; and, from the same state,
the non-streaming objects (so a streamed answer and a plain one can never disagree).

Chat (serving-protocols.md §2.1), per choice: a role chunk (``{"role":"assistant","content":""}``),
then content / reasoning / tool-call chunks, then ``delta: {}`` with ``finish_reason``; with
``stream_options.include_usage`` every chunk carries ``usage: null`` and one last chunk has
``choices: []`` and the usage; then ``data: [DONE]``. A tool call's first delta carries
``index``, ``id``, ``type: "function"``, the name and ``arguments: ""``; later ones only the
index and an argument fragment.

Responses (§2.4): ``response.created``, ``response.in_progress``, then per output item
``output_item.added`` ... its deltas ... every ``*.done`` event ... ``output_item.done``, then
``response.completed`` (or ``response.incomplete`` at the token limit) whose ``output`` holds the
same items with the same ids. No ``[DONE]``.

The encoders take the generation API's ``RequestOutput``s (text already parsed); ids come from an ``Ids``.
"""

from __future__ import annotations

from collections.abc import Sequence

from surogate.serve.types import RequestOutput, TokenLogprob

from ..errors import ApiError, error_body
from ..sse import DONE, Ids, Template, data, event
from . import protocol as p


def chat_logprobs(entries: Sequence[TokenLogprob]) -> list[p.TokenLogprob]:
    return [p.TokenLogprob(e.token, e.bytes, e.logprob, [p.TopLogprob(t.token, t.bytes, t.logprob) for t in e.top])
            for e in entries]


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0, reasoning_tokens: int = 0) -> p.Usage:
    return p.Usage(completion_tokens=completion_tokens, prompt_tokens=prompt_tokens,
                   total_tokens=prompt_tokens + completion_tokens,
                   completion_tokens_details=p.CompletionTokensDetails(reasoning_tokens=reasoning_tokens),
                   prompt_tokens_details=p.PromptTokensDetails(cached_tokens=cached_tokens))


class _Choice:
    def __init__(self):
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, list] = {}  # parser index -> [id, name, [argument fragments]]
        self.logprobs: list[TokenLogprob] = []
        self.pending_logprobs: list[TokenLogprob] = []
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None


class ChatStream:
    """One chat completion: ``start()``, ``delta(i, d)`` per step, ``end(usage)``; or, without
    streaming, the same ``delta`` calls then ``completion(usage)``."""

    def __init__(self, *, id: str, created: int, model: str, n: int = 1, include_usage: bool = False,
                 reasoning_field: str = "reasoning_content", logprobs: bool = False, ids: Ids | None = None):
        self.id, self.created, self.model = id, created, model
        self.include_usage = include_usage
        self.reasoning_field = reasoning_field
        self.want_logprobs = logprobs
        self.ids = ids or Ids()
        self.choices = [_Choice() for _ in range(n)]
        self._templates: dict[tuple[str, int], Template | None] = {}  # (field, index) -> its chunk, prebuilt

    def _text_chunk(self, kind: str, index: int, text: str) -> bytes:
        """A content or reasoning chunk (no logprobs): the bytes of ``_chunk`` from a template
        built once per choice."""
        t = self._templates.get((kind, index), False)
        if t is False:
            delta = p.ChoiceDelta(content=Template.MARK) if kind == "content" else self._reasoning_delta(Template.MARK)
            t = self._templates[kind, index] = Template.build(self._struct(index, delta))
        if t is not None:
            return t.fill(text)
        return self._chunk(index, p.ChoiceDelta(content=text) if kind == "content" else self._reasoning_delta(text))

    def _struct(self, index: int, delta: p.ChoiceDelta, *, finish_reason=None, logprobs=None,
                stop_reason=p.UNSET) -> p.ChatCompletionChunk:
        choice = p.ChunkChoice(delta=delta, index=index, finish_reason=finish_reason, logprobs=logprobs,
                               stop_reason=stop_reason)
        return p.ChatCompletionChunk(id=self.id, choices=[choice], created=self.created, model=self.model,
                                     usage=None if self.include_usage else p.UNSET)

    def _chunk(self, index: int, delta: p.ChoiceDelta, *, finish_reason=None, logprobs=None, stop_reason=p.UNSET):
        return data(self._struct(index, delta, finish_reason=finish_reason, logprobs=logprobs, stop_reason=stop_reason))

    def start(self) -> bytes:
        return b"".join(self._chunk(i, p.ChoiceDelta(role="assistant", content=""))
                        for i in range(len(self.choices)))

    def delta(self, index: int, d: RequestOutput) -> bytes:
        c = self.choices[index]
        out = []
        if d.logprobs and self.want_logprobs:
            c.logprobs.extend(d.logprobs)
            c.pending_logprobs.extend(d.logprobs)
        if d.reasoning:
            c.reasoning.append(d.reasoning)
            out.append(self._text_chunk("reasoning", index, d.reasoning))
        if d.content:
            c.content.append(d.content)
            if self.want_logprobs:
                out.append(self._chunk(index, p.ChoiceDelta(content=d.content), logprobs=self._take_logprobs(c)))
            else:
                out.append(self._text_chunk("content", index, d.content))
        for call in d.tool_calls:
            out.append(self._chunk(index, p.ChoiceDelta(tool_calls=[self._call_delta(c, call)])))
        if d.finish_reason is not None:
            c.finish_reason, c.stop_reason = d.finish_reason, d.stop_reason
            out.append(self._chunk(index, p.ChoiceDelta(), finish_reason=d.finish_reason,
                                   logprobs=self._take_logprobs(c), stop_reason=d.stop_reason))
        return b"".join(out)

    def end(self, final_usage: p.Usage) -> bytes:
        tail = b""
        if self.include_usage:
            tail = data(p.ChatCompletionChunk(id=self.id, choices=[], created=self.created, model=self.model,
                                              usage=final_usage))
        return tail + DONE

    def error(self, err: ApiError) -> bytes:
        """An error after the 200 header: vLLM's shape, then [DONE] (the SDKs raise on it)."""
        return data(error_body(err, "openai")) + DONE

    def completion(self, final_usage: p.Usage) -> p.ChatCompletion:
        choices = []
        for i, c in enumerate(self.choices):
            calls = [p.ChoiceToolCall(id=cid, function=p.ChoiceToolCallFunction(name, "".join(args)))
                     for cid, name, args in (c.calls[k] for k in sorted(c.calls))]
            message = p.ChatCompletionMessage(content="".join(c.content) if c.content or not calls else None,
                                              tool_calls=calls or p.UNSET)
            if c.reasoning:
                self._set_reasoning(message, "".join(c.reasoning))
            logprobs = p.ChoiceLogprobs(content=chat_logprobs(c.logprobs)) if self.want_logprobs else None
            choices.append(p.ChatChoice(finish_reason=c.finish_reason, index=i, logprobs=logprobs, message=message,
                                        stop_reason=c.stop_reason))
        return p.ChatCompletion(id=self.id, choices=choices, created=self.created, model=self.model,
                                usage=final_usage)

    def _take_logprobs(self, c: _Choice) -> p.ChoiceLogprobs | None:
        if not self.want_logprobs:
            return None
        entries, c.pending_logprobs = c.pending_logprobs, []
        return p.ChoiceLogprobs(content=chat_logprobs(entries))

    def _reasoning_delta(self, text: str) -> p.ChoiceDelta:
        delta = p.ChoiceDelta()
        self._set_reasoning(delta, text)
        return delta

    def _set_reasoning(self, obj, text: str) -> None:
        if self.reasoning_field in ("reasoning_content", "both"):
            obj.reasoning_content = text
        if self.reasoning_field in ("reasoning", "both"):
            obj.reasoning = text

    def _call_delta(self, c: _Choice, call) -> p.DeltaToolCall:
        if call.name is not None:
            cid = self.ids.new("call_")
            c.calls[call.index] = [cid, call.name, []]
            return p.DeltaToolCall(index=call.index, id=cid, type="function",
                                   function=p.DeltaToolCallFunction(name=call.name, arguments=call.arguments))
        c.calls[call.index][2].append(call.arguments)
        return p.DeltaToolCall(index=call.index, function=p.DeltaToolCallFunction(arguments=call.arguments))


# -- completions ----------------------------------------------------------------------------------


def legacy_logprobs(entries: Sequence[TokenLogprob | None], offset: int) -> p.CompletionLogprobs:
    """The completions API's parallel lists; ``offset`` is where the first token's text starts."""
    tokens, token_logprobs, top, offsets = [], [], [], []
    for e in entries:
        offsets.append(offset)
        if e is None:  # the prompt's first token has no logprob
            tokens.append("")
            token_logprobs.append(None)
            top.append(None)
            continue
        tokens.append(e.token)
        token_logprobs.append(e.logprob)
        top.append({t.token: t.logprob for t in e.top} or None)
        offset += len(e.token)
    return p.CompletionLogprobs(text_offset=offsets, token_logprobs=token_logprobs, tokens=tokens, top_logprobs=top)


class _CompletionChoice:
    def __init__(self, prefix: str = "", prefix_logprobs: Sequence[TokenLogprob | None] = ()):
        self.text: list[str] = [prefix] if prefix else []
        self.logprobs: list[TokenLogprob | None] = list(prefix_logprobs)
        self.offset = 0  # text length already covered by emitted logprobs
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None


class CompletionStream:
    """One completions request (all prompts x n choices, indexed ``prompt * n + i``)."""

    def __init__(self, *, id: str, created: int, model: str, num_choices: int, include_usage: bool = False,
                 logprobs: bool = False):
        self.id, self.created, self.model = id, created, model
        self.include_usage = include_usage
        self.want_logprobs = logprobs
        self.choices = [_CompletionChoice() for _ in range(num_choices)]
        self._text_chunks: dict[int, Template | None] = {}  # index -> its plain text chunk, prebuilt

    def _text_chunk(self, index: int, text: str) -> bytes:
        """``_chunk(index, text)``'s bytes from a template built once per choice (most chunks)."""
        t = self._text_chunks.get(index, False)
        if t is False:
            t = self._text_chunks[index] = Template.build(self._struct(index, Template.MARK))
        return t.fill(text) if t is not None else self._chunk(index, text)

    def _struct(self, index: int, text: str, logprobs=None, finish_reason=None, stop_reason=p.UNSET) -> p.Completion:
        choice = p.CompletionChoice(finish_reason=finish_reason, index=index, logprobs=logprobs, text=text,
                                    stop_reason=stop_reason)
        return p.Completion(id=self.id, choices=[choice], created=self.created, model=self.model,
                            usage=None if self.include_usage else p.UNSET)

    def _chunk(self, index: int, text: str, logprobs=None, finish_reason=None, stop_reason=p.UNSET) -> bytes:
        return data(self._struct(index, text, logprobs, finish_reason, stop_reason))

    def echo(self, index: int, prompt_text: str, prompt_logprobs: Sequence[TokenLogprob | None] = ()) -> bytes:
        """The prompt itself first (``echo: true``), with its logprobs when asked."""
        c = self.choices[index]
        c.text.append(prompt_text)
        lp = self._logprobs(c, list(prompt_logprobs)) if self.want_logprobs and prompt_logprobs else None
        c.offset = len(prompt_text)  # the answer's offsets count from the end of the echoed prompt
        return self._chunk(index, prompt_text, lp) if prompt_text or lp else b""

    def delta(self, index: int, d: RequestOutput) -> bytes:
        c = self.choices[index]
        lp = self._logprobs(c, d.logprobs or []) if self.want_logprobs and d.logprobs else None
        out = b""
        if lp:
            c.text.append(d.content)
            out += self._chunk(index, d.content, lp)
        elif d.content:
            c.text.append(d.content)
            out += self._text_chunk(index, d.content)
        if d.finish_reason is not None:
            c.finish_reason, c.stop_reason = d.finish_reason, d.stop_reason
            out += self._chunk(index, "", finish_reason=d.finish_reason, stop_reason=d.stop_reason)
        return out

    def end(self, final_usage: p.Usage) -> bytes:
        tail = b""
        if self.include_usage:
            tail = data(p.Completion(id=self.id, choices=[], created=self.created, model=self.model,
                                     usage=final_usage))
        return tail + DONE

    def error(self, err: ApiError) -> bytes:
        return data(error_body(err, "openai")) + DONE

    def completion(self, final_usage: p.Usage) -> p.Completion:
        choices = [p.CompletionChoice(finish_reason=c.finish_reason, index=i,
                                      logprobs=legacy_logprobs(c.logprobs, 0) if self.want_logprobs else None,
                                      text="".join(c.text), stop_reason=c.stop_reason)
                   for i, c in enumerate(self.choices)]
        return p.Completion(id=self.id, choices=choices, created=self.created, model=self.model, usage=final_usage)

    def _logprobs(self, c: _CompletionChoice, entries: list) -> p.CompletionLogprobs:
        lp = legacy_logprobs(entries, c.offset)
        c.logprobs.extend(entries)
        c.offset += sum(len(e.token) for e in entries if e is not None)
        return lp


# -- responses ------------------------------------------------------------------------------------


class ResponsesStream:
    """One response: output items open and close as the answer moves from reasoning to text to
    tool calls; every item added is also done, with the same id, and ``response.completed``
    lists them all. With ``top_logprobs`` the text's token logprobs ride on each
    ``output_text.delta`` and are gathered on the finished ``output_text`` part."""

    def __init__(self, base: p.Response, ids: Ids | None = None):
        self.base = base
        self.ids = ids or Ids()
        self.seq = 0
        self.items: list[p.OutputItem] = []  # closed items, in output order
        self._open: p.OutputItem | None = None  # the item receiving deltas
        self._parts: list[str] = []  # the open item's text
        self._logprobs: list[p.TokenLogprob] = []  # the open message's token logprobs
        self._held: list[p.TokenLogprob] = []  # of tokens whose text the detokenizer still holds back

    def _event(self, cls, **fields) -> bytes:
        ev = cls(sequence_number=self.seq, **fields)
        self.seq += 1
        return event(ev.__struct_config__.tag, ev)

    def start(self) -> bytes:
        snapshot = self._response("in_progress", output=[])
        return (self._event(p.ResponseCreatedEvent, response=snapshot)
                + self._event(p.ResponseInProgressEvent, response=snapshot))

    def delta(self, d: RequestOutput) -> bytes:
        out = []
        if d.reasoning or d.tool_calls:
            self._held = []  # logprobs describe output_text only
        elif d.logprobs and not d.content:
            self._held.extend(chat_logprobs(d.logprobs))
        if d.reasoning:
            if not isinstance(self._open, p.ReasoningItem):
                out.append(self._close())
                item = p.ReasoningItem(id=self.ids.new("rs_"), content=[], status="in_progress")
                out.append(self._add(item))
                out.append(self._event(p.ContentPartAddedEvent, content_index=0, item_id=item.id,
                                       output_index=self._index(), part=p.ReasoningText(text="")))
            self._parts.append(d.reasoning)
            out.append(self._event(p.ReasoningTextDeltaEvent, content_index=0, delta=d.reasoning,
                                   item_id=self._open.id, output_index=self._index()))
        if d.content:
            if not isinstance(self._open, p.OutputMessage):
                out.append(self._close())
                item = p.OutputMessage(id=self.ids.new("msg_"), content=[], status="in_progress")
                out.append(self._add(item))
                out.append(self._event(p.ContentPartAddedEvent, content_index=0, item_id=item.id,
                                       output_index=self._index(), part=p.OutputText(text="")))
            self._parts.append(d.content)
            logprobs = self._held + (chat_logprobs(d.logprobs) if d.logprobs else [])
            self._held = []
            self._logprobs.extend(logprobs)
            out.append(self._event(p.OutputTextDeltaEvent, content_index=0, delta=d.content, item_id=self._open.id,
                                   logprobs=logprobs, output_index=self._index()))
        for call in d.tool_calls:
            if call.name is not None:
                out.append(self._close())
                item = p.FunctionToolCall(arguments="", call_id=self.ids.new("call_"), name=call.name,
                                          id=self.ids.new("fc_"), status="in_progress")
                out.append(self._add(item))
            if call.arguments:
                self._parts.append(call.arguments)
                out.append(self._event(p.FunctionCallArgumentsDeltaEvent, delta=call.arguments,
                                       item_id=self._open.id, output_index=self._index()))
        return b"".join(out)

    def end(self, status: str, final_usage: p.ResponseUsage, incomplete_reason: str | None = None) -> bytes:
        """``completed``, or ``incomplete`` with ``max_output_tokens`` as the reason."""
        out = self._close()
        response = self.response(status, final_usage, incomplete_reason)
        cls = p.ResponseCompletedEvent if status == "completed" else p.ResponseIncompleteEvent
        return out + self._event(cls, response=response)

    def error(self, err: ApiError) -> bytes:
        info = error_body(err, "openai").error
        return self._event(p.ResponseErrorEvent, code=info.code or info.type, message=info.message, param=info.param)

    def response(self, status: str, final_usage: p.ResponseUsage | None,
                 incomplete_reason: str | None = None) -> p.Response:
        self._close()
        return self._response(status, output=list(self.items), usage=final_usage,
                              incomplete_details=p.IncompleteDetails(reason=incomplete_reason)
                              if incomplete_reason else None)

    def _response(self, status: str, **fields) -> p.Response:
        base = {f: getattr(self.base, f) for f in self.base.__struct_fields__}
        return p.Response(**{**base, "status": status, **fields})

    def _index(self) -> int:
        return len(self.items)

    def _add(self, item) -> bytes:
        self._open, self._parts, self._logprobs = item, [], []
        return self._event(p.OutputItemAddedEvent, item=item, output_index=self._index())

    def _close(self) -> bytes:
        item = self._open
        if item is None:
            return b""
        text = "".join(self._parts)
        index = self._index()
        out = []
        if isinstance(item, p.ReasoningItem):
            done = p.ReasoningItem(id=item.id, content=[p.ReasoningText(text=text)], status="completed")
            out.append(self._event(p.ReasoningTextDoneEvent, content_index=0, item_id=item.id, output_index=index,
                                   text=text))
            out.append(self._event(p.ContentPartDoneEvent, content_index=0, item_id=item.id, output_index=index,
                                   part=p.ReasoningText(text=text)))
        elif isinstance(item, p.OutputMessage):
            part = p.OutputText(text=text, logprobs=self._logprobs)
            done = p.OutputMessage(id=item.id, content=[part], status="completed")
            out.append(self._event(p.OutputTextDoneEvent, content_index=0, item_id=item.id,
                                   logprobs=self._logprobs, output_index=index, text=text))
            out.append(self._event(p.ContentPartDoneEvent, content_index=0, item_id=item.id, output_index=index,
                                   part=part))
        else:
            done = p.FunctionToolCall(arguments=text, call_id=item.call_id, name=item.name, id=item.id,
                                      status="completed")
            out.append(self._event(p.FunctionCallArgumentsDoneEvent, arguments=text, item_id=item.id,
                                   output_index=index, name=item.name))
        out.append(self._event(p.OutputItemDoneEvent, item=done, output_index=index))
        self.items.append(done)
        self._open, self._parts, self._logprobs = None, [], []
        return b"".join(out)
