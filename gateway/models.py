"""The models a gateway serves, by the names clients use in ``model``.

A ``ServedModel`` is a name and the model's generation API (``surogate.serve.LLM``: tokenizer,
chat template and parsers, enough for templates, /tokenize and count_tokens, around the engine
client that generates), whose engine is None while the model loads: generation then answers 503
(OpenAI) / 529 (Anthropic) with ``Retry-After``, and /health reports ``loading``. An asleep model
(``POST /sleep``) answers the same way and /health reports ``sleeping``; once its running requests
finish, the engine gives its KV cache, Programs and the weights' device copies back
(``EngineClient.release``) until ``POST /wake_up`` (``restore``). LoRA adapters are served under
their own names and resolve to (base model, adapter name); the engine client knows their slots.
``POST /v1/load_lora_adapter`` / ``/v1/unload_lora_adapter`` (gateway/adapters.py) change a
model's ``adapters`` at run time. ``embedder``: the model's ``surogate.serve.Embedder`` when it
answers /v1/embeddings; an encoder (``generates`` False) answers nothing else.

Admission: ``queued`` (the LLM's) holds the engine requests submitted for the model that have no
output yet; once ``GatewayConfig.max_queued_requests`` of them wait, a new request is a 429
before anything reaches the engine.
"""

from __future__ import annotations

import asyncio

import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from surogate.io import Tokenizer
from surogate.serve import LLM, EngineClient
from surogate.serve.frontend import Limits


@dataclass
class ServedModel:
    name: str
    llm: LLM
    adapters: tuple[str, ...] = ()  # served now, in load order (the engine client's table after each change)
    embedder: Any = None  # surogate.serve.Embedder: /v1/embeddings (None: the route answers 400)
    generates: bool = True  # False: an encoder (EmbeddingGemma), no engine; only /v1/embeddings
    owned_by: str = "surogate"
    created: int = field(default_factory=lambda: int(time.time()))
    asleep: bool = False
    released: bool = False  # asleep with its memory given back (the engine's release())
    transition: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False, compare=False)  # sleep / wake

    @classmethod
    def from_tokenizer(cls, name: str, tokenizer: Tokenizer, engine: EngineClient | None, max_model_len: int, *,
                       model_type: str | None = None, reasoning_parser: str = "auto", tool_parser: str = "auto",
                       template_defaults: dict[str, Any] | None = None, chat_template: str | None = None,
                       **kw) -> ServedModel:
        """Parsers detected from the tokenizer's chat template (or named: ``hermes``, ``none``, ...)."""
        llm = LLM.for_model(engine, tokenizer, max_model_len, model_type=model_type, reasoning_parser=reasoning_parser,
                            tool_parser=tool_parser, template_defaults=template_defaults, chat_template=chat_template)
        return cls(name, llm, **kw)

    @property
    def tokenizer(self) -> Tokenizer:
        return self.llm.tokenizer

    @property
    def engine(self) -> EngineClient | None:
        return self.llm.client

    @property
    def max_model_len(self) -> int:
        return self.llm.max_model_len

    @property
    def queued(self) -> set:
        return self.llm.queued

    @property
    def ready(self) -> bool:
        """Loaded: its engine is there, or it is an encoder that needs none."""
        return self.engine is not None or not self.generates

    @property
    def status(self) -> str:
        if not self.ready:
            return "loading"
        return "sleeping" if self.asleep else "loaded"


class GatewayConfig(msgspec.Struct, kw_only=True, frozen=True):
    api_keys: tuple[str, ...] = ()  # empty: no auth
    max_body_bytes: int = 32 * 1024 * 1024
    reasoning_field: str = "reasoning_content"  # or "reasoning" (vLLM's new name) or "both"
    metrics_need_key: bool = True  # /metrics behind the keys too (only /health is always open)
    max_logprobs: int = 20
    max_n: int = 16
    log_requests: bool = True  # one JSON line per request on the "surogate.gateway.access" logger
    sse_ping_seconds: float = 15.0  # keep-alive in quiet streams; 0: never
    max_queued_requests: int = 1024  # per model: engine requests waiting for their first output; then 429
    # image inputs (gateway/media.py): data: URLs always; local files only under this folder; http(s) only if allowed
    allowed_local_media_path: str | None = None
    allow_remote_media: bool = False
    max_images_per_prompt: int = 8  # --limit-mm-per-prompt '{"image": N}'
    max_videos_per_prompt: int = 2  # --limit-mm-per-prompt '{"video": N}'

    def __post_init__(self):
        if self.max_queued_requests < 1:
            raise ValueError(f"max_queued_requests must be at least 1, got {self.max_queued_requests}")
        if self.max_images_per_prompt < 0:
            raise ValueError(f"max_images_per_prompt must be at least 0, got {self.max_images_per_prompt}")
        if self.max_videos_per_prompt < 0:
            raise ValueError(f"max_videos_per_prompt must be at least 0, got {self.max_videos_per_prompt}")
        if self.reasoning_field not in ("reasoning_content", "reasoning", "both"):
            raise ValueError("reasoning_field must be reasoning_content, reasoning or both")


class ModelTable:
    def __init__(self, models: list[ServedModel]):
        self.models = {m.name: m for m in models}

    def lookup(self, name: str) -> tuple[ServedModel, str | None] | None:
        if name in self.models:
            return self.models[name], None
        for m in self.models.values():  # adapters come and go at run time
            if name in m.adapters:
                return m, name
        return None

    def limits(self, model: ServedModel, config: GatewayConfig) -> Limits:
        return Limits(max_model_len=model.max_model_len, max_logprobs=config.max_logprobs, max_n=config.max_n,
                      vocab_size=model.tokenizer.vocab_size)

    def __iter__(self):
        return iter(self.models.values())
