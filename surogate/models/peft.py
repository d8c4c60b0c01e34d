"""The PEFT LoRA format: tensor names and reading an adapter folder (training writes them, see
surogate.train.lora; serving loads them per request).

Our adapter parameters are named after the HF module they adapt (``layers.0.mlp.gate_proj.lora_A``
even though gate and up share one fused weight inside the model), so PEFT names are a prefix
away: ``base_model.model.`` + the HF module path + ``.lora_A.weight``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from surogate.dsl.nn import LoRAConfig
from surogate.errors import FileFormatError, NotFoundError
from surogate.io import open_safetensors

ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PEFT_PREFIX = "base_model.model."


def to_peft_name(name: str, module_prefix: str = "model.") -> str:
    module, _, ab = name.rpartition(".")  # layers.0.self_attn.q_proj, lora_A
    return f"{PEFT_PREFIX}{module_prefix}{module}.{ab}.weight"


def from_peft_name(name: str, module_prefix: str = "model.") -> str:
    if not name.startswith(PEFT_PREFIX + module_prefix) or not name.endswith(".weight"):
        raise FileFormatError(f"adapter tensor {name!r} is not a PEFT LoRA weight of this model family",
                              hint=f"expected names like {PEFT_PREFIX}{module_prefix}layers.0.self_attn.q_proj.lora_A.weight")
    inner = name[len(PEFT_PREFIX + module_prefix):-len(".weight")]
    return inner.replace(".default", "")


def load_peft_adapter(path: str | Path, module_prefix: str = "model.") -> tuple[LoRAConfig, dict[str, np.ndarray]]:
    path = Path(path)
    cfg_file = path / "adapter_config.json"
    if not cfg_file.is_file():
        raise NotFoundError(f"{path}: no adapter_config.json", hint="pass the folder a LoRA run wrote (PEFT format)")
    try:
        c = json.loads(cfg_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FileFormatError(f"{cfg_file} is not valid JSON: {e}", hint="pass a folder PEFT wrote") from None
    if not isinstance(c, dict) or not isinstance(c.get("r"), int) or c["r"] < 1:
        raise FileFormatError(f"{cfg_file}: no LoRA rank `r` (a positive integer)", hint="pass a folder PEFT wrote")
    if c.get("peft_type", "LORA") != "LORA":
        raise FileFormatError(f"{cfg_file}: peft_type {c.get('peft_type')!r} is not LORA")
    targets = c.get("target_modules") or list(ALL_TARGETS)
    if isinstance(targets, str):
        targets = list(ALL_TARGETS) if targets == "all-linear" else [targets]
    cfg = LoRAConfig(rank=int(c["r"]), alpha=float(c.get("lora_alpha", c["r"])), targets=tuple(targets),
                     use_rslora=bool(c.get("use_rslora", False)))
    weights = path / "adapter_model.safetensors"
    if not weights.is_file():
        raise NotFoundError(f"{path}: no adapter_model.safetensors")
    f = open_safetensors(weights)
    params = {from_peft_name(k, module_prefix): np.array(f.get(k), dtype=np.float32) for k in f.keys()}
    return cfg, params
