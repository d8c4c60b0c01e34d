"""Serving: ``LLM``, the generation API (prompts or messages in, streamed outputs out: ``n``, stop
strings, adapters, logprobs, abort; detokenization and parsers inside), over ``EngineClient``,
the handle on one model's native continuous-batching engine. ``types`` is the one vocabulary of
both: ``SamplingParams`` in, ``RequestOutput`` (with ``TokenLogprob``s) out. See README-dev.md."""

from __future__ import annotations

from surogate.serve.embedder import Embedder
from surogate.serve.engine_client import EngineClient
from surogate.serve.llm import LLM, Generation
from surogate.serve.types import (EngineConfig, EngineStats, RequestOutput, SamplingParams, StructuredOutputsParams,
                                  TokenLogprob)

__all__ = ["LLM", "Embedder", "EngineClient", "EngineConfig", "EngineStats", "Generation", "RequestOutput",
           "SamplingParams", "StructuredOutputsParams", "TokenLogprob"]
