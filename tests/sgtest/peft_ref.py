"""peft as the reference for LoRA: a peft model with random (nonzero) B's, its adapter tensors under
the names its adapter files use, and the check that our loss and every LoRA gradient equal its own
on the same tokens (the harness the family, MoE and QLoRA tests share)."""

from __future__ import annotations

import numpy as np
import pytest


def peft_model(ref, targets, r: int = 4, alpha: int = 8, seed: int = 0, **kw):
    """``ref`` (a transformers model) under ``LoraConfig(target_modules=targets)``, its B's drawn
    from N(0, 0.05²): B = 0 (peft's init) would leave every A gradient zero."""
    import peft
    import torch

    pm = peft.get_peft_model(ref, peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0,
                                                  **kw))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return pm


def peft_tensors(pm, attr: str = "data") -> dict[str, np.ndarray]:
    """peft's adapter tensors (values, or grads with ``attr="grad"``) under their saved names
    (``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``; modules_to_save too)."""
    out = {}
    for name, p in pm.named_parameters():
        if "lora_" in name or "modules_to_save" in name:
            t = p.grad if attr == "grad" else p.detach()
            out[name.replace(".default", "").replace(".modules_to_save", "")] = t.numpy().copy()
    return out


def check_lora_grads(ours, pm, lora, ids, lora_params=None, tol: float = 1e-4) -> dict[str, np.ndarray]:
    """Our loss and LoRA gradients on ``ids`` equal peft's (``pm``, with the same adapter values):
    loss to 1e-5 relative, each gradient to ``tol`` of its largest entry. Returns our gradients."""
    import torch

    from surogate.models.peft import from_peft_tensors

    params = lora_params if lora_params is not None else from_peft_tensors(peft_tensors(pm), lora)
    loss, grads = ours.loss_and_grads(ids, lora=lora, lora_params=params)
    t = torch.tensor(np.asarray(ids))[None]
    out = pm(input_ids=t, labels=t)
    out.loss.backward()
    assert loss == pytest.approx(out.loss.item(), rel=1e-5)
    ref = from_peft_tensors(peft_tensors(pm, "grad"), lora)
    assert set(grads) == set(ref)
    for name, g in grads.items():
        r = ref[name]
        err = np.abs(g - r).max() / (np.abs(r).max() + 1e-12)
        assert err < tol, f"{name}: {err:.2e}"
    return grads
