"""The engine's wire types: what a request carries into the native engine and what comes back.

Field names and meanings follow vLLM's ``SamplingParams`` and the OpenAI API (see
``kernels_native/serve/sampling_params.h`` for the exact formulas). The native side reads
``SamplingParams`` and ``EngineConfig`` by attribute name and validates them; an out-of-range
value raises ``InvalidArgumentError`` naming the field.
"""

from __future__ import annotations

import msgspec


class SamplingParams(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
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
    stop_token_ids: list[int] = msgspec.field(default_factory=list)
    eos_token_ids: list[int] = msgspec.field(default_factory=list)  # empty = the model's (EngineConfig)
    ignore_eos: bool = False
    logprobs: int | None = None  # top-N, 0..20; the chosen token's logprob is always included
    prompt_logprobs: int | None = None  # top-N, 0..20


class Request(msgspec.Struct, kw_only=True):
    prompt_token_ids: list[int]
    params: SamplingParams = msgspec.field(default_factory=SamplingParams)
    adapter: int | None = None  # LoRA adapter slot id; None = the base model


class TokenLogprob(msgspec.Struct, array_like=True):
    """A token's raw model logprob (log_softmax of the logits, before penalties and temperature),
    its rank (1 = most likely) and the top-N ``(token_id, logprob)`` pairs, most likely first."""

    token_id: int
    logprob: float
    rank: int
    top: list[tuple[int, float]]


class RequestOutput(msgspec.Struct):
    """What one engine step produced for one request. Field order = the native tuple's order."""

    request_id: int
    new_token_ids: list[int]  # a stop / eos token that finished the request is included
    logprobs: list[TokenLogprob] | None  # one per new token, when asked for
    prompt_logprobs: list[TokenLogprob | None] | None  # once; entry 0 (first prompt token) is None
    finish_reason: str | None  # None while running; "stop", "length", "abort" or "error"
    finish_message: str | None  # why, for "error" (and "length" at the context limit)
    stop_token_id: int | None  # the token that finished it with "stop"
    num_prompt_tokens: int
    num_cached_tokens: int  # prompt tokens served by the prefix cache
    num_output_tokens: int  # generated so far, these included

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @classmethod
    def from_native(cls, t: tuple) -> RequestOutput:
        out = cls(*t)
        if out.logprobs is not None:
            out.logprobs = [TokenLogprob(*lp) for lp in out.logprobs]
        if out.prompt_logprobs is not None:
            out.prompt_logprobs = [None if lp is None else TokenLogprob(*lp) for lp in out.prompt_logprobs]
        return out


class EngineConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    num_blocks: int  # KV cache size in blocks; the runner allocates that memory
    block_size: int = 16
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 8192  # per-step token budget (chunked prefill)
    max_model_len: int | None = None  # prompt + output per request; None = the cache's capacity
    enable_prefix_caching: bool = True
    eos_token_ids: list[int] = msgspec.field(default_factory=list)  # the model's end tokens
    seed: int | None = None  # base of the generators of unseeded requests; None = random


class EngineStats(msgspec.Struct, kw_only=True):
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
    model_seconds: float  # of which in the model runner
    last_error: str | None
