"""Qwen3-MoE beyond the registry-driven tests: the router's load-balancing loss equals the
aux_loss transformers reports, and LoRA on the attention projections of a MoE model equals peft's."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import surogate  # noqa: E402
from sgtest.tiny_models import make_model  # noqa: E402
from surogate.dsl.nn import LoRAConfig  # noqa: E402


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_model("qwen3_moe", tmp_path_factory.mktemp("qwen3_moe"), seed=5)


def test_aux_loss_equals_transformers_aux_loss(folder):
    ours = surogate.load_model(folder)
    ids = np.random.default_rng(3).integers(0, ours.spec.vocab_size, 29)
    loss, _ = ours.loss_and_grads(ids)
    exe = ours.executable("train", len(ids), 1, grads=True)
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    t = torch.tensor(ids)[None]
    out = ref(t, labels=t)
    assert float(exe.read("aux_loss")[0]) == pytest.approx(out.aux_loss.item(), rel=1e-5)
    assert ours.spec.moe.router_aux_loss_coef == ref.config.router_aux_loss_coef > 0
    assert loss == pytest.approx(out.loss.item(), rel=1e-5)


def test_attention_lora_on_a_moe_model_matches_peft(folder):
    peft = pytest.importorskip("peft")
    ours = surogate.load_model(folder)
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
    pm = peft.get_peft_model(ref, peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets, lora_dropout=0.0))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    lora_params = {name.removeprefix("base_model.model.model.").replace(".default.weight", ""): p.detach().numpy()
                   for name, p in pm.named_parameters() if "lora_" in name}
    ids = np.random.default_rng(2).integers(0, ours.spec.vocab_size, 19)
    loss, grads = ours.loss_and_grads(ids, lora=LoRAConfig(rank=4, alpha=8, targets=tuple(targets)),
                                      lora_params=lora_params)
    t = torch.tensor(ids)[None]
    out = pm(input_ids=t, labels=t)
    out.loss.backward()
    assert loss == pytest.approx(out.loss.item(), rel=1e-5)
    ref_grads = {name.removeprefix("base_model.model.model.").replace(".default.weight", ""): p.grad.numpy()
                 for name, p in pm.named_parameters() if "lora_" in name}
    assert set(grads) == set(ref_grads)
    for name, g in grads.items():
        r = ref_grads[name]
        assert np.abs(g - r).max() / (np.abs(r).max() + 1e-12) < 1e-4, name


# ---- LoRA on the experts: peft 0.21's layout on transformers 5 (target_parameters) ----------
ATTN = ["q_proj", "k_proj", "v_proj", "o_proj"]
EXPERT_TARGETS = ["gate_proj", "up_proj", "down_proj"]


def _peft_model(folder, targets, r=4, alpha=8, seed=0, **kw):
    """peft's model for LoraConfig(target_modules=targets) with random (nonzero) B's."""
    peft = pytest.importorskip("peft")
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    pm = peft.get_peft_model(ref, peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0,
                                                  **kw))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return pm


def _peft_tensors(pm, attr="data"):
    """peft's adapter tensors (values or grads) under their saved names."""
    out = {}
    for name, p in pm.named_parameters():
        if "lora_" in name or "modules_to_save" in name:
            t = p.grad if attr == "grad" else p.detach()
            out[name.replace(".default", "").replace(".modules_to_save", "")] = t.numpy().copy()
    return out


@pytest.mark.parametrize("targets", [ATTN + EXPERT_TARGETS, ["down_proj"], ["gate_proj", "up_proj"]])
def test_expert_lora_grads_match_peft(folder, targets):
    from surogate.models.peft import from_peft_tensors, load_peft_adapter

    pm = _peft_model(folder, targets)
    pm.save_pretrained(str(folder.parent / "peft_adapter"))
    cfg, params = load_peft_adapter(folder.parent / "peft_adapter")
    assert cfg.targets  # its target_parameters (gate_up_proj with rank 2r) as our targets
    ours = surogate.load_model(folder)
    ids = np.random.default_rng(2).integers(0, ours.spec.vocab_size, 23)
    lora = LoRAConfig(rank=4, alpha=8, targets=tuple(targets))
    # The config we build from the user's targets and the one read back from peft's folder agree.
    g1 = ours.arch.build(mode="train", lora=lora)
    g2 = ours.arch.build(mode="train", lora=cfg)
    shapes = {p.name: p.shape for p in g1.params() if p.meta.get("lora")}
    assert shapes == {p.name: p.shape for p in g2.params() if p.meta.get("lora")} == \
        {n: a.shape for n, a in params.items()}
    loss, grads = ours.loss_and_grads(ids, lora=lora, lora_params=params)
    t = torch.tensor(ids)[None]
    out = pm(input_ids=t, labels=t)
    out.loss.backward()
    assert loss == pytest.approx(out.loss.item(), rel=1e-5)
    ref_grads = from_peft_tensors(_peft_tensors(pm, "grad"), cfg)
    assert set(grads) == set(ref_grads)
    assert any(".mlp.experts." in n for n in grads)
    for name, g in grads.items():
        r = ref_grads[name]
        assert np.abs(g - r).max() / (np.abs(r).max() + 1e-12) < 1e-4, name
