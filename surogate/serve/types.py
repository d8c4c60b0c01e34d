"""Serving's one vocabulary, from the engine to the wire: what a request asks for
(``SamplingParams``), what comes back for it (``RequestOutput``, with ``TokenLogprob``s), and the
engine's configuration and counters.

Field names and meanings follow vLLM's ``SamplingParams`` and the OpenAI API (see
``kernels_native/serve/sampling_params.h`` for the exact formulas). The native side reads
``SamplingParams`` and ``EngineConfig`` by attribute name and validates them; an out-of-range
value raises ``InvalidArgumentError`` naming the field. The fields it does not read (``n``, stop
strings, detokenization) are the generation API's (surogate.serve.llm): it fans ``n`` out into
one engine request per answer and applies stop strings to the text.

``structured_outputs`` (vLLM's name and fields) constrains the answer to a grammar: the engine
samples only tokens a matcher allows (surogate.serve.structured, through llguidance).
``max_reasoning_tokens`` caps a reasoning span (``<think>``): the generation API fills in the
model's reasoning tokens (the ``reasoning_*`` fields) from its reasoning parser.

``EmbedSpan``: embedding rows a request gives in place of some prompt tokens' embeddings (image
features at the image placeholders; vLLM's prompt embeddings), with the key the prefix cache knows
them by and whether the span's tokens attend to each other both ways (Gemma 3's images).
"""

from __future__ import annotations

import msgspec
import numpy as np

from surogate.serve.parsers.base import ToolCallDelta


class EmbedSpan(msgspec.Struct):
    """Rows (float32 [n, hidden_size]) that replace the first decoder layer's input at prompt
    positions ``start .. start + n - 1`` (after any embedding scale: the rows are used as they
    are). ``key`` names their content for the prefix cache (the same key = the same rows, e.g.
    ``surogate.io.images.image_hash``); empty: the rows' bytes are hashed instead.
    ``bidirectional``: the span's tokens also see its later tokens (Gemma 3's image tokens,
    transformers' token_type_ids mask); the engine then computes the span in one step.
    ``position_shift``: the rope position of every later token (the rest of the prompt, every
    generated token) moves by this (Qwen3-VL: an image advances MRoPE's position by max(h, w) /
    merge, not by its token count; transformers' rope_deltas); it is part of the prefix-cache key."""

    start: int
    rows: np.ndarray
    key: bytes = b""
    bidirectional: bool = False
    position_shift: int = 0


