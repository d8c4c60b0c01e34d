"""Model families: one file per family (llama.py, qwen3.py) holds everything that differs
between families, as one ``Family`` (family.py); registry.py lists them and finds a checkpoint's.
decoder.py has the parts dense decoder families share; name_table.py, gguf_names.py and peft.py
the name mechanisms. README-dev.md says how to add a family.
"""

from __future__ import annotations

from surogate.models.family import ChatDefaults, Family, GGUFArchitecture, TinyModel
from surogate.models.registry import (
    FAMILIES,
    REGISTRY,
    chat_defaults_for,
    config_from_gguf,
    family_for,
    family_for_gguf,
    family_named,
)

__all__ = ["FAMILIES", "REGISTRY", "ChatDefaults", "Family", "GGUFArchitecture", "TinyModel", "chat_defaults_for",
           "config_from_gguf", "family_for", "family_for_gguf", "family_named"]
