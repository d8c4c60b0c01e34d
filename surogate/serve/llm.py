"""LLM: the generation API of one served model, for every caller (the gateway, the TUI, the
benchmarks, GRPO rollouts).

In: a prompt as token ids, text, or chat messages (``render``: the chat template with tools and
thinking controls), and one ``SamplingParams`` per prompt. ``submit`` fans each prompt out into
``n`` engine requests (the seed offset by the answer's index, so the answers differ), all
submitted before it returns (so an engine that refuses one is an error at the call, with the
others aborted), and returns a ``Generation``: the merged stream of their outputs.

Out: ``RequestOutput``s, each filled in by its answer's ``OutputProcessor`` (detokenization, stop
strings, reasoning and tool-call parsers) in the engine client's poller thread, one engine step's
outputs at a time; ``index`` says which answer (prompt * n + answer). A stop string the engine
cannot see aborts its engine request there and then. Read a Generation with ``async for`` or
``for`` (one output at a time), ``next_batch`` (everything that arrived: one wake-up per engine
step however many answers stream), or ``result`` (each answer summed into one output).
Leaving early (``close``, the ``with`` block, the client gone) aborts what still runs.

Images (a model with an ``ImageEncoder``, serve.multimodal): ``render`` expands each image's
placeholder into the model's image tokens before tokenizing (the ids, and so every count of
prompt tokens, are the HF processor's); ``embed`` encodes the images into the prompt's
``EmbedSpan``s (blocking: the gateway calls it in a worker thread), which ``submit`` does itself
for a prompt not embedded yet (or embedded for another projector). Videos (``render(...,
videos=)``, a model whose family reads them) the same way. A request of a LoRA adapter that
trained the projector (train_projector) has its images encoded through that projector
(``embed(prompt, adapter=)``; serve.multimodal keeps its rows apart from everyone else's).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

import msgspec

from surogate.errors import InvalidArgumentError
from surogate.io import Tokenizer
from surogate.serve.engine_client import EngineClient, OutputStream
from surogate.serve.frontend import OutputProcessor, Prompt, RequestError, encode_prompt, render_chat, template_kwargs
from surogate.serve.multimodal import ImageEncoder
from surogate.serve.parsers import ForcedTools, OfferedTools, ParserChoice, make_output_parser, resolve_parsers
from surogate.serve.structured import Grammars
from surogate.serve.types import EmbedSpan, RequestOutput, SamplingParams

PromptInput = Prompt | str | Sequence[int]


class LLM:
    """A model's tokenizer, chat template and output parsers around its engine client.
    ``client`` None: not attached yet (a model still loading); rendering and tokenizing work,
    ``submit`` does not."""

    def __init__(self, client: EngineClient | None, tokenizer: Tokenizer | None, *,
                 parsers: ParserChoice | None = None, max_model_len: int | None = None,
                 template_defaults: Mapping[str, Any] | None = None, chat_template: str | None = None,
                 image_placeholder: str | None = None, images: ImageEncoder | None = None):
        self.client = client
        self.tokenizer = tokenizer
        self.parsers = parsers or ParserChoice()
        self.max_model_len = max_model_len if max_model_len is not None else client.max_model_len
        self.template_defaults = dict(template_defaults or {})  # like vLLM's --default-chat-template-kwargs
        self.chat_template = chat_template  # a template name or text; None: the model's own
        self.images = images  # the model's image path (expand, encode); None: images are refused at submit
        if images is not None and image_placeholder is None:
            image_placeholder = images.placeholder
        self.image_placeholder = image_placeholder  # what the template writes per image; None: takes no images
        self.queued: set = set()  # one entry per engine request submitted with no output yet (admission reads it)
        self._grammars: Grammars | None = None

    @property
    def grammars(self) -> Grammars:
        """Structured outputs' grammar compiler for this model (its tokenizer built on first use)."""
        if self._grammars is None:
            if self.tokenizer is None:
                raise InvalidArgumentError("structured outputs need the model's tokenizer; this LLM has none",
                                           hint="build the LLM with the model's tokenizer")
            self._grammars = Grammars(self.tokenizer, self.client.vocab_size if self.client is not None else None)
        return self._grammars

    @property
    def video_placeholder(self) -> str | None:
        """What the template writes per video; None: the model takes no videos."""
        return self.images.video_placeholder if self.images is not None else None

    @property
    def accepts_videos(self) -> bool:
        return self.video_placeholder is not None

    @property
    def accepts_images(self) -> bool:
        """The model reads images (it has a vision encoder and its template writes a placeholder per image)."""
        return self.image_placeholder is not None

    @classmethod
    def for_model(cls, client: EngineClient | None, tokenizer: Tokenizer, max_model_len: int, *,
                  model_type: str | None = None, reasoning_parser: str = "auto", tool_parser: str = "auto",
                  **kw) -> LLM:
        """Parsers detected from the tokenizer's chat template (or named: ``hermes``, ``none``, ...)."""
        parsers = resolve_parsers(tokenizer.chat_template, model_type, reasoning=reasoning_parser, tool=tool_parser)
        return cls(client, tokenizer, parsers=parsers, max_model_len=max_model_len, **kw)

    # -- in --

    def encode(self, prompt: PromptInput, *, add_special_tokens: bool = True, param: str = "prompt") -> Prompt:
        """A completion prompt: text (tokenized) or token ids (checked against the vocabulary)."""
        if isinstance(prompt, Prompt):
            return prompt
        if self.tokenizer is None:
            if isinstance(prompt, str):
                raise InvalidArgumentError("this LLM has no tokenizer: a prompt must be token ids",
                                           hint="pass token ids, or build the LLM with the model's tokenizer")
            return Prompt(list(prompt))
        return encode_prompt(self.tokenizer, prompt, add_special_tokens=add_special_tokens, param=param)

    def render(self, messages: Sequence[Mapping], tools: Sequence[Mapping] | None = None, *,
               enable_thinking: bool | None = None, reasoning_effort: str | None = None,
               chat_template_kwargs: Mapping[str, Any] | None = None, add_generation_prompt: bool = True,
               continue_final_message: bool = False, documents: Sequence[Mapping] | None = None,
               images: Sequence[Any] = (), videos: Sequence[Any] = ()) -> Prompt:
        """Chat messages (template format) through the model's chat template, with the thinking
        controls (``frontend.template_kwargs``' precedence) over the model's template defaults.
        ``images``: one decoded image per ``{"type": "image"}`` part, in order (serve.multimodal);
        ``videos``: one surogate.io.videos.Video per ``{"type": "video"}`` part."""
        kwargs = template_kwargs(self.template_defaults, chat_template_kwargs=chat_template_kwargs,
                                 enable_thinking=enable_thinking, reasoning_effort=reasoning_effort)
        return render_chat(self.tokenizer, messages, tools, kwargs=kwargs, add_generation_prompt=add_generation_prompt,
                           continue_final_message=continue_final_message, chat_template=self.chat_template,
                           documents=documents, images=images, image_placeholder=self.image_placeholder,
                           expand_images=self.images.expand if self.images is not None else None,
                           videos=videos, video_placeholder=self.video_placeholder,
                           expand_videos=self.images.expand_videos if self.accepts_videos else None)

    def embed(self, prompt: Prompt, adapter: str | int | None = None) -> Prompt:
        """``prompt`` with its images' EmbedSpans (encoded, or from the encoder's cache) for the
        base model or ``adapter`` (a served adapter's name or slot: its projector, when it trained
        one); blocking. A prompt without images is checked to hold no image tokens and returned as
        it is."""
        if self.images is None:
            if prompt.images or prompt.videos:
                raise InvalidArgumentError(f"this prompt holds {'images' if prompt.images else 'videos'}, and this "
                                           "model takes none (it has no image encoder)",
                                           hint="send text only, or serve a vision model")
            return prompt
        if prompt.videos and not self.accepts_videos:
            raise InvalidArgumentError("this prompt holds videos, and this model takes none",
                                       hint="send images or text only, or serve a model that reads videos (Qwen3-VL)")
        if not prompt.images and not prompt.videos:
            if self.images.prompt.image_token_id in prompt.token_ids:
                raise RequestError(f"the prompt holds the image token (id {self.images.prompt.image_token_id}) "
                                   "but no image",
                                   hint="send the image as an image part; do not write the image token in the text")
            return prompt
        slot = self.client.adapter_slot(adapter) if adapter is not None and self.client is not None else -1
        projector = self.images.projector_for(slot)
        if prompt.embeds and prompt.embeds_for == projector:
            return prompt
        with self.weights_held():  # the weights stay while the tower runs: a sleep waits for it
            spans = self.images.spans(prompt.token_ids, prompt.images, prompt.videos, adapter=projector)
        return msgspec.structs.replace(prompt, embeds=spans, embeds_for=projector)

    def weights_held(self) -> contextlib.AbstractContextManager:
        """The engine's ``EngineClient.weights_held``: inside it a sleep (``release``) waits and
        ``idle`` is False (an image encode; the gateway's admission from the encode to the submit).
        A no-op without an engine (or with a test's stand-in for one)."""
        held = getattr(self.client, "weights_held", None)
        return held() if held is not None else contextlib.nullcontext()

    # -- run --

    def submit(self, prompts: PromptInput | Sequence[PromptInput], params: SamplingParams | Sequence[SamplingParams]
               | None = None, *, adapter: str | int | None = None, tools: bool | OfferedTools | ForcedTools = False,
               max_tool_calls: int | None = None, reasoning: bool = True,
               embeds: Sequence[EmbedSpan] | Sequence[Sequence[EmbedSpan]] = ()) -> Generation:
        """Start generating: ``params`` is one SamplingParams for all prompts or one per prompt.
        ``tools``: the prompt offered tools, so tool calls are parsed; ``reasoning``: parse
        reasoning (``<think>``) when the model has a reasoning parser. ``embeds``: EmbedSpans of
        the prompt (image features at its placeholder tokens), or one sequence of them per prompt."""
        if self.client is None:
            raise InvalidArgumentError("this model has no engine yet (it is loading)", hint="retry once it has loaded")
        many = isinstance(prompts, Sequence) and not isinstance(prompts, str) and bool(prompts) \
            and not isinstance(prompts[0], int)
        items = [self.encode(p) for p in (prompts if many else [prompts])]
        if params is None or isinstance(params, SamplingParams):
            per_prompt = [params or SamplingParams()] * len(items)
        else:
            per_prompt = list(params)
            if len(per_prompt) != len(items):
                raise InvalidArgumentError(f"{len(per_prompt)} SamplingParams for {len(items)} prompts",
                                           hint="pass one SamplingParams, or one per prompt")
        spans = list(embeds)
        if spans and isinstance(spans[0], EmbedSpan):
            spans = [spans]
        if spans and len(spans) != len(items):
            raise InvalidArgumentError(f"embeds for {len(spans)} prompts, but {len(items)} prompts",
                                       hint="pass one sequence of EmbedSpan per prompt")
        if spans and any(p.images or p.videos for p in items):
            raise InvalidArgumentError("embeds given for prompts whose images give their own",
                                       hint="pass images in the prompt, or embeds, not both")
        if not spans:  # the prompts' own images (encoded here unless LLM.embed did it before)
            items = [self.embed(p, adapter) for p in items]
            spans = [p.embeds for p in items]
        requests, processors = [], []
        for prompt, p, prompt_embeds in zip(items, per_prompt, spans):
            p = self._reasoning_budget(prompt, p) if reasoning else msgspec.structs.replace(p, max_reasoning_tokens=None)
            grammar = self.grammars.compile(p.structured_outputs) if p.structured_outputs is not None else None
            for i in range(p.n):
                # the engine's copy: one sequence, its own seed; stop strings stay with the processor
                one = msgspec.structs.replace(p, n=1, seed=None if p.seed is None else p.seed + i, stop=[])
                requests.append((prompt.token_ids, one, None if grammar is None else self.grammars.matcher(grammar),
                                 tuple(prompt_embeds)))
                parser = make_output_parser(self.parsers, prompt.text, tools=tools, reasoning=reasoning,
                                            max_tool_calls=max_tool_calls) if p.detokenize else None
                processors.append(OutputProcessor(self.tokenizer, p, parser))
        return Generation(self, requests, processors, adapter)

    def _reasoning_budget(self, prompt: Prompt, p: SamplingParams) -> SamplingParams:
        """``max_reasoning_tokens`` in the engine's terms: the model's reasoning tags as token ids
        and whether the prompt opened the span. Dropped where there is no span to cap: the model
        has no reasoning parser, or the prompt closed the span (thinking off)."""
        if p.max_reasoning_tokens is None:
            return p
        parser = make_output_parser(self.parsers, prompt.text, tools=False) if self.parsers.reasoning else None
        r = parser.reasoning if parser is not None else None
        start_tag, end_tag = getattr(r, "start_tag", None), getattr(r, "end_tag", None)
        state = getattr(r, "state", None)
        if self.tokenizer is None or start_tag is None or state == "content":
            return msgspec.structs.replace(p, max_reasoning_tokens=None)
        start, end = self.tokenizer.token_to_id(start_tag), self.tokenizer.token_to_id(end_tag)
        if start is None or end is None:
            raise InvalidArgumentError(f"this model's reasoning tags {start_tag!r} / {end_tag!r} are not single tokens, "
                                       "so a reasoning budget (max_reasoning_tokens) cannot end the span",
                                       hint="leave max_reasoning_tokens (thinking.budget_tokens) unset for this model")
        # The templates write the reasoning then "\n</think>": close a cut-off span the same way.
        newline = self.tokenizer.encode("\n", add_special_tokens=False)
        return msgspec.structs.replace(p, reasoning_start_token_id=start, reasoning_end_token_id=end,
                                       reasoning_started=state == "reasoning", reasoning_end_ids=[*newline, end])

    def generate(self, prompts: PromptInput | Sequence[PromptInput], params: SamplingParams | Sequence[SamplingParams]
                 | None = None, **kw) -> list[RequestOutput]:
        """Blocking: each answer in full, in order (prompt * n + answer)."""
        with self.submit(prompts, params, **kw) as gen:
            return gen.result()

    def chat(self, messages: Sequence[Mapping], params: SamplingParams | None = None, *,
             tools: Sequence[Mapping] | None = None, adapter: str | int | None = None, **render_kw) -> Generation:
        """``render`` + ``submit``: the conversation's answers, tool calls parsed when tools are offered."""
        offered = OfferedTools({f.get("name", ""): f.get("parameters") or {} for f in
                                (t.get("function", t) for t in tools)}) if tools else False
        return self.submit(self.render(messages, tools, **render_kw), params, adapter=adapter, tools=offered)


