"""Serving: the engine client (submit / stream / abort) over the native continuous-batching
engine, and its wire types. The frontend (templates, detokenization, stop strings, parsers) and
the model and adapter registries build on these."""

from __future__ import annotations

from surogate.serve.engine_client import EngineClient
from surogate.serve.types import EngineConfig, EngineStats, Request, RequestOutput, SamplingParams, TokenLogprob

__all__ = ["EngineClient", "EngineConfig", "EngineStats", "Request", "RequestOutput", "SamplingParams", "TokenLogprob"]
