"""Activation checkpointing per block: the same loss and gradients, bit for bit, in less memory."""

import numpy as np
import pytest

pytest.importorskip("torch")

import surogate  # noqa: E402
from sgtest.tiny_models import make_llama  # noqa: E402
from surogate.dsl.nn import LoRAConfig  # noqa: E402


@pytest.mark.parametrize("lora", [None, LoRAConfig(rank=4, alpha=8)])
def test_recompute_gives_identical_gradients_in_a_smaller_arena(tmp_path, lora):
    model = surogate.load_model(make_llama(tmp_path / "m", num_hidden_layers=4))
    ids = np.random.default_rng(0).integers(0, model.spec.vocab_size, 96)
    lora_params = None
    if lora is not None:
        from surogate.train.lora import init_lora

        g = model.arch.build(mode="train", lora=lora)
        lora_params = {k: v + 0.01 for k, v in init_lora(g, 0).items()}  # B != 0
    plain_loss, plain = model.loss_and_grads(ids, lora=lora, lora_params=lora_params)
    re_loss, re = model.loss_and_grads(ids, lora=lora, lora_params=lora_params, recompute=True)
    assert plain_loss == re_loss
    assert set(plain) == set(re)
    for name in plain:
        np.testing.assert_array_equal(plain[name], re[name], err_msg=name)
    key = lambda r: ("train", len(ids), 1, None if lora is None else lora.key(),
                     True, r)
    small = model._cache[key(True)].memory().activations
    big = model._cache[key(False)].memory().activations
    assert small < 0.75 * big, (small, big)