class Generation:
    """The answers of one ``LLM.submit``, as one stream. ``processors[i]`` holds answer i's
    totals once it ends (``num_tokens``, ``reasoning_tokens``, ``finish_reason``, ``stop_reason``)."""

    def __init__(self, llm: LLM, requests: list[tuple[list[int], SamplingParams, Any, tuple[EmbedSpan, ...]]],
                 processors: list[OutputProcessor], adapter: str | int | None):
        self.client = client = llm.client
        self.processors = processors
        self.request_ids: list = []
        self._queued = llm.queued  # holds (self, answer index) until the answer's first output
        self._live: set = set()  # engine requests neither finished nor aborted
        self._unread = len(processors)  # answers whose last output the consumer has not taken yet
        self._stream = OutputStream(self._process)
        try:
            for i, (prompt_ids, params, matcher, embeds) in enumerate(requests):
                self._queued.add((self, i))  # before submit: its first output may come at once
                extra = {} if matcher is None else {"matcher": matcher}  # stand-in clients take neither
                if embeds:
                    extra["embeds"] = embeds
                rid = client.submit(prompt_ids, params, adapter, stream=self._stream, index=i, **extra)
                self._live.add(rid)
                self.request_ids.append(rid)
        except BaseException:
            self.close()
            raise

    @property
    def done(self) -> bool:
        """Every answer's last output was read."""
        return self._unread == 0

    # -- the poller's side: one engine step's outputs for this generation --

    def _process(self, outs: list[RequestOutput]) -> list[RequestOutput]:
        keep = []
        for out in outs:
            rid, i = out.request_id, out.index
            proc = self.processors[i]
            if proc.num_tokens == 0:
                self._queued.discard((self, i))
            if not proc.process(out):
                continue
            keep.append(out)
            if proc.finished:
                self._live.discard(rid)
                self._queued.discard((self, i))
                if proc.stopped_by_string:  # the engine knows only stop tokens: it would go on
                    self.client.abort(rid)
                self.client.forget(rid)
        return keep

    # -- the consumer's side --

    async def next_batch(self, timeout: float | None = None) -> list[RequestOutput]:
        """Every output that arrived since the last call, waiting for the next engine step's when
        none has; [] once ``timeout`` seconds pass without one, or when ``done``."""
        if self._unread == 0:
            return []
        return self._read(await self._stream.take(timeout))

    def next_batch_sync(self, timeout: float | None = None) -> list[RequestOutput]:
        if self._unread == 0:
            return []
        return self._read(self._stream.take_sync(timeout))

    def _read(self, outs: list[RequestOutput]) -> list[RequestOutput]:
        for out in outs:
            if out.finish_reason is not None:  # each answer's last (process drops anything after it)
                self._unread -= 1
        return outs

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        while not self.done:
            for out in await self.next_batch():
                yield out

    def __iter__(self) -> Iterator[RequestOutput]:
        while not self.done:
            yield from self.next_batch_sync()

    def result(self, timeout: float | None = None) -> list[RequestOutput]:
        """Blocking: each answer's outputs summed into one, in answer order."""
        answers: list[RequestOutput | None] = [None] * len(self.processors)
        while not self.done:
            outs = self.next_batch_sync(timeout)
            if not outs and not self.done:
                raise TimeoutError(f"no engine output within {timeout} s")
            for out in outs:
                if answers[out.index] is None:
                    answers[out.index] = out
                else:
                    answers[out.index].merge(out)
        return answers

    def abort(self) -> None:
        """Abort every engine request still running; each answer still ends, with reason "abort"
        (drain the stream to read it). Idempotent."""
        live, self._live = list(self._live), set()
        for rid in live:
            self.client.abort(rid)
        for i in range(len(self.processors)):  # an aborted request waits for nothing
            self._queued.discard((self, i))

    def close(self) -> None:
        """The consumer is gone: abort what still runs and drop the outputs still to come."""
        self.abort()
        for rid in self.request_ids:
            self.client.forget(rid)

    def __enter__(self) -> Generation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Generation:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
