"""The registry: every model family surogate runs, one line each (a family is one file, see
README-dev.md), and the lookups by what a checkpoint says it is: config.json's ``architectures``
(or, without them, ``model_type``), a GGUF file's ``general.architecture``, or our own name."""

from __future__ import annotations

from typing import TYPE_CHECKING

from surogate.errors import UnsupportedError
from surogate.models import gemma3, gemma4, gpt_oss, lfm2, llama, mistral, qwen2, qwen3, qwen3_moe, qwen3_vl, qwen3_vl_moe
from surogate.models.family import ChatDefaults, Family

if TYPE_CHECKING:
    from surogate.io.gguf import GGUFFile

REGISTRY: tuple[Family, ...] = (
    llama.FAMILY,
    qwen3.FAMILY,
    qwen2.FAMILY,
    mistral.FAMILY,
    gemma3.FAMILY,
    gemma4.FAMILY,
    lfm2.FAMILY,
    qwen3_moe.FAMILY,
    gpt_oss.FAMILY,
)

# Families that load, run and train (their own tests) but are not in REGISTRY's per-family sweeps
# (tiny text checkpoints from TinyModel.config, GGUF, serving): Qwen3-VL, whose tiny checkpoint is
# a nested Qwen3VLConfig and whose images need MRoPE positions the serving step does not make yet,
# and Qwen3-VL-MoE, its MoE variant.
MULTIMODAL: tuple[Family, ...] = (
    qwen3_vl.FAMILY,
    qwen3_vl_moe.FAMILY,
)

FAMILIES: dict[str, Family] = {arch: f for f in REGISTRY + MULTIMODAL for arch in f.hf_architectures}
_BY_NAME = {f.name: f for f in REGISTRY + MULTIMODAL}
_BY_MODEL_TYPE = {t: f for f in REGISTRY + MULTIMODAL for t in f.model_types}
# llama.cpp files several HF families under one architecture (Mistral and SmolLM are "llama"):
# a GGUF file loads as the first registered family of its architecture.
_BY_GGUF = {f.gguf.name: f for f in reversed(REGISTRY + MULTIMODAL)}


def family_for(config: dict, source: str = "config.json") -> Family:
    """The family of an HF config: its ``architectures``, else its ``model_type``."""
    archs = config.get("architectures") or []
    if not archs and config.get("model_type") in _BY_MODEL_TYPE:
        archs = [_BY_MODEL_TYPE[config["model_type"]].hf_architecture]
    for a in archs:
        if a in FAMILIES:
            return FAMILIES[a]
    raise UnsupportedError(
        f"{source}: architecture {', '.join(archs) or '(none given)'} is not supported",
        hint="supported architectures: " + ", ".join(sorted(FAMILIES)),
    )


def family_named(name: str) -> Family:
    """A family by our name (``ModelSpec.family``: "llama", "qwen3")."""
    if name not in _BY_NAME:
        raise UnsupportedError(f"no model family named {name!r}", hint="known: " + ", ".join(_BY_NAME))
    return _BY_NAME[name]


def family_for_gguf(gf: GGUFFile) -> Family:
    """The family of a GGUF file, by its ``general.architecture``."""
    arch = gf.architecture
    if arch not in _BY_GGUF:
        raise UnsupportedError(f"{gf.path}: GGUF architecture {arch!r} is not supported",
                               hint="supported: " + ", ".join(sorted(_BY_GGUF)))
    return _BY_GGUF[arch]


def config_from_gguf(gf: GGUFFile) -> dict:
    """A GGUF file's hyper-parameters as the HF config.json its family reads."""
    return family_for_gguf(gf).gguf.config_from_gguf(gf)


def chat_defaults_for(model_type: str | None) -> ChatDefaults | None:
    """The ChatDefaults of the family whose model types prefix ``model_type`` (None: none does)."""
    mtype = (model_type or "").lower()
    for f in REGISTRY:
        if f.chat.model_types and mtype.startswith(f.chat.model_types):
            return f.chat
    return None
