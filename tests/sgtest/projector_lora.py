"""A LoRA adapter of a tiny vision model with its multimodal projector trained whole (what a run
with ``train_projector: true`` saves: peft's layout, the language model's LoRA under
model.language_model.*, the tower excluded, the projector's modules in modules_to_save), written
from random values: B's that change the answers, the projector the base's plus noise."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_projector_adapter(folder, path, *, seed: int = 0, scale: float = 0.5, lora_scale: float = 0.3,
                            targets=("q_proj", "v_proj", "down_proj"), projector: dict | None = None) -> Path:
    """The adapter folder at ``path`` for the model at ``folder``. ``projector``: HF-named tensors
    (``model.multi_modal_projector.*``) to write instead of the noisy base ones (a misfit, for the
    errors)."""
    import surogate
    from surogate.dsl.nn import LoRAConfig
    from surogate.models.peft import LANGUAGE_MODEL_PREFIX, VISION_MODULES
    from surogate.train.lora import init_lora, save_peft_adapter

    model = surogate.load_model(folder)
    rng = np.random.default_rng(seed)
    cfg = LoRAConfig(rank=4, alpha=8.0, targets=tuple(targets))
    g = model.arch.build(mode="logits", dtype="float32", lora=cfg)
    lora = {k: (v if k.endswith("lora_A") else rng.standard_normal(v.shape).astype(np.float32) * lora_scale)
            for k, v in init_lora(g, seed).items()}
    if projector is None:
        mine = {n: model.params[n] + rng.standard_normal(model.params[n].shape).astype(np.float32) * scale
                for n in model.projectors.names()}
        projector = {n if n.startswith("model.") else "model." + n: a for n, a in model.to_hf(mine).items()}
    return save_peft_adapter(path, lora, cfg, base_model=str(folder), module_prefix=LANGUAGE_MODEL_PREFIX,
                             exclude_modules=VISION_MODULES, modules_to_save=list(model.spec.vision.projector_modules),
                             whole=projector)


def peft_reference(folder, adapter):
    """transformers' model of ``folder`` (its architecture) under peft's adapter, f32, eval."""
    import json

    import peft
    import torch
    import transformers

    arch = json.loads((Path(folder) / "config.json").read_text())["architectures"][0]
    base = getattr(transformers, arch).from_pretrained(str(folder), dtype=torch.float32)
    return peft.PeftModel.from_pretrained(base, str(adapter)).eval()
