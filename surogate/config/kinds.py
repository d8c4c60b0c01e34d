"""Which config Struct each training command reads (``load_config(path, kind=...)``)."""

from __future__ import annotations

from surogate.config.distill import DistillConfig
from surogate.config.dpo import DPOConfig
from surogate.config.grpo import GRPOConfig
from surogate.config.sft import PTConfig, SFTConfig

CONFIG_KINDS: dict[str, type[SFTConfig]] = {"sft": SFTConfig, "pt": PTConfig, "dpo": DPOConfig,
                                            "distill": DistillConfig, "grpo": GRPOConfig}
