"""Qwen2 and Mistral through GGUF, beyond the registry-driven writer tests: every tensor name we
write is the one gguf-py's own HF -> GGUF map gives for the architecture (llama.cpp's names,
biases included); the hyper-parameters round-trip (a Mistral file, written as llama.cpp's
"llama", reads back as the same model); and what a sliding window becomes in a GGUF, which has
no key for it in either architecture: a warning, and the full-attention model llama.cpp runs."""

from __future__ import annotations

import dataclasses
import json
import logging

import numpy as np
import pytest
from gguf import GGUFReader, get_tensor_name_map
from gguf.constants import MODEL_ARCH_NAMES
from sgtest import tiny_models

import surogate
from surogate.io import GGUFFile
from surogate.models import config_from_gguf, family_for_gguf, family_named
from surogate.models.gguf_names import quantize_to_gguf

ARCH = {name: arch for arch, name in MODEL_ARCH_NAMES.items()}


@pytest.mark.parametrize("family", ["qwen2", "mistral"])
def test_tensor_names_are_gguf_pys(tmp_path, family):
    f = family_named(family)
    folder = tiny_models.make_model(family, tmp_path / "m", **f.tiny.gguf)
    path = quantize_to_gguf(folder, tmp_path / "m.gguf", "F32")
    reader = GGUFReader(path)
    arch = reader.fields["general.architecture"].contents()
    assert arch == f.gguf.name
    layers = json.loads((folder / "config.json").read_text())["num_hidden_layers"]
    names = get_tensor_name_map(ARCH[arch], layers)
    from surogate.io import ModelFolder

    hf_names = list(ModelFolder(folder).open_weights().keys())  # noqa: SIM118
    want = {names.get_name(n, try_suffixes=(".weight", ".bias")) for n in hf_names}
    assert None not in want
    assert {t.name for t in reader.tensors} == want
    if family == "qwen2":
        assert {f"blk.0.attn_{p}.bias" for p in "qkv"} <= want and "blk.0.attn_output.bias" not in want


def spec_fields(spec) -> dict:
    d = dataclasses.asdict(spec)
    d.pop("family")
    return d


@pytest.mark.parametrize("family,overrides", [
    ("qwen2", {"use_sliding_window": False, "tie_word_embeddings": False}),
    ("qwen2", {"use_sliding_window": False, "num_attention_heads": 4, "num_key_value_heads": 4}),
    # v0.3 (rope base 1e6, no window) and Nemo's head_dim apart from hidden / heads.
    ("mistral", {"sliding_window": None, "rope_theta": 1000000.0}),
    ("mistral", {"sliding_window": None, "head_dim": 128, "num_attention_heads": 4, "num_key_value_heads": 1}),
])
def test_hyperparameters_round_trip(tmp_path, family, overrides):
    f = family_named(family)
    folder = tiny_models.make_model(family, tmp_path / "m", **{**f.tiny.gguf, **overrides})
    path = quantize_to_gguf(folder, tmp_path / "m.gguf", "F32")
    gf = GGUFFile(path)
    back = family_for_gguf(gf)
    assert back.name == ("llama" if family == "mistral" else family)  # llama.cpp files Mistral as llama
    source = f.spec_from_config(json.loads((folder / "config.json").read_text()))
    read = back.spec_from_config(config_from_gguf(gf))
    a, b = spec_fields(read), spec_fields(source)
    assert a.pop("rms_norm_eps") == pytest.approx(b.pop("rms_norm_eps"), rel=1e-6)  # GGUF keeps it as f32
    assert a == b
    ids = list(range(1, 40))
    np.testing.assert_allclose(surogate.load_model(path).forward(ids), surogate.load_model(folder).forward(ids),
                               atol=1e-5, rtol=0)


@pytest.mark.parametrize("family,window", [("qwen2", {"use_sliding_window": True, "sliding_window": 8,
                                                      "max_window_layers": 0}),
                                           ("mistral", {"sliding_window": 8})])
def test_a_window_gguf_cannot_hold_is_said_and_runs_full(tmp_path, family, window, caplog):
    f = family_named(family)
    folder = tiny_models.make_model(family, tmp_path / "m", **{**f.tiny.gguf, **window})
    with caplog.at_level(logging.WARNING):
        path = quantize_to_gguf(folder, tmp_path / "m.gguf", "F32")
    assert "sliding window (8 tokens) is not written to GGUF" in caplog.text
    assert not any(k.endswith("sliding_window") for k in GGUFReader(path).fields)
    gguf_model, hf_model = surogate.load_model(path), surogate.load_model(folder)
    assert gguf_model.spec.sliding_windows == [] and hf_model.spec.sliding_windows
    ids = list(range(1, 24))
    a, b = gguf_model.forward(ids), hf_model.forward(ids)
    np.testing.assert_allclose(a[:8], b[:8], atol=1e-5, rtol=0)  # within the window: the same model
    assert np.abs(a[8:] - b[8:]).max() > 1e-4


def test_qwen2_biases_through_gguf(tmp_path):
    """transformers starts biases at zero; with values, they travel into the GGUF (F32, as
    llama.cpp keeps 1-D tensors), read back by transformers' GGUF loader and ours, and are added
    after gguf_matmul when the weights stay GGML blocks."""
    torch = pytest.importorskip("torch")
    import transformers

    f = family_named("qwen2")
    folder = tiny_models.make_model("qwen2", tmp_path / "m", seed=4, initializer_range=0.05, **f.tiny.gguf)
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=gen))
    ref.save_pretrained(folder)
    ids = list(range(1, 30))
    want = surogate.load_model(folder).forward(ids)
    f32 = quantize_to_gguf(folder, tmp_path / "m.f32.gguf", "F32")
    np.testing.assert_allclose(surogate.load_model(f32).forward(ids), want, atol=1e-5, rtol=0)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=f32.name, dtype=torch.float32)
    with torch.no_grad():
        np.testing.assert_allclose(hf(torch.tensor([ids])).logits[0].numpy(), want, atol=1e-4, rtol=0)
    q8 = quantize_to_gguf(folder, tmp_path / "m.q8.gguf", "Q8_0")
    deq, blk = surogate.load_model(q8), surogate.load_model(q8, quantized=True)
    assert "layers.0.self_attn.q_proj.weight" in blk.quant
    a, b = deq.forward(ids), blk.forward(ids)
    assert np.abs(a - b).max() < 0.05 * np.abs(a).max()
    # Without the biases the answer is far off: the bound above would catch a dropped add.
    no_bias = surogate.load_model(folder)
    no_bias.params.update({n: np.zeros_like(v) for n, v in no_bias.params.items() if n.endswith(".bias")})
    assert np.abs(no_bias.forward(ids) - a).max() > 0.2 * np.abs(a).max()
