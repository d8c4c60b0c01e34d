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
from surogate.dsl.nn import LoRAConfig, expert_lora
from surogate.errors import FileFormatError
from surogate.io import save_safetensors
from surogate.models.name_table import experts_transposed
from surogate.models.peft import (ALL_TARGETS, EXPERTS, PEFT_PREFIX, ROUTER, from_peft_name, is_expert_lora,
                                  load_peft_adapter, peft_config, to_peft_name, to_peft_tensors)

__all__ = ["ALL_TARGETS", "EXPERTS", "PEFT_PREFIX", "from_peft_name", "init_lora", "load_peft_adapter", "merge_into_hf",
           "save_peft_adapter", "to_peft_name"]



def init_lora(g: Graph, seed: int) -> dict[str, np.ndarray]:
    """A: kaiming-uniform as peft (bound 1/sqrt(fan_in)); B: zeros, so training starts at the
    base model. f32 master values; deterministic for a seed and a graph."""
    rng = np.random.default_rng(seed)
    out = {}
    for p in sorted(g.params(), key=lambda v: v.name):
        if p.meta.get("lora") == "A":
            fan_in = p.shape[-1]  # [r, in]; a MoE layer's experts [E, r, in] (peft: each expert's rows alike)
            bound = 1.0 / math.sqrt(fan_in)
            out[p.name] = rng.uniform(-bound, bound, size=p.shape).astype(np.float32)
        elif p.meta.get("lora") == "B":
            out[p.name] = np.zeros(p.shape, np.float32)
    return out


def save_peft_adapter(path: str | Path, params: dict[str, np.ndarray], cfg: LoRAConfig, base_model: str,
                      module_prefix: str = "model.", exclude_modules: str | None = None,
                      modules_to_save: list[str] | None = None, whole: dict[str, np.ndarray] | None = None) -> Path:
    """Write adapter_config.json + adapter_model.safetensors (f32), atomically: into a temp
    folder beside `path`, then renamed over it. ``exclude_modules``: peft's regex of modules
    the target names must not wrap (a vision tower's q_proj). ``modules_to_save`` / ``whole``:
    modules trained whole beside the adapter (Gemma 3's multi_modal_projector) and their tensors
    under the model's HF names (``model.multi_modal_projector.mm_input_projection_weight``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    adapted = [n for n in params if not n.endswith(ROUTER)]
    modules = sorted({n.rsplit(".", 2)[-2] for n in adapted if not is_expert_lora(n)})
    experts = sorted({n.rsplit(".", 2)[-2] for n in adapted if is_expert_lora(n)})
    config = peft_config(cfg, modules, experts, base_model, train_router=len(adapted) < len(params))
    if exclude_modules is not None:
        config["exclude_modules"] = exclude_modules
    if modules_to_save:
        config["modules_to_save"] = [*(config["modules_to_save"] or []), *modules_to_save]
    (tmp / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = to_peft_tensors(params, module_prefix)
    tensors.update({PEFT_PREFIX + n: np.asarray(a, np.float32) for n, a in (whole or {}).items()})
    save_safetensors(tmp / "adapter_model.safetensors", tensors, metadata={"format": "pt"})
    _replace_dir(tmp, path)
    return path


def merge_into_hf(hf: dict[str, np.ndarray], params: dict[str, np.ndarray], cfg: LoRAConfig,
                  module_prefix: str = "model.", transposed_experts: bool = False) -> dict[str, np.ndarray]:
    """W += scale * B @ A for every adapted module, on HF-named tensors (in f32, then back to
    each tensor's dtype); a MoE layer's experts W[e] += scale B[e] @ A[e], into the stacked
    gate_up_proj / down_proj or the checkpoint's per-expert gate_proj / up_proj / down_proj; a
    router trained beside the adapter (train_router) replaces the base one. ``transposed_experts``:
    the stacked tensors are [E, in, out] (GPT-OSS; name_table.transposed_experts). Returns a new
    dict; untouched tensors are shared."""
    out = dict(hf)
    for name, a in params.items():
        if name.endswith(ROUTER):
            key = module_prefix + name
            if key not in out:
                raise FileFormatError(f"the adapter replaces {key}, which the base model does not have",
                                      hint="is this adapter for another model?")
            out[key] = np.asarray(a).astype(out[key].dtype)
    modules = sorted({n.rsplit(".", 1)[0] for n in params if not n.endswith(ROUTER)})
    for module in modules:
        A, B = params[module + ".lora_A"].astype(np.float32), params[module + ".lora_B"].astype(np.float32)
        if is_expert_lora(module + ".lora_A"):
            _, _, scale = expert_lora(cfg)[module.rsplit(".", 1)[1]]
            delta = scale * (B @ A)
            _merge_experts(out, module_prefix + module, delta, transposed_experts)
            continue
        key = f"{module_prefix}{module}.weight"
        if key not in out:
            raise FileFormatError(f"the adapter adapts {key}, which the base model does not have",
                                  hint="is this adapter for another model?")
        w = out[key]
        merged = w.astype(np.float32) + cfg.scale * (B @ A)
        out[key] = merged.astype(w.dtype)
    return out


def _merge_experts(out: dict[str, np.ndarray], key: str, delta: np.ndarray, transposed: bool = False) -> None:
    """delta [E, out, in] into model.layers.i.mlp.experts.gate_up_proj (or down_proj), stacked as
    transformers 5 holds it ([E, in, out] with ``transposed``, or as the layer's two stacked tensors'
    shapes say: name_table.experts_transposed) or one tensor per expert as the hub's checkpoints do."""
    if key in out:
        w = out[key]
        experts = key.rsplit(".", 1)[0]
        pair = [out.get(f"{experts}.{p}") for p in ("gate_up_proj", "down_proj")]
        if all(p is not None for p in pair):
            transposed = experts_transposed(pair[0].shape, pair[1].shape, key)
        out[key] = (w.astype(np.float32) + (np.swapaxes(delta, 1, 2) if transposed else delta)).astype(w.dtype)
        return
    experts, param = key.rsplit(".", 1)
    halves = ("gate_proj", "up_proj") if param == "gate_up_proj" else ("down_proj",)
    rows = delta.shape[1] // len(halves)
    for e in range(delta.shape[0]):
        for h, half in enumerate(halves):
            k = f"{experts}.{e}.{half}.weight"
            if k not in out:
                raise FileFormatError(f"the adapter adapts {key}, and the base model has neither it nor {k}",
                                      hint="is this adapter for another model?")
            w = out[k]
            out[k] = (w.astype(np.float32) + delta[e, h * rows:(h + 1) * rows]).astype(w.dtype)


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
