"""LoRA adapters: initialization, PEFT-format files, and merging into base weights.

Our adapter parameters are named after the HF module they adapt (``layers.0.mlp.gate_proj.lora_A``
even though gate and up share one fused weight inside the model), so PEFT names are a prefix
away: ``base_model.model.`` + the HF module path + ``.lora_A.weight``.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np

from surogate.dsl.graph import Graph
from surogate.dsl.nn import LoRAConfig
from surogate.errors import FileFormatError, NotFoundError
from surogate.io import open_safetensors, save_safetensors

ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PEFT_PREFIX = "base_model.model."


def init_lora(g: Graph, seed: int) -> dict[str, np.ndarray]:
    """A: kaiming-uniform as peft (bound 1/sqrt(fan_in)); B: zeros, so training starts at the
    base model. f32 master values; deterministic for a seed and a graph."""
    rng = np.random.default_rng(seed)
    out = {}
    for p in sorted(g.params(), key=lambda v: v.name):
        if p.meta.get("lora") == "A":
            fan_in = p.shape[1]
            bound = 1.0 / math.sqrt(fan_in)
            out[p.name] = rng.uniform(-bound, bound, size=p.shape).astype(np.float32)
        elif p.meta.get("lora") == "B":
            out[p.name] = np.zeros(p.shape, np.float32)
    return out


def to_peft_name(name: str, module_prefix: str = "model.") -> str:
    module, _, ab = name.rpartition(".")  # layers.0.self_attn.q_proj, lora_A
    return f"{PEFT_PREFIX}{module_prefix}{module}.{ab}.weight"


def from_peft_name(name: str, module_prefix: str = "model.") -> str:
    if not name.startswith(PEFT_PREFIX + module_prefix) or not name.endswith(".weight"):
        raise FileFormatError(f"adapter tensor {name!r} is not a PEFT LoRA weight of this model family",
                              hint=f"expected names like {PEFT_PREFIX}{module_prefix}layers.0.self_attn.q_proj.lora_A.weight")
    inner = name[len(PEFT_PREFIX + module_prefix):-len(".weight")]
    return inner.replace(".default", "")


def save_peft_adapter(path: str | Path, params: dict[str, np.ndarray], cfg: LoRAConfig, base_model: str,
                      module_prefix: str = "model.") -> Path:
    """Write adapter_config.json + adapter_model.safetensors (f32), atomically: into a temp
    folder beside `path`, then renamed over it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    targets = sorted({n.rsplit(".", 2)[-2] for n in params})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": cfg.rank,
        "lora_alpha": cfg.alpha,
        "lora_dropout": 0.0,
        "target_modules": targets,
        "bias": "none",
        "use_rslora": cfg.use_rslora,
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "modules_to_save": None,
    }
    (tmp / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_safetensors(tmp / "adapter_model.safetensors",
                     {to_peft_name(n, module_prefix): np.ascontiguousarray(a, np.float32) for n, a in params.items()},
                     metadata={"format": "pt"})
    _replace_dir(tmp, path)
    return path


def load_peft_adapter(path: str | Path, module_prefix: str = "model.") -> tuple[LoRAConfig, dict[str, np.ndarray]]:
    path = Path(path)
    cfg_file = path / "adapter_config.json"
    if not cfg_file.is_file():
        raise NotFoundError(f"{path}: no adapter_config.json", hint="pass the folder a LoRA run wrote (PEFT format)")
    c = json.loads(cfg_file.read_text())
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


def merge_into_hf(hf: dict[str, np.ndarray], params: dict[str, np.ndarray], cfg: LoRAConfig,
                  module_prefix: str = "model.") -> dict[str, np.ndarray]:
    """W += scale * B @ A for every adapted module, on HF-named tensors (in f32, then back to
    each tensor's dtype). Returns a new dict; untouched tensors are shared."""
    out = dict(hf)
    modules = sorted({n.rsplit(".", 1)[0] for n in params})
    for module in modules:
        key = f"{module_prefix}{module}.weight"
        if key not in out:
            raise FileFormatError(f"the adapter adapts {key}, which the base model does not have",
                                  hint="is this adapter for another model?")
        A, B = params[module + ".lora_A"], params[module + ".lora_B"]
        w = out[key]
        merged = w.astype(np.float32) + cfg.scale * (B.astype(np.float32) @ A.astype(np.float32))
        out[key] = merged.astype(w.dtype)
    return out


def _replace_dir(tmp: Path, final: Path) -> None:
    """Move the complete folder tmp to final. An old folder is renamed aside first and removed
    after: a crash in between leaves it complete under its `.old-PID` name, never half-written."""
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.replace(final, old)
        os.replace(tmp, final)
        _rmtree(old)
    else:
        os.replace(tmp, final)


def _rmtree(p: Path) -> None:
    import shutil

    shutil.rmtree(p, ignore_errors=True)
