"""LFM2 beyond the registry-driven tests: conv biases with values (transformers initialises them
to zero, so the parity tests cannot see a dropped one), packed documents never crossing in the
short convolution, and the MLP width rule of block_auto_adjust_ff_dim."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import surogate  # noqa: E402
from sgtest.tiny_models import make_model  # noqa: E402
from surogate.models.lfm2 import ff_dim  # noqa: E402


@pytest.fixture(scope="module")
def biased(tmp_path_factory):
    """The untied, biased tiny variant with every conv bias set to random values."""
    from surogate.models import family_named

    variant = family_named("lfm2").tiny.variants["untied-bias-l4"]
    path = make_model("lfm2", tmp_path_factory.mktemp("lfm2b"), seed=5, **variant)
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        n = 0
        for name, p in ref.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
                n += 1
    assert n > 0
    ref.save_pretrained(path)
    return path, ref.eval()


def test_conv_biases_with_values_match_transformers(biased):
    path, ref = biased
    ours = surogate.load_model(path)
    ids = np.random.default_rng(1).integers(0, ours.spec.vocab_size, 21)
    t = torch.tensor(ids)[None]
    out = ref(t, labels=t)
    np.testing.assert_allclose(ours.forward(ids), out.logits[0].detach().numpy(), atol=1e-4, rtol=0)
    loss, grads = ours.loss_and_grads(ids)
    assert loss == pytest.approx(out.loss.item(), rel=1e-5)
    out.loss.backward()
    theirs = {name: p.grad.numpy() for name, p in ref.named_parameters()}
    for name, g in ours.to_hf(grads).items():
        if name.endswith("bias"):
            r = theirs[name]
            assert np.abs(g - r).max() / (np.abs(r).max() + 1e-12) < 1e-4, name


def test_packed_documents_equal_each_document_alone(biased):
    ours = surogate.load_model(biased[0])
    rng = np.random.default_rng(2)
    docs = [rng.integers(0, ours.spec.vocab_size, n) for n in (6, 1, 2, 11)]
    alone = np.concatenate([ours.forward(d) for d in docs])
    np.testing.assert_allclose(ours.forward(docs), alone, atol=1e-5, rtol=0)


def test_mlp_width_follows_transformers():
    # LFM2-1.2B: block_ff_dim 12288 -> 8192; without a multiplier transformers does not round.
    assert ff_dim({"intermediate_size": 12288, "block_ff_dim": 12288, "block_multiple_of": 256,
                   "block_ffn_dim_multiplier": 1.0, "block_auto_adjust_ff_dim": True}) == 8192
    assert ff_dim({"intermediate_size": 100, "block_multiple_of": 256, "block_ffn_dim_multiplier": None}) == 66
    assert ff_dim({"intermediate_size": 96, "block_auto_adjust_ff_dim": False}) == 96
    for size, mult in ((1000, 1.3), (4608, 1.0), (777, 0.5)):
        cfg = transformers.Lfm2Config(hidden_size=64, intermediate_size=size, block_multiple_of=64,
                                      block_ffn_dim_multiplier=mult, num_hidden_layers=1, num_attention_heads=4)
        mlp = transformers.models.lfm2.modeling_lfm2.Lfm2MLP(cfg)
        assert ff_dim(cfg.to_dict()) == mlp.w1.out_features
