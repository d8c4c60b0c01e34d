"""The PEFT LoRA format: tensor names and reading an adapter folder (training writes them, see
surogate.train.lora; serving loads them per request).

Our adapter parameters are named after the HF module they adapt (``layers.0.mlp.gate_proj.lora_A``
even though gate and up share one fused weight inside the model), so PEFT names are a prefix
away: ``base_model.model.`` + the HF module path + ``.lora_A.weight``.

A MoE layer's experts (dsl/nn.py expert_lora) are peft's ``target_parameters``: transformers 5
stacks them (``mlp.experts.gate_up_proj`` [E, 2F, C], ``down_proj`` [E, C, F]) and peft wraps
each stacked nn.Parameter in a ParamWrapper, nested in the module's parameter order, so the first
adapted one sits under ``base_layer.``: ``mlp.experts.base_layer.lora_A.weight`` is gate_up_proj's
when down_proj is adapted too (``mlp.experts.lora_A.weight`` otherwise). Its A is [E * r, in]
(expert-major rows: A[e] = rows e*r .. e*r+r-1) and B [out, r * E] (expert-minor columns:
B[e][:, j] = column j*E + e); ours are [E, r, in] and [E, out, r], what the grouped GEMMs read.
A router trained beside LoRA (train_router) is peft's ``modules_to_save: [gate]``, its weight
saved whole as ``...mlp.gate.weight``. Adapters written before transformers 5 (one Linear per
expert: ``mlp.experts.3.gate_proj.lora_A.weight``) are read into the stacked form as peft 0.21
converts them: gate and up's A's stacked along the rank, their B's block-diagonal.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from surogate.dsl.nn import EXPERT_PARAMETERS, LoRAConfig, expert_lora
from surogate.errors import FileFormatError, NotFoundError
from surogate.io import open_safetensors

ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PEFT_PREFIX = "base_model.model."
# peft on a multimodal model (transformers 5's Gemma3ForConditionalGeneration): the language
# model's modules are model.language_model.layers.*, not model.layers.*.
LANGUAGE_MODEL_PREFIX = "model.language_model."
# Its vision modules, which a target_modules list would also wrap (Gemma 3's SigLIP tower has
# q_proj / k_proj / v_proj): peft's exclude_modules regex keeps the adapter to the language model
# (Gemma 3's vision_tower and multi_modal_projector; Qwen3-VL's visual).
VISION_MODULES = r".*(vision_tower|multi_modal_projector|visual).*"


def to_peft_name(name: str, module_prefix: str = "model.") -> str:
    module, _, ab = name.rpartition(".")  # layers.0.self_attn.q_proj, lora_A
    return f"{PEFT_PREFIX}{module_prefix}{module}.{ab}.weight"


def from_peft_name(name: str, module_prefix: str = "model.") -> str:
    if not name.startswith(PEFT_PREFIX + module_prefix) or not name.endswith(".weight"):
        raise FileFormatError(f"adapter tensor {name!r} is not a PEFT LoRA weight of this model family",
                              hint=f"expected names like {PEFT_PREFIX}{module_prefix}layers.0.self_attn.q_proj.lora_A.weight")
    inner = name[len(PEFT_PREFIX + module_prefix):-len(".weight")]
    return inner.replace(".default", "")


EXPERTS = ".mlp.experts."  # the module that holds a MoE layer's stacked expert weights
ROUTER = ".mlp.gate.weight"  # a MoE router's weight (train_router: saved whole, modules_to_save)


def is_expert_lora(name: str) -> bool:
    """``layers.0.mlp.experts.gate_up_proj.lora_A``: an adapter of stacked expert weights."""
    return EXPERTS in name and name.rsplit(".", 2)[-2] in EXPERT_PARAMETERS


def to_peft_tensors(params: dict[str, np.ndarray], module_prefix: str = "model.") -> dict[str, np.ndarray]:
    """Our adapter tensors under PEFT's names and layouts (f32)."""
    out = {}
    adapted: dict[str, list[str]] = {}  # experts module -> its adapted parameters, in module order
    for n in params:
        if is_expert_lora(n):
            module, p, _ = n.rsplit(".", 2)
            adapted.setdefault(module, [])
            if p not in adapted[module]:
                adapted[module].append(p)
    for n, a in params.items():
        a = np.asarray(a, np.float32)
        if n.endswith(ROUTER):
            out[f"{PEFT_PREFIX}{module_prefix}{n}"] = a
        elif is_expert_lora(n):
            module, p, ab = n.rsplit(".", 2)
            order = [q for q in EXPERT_PARAMETERS if q in adapted[module]]
            nesting = "base_layer." * (len(order) - 1 - order.index(p))
            a = a.reshape(-1, a.shape[2]) if ab == "lora_A" else a.transpose(1, 2, 0).reshape(a.shape[1], -1)
            out[f"{PEFT_PREFIX}{module_prefix}{module}.{nesting}{ab}.weight"] = a
        else:
            out[to_peft_name(n, module_prefix)] = a
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def from_peft_tensors(tensors: dict[str, np.ndarray], cfg: LoRAConfig,
                      module_prefix: str = "model.") -> dict[str, np.ndarray]:
    """PEFT-named adapter tensors -> ours (the inverse of to_peft_tensors)."""
    out = {}
    per_expert: dict[tuple[str, str, str], dict[int, np.ndarray]] = {}  # transformers 4's layout
    for k, a in tensors.items():
        if k.endswith(ROUTER) and k.startswith(PEFT_PREFIX + module_prefix):
            out[k[len(PEFT_PREFIX + module_prefix):]] = a
            continue
        name = from_peft_name(k, module_prefix)
        v4 = _PER_EXPERT.match(name)
        if v4:
            module, e, proj, ab = v4.groups()
            per_expert.setdefault((module, proj, ab), {})[int(e)] = a
            continue
        stem = name.replace(".base_layer", "")  # layers.0.mlp.experts.lora_A: a ParamWrapper's
        if not stem.endswith((EXPERTS + "lora_A", EXPERTS + "lora_B")):
            out[name] = a
            continue
        depth = name.count(".base_layer")
        module, ab = stem.rsplit(".", 1)
        ranks = {p: r for p, (r, _, _) in expert_lora(cfg).items()}  # (only a MoE adapter gets here)
        order = [p for p in EXPERT_PARAMETERS if p in ranks]
        if not order or depth >= len(order):
            raise FileFormatError(f"adapter tensor {k!r} adapts a stacked expert weight that adapter_config.json's "
                                  f"target_parameters ({', '.join(order) or 'none'}) does not name")
        p = order[len(order) - 1 - depth]
        r = ranks[p]
        if a.ndim != 2 or (a.shape[0] if ab == "lora_A" else a.shape[1]) % r:
            raise FileFormatError(f"adapter tensor {k!r} {a.shape} is not a rank-{r} adapter of stacked experts")
        if ab == "lora_A":
            a = a.reshape(-1, r, a.shape[1])
        else:
            a = a.reshape(a.shape[0], r, -1).transpose(2, 0, 1)
        out[f"{module}.{p}.{ab}"] = np.ascontiguousarray(a)
    out.update(_stack_experts(per_expert))
    return out


