"""Tiled MLP (long_context): every dense MLP run over row chunks, forward and backward, gives
the unchunked loss and gradients (weight gradients up to the order of their sum over chunks)
while its [N, 2F] / [N, F] interior never exists whole."""

import numpy as np
import pytest

pytest.importorskip("torch")

import surogate  # noqa: E402
from sgtest.tiny_models import make_model  # noqa: E402
from surogate.dsl.nn import LORA_RNG, LoRAConfig  # noqa: E402
from surogate.train.lora import init_lora  # noqa: E402

CHUNK = 24  # rows per chunk: 80 tokens = 3 full chunks and a short one


def assert_same(plain, tiled):
    (l0, g0), (l1, g1) = plain, tiled
    assert l1 == pytest.approx(l0, rel=1e-6)
    assert set(g0) == set(g1)
    for name in g0:
        scale = float(np.abs(g0[name]).max()) or 1.0
        np.testing.assert_allclose(g1[name], g0[name], rtol=1e-4, atol=2e-6 * scale, err_msg=name)


def dense_layers(model) -> int:
    moe = model.spec.moe
    return model.spec.num_layers - (0 if moe is None else len(moe.layers))


@pytest.mark.parametrize("family", ["llama", "gemma3", "qwen3", "lfm2", "qwen3_moe", "gemma4"])
def test_tiled_mlp_gives_the_unchunked_loss_and_gradients(tmp_path, family):
    model = surogate.load_model(make_model(family, tmp_path / family))
    ids = np.random.default_rng(0).integers(0, model.spec.vocab_size, 80)
    plain = model.loss_and_grads(ids)
    tiled = model.loss_and_grads(ids, mlp_chunk=CHUNK)
    assert_same(plain, tiled)
    exe = model.executable("train", len(ids), 1, grads=True, mlp_chunk=CHUNK)
    # Every dense MLP is tiled (qwen3_moe's sparse layers run whole, as in the original).
    assert exe.lowered.tiled_mlps == dense_layers(model) > 0


@pytest.mark.parametrize("dropout,recompute", [(0.0, False), (0.25, False), (0.25, True)])
def test_tiled_mlp_under_lora_dropout_and_recompute(tmp_path, dropout, recompute):
    model = surogate.load_model(make_model("llama", tmp_path / "m"))
    ids = np.random.default_rng(1).integers(0, model.spec.vocab_size, 80)
    lora = LoRAConfig(rank=4, alpha=8, dropout=dropout)
    params = {k: v + 0.01 for k, v in init_lora(model.arch.build(mode="train", lora=lora), 0).items()}  # B != 0
    runs = []
    for chunk in (0, CHUNK):
        exe = model.executable("train", len(ids), 1, lora=lora, grads=True, recompute=recompute, mlp_chunk=chunk)
        if LORA_RNG in exe.lowered.by_value:  # the same masks in both runs: a chunk continues the whole mask
            exe.bind(LORA_RNG, np.array([3, 4], np.int32))
        runs.append(model.loss_and_grads(ids, lora=lora, lora_params=params, recompute=recompute, mlp_chunk=chunk))
    assert_same(*runs)


def test_the_mlp_interior_is_one_chunk_and_the_arena_stops_growing_with_it(tmp_path):
    model = surogate.load_model(make_model("llama", tmp_path / "m", intermediate_size=256))
    F = model.spec.intermediate_size
    arenas = {}
    for n in (256, 1024):
        for chunk in (0, 64):
            exe = model.executable("train", n, 1, grads=True, recompute=True, mlp_chunk=chunk)
            arenas[n, chunk] = exe.memory().activations
            widest = max(b.shape[0] for b in exe.lowered.bufs
                         if b.kind == "internal" and len(b.shape) == 2 and b.shape[1] in (F, 2 * F))
            assert widest == (n if chunk == 0 else chunk)
    # The tiled arena is smaller, and what it adds from 256 to 1024 tokens is the residual
    # stream's share (rows of width C), not the MLP's (rows of width 2F and F).
    assert arenas[1024, 64] < 0.6 * arenas[1024, 0], arenas
    assert arenas[1024, 64] - arenas[256, 64] < 0.5 * (arenas[1024, 0] - arenas[256, 0]), arenas


def test_a_graph_without_a_dense_mlp_tiles_nothing(tmp_path):
    model = surogate.load_model(make_model("qwen3_moe", tmp_path / "m", mlp_only_layers=[]))
    exe = model.executable("train", 64, 1, grads=True, mlp_chunk=16)
    assert exe.lowered.tiled_mlps == 0


def test_tiled_mlp_over_ggml_blocks_qlora(tmp_path):
    model = surogate.load_model(make_model("llama", tmp_path / "m", hidden_size=256, intermediate_size=512,
                                           head_dim=64), quantize="Q8_0")
    assert "layers.0.mlp.gate_up_proj.weight" in model.quant
    ids = np.random.default_rng(2).integers(0, model.spec.vocab_size, 80)
    lora = LoRAConfig(rank=4, alpha=8)
    g = model.arch.build(mode="train", lora=lora, quant=model.quant)
    params = {k: v + 0.01 for k, v in init_lora(g, 0).items()}
    assert_same(model.loss_and_grads(ids, lora=lora, lora_params=params),
                model.loss_and_grads(ids, lora=lora, lora_params=params, mlp_chunk=CHUNK))
