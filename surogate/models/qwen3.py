"""Qwen3 (dense): Llama's layout plus per-head RMSNorm on q and k before rope (qk-norm)."""

from __future__ import annotations

from surogate.dsl.nn import ModelSpec
from surogate.models import llama
from surogate.models.name_table import NameTable


def spec_from_config(cfg: dict) -> ModelSpec:
    spec = llama.spec_from_config(cfg, family="qwen3")
    spec.qk_norm = True
    return spec


def name_table() -> NameTable:
    return llama.name_table(qk_norm=True)