_PER_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.(lora_A|lora_B)$")


def _stack_experts(per_expert: dict[tuple[str, str, str], dict[int, np.ndarray]]) -> dict[str, np.ndarray]:
    """One adapter per expert (transformers 4's layout) -> ours over the stacked weights: down_proj's
    A [E, r, F] and B [E, C, r]; gate_up_proj's A [E, 2r, C] (gate's rows, then up's) and B
    [E, 2F, 2r] block-diagonal, the rank-2r adapter expert_lora builds for gate_proj + up_proj."""
    def stacked(module: str, proj: str, ab: str) -> list[np.ndarray]:
        by_e = per_expert.get((module, proj, ab))
        if by_e is None or sorted(by_e) != list(range(len(by_e))):
            raise FileFormatError(f"adapter: {module}.*.{proj}.{ab} is not given for experts 0..E-1",
                                  hint="a per-expert adapter needs every expert's lora_A and lora_B")
        return [by_e[e] for e in range(len(by_e))]

    out = {}
    for module in sorted({m for m, _, _ in per_expert}):
        projs = {p for m, p, _ in per_expert if m == module}
        if "down_proj" in projs:
            for ab in ("lora_A", "lora_B"):
                out[f"{module}.down_proj.{ab}"] = np.stack(stacked(module, "down_proj", ab))
        if projs & {"gate_proj", "up_proj"}:
            if not {"gate_proj", "up_proj"} <= projs:
                raise FileFormatError(f"adapter: {module} adapts one of gate_proj / up_proj per expert without "
                                      "the other", hint="the stacked gate_up_proj needs both")
            ga, ua = stacked(module, "gate_proj", "lora_A"), stacked(module, "up_proj", "lora_A")
            gb, ub = stacked(module, "gate_proj", "lora_B"), stacked(module, "up_proj", "lora_B")
            out[f"{module}.gate_up_proj.lora_A"] = np.stack([np.concatenate([g, u]) for g, u in zip(ga, ua)])
            B = np.zeros((len(gb), gb[0].shape[0] + ub[0].shape[0], gb[0].shape[1] + ub[0].shape[1]), np.float32)
            for e, (g, u) in enumerate(zip(gb, ub)):
                B[e, :g.shape[0], :g.shape[1]] = g
                B[e, g.shape[0]:, g.shape[1]:] = u
            out[f"{module}.gate_up_proj.lora_B"] = B
    return out


