"""Training a Qwen3-MoE end to end (CPU, f32): LoRA on attention and experts with the router
trained beside it and the z-loss on; the step lines carry the expert load; the adapter loads in
peft with the merged model's logits; config errors name their key."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import surogate  # noqa: E402
from sgtest.qa import interrupt_after, sft_config, step_losses, step_records, write_qa  # noqa: E402
from sgtest.tiny_models import make_model, make_qwen3  # noqa: E402
from surogate.errors import ConfigError  # noqa: E402
from surogate.train.trainer import Trainer  # noqa: E402


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_model("qwen3_moe", tmp_path_factory.mktemp("moe"), seed=3)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_qa(tmp_path_factory.mktemp("data") / "qa.jsonl")


def test_expert_lora_with_router_and_z_loss_trains_and_loads_in_peft(base, data, tmp_path):
    cfg = sft_config(base, data, tmp_path / "run", max_steps=3, merge_adapter=True, train_router=True,
                     router_z_loss_coef=0.01, lora_rank=4, lora_alpha=8)
    tr = Trainer(cfg)
    assert any(".mlp.experts.gate_up_proj.lora_A" in n for n in tr.trainable)
    assert "layers.0.mlp.gate.weight" in tr.trainable
    router0 = tr.model.params["layers.0.mlp.gate.weight"].copy()
    result = tr.train()
    np.testing.assert_array_equal(tr.model.params["layers.0.mlp.gate.weight"], router0)  # the base stays
    assert np.abs(tr._trainable_state()["layers.0.mlp.gate.weight"] - router0).max() > 1e-4  # the copy trained
    steps = step_records(tmp_path / "run")
    assert len(steps) == 3
    E, K = tr.model.spec.moe.num_experts, tr.model.spec.moe.top_k
    for r in steps:
        # every row of every micro-batch routed to K experts in each of the sparse layers
        assert sum(r["moe_tokens_per_expert"]) == tr.N * K * len(tr.model.spec.moe.layers) * 2
        assert len(r["moe_tokens_per_expert"]) == E
        assert r["moe_load_max"] == max(r["moe_tokens_per_expert"])
        assert r["moe_load_imbalance"] == pytest.approx(r["moe_load_max"] / r["moe_load_mean"])
        assert len(r["moe_layer_imbalance"]) == len(tr.model.spec.moe.layers)
        assert r["moe_z_loss"] > 0 and r["moe_aux_loss"] > 0

    meta = json.loads((result.output / "adapter_config.json").read_text())
    assert meta["modules_to_save"] == ["gate"] and sorted(meta["target_parameters"]) == ["down_proj", "gate_up_proj"]
    peft = pytest.importorskip("peft")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    pm = peft.PeftModel.from_pretrained(hf, str(result.output)).eval()
    merged = surogate.load_model(result.merged)
    ids = np.arange(3, 40)
    with torch.no_grad():
        ref = pm(torch.tensor(ids)[None]).logits[0].numpy()
    got = merged.forward(ids)
    assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-4
    base_logits = surogate.load_model(base).forward(ids)
    assert np.abs(got - base_logits).max() > 1e-3  # the run changed the model


def test_moe_keys_on_a_dense_model_name_the_key(data, tmp_path):
    dense = make_qwen3(tmp_path / "dense")
    with pytest.raises(ConfigError, match="train_router"):
        Trainer(sft_config(dense, data, tmp_path / "run", train_router=True))
    with pytest.raises(ConfigError, match="router_z_loss_coef"):
        sft_config(dense, data, tmp_path / "run", router_z_loss_coef=-1.0)


def test_expert_lora_refuses_dropout(base, data, tmp_path):
    from surogate.errors import UnsupportedError

    with pytest.raises(UnsupportedError, match="lora_dropout"):
        Trainer(sft_config(base, data, tmp_path / "run", lora_dropout=0.1))


def test_resume_with_a_trained_router_reproduces_the_curve(base, data, tmp_path):
    """The routers trained beside the adapters are checkpointed with them: a resumed run's
    losses (which depend on the routers through the routing and the z-loss) equal the
    uninterrupted run's."""
    def cfg(out, **kw):
        return sft_config(base, data, out, save_steps=3, train_router=True, router_z_loss_coef=0.01, **kw)

    Trainer(cfg(tmp_path / "a")).train()
    want = step_losses(tmp_path / "a")
    interrupted = Trainer(cfg(tmp_path / "b"))
    interrupt_after(interrupted, 4)
    with pytest.raises(KeyboardInterrupt):
        interrupted.train()
    Trainer(cfg(tmp_path / "b", resume_from_checkpoint=True)).train()
    by_step = {r["step"]: r["loss"] for r in step_records(tmp_path / "b")}
    assert [by_step[s] for s in range(1, 7)] == want