class StructuredOutputsParams(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """One of: a JSON schema (``json``, a dict or its text), any JSON object (``json_object``), a
    regular expression, one of several strings (``choice``), or a Lark grammar (``grammar``,
    llguidance's dialect; GBNF is accepted too). vLLM's ``structured_outputs`` extension."""

    json: dict | str | None = None
    json_object: bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None


class SamplingParams(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    n: int = 1  # answers per prompt: one engine request each, seeds offset by the answer's index
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 or -1 = off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0  # HF / vLLM, over prompt + output tokens
    presence_penalty: float = 0.0  # OpenAI, over output tokens
    frequency_penalty: float = 0.0  # OpenAI, over output tokens
    seed: int | None = None
    max_tokens: int | None = None  # None = up to the context limit
    min_tokens: int = 0
    stop: list[str] = msgspec.field(default_factory=list)  # stop strings: matched on the text, never shown
    stop_token_ids: list[int] = msgspec.field(default_factory=list)
    include_stop_str_in_output: bool = False
    eos_token_ids: list[int] = msgspec.field(default_factory=list)  # empty = the model's (EngineConfig)
    ignore_eos: bool = False
    logprobs: int | None = None  # top-N, 0..20; the chosen token's logprob is always included
    prompt_logprobs: int | None = None  # top-N, 0..20
    detokenize: bool = True  # False: token ids only (no text, no stop strings, no parsers)
    skip_special_tokens: bool = True
    logit_bias: dict[int, float] | None = None  # OpenAI: token id -> bias in [-100, 100], added to the logits
    structured_outputs: StructuredOutputsParams | None = None  # the answer follows this grammar
    max_reasoning_tokens: int | None = None  # reasoning span cap; None = none
    # The model's reasoning span, filled in by the generation API (LLM.submit) from its parser.
    reasoning_start_token_id: int | None = None
    reasoning_end_token_id: int | None = None
    reasoning_started: bool = False  # the prompt opened the span
    reasoning_end_ids: list[int] = msgspec.field(default_factory=list)  # forced when the budget runs out


# gc=False on the per-token outputs: made by the thousand a second and never part of a reference
# cycle (they hold ints, strings and lists of each other), so the collector need not track them,
# and their allocations do not trigger collections.
class TokenLogprob(msgspec.Struct, gc=False):
    """A token's raw model logprob (log_softmax of the logits, before penalties and temperature)
    and its rank (1 = most likely). For a sampled token, ``top`` holds the N most likely
    alternatives, most likely first (as TokenLogprobs whose own ``top`` is empty). ``token`` and
    ``bytes`` are its text and UTF-8 bytes, filled in by the generation API's detokenization."""

    token_id: int
    logprob: float
    rank: int
    top: list[TokenLogprob] = []
    token: str = ""
    bytes: list[int] | None = None

    @classmethod
    def from_native(cls, t: tuple) -> TokenLogprob:
        """``(token_id, logprob, rank, [(token_id, logprob), ...])`` as the engine sends it."""
        token_id, logprob, rank, top = t
        return cls(token_id, logprob, rank, [cls(tid, lp, i + 1) for i, (tid, lp) in enumerate(top)])


class RequestOutput(msgspec.Struct, gc=False):
    """What one engine step produced for one request. The first ten fields are the engine's (in
    the native tuple's order); the generation API fills the rest in place: which answer this is,
    the text this step added after detokenization, stop strings and the parsers, and why the
    answer ended. A finished answer's outputs summed (``merge``) are the whole answer."""

    request_id: int
    new_token_ids: list[int]  # a stop / eos token that finished the request is included
    logprobs: list[TokenLogprob] | None  # one per new token, when asked for
    prompt_logprobs: list[TokenLogprob | None] | None  # once; entry 0 (first prompt token) is None
    # None while running. The engine's: "stop", "length", "abort" or "error"; once through the
    # generation API: "stop" (EOS, a stop token or string), "length", "tool_calls" or "abort".
    finish_reason: str | None
    finish_message: str | None  # why, for "error" (and "length" at the context limit)
    stop_token_id: int | None  # the token that finished it with "stop"
    num_prompt_tokens: int
    num_cached_tokens: int  # prompt tokens served by the prefix cache
    num_output_tokens: int  # generated so far, these included
    index: int = 0  # the answer's place in its generation: prompt * n + answer
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallDelta] = []
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it (None for EOS)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def num_tokens(self) -> int:
        """Tokens this step generated."""
        return len(self.new_token_ids)

    @classmethod
    def from_native(cls, t: tuple) -> RequestOutput:
        out = cls(*t)
        if out.logprobs is not None:
            out.logprobs = [TokenLogprob.from_native(lp) for lp in out.logprobs]
        if out.prompt_logprobs is not None:
            out.prompt_logprobs = [None if lp is None else TokenLogprob.from_native(lp) for lp in out.prompt_logprobs]
        return out

    def merge(self, later: RequestOutput) -> None:
        """Add a later output of the same answer to this one (a non-streaming answer is the sum
        of its streamed outputs)."""
        self.new_token_ids.extend(later.new_token_ids)
        if later.logprobs is not None:
            self.logprobs = (self.logprobs or []) + later.logprobs
        if self.prompt_logprobs is None:
            self.prompt_logprobs = later.prompt_logprobs
        self.content += later.content
        self.reasoning += later.reasoning
        if later.tool_calls:
            self.tool_calls = self.tool_calls + later.tool_calls
        if later.finish_reason is not None:  # field by field: merge runs per output for a lagging stream
            self.finish_reason = later.finish_reason
        if later.finish_message is not None:
            self.finish_message = later.finish_message
        if later.stop_token_id is not None:
            self.stop_token_id = later.stop_token_id
        if later.stop_reason is not None:
            self.stop_reason = later.stop_reason
        self.num_output_tokens = later.num_output_tokens
        self.num_cached_tokens = max(self.num_cached_tokens, later.num_cached_tokens)


class EngineConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    num_blocks: int  # KV cache size in blocks; the runner allocates that memory
    block_size: int = 16
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 8192  # per-step token budget (chunked prefill)
    max_model_len: int | None = None  # prompt + output per request; None = the cache's capacity
    enable_prefix_caching: bool = True
    eos_token_ids: list[int] = msgspec.field(default_factory=list)  # the model's end tokens
    seed: int | None = None  # base of the seeds of unseeded requests; None = random
    # Speculative decoding (kernels_native/serve/engine.h): None (off), "ngram" (prompt lookup)
    # or "draft" (a draft model: EngineClient's draft runner), drafting up to
    # num_speculative_tokens tokens per step; the ngram method matches
    # suffixes of prompt_lookup_min..prompt_lookup_max tokens (vLLM's names and defaults: 5 and
    # 5 when neither is set, the other one's value when one is).
    speculative_method: str | None = None
    num_speculative_tokens: int | None = None
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    speculative_disable_by_batch_size: int | None = None  # no drafts while more sequences run

    def __post_init__(self) -> None:
        if self.speculative_method == "ngram":
            lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
            if lo is None and hi is None:
                lo = hi = 5
            self.prompt_lookup_min = hi if lo is None else lo
            self.prompt_lookup_max = lo if hi is None else hi


class EngineStats(msgspec.Struct, kw_only=True):
    """The engine's gauges and counters (totals since start); /metrics exports them as they are."""

    num_running: int
    num_waiting: int
    num_blocks: int
    blocks_used: int
    blocks_free: int  # allocatable, cached ones included
    blocks_cached: int  # free blocks still holding a reusable prefix
    kv_usage: float  # blocks_used / num_blocks
    prefix_cache_queries: int  # tokens
    prefix_cache_hits: int  # tokens
    prompt_tokens: int
    generation_tokens: int
    num_preemptions: int
    num_steps: int
    num_finished: int
    step_seconds: float  # engine wall time in steps (scheduling, the model, sampling, outputs)
    model_seconds: float  # of which in the model runner (grammar masks' waits included)
    # Speculative decoding: verification spans with drafts, draft tokens, accepted draft tokens,
    # and accepted ones by draft position (acceptance rate = accepted / draft tokens).
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_per_pos: list[int] = msgspec.field(default_factory=list)
    device_masked_rows: int = 0  # grammar rows masked and sampled on the device (not the host)
    # Grammar rows drawn first and then checked (greedy or temperature-only rows on the device),
    # and of those the draws the grammar allowed as they were (no mask needed).
    grammar_checked_rows: int = 0
    grammar_checked_allowed: int = 0
    # Of model_seconds, a grammar step's parts after the runner's run: waiting for the masks
    # filled beside it, checking its draws, drawing refused rows again under their masks.
    mask_wait_seconds: float = 0.0
    check_seconds: float = 0.0
    redraw_seconds: float = 0.0
    last_error: str | None