def _patterns(c: dict, key: str, cast) -> dict:
    """peft's rank_pattern / alpha_pattern (regexes over module paths) for the stacked expert
    weights: each expert parameter's value, where a pattern names it."""
    out = {}
    for p in EXPERT_PARAMETERS:
        probe = f"model.layers.0.mlp.experts.{p}"
        for pat, v in (c.get(key) or {}).items():
            if re.fullmatch(rf"(.*\.)?(?:{pat})", probe):
                out[p] = cast(v)
    return out


def peft_config(cfg: LoRAConfig, modules: list[str], experts: list[str], base_model: str,
                train_router: bool = False) -> dict:
    """adapter_config.json for our adapter: the modules (target_modules) and the stacked expert
    parameters (target_parameters) it adapts."""
    params = [p for p in EXPERT_PARAMETERS if p in experts]
    expert = expert_lora(cfg) if params else {}  # (a dense model's gate_proj alone is fine)
    rank_pattern = {rf".*\.{p}": expert[p][0] for p in params if expert.get(p, (cfg.rank,))[0] != cfg.rank}
    alpha_pattern = {rf".*\.{p}": expert[p][1] for p in params if expert.get(p, (0, cfg.alpha))[1] != cfg.alpha}
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": cfg.rank,
        "lora_alpha": cfg.alpha,
        "lora_dropout": 0.0,
        "target_modules": list(modules),
        "target_parameters": params or None,
        "rank_pattern": rank_pattern,
        "alpha_pattern": alpha_pattern,
        "bias": "none",
        "use_rslora": cfg.use_rslora,
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "modules_to_save": ["gate"] if train_router else None,
    }


# A multimodal projector trained whole beside the adapter (train_projector: peft's modules_to_save),
# by its modules under the model's HF names less ``model.`` (ModelSpec.vision.projector_modules):
# Gemma 3's multi_modal_projector, Qwen3-VL's mergers (the final one and the DeepStack ones).
PROJECTOR_MODULES = ("multi_modal_projector.", "visual.merger.", "visual.deepstack_merger_list.")
PROJECTOR_PEFT_PREFIXES = tuple(PEFT_PREFIX + "model." + m for m in PROJECTOR_MODULES)


def load_peft_adapter(path: str | Path, module_prefix: str = "model.") -> tuple[LoRAConfig, dict[str, np.ndarray]]:
    """(its LoRAConfig, its tensors by our names). A projector saved whole beside the adapter
    (train_projector) comes too, under its HF names less ``model.``
    (``multi_modal_projector.mm_input_projection_weight``, ``visual.merger.linear_fc1.weight``; HF's
    layout): merging writes them into the checkpoint, serving into Model.projectors
    (models/projectors.py)."""
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
    targets = c.get("target_modules") or ([] if c.get("target_parameters") else list(ALL_TARGETS))
    if isinstance(targets, str):
        targets = list(ALL_TARGETS) if targets == "all-linear" else [targets]
    targets = list(targets)
    # Stacked expert weights (target_parameters "down_proj" or "mlp.experts.down_proj"): their names.
    targets += [t.rsplit(".", 1)[-1] for t in c.get("target_parameters") or []]
    cfg = LoRAConfig(rank=int(c["r"]), alpha=float(c.get("lora_alpha", c["r"])), targets=tuple(targets),
                     use_rslora=bool(c.get("use_rslora", False)), rank_pattern=_patterns(c, "rank_pattern", int),
                     alpha_pattern=_patterns(c, "alpha_pattern", float))
    weights = path / "adapter_model.safetensors"
    if not weights.is_file():
        raise NotFoundError(f"{path}: no adapter_model.safetensors")
    f = open_safetensors(weights)
    tensors = {k: np.array(f.get(k), dtype=np.float32) for k in f.keys()}
    if module_prefix == "model." and any(k.startswith(PEFT_PREFIX + LANGUAGE_MODEL_PREFIX) for k in tensors):
        module_prefix = LANGUAGE_MODEL_PREFIX  # an adapter of a multimodal model's language model
    projector = {k[len(PEFT_PREFIX + "model."):]: tensors.pop(k) for k in list(tensors)
                 if k.startswith(PROJECTOR_PEFT_PREFIXES)}
    params = from_peft_tensors(tensors, cfg, module_prefix)
    params.update(projector)
    return cfg, params
