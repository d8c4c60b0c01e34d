"""QLoRA over GGML blocks (``qlora_gguf``): the frozen projection weights stay quantized, the
adapters train. Gradients checked against peft on the same model with the weights gguf-py
dequantizes from our blocks; the trainer end to end from YAML keys, over an HF folder quantized at
load and over a GGUF file's own blocks; config errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
gguf = pytest.importorskip("gguf")

import surogate  # noqa: E402
from sgtest.peft_ref import check_lora_grads, peft_model  # noqa: E402
from sgtest.qa import fell, sft_config, step_losses, write_qa  # noqa: E402
from sgtest.tiny_models import make_model  # noqa: E402
from surogate.dsl.nn import LoRAConfig  # noqa: E402
from surogate.errors import ConfigError  # noqa: E402
from surogate.io.gguf import ggml_type_name  # noqa: E402
from surogate.models import family_named  # noqa: E402
from surogate.train.trainer import Trainer  # noqa: E402

# Hidden 256 puts every projection's rows in whole K blocks (Q4_K, Q6_K); 64 makes Q4_K_M fall
# back to 32-value blocks (Q5_0), as llama.cpp does.
CASES = {
    "llama-q8_0": ("llama", "Q8_0", {}),
    "llama-q4_k_m-256": ("llama", "Q4_K_M", dict(hidden_size=256, intermediate_size=512)),
    "qwen2-q6_k-256": ("qwen2", "Q6_K", dict(hidden_size=256, intermediate_size=512)),
    "lfm2-q4_k_m": ("lfm2", "Q4_K_M", {}),
    "gemma3-q8_0": ("gemma3", "Q8_0", {}),
}


def dequantized(model) -> dict[str, np.ndarray]:
    """The model's parameters with every block tensor decoded by gguf-py (the reference decoder)."""
    out = dict(model.params)
    for name, t in model.quant.items():
        q = gguf.GGMLQuantizationType[ggml_type_name(t)]
        out[name] = np.asarray(gguf.quants.dequantize(model.params[name], q), np.float32)
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_lora_grads_over_blocks_match_peft_on_the_dequantized_weights(tmp_path, case):
    family, qtype, overrides = CASES[case]
    path = make_model(family, tmp_path / "base", seed=3, **overrides)
    ours = surogate.load_model(path, quantize=qtype)
    assert ours.quant, "no projection was quantized"
    kinds = {ggml_type_name(t) for t in ours.quant.values()}
    if "256" in case:
        assert kinds & {"Q4_K", "Q6_K"}, kinds
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    state = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in ours.to_hf(dequantized(ours)).items()}
    missing, unexpected = ref.load_state_dict(state, strict=False)
    assert not unexpected and all("lm_head" in k for k in missing), (missing, unexpected)
    targets = list(family_named(family).lora_targets)
    check_lora_grads(ours, peft_model(ref, targets), LoRAConfig(rank=4, alpha=8, targets=tuple(targets)),
                     np.random.default_rng(2).integers(0, ours.spec.vocab_size, 29))


def test_blocks_are_a_fraction_of_the_weights(tmp_path):
    path = make_model("llama", tmp_path / "base", seed=3, hidden_size=256, intermediate_size=512)
    full, q = surogate.load_model(path), surogate.load_model(path, quantize="Q4_K_M")
    for name in q.quant:
        assert q.params[name].dtype == np.uint8
        assert q.params[name].nbytes < full.params[name].nbytes / 4.8  # 4.5 (Q4_K) to 6.6 (Q6_K) bits of 32


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_qa(tmp_path_factory.mktemp("data") / "qa.jsonl")


def test_sft_over_an_hf_folder_quantized_at_load_learns_and_saves_a_peft_adapter(tmp_path, data):
    base = make_model("llama", tmp_path / "base", seed=5)
    t = Trainer(sft_config(base, data, tmp_path / "out", qlora_gguf="q8_0", merge_adapter=True,
                             sequence_len=128, max_steps=12))
    assert t.model.quant
    result = t.train()
    Trainer(sft_config(base, data, tmp_path / "full", sequence_len=128)).train()
    # Q8_0 blocks move the curve by little against the same run over the f32 weights (its first 6
    # steps; past them the runs drift apart at this learning rate); it falls.
    losses, want = step_losses(tmp_path / "out"), step_losses(tmp_path / "full")
    assert np.allclose(losses[:6], want, rtol=1e-2), (losses, want)
    assert fell(losses, 0.2), losses
    # The adapter is a PEFT adapter of the full-precision base; over those weights it scores the
    # data about as the quantized run did (Q8_0 moves the loss by far less than training did).
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    pm = peft.PeftModel.from_pretrained(ref, str(result.output))
    assert json.loads((result.output / "adapter_config.json").read_text())["base_model_name_or_path"] == str(base)
    merged = transformers.AutoModelForCausalLM.from_pretrained(str(result.merged), dtype=torch.float32)
    ids = torch.tensor(np.random.default_rng(0).integers(0, 256, 17))[None]
    with torch.no_grad():
        np.testing.assert_allclose(merged(ids).logits.numpy(), pm(input_ids=ids).logits.numpy(), atol=1e-4)


def test_sft_over_a_gguf_files_own_blocks(tmp_path, data):
    from surogate.models.gguf_names import quantize_to_gguf

    base = make_model("qwen3", tmp_path / "base", seed=5)
    file = quantize_to_gguf(base, tmp_path / "base.gguf", "Q8_0")
    t = Trainer(sft_config(file, data, tmp_path / "out", qlora_gguf=True, max_steps=4, sequence_len=128))
    assert {ggml_type_name(v) for v in t.model.quant.values()} == {"Q8_0"}
    t.train()
    losses = step_losses(tmp_path / "out")
    assert losses[-1] < losses[0], losses
    assert (tmp_path / "out" / "adapter" / "adapter_model.safetensors").is_file()


def test_qlora_config_errors_name_the_key(tmp_path, data):
    base = make_model("llama", tmp_path / "base", seed=5)
    with pytest.raises(ConfigError, match="qlora_gguf.*not a GGUF file"):
        Trainer(sft_config(base, data, tmp_path / "a", qlora_gguf=True))
    with pytest.raises(ConfigError, match="qlora_gguf: 'Q3_X' is not a block type"):
        sft_config(base, data, tmp_path / "b", qlora_gguf="Q3_X")
    with pytest.raises(ConfigError, match="qlora_gguf: needs lora: true"):
        sft_config(base, data, tmp_path / "c", qlora_gguf="Q8_0", lora=False)
