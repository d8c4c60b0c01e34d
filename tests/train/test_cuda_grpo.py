"""`surogate grpo` on the GPU: the loss and LoRA gradients of fixed rollouts equal the CPU
trainer's (f32; the CUDA graphs of the reference and the policy's phases), the co-located
engine reads the trainer's device tensors (no second copy) and samples from the weights each
optimizer step wrote (LoRA and full fine-tuning, f32 and bf16). Skipped without a CUDA build
and a GPU; run on the lent H200."""

from __future__ import annotations

import numpy as np
import pytest

from surogate import _native

pytestmark = pytest.mark.cuda
if not (_native.build_info()["cuda"] and _native.cuda_devices()):
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)

from sgtest.grpo import grpo_config as config  # noqa: E402
from sgtest.grpo import write_prompts  # noqa: E402
from sgtest.qa import step_records  # noqa: E402
from sgtest.tiny_models import make_qwen3  # noqa: E402

from surogate.train.grpo import GRPOTrainer  # noqa: E402


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_qwen3(tmp_path_factory.mktemp("base"), seed=11, initializer_range=0.2, head_dim=64)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_prompts(tmp_path_factory.mktemp("data") / "prompts.jsonl")


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_fixed_rollouts_give_the_cpu_loss_and_grads(base, data, tmp_path, loss_type):
    trainers = [GRPOTrainer(config(base, data, tmp_path / d, device=d, loss_type=loss_type, epsilon_high=0.28))
                for d in ("cpu", "cuda")]
    try:
        rng = np.random.default_rng(3)
        adapter = {n: rng.normal(0, 0.3, a.shape).astype(a.dtype) for n, a in trainers[0].trainable.items()}
        for tr in trainers:
            for n, a in tr.trainable.items():
                a[...] = adapter[n]
                tr.exe.push(n)
        rollouts, _ = trainers[0].rollout(trainers[0].train_data.batch(range(4)), 0)
        for r in rollouts:
            r.logps = r.logps + rng.normal(0, 0.4, len(r.logps))
        per_fn = rng.integers(0, 3, (len(rollouts), 2)).astype(np.float64)
        out = [tr.learn(rollouts, per_fn, [2, 2], 0) for tr in trainers]
        (cpu_loss, _, cpu_m), (gpu_loss, _, gpu_m) = out
        assert gpu_loss == pytest.approx(cpu_loss, rel=1e-4, abs=1e-6)
        assert gpu_m["kl"] == pytest.approx(cpu_m["kl"], rel=1e-3, abs=1e-6)
        assert gpu_m["clip_ratio/region_mean"] == cpu_m["clip_ratio/region_mean"]
        gpu = trainers[1]
        for n in gpu.grads:
            gpu.exe.pull(n)
        scale = max(np.abs(g).max() for g in trainers[0].grads.values())
        for n, g in trainers[0].grads.items():
            np.testing.assert_allclose(gpu.grads[n], g, atol=1e-4 * scale, rtol=1e-3, err_msg=n)
    finally:
        for tr in trainers:
            tr.close()


@pytest.mark.parametrize("lora,recipe", [(True, "fp32"), (False, "fp32"), (True, "bf16")])
def test_the_engine_samples_the_trained_device_weights(base, data, tmp_path, lora, recipe):
    tr = GRPOTrainer(config(base, data, tmp_path / "run", device="cuda", lora=lora, recipe=recipe,
                            learning_rate=1e-2 if lora else 2e-3))
    tr.rollout(tr.train_data.batch([0, 1]), 0)
    assert tr.runner.fused and all(host is None for host, _ in tr.runner.fused.values())  # no host stack uploaded
    for exe in tr.runner._programs.values():  # the trainer's device tensors, no copies
        for name in exe.external_names("param"):
            if name in tr.model.stacks:  # the fused q/k/v: the trainer's q, k, v tensors are its rows
                stack = exe.tensor(name)
                row_bytes = stack.nbytes // stack.shape[0]
                for part, first, _ in tr.model.stacks[name][1]:
                    assert tr.exe.tensor(part).data_ptr == stack.data_ptr + first * row_bytes, part
            else:
                assert exe.tensor(name) is tr.exe.tensor(name), name
    tr.train()
    steps = step_records(tmp_path / "run")
    assert steps[-1]["kl"] > 1e-3, steps[-1]
    limit = 1e-3 if recipe == "fp32" else 0.1  # bf16: the serving and training kernels round apart
    for s in steps:
        assert s["sampling/sampling_logp_difference/mean"] < limit, s


def test_num_iterations_and_temperature_give_the_cpu_passes(base, data, tmp_path):
    """Two passes over fixed rollouts at temperature 0.7: each pass's loss and clip fractions
    equal the CPU trainer's (the tempered head on the GPU, the second pass's ratio off 1)."""
    trainers = [GRPOTrainer(config(base, data, tmp_path / d, device=d, temperature=0.7, num_iterations=2,
                                   learning_rate=5e-2, epsilon=0.05)) for d in ("cpu", "cuda")]
    try:
        rollouts, _ = trainers[0].rollout(trainers[0].train_data.batch(range(4)), 0)
        per_fn = np.random.default_rng(3).integers(0, 3, (len(rollouts), 2)).astype(np.float64)
        for it in range(2):
            outs = []
            for tr in trainers:
                for r in rollouts:
                    r.old = getattr(r, f"old_{tr.model.device}", None)
                if it:
                    tr.opt.apply(5e-2)
                outs.append(tr.learn(rollouts, per_fn, [2, 2], 0, iteration=it))
                for r in rollouts:
                    setattr(r, f"old_{tr.model.device}", r.old)
            (cl, _, cm), (gl, _, gm) = outs
            assert gl == pytest.approx(cl, rel=1e-3, abs=1e-6), it
            assert gm["clip_ratio/region_mean"] == pytest.approx(cm["clip_ratio/region_mean"], abs=0.02), it
        assert cm["clip_ratio/region_mean"] > 0
    finally:
        for tr in trainers:
            tr.close()
