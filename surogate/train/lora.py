"""LoRA adapters in training: initialization, writing PEFT-format folders, and merging into
base weights. Reading them (and the PEFT names) is surogate.models.peft, which serving shares."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np

from surogate.dsl.graph import Graph
from surogate.dsl.nn import LoRAConfig
from surogate.errors import FileFormatError
from surogate.io import save_safetensors
from surogate.models.peft import ALL_TARGETS, PEFT_PREFIX, from_peft_name, load_peft_adapter, to_peft_name

__all__ = ["ALL_TARGETS", "PEFT_PREFIX", "from_peft_name", "init_lora", "load_peft_adapter", "merge_into_hf",
           "save_peft_adapter", "to_peft_name"]



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
