"""Run configs: YAML files decoded into one typed, validated tree of msgspec Structs.

``load_config("run.yaml", kind="sft")`` returns an ``SFTConfig`` (``PTConfig`` for "pt",
``DPOConfig`` for "dpo", ``DistillConfig`` for "distill", ``GRPOConfig`` for "grpo") or raises a ``ConfigError`` naming the
key path, its line and what would be accepted.
"""

from __future__ import annotations

from surogate.config.distill import DistillationConfig, DistillConfig
from surogate.config.dpo import DPOConfig
from surogate.config.grpo import GRPOConfig
from surogate.config.kinds import CONFIG_KINDS
from surogate.config.loader import load_config
from surogate.config.sft import ALL_LORA_TARGETS, DatasetConfig, PTConfig, SFTConfig

__all__ = ["ALL_LORA_TARGETS", "CONFIG_KINDS", "DPOConfig", "DatasetConfig", "DistillConfig", "DistillationConfig",
           "GRPOConfig", "PTConfig", "SFTConfig", "load_config"]
