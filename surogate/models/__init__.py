"""Model families: each maps an HF config to a ModelSpec and has a name table.

The registry is keyed by the HF ``architectures`` strings of config.json.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from surogate.dsl.nn import ModelSpec
from surogate.errors import UnsupportedError
from surogate.models import llama, qwen3
from surogate.models.name_table import NameTable


@dataclass(frozen=True)
class Family:
    name: str
    spec_from_config: Callable[[dict], ModelSpec]
    name_table: Callable[[], NameTable]


FAMILIES: dict[str, Family] = {
    "LlamaForCausalLM": Family("llama", lambda c: llama.spec_from_config(c, "llama"), llama.name_table),
    "Qwen3ForCausalLM": Family("qwen3", qwen3.spec_from_config, qwen3.name_table),
}


def family_for(config: dict, source: str = "config.json") -> Family:
    archs = config.get("architectures") or []
    if not archs and config.get("model_type") in ("llama", "qwen3"):
        archs = ["LlamaForCausalLM" if config["model_type"] == "llama" else "Qwen3ForCausalLM"]
    for a in archs:
        if a in FAMILIES:
            return FAMILIES[a]
    raise UnsupportedError(
        f"{source}: architecture {', '.join(archs) or '(none given)'} is not supported",
        hint="supported architectures: " + ", ".join(sorted(FAMILIES)),
    )


__all__ = ["FAMILIES", "Family", "family_for"]
