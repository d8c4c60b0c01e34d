"""What the registry-driven parity tests cannot see for Qwen2 and Mistral: transformers starts
biases at zero, so Qwen2's q/k/v biases are given values here before logits, gradients and LoRA
are compared; and which layers slide, as transformers' configs define it (Qwen2's
use_sliding_window / max_window_layers / layer_types, Mistral's every-layer window)."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import surogate  # noqa: E402
from sgtest.tiny_models import make_model  # noqa: E402
from surogate.dsl.nn import LoRAConfig  # noqa: E402
from surogate.models import family_named  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def tokens(vocab: int, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, size=n).astype(np.int64)


def rel_err(a, b) -> float:
    return float(np.abs(a - b).max() / (np.abs(b).max() + 1e-12))


@pytest.fixture(scope="module")
def qwen2_with_biases(tmp_path_factory):
    """The tiny Qwen2 with q/k/v biases of the size of its weights (saved by transformers)."""
    path = make_model("qwen2", tmp_path_factory.mktemp("qwen2b"), seed=5)
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    ref.save_pretrained(path)
    return path


def test_qwen2_biases_logits_and_grads_match_transformers(qwen2_with_biases):
    ours = surogate.load_model(qwen2_with_biases)
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(qwen2_with_biases), dtype=torch.float32).eval()
    assert all(p.abs().max() > 0.1 for n, p in ref.named_parameters() if n.endswith(".bias"))
    assert not any("o_proj.bias" in n for n, _ in ref.named_parameters())
    ids = tokens(ours.spec.vocab_size, 21, seed=3)
    t = torch.tensor(ids)[None]
    out = ref(t, labels=t)
    np.testing.assert_allclose(ours.forward(ids), out.logits[0].detach().numpy(), atol=1e-4, rtol=0)
    loss, grads = ours.loss_and_grads(ids)
    assert loss == pytest.approx(out.loss.item(), rel=1e-5)
    out.loss.backward()
    hf = ours.to_hf(grads)
    biases = [n for n in hf if n.endswith(".bias")]
    assert len(biases) == 3 * ours.spec.num_layers
    for name in biases:
        assert rel_err(hf[name], dict(ref.named_parameters())[name].grad.numpy()) < 1e-4, name


def test_qwen2_lora_with_biases_matches_peft(qwen2_with_biases):
    """LoRA on a biased projection: y = x W^T + b + s (x A^T) B^T, the base bias frozen (peft's
    default bias="none")."""
    peft = pytest.importorskip("peft")
    ours = surogate.load_model(qwen2_with_biases)
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(qwen2_with_biases), dtype=torch.float32)
    pm = peft.get_peft_model(ref, peft.LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, lora_dropout=0.0))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)

    def inner(name):
        return name.removeprefix("base_model.model.model.").replace(".default.weight", "")

    lora_params = {inner(n): p.detach().numpy().copy() for n, p in pm.named_parameters() if "lora_" in n}
    ids = tokens(ours.spec.vocab_size, 19, seed=2)
    loss, grads = ours.loss_and_grads(ids, lora=LoRAConfig(rank=4, alpha=8, targets=tuple(TARGETS)),
                                      lora_params=lora_params)
    t = torch.tensor(ids)[None]
    out = pm(input_ids=t, labels=t)
    out.loss.backward()
    assert loss == pytest.approx(out.loss.item(), rel=1e-5)
    ref_grads = {inner(n): p.grad.numpy() for n, p in pm.named_parameters() if "lora_" in n}
    assert set(grads) == set(ref_grads)
    for name, g in grads.items():
        assert rel_err(g, ref_grads[name]) < 1e-4, name


QWEN2_WINDOWS = [
    # (config keys beside 4 layers, windows)
    ({"use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 2}, []),  # Qwen2.5's releases
    ({"sliding_window": 4096, "max_window_layers": 2}, []),  # use_sliding_window defaults to off
    ({"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 2}, [0, 0, 16, 16]),
    ({"use_sliding_window": True, "sliding_window": 16}, []),  # max_window_layers defaults to 28
    ({"use_sliding_window": True, "sliding_window": None, "max_window_layers": 0}, []),
    ({"use_sliding_window": True, "sliding_window": 16,
      "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]}, [16, 0, 16, 0]),
    ({"use_sliding_window": False, "sliding_window": 16, "layer_types": ["sliding_attention"] * 4}, []),
]


@pytest.mark.parametrize("keys,windows", QWEN2_WINDOWS)
def test_qwen2_windows_are_transformers_layer_types(keys, windows):
    base = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4,
            "num_attention_heads": 2, "num_key_value_heads": 1}
    assert family_named("qwen2").spec_from_config({**base, **keys}).sliding_windows == windows
    # transformers' own reading of the same keys: its layer_types and the window they get.
    hf = transformers.Qwen2Config(**base, **keys)
    expect = [hf.sliding_window if t == "sliding_attention" and hf.sliding_window else 0 for t in hf.layer_types]
    assert (windows or [0] * 4) == expect


@pytest.mark.parametrize("window,windows", [(None, []), (4096, [4096] * 3), (7, [7] * 3)])
def test_mistral_window_covers_every_layer(window, windows):
    cfg = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3,
           "num_attention_heads": 2, "sliding_window": window}
    assert family_named("mistral").spec_from_config(cfg).sliding_windows == windows


@pytest.mark.parametrize("family", ["qwen2", "mistral"])
def test_the_window_changes_what_the_parity_tests_see(family, tmp_path):
    """The tiny configs' window (8 tokens) cuts into the parity tests' sequences: without it the
    logits agree on the first 8 positions only, so the parity tests check the window's edge."""
    path = make_model(family, tmp_path / "w", seed=3)
    windowed = surogate.load_model(path).forward(ids := tokens(400, 23, seed=1))
    cfg = json.loads((path / "config.json").read_text())
    cfg.update({"sliding_window": None, "use_sliding_window": False, "layer_types": None})
    (path / "config.json").write_text(json.dumps(cfg))
    full = surogate.load_model(path)
    assert full.spec.sliding_windows == []
    diff = np.abs(full.forward(ids) - windowed).max(axis=-1)
    assert diff[:8].max() < 1e-5 and diff[8:].min() > 1e-4
