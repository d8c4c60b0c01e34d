"""QLoRA over bitsandbytes NF4 (``qlora_bnb``): the projections quantized at load as bnb does
and kept 4-bit (+ absmax) in the model's tensors; LoRA gradients equal peft's over the same
dequantized base (bitsandbytes' own decoder); a YAML-keyed run trains, its adapter loads in
peft and the merge writes the dequantized base + LoRA in bf16."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
F = pytest.importorskip("bitsandbytes.functional")

import surogate  # noqa: E402
from sgtest.peft_ref import check_lora_grads, peft_model  # noqa: E402
from sgtest.qa import fell, sft_config, step_losses, write_qa  # noqa: E402
from sgtest.tiny_models import make_model  # noqa: E402
from surogate.dsl.nn import LoRAConfig  # noqa: E402
from surogate.errors import ConfigError  # noqa: E402
from surogate.io.nf4 import NF4Spec, NF4Weight  # noqa: E402
from surogate.model import nf4_dequantized  # noqa: E402
from surogate.models import family_named  # noqa: E402
from surogate.train.trainer import Trainer  # noqa: E402


def bnb_dequantized(model) -> dict[str, np.ndarray]:
    """The model's parameters with every NF4 weight decoded by bitsandbytes (the reference)."""
    out = nf4_dequantized(model)
    for name, spec in model.quant.items():
        t = NF4Weight.from_tensors(model.params, name, spec)
        rows, cols = t.shape
        q = torch.from_numpy(t.q.reshape(-1, 1))
        absmax = torch.from_numpy(t.absmax)
        if spec.double_quant:
            state2 = F.QuantState(absmax=torch.from_numpy(t.absmax_scale), code=F.create_dynamic_map(), blocksize=256,
                                  dtype=torch.float32)
            s = F.QuantState(absmax=absmax, shape=torch.Size((rows, cols)), code=F.get_4bit_type("nf4", "cpu"),
                             blocksize=spec.blocksize, quant_type="nf4", dtype=torch.float32,
                             offset=torch.tensor(t.offset[0]), state2=state2)
        else:
            s = F.QuantState(absmax=absmax, shape=torch.Size((rows, cols)), code=F.get_4bit_type("nf4", "cpu"),
                             blocksize=spec.blocksize, quant_type="nf4", dtype=torch.float32)
        ref = F.dequantize_4bit(q, s).numpy()
        assert np.array_equal(ref, out[name]), name  # our decoder is bnb's, bit for bit
        out[name] = ref
    return out


@pytest.mark.parametrize("family,double_quant", [("llama", True), ("qwen2", False)])
def test_lora_grads_over_nf4_match_peft_on_the_dequantized_base(tmp_path, family, double_quant):
    path = make_model(family, tmp_path / "base", seed=3)
    ours = surogate.load_model(path, quantize="NF4", nf4=NF4Spec(64, double_quant))
    assert ours.quant
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    state = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in ours.to_hf(bnb_dequantized(ours)).items()}
    missing, unexpected = ref.load_state_dict(state, strict=False)
    assert not unexpected and all("lm_head" in k for k in missing), (missing, unexpected)
    targets = list(family_named(family).lora_targets)
    check_lora_grads(ours, peft_model(ref, targets), LoRAConfig(rank=4, alpha=8, targets=tuple(targets)),
                     np.random.default_rng(2).integers(0, ours.spec.vocab_size, 29))


def test_the_base_stays_four_bit(tmp_path):
    path = make_model("llama", tmp_path / "base", seed=3, hidden_size=256, intermediate_size=512)
    full, q = surogate.load_model(path), surogate.load_model(path, quantize="NF4")
    for name in q.quant:
        assert q.params[name].dtype == np.uint8 and q.params[name].shape[1] * 2 == full.params[name].shape[1]
        state = sum(q.params[name + s].nbytes for s in (".absmax", ".absmax_scale", ".absmax_offset"))
        # 4 bits per value + 8 bits per 64-block + 32 bits per 256 blocks: ~4.13 bits of 32.
        assert (q.params[name].nbytes + state) / full.params[name].nbytes < 4.2 / 32


