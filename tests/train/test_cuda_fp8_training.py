"""recipe: fp8_hybrid on the GPU (cuda/fp8.cu, cuBLASLt FP8 GEMMs) against the CPU backend's exact
emulation (itself checked against transformers with FP8 projections in test_fp8_training.py):
loss and gradients of a tiny Qwen3, then the trainer end to end (LoRA and full, CUDA graphs on)
against the CPU trainer's fp8 curve and the GPU's bf16 one, and delayed scaling's histories.
Skipped without a CUDA build and a GPU; run on the lent H200 before resolving."""

from __future__ import annotations

import numpy as np
import pytest

from surogate import _native

pytestmark = pytest.mark.cuda
if not (_native.build_info()["cuda"] and _native.cuda_devices()):
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)

import surogate  # noqa: E402
from sgtest.ops import rel_err  # noqa: E402
from sgtest.qa import sft_config, step_losses, write_qa  # noqa: E402
from sgtest.tiny_models import make_qwen3  # noqa: E402
from surogate.compile.fp8 import Fp8Recipe  # noqa: E402
from surogate.train.trainer import Trainer  # noqa: E402


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_qwen3(tmp_path_factory.mktemp("base"), seed=11, initializer_range=0.2)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_qa(tmp_path_factory.mktemp("data") / "qa.jsonl")


@pytest.mark.parametrize("recipe", [Fp8Recipe(), Fp8Recipe(amax_history=4)])
def test_loss_and_gradients_match_the_cpu_emulation(base, recipe):
    cpu = surogate.load_model(base, dtype="float32")
    gpu = surogate.load_model(base, device="cuda", dtype="float32")
    ids = np.random.default_rng(3).integers(0, cpu.spec.vocab_size, 64)
    loss_c, grads_c = cpu.loss_and_grads(ids, fp8=recipe)
    loss_g, grads_g = gpu.loss_and_grads(ids, fp8=recipe)
    plain, exact = cpu.loss_and_grads(ids)
    # The GPU's FP8 GEMMs keep fewer bits in their partial sums than the CPU's f32 (some 14), so
    # the amaxes after them, and with them every later scale and code, move a little: the loss
    # stays within 1e-3 of the emulation's (4e-4 seen), well inside the FP8 error itself
    # (loss_c - plain). The gradients then round independently (e5m2 keeps 2 mantissa bits: some
    # 20-35% off the f32 ones at their largest here): the GPU's are about as far from the f32
    # gradients as the emulation's (at most 1.32x of it was seen, the first layer's norm and v_proj);
    # a wrong layout or scale would be off by their whole size.
    assert abs(loss_g - loss_c) < min(1e-3 * loss_c, 0.5 * abs(loss_c - plain)), (loss_g, loss_c, plain)
    off = {name: (rel_err(grads_g[name], exact[name]), rel_err(grads_c[name], exact[name])) for name in grads_c}
    worse = {name: e for name, e in off.items() if e[0] > 1.5 * e[1] + 0.05}
    assert not worse, worse
    assert all(e[1] > 0 for e in off.values())  # (FP8 moved every gradient)


@pytest.mark.parametrize("lora, lr", [(True, 2e-2), (False, 2e-3)])
def test_trainer_on_cuda_follows_the_cpu_fp8_curve_and_ends_near_bf16(base, data, tmp_path, lora, lr):
    runs = {}
    for name, device, recipe in (("cpu", "cpu", "fp8_hybrid"), ("gpu", "cuda", "fp8_hybrid"),
                                 ("gpu_bf16", "cuda", "bf16")):
        cfg = sft_config(base, data, tmp_path / name, recipe=recipe, device=device, lora=lora, learning_rate=lr,
                         max_steps=24)
        tr = Trainer(cfg)
        assert ("matmul_fp8" in [i.op for i in tr.exe.lowered.instrs]) == (recipe == "fp8_hybrid")
        tr.train()
        runs[name] = step_losses(tmp_path / name)
    assert abs(runs["gpu"][0] - runs["cpu"][0]) < 1e-2 * runs["cpu"][0]
    end = lambda losses: sum(losses[-4:]) / 4
    assert abs(end(runs["gpu"]) - end(runs["cpu"])) < 0.1
    assert abs(end(runs["gpu"]) - end(runs["gpu_bf16"])) < (0.1 if lora else 0.03)


def test_delayed_scaling_histories_fill_on_the_device(base, data, tmp_path):
    tr = Trainer(sft_config(base, data, tmp_path / "run", recipe="fp8_hybrid", device="cuda", fp8_amax_history=4,
                            max_steps=3))
    tr.train()
    hist = {n: tr.exe.pull(n) for n in tr.fp8_state}
    assert all(np.isfinite(h).all() and (h > 0).all() for h in hist.values())  # 3 steps x 2 micro-batches >= 4