def test_bf16_training_step_decodes_to_bf16_and_tracks_f32(tmp_path):
    path = make_model("llama", tmp_path / "base", seed=3)
    lora = LoRAConfig(rank=4, alpha=8, targets=("q_proj", "down_proj"))
    ids = np.random.default_rng(1).integers(0, 256, 21)
    out = {}
    for dtype in ("float32", "bfloat16"):
        m = surogate.load_model(path, dtype=dtype, quantize="NF4")
        exe = m.executable("train", len(ids), 1, lora=lora, grads=True)
        b0, b1 = exe.lowered.phases["backward"]
        deq = [i for i in exe.lowered.instrs if i.op == "nf4_dequantize"]
        bwd = [i for i in exe.lowered.instrs[b0:b1] if i.op == "nf4_dequantize"]
        # Forward: every quantized projection; backward: each one whose input needs a gradient
        # (not the first layer's q/k/v: nothing below them trains). Temps in the step's dtype.
        assert len(deq) - len(bwd) == len(m.quant) and len(bwd) == len(m.quant) - 3
        assert all(i.outputs[0].dtype == dtype and i.outputs[0].kind == "internal" for i in deq)
        out[dtype] = m.loss(ids)
    assert out["bfloat16"] == pytest.approx(out["float32"], rel=2e-2)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_qa(tmp_path_factory.mktemp("data") / "qa.jsonl")


def test_sft_with_qlora_bnb_learns_saves_a_peft_adapter_and_merges_in_bf16(tmp_path, data):
    base = make_model("llama", tmp_path / "base", seed=5)
    t = Trainer(sft_config(base, data, tmp_path / "out", qlora_bnb=True, merge_adapter=True, sequence_len=128,
                           max_steps=12))
    assert t.model.quant and all(isinstance(s, NF4Spec) for s in t.model.quant.values())
    result = t.train()
    losses = step_losses(tmp_path / "out")
    assert fell(losses, 0.2), losses
    # The adapter is a PEFT adapter; over the NF4-dequantized base it gives what the merged
    # folder (dequantized base + LoRA, stored in bf16) gives.
    deq = nf4_dequantized(t.model)
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    ref.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in t.model.to_hf(deq).items()},
                        strict=False)
    pm = peft.PeftModel.from_pretrained(ref, str(result.output))
    ids = np.random.default_rng(0).integers(0, 256, 17)
    merged = transformers.AutoModelForCausalLM.from_pretrained(str(result.merged))
    assert merged.dtype == torch.bfloat16
    with torch.no_grad():
        want = pm(input_ids=torch.tensor(ids)[None]).logits.numpy()
        got = merged.float()(torch.tensor(ids)[None]).logits.numpy()
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max(), np.abs(got - want).max()  # bf16 rounding only


def test_the_example_yaml_trains_and_its_adapter_loads_in_peft(tmp_path, data):
    """configs/sft-qlora-bnb-llama.yaml with only the model, data and size keys changed."""
    import yaml
    from pathlib import Path

    from surogate.config import load_config

    raw = yaml.safe_load((Path(__file__).resolve().parents[2] / "configs" / "sft-qlora-bnb-llama.yaml").read_text())
    base = make_model("llama", tmp_path / "base", seed=5)
    raw.update(model=str(base), output_dir=str(tmp_path / "out"), datasets=[{"path": str(data), "type": "messages"}],
               device="cpu", recipe="fp32", sequence_len=128, max_steps=6, learning_rate=2e-2, eval_steps=0,
               save_steps=0, per_device_train_batch_size=2, gradient_accumulation_steps=2, recompute=False,
               optimizer="adamw", warmup_ratio=0.0, lr_scheduler_type="constant")
    cfg = load_config(raw, kind="sft")
    assert cfg.qlora_bnb and cfg.qlora_bnb_block_size == 64 and cfg.qlora_bnb_double_quant
    result = Trainer(cfg).train()
    losses = step_losses(tmp_path / "out")
    assert len(losses) == 6 and losses[-1] < losses[0] - 0.3, losses
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    pm = peft.PeftModel.from_pretrained(ref, str(result.output))
    assert any("lora_A" in n for n, _ in pm.named_parameters())


def test_qlora_bnb_config_errors(tmp_path, data):
    base = make_model("llama", tmp_path / "base", seed=5)
    with pytest.raises(ConfigError, match="qlora_bnb"):
        sft_config(base, data, tmp_path / "o", qlora_bnb=True, lora=False)
    with pytest.raises(ConfigError, match="qlora_bnb_block_size"):
        sft_config(base, data, tmp_path / "o", qlora_bnb=True, qlora_bnb_block_size=48)
    with pytest.raises(ConfigError, match="qlora_bnb"):
        sft_config(base, data, tmp_path / "o", qlora_bnb=True, qlora_gguf="Q8_0")
