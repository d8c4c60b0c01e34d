"""`surogate dpo` on the GPU against the CPU trainer: the same loss and reward curve in f32 (LoRA
with the no-adapter reference, and CUDA graphs for the reference forward and the policy's
forward / backward phases), the ln 2 start, a full fine-tune's frozen device copy of the
reference, and resume. Skipped without a CUDA build and a GPU; run on the lent H200."""

from __future__ import annotations

import math

import pytest

from surogate import _native

pytestmark = pytest.mark.cuda
if not (_native.build_info()["cuda"] and _native.cuda_devices()):
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)

from sgtest.qa import interrupt_after, step_losses, step_records  # noqa: E402
from sgtest.tiny_models import make_qwen3  # noqa: E402
from sgtest.preference import dpo_config as config  # noqa: E402
from sgtest.preference import write_pairs  # noqa: E402

from surogate.train.dpo import DPOTrainer  # noqa: E402


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_qwen3(tmp_path_factory.mktemp("base"), seed=11, initializer_range=0.2, head_dim=64)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_pairs(tmp_path_factory.mktemp("data") / "pref.jsonl")


def test_dpo_on_cuda_follows_the_cpu_curve_and_resumes(base, data, tmp_path):
    DPOTrainer(config(base, data, tmp_path / "cpu", device="cpu")).train()
    gpu = DPOTrainer(config(base, data, tmp_path / "gpu", device="cuda", save_steps=3))
    assert gpu.exe.device.startswith("cuda")
    gpu.train()
    cpu_steps, gpu_steps = step_records(tmp_path / "cpu"), step_records(tmp_path / "gpu")
    assert gpu_steps[0]["loss"] == pytest.approx(math.log(2), abs=1e-5)
    for c, g in zip(cpu_steps, gpu_steps):
        assert g["loss"] == pytest.approx(c["loss"], rel=2e-3, abs=1e-4), (c["step"], c["loss"], g["loss"])
        assert g["rewards/margins"] == pytest.approx(c["rewards/margins"], rel=5e-3, abs=1e-3)

    again = DPOTrainer(config(base, data, tmp_path / "again", device="cuda", save_steps=3))
    interrupt_after(again, 4)
    with pytest.raises(KeyboardInterrupt):
        again.train()
    DPOTrainer(config(base, data, tmp_path / "again", device="cuda", save_steps=3,
                      resume_from_checkpoint=True)).train()
    by_step = {r["step"]: r["loss"] for r in step_records(tmp_path / "again")}
    assert [by_step[s] for s in range(1, 7)] == step_losses(tmp_path / "gpu")


def test_full_finetune_on_cuda_keeps_a_frozen_reference(base, data, tmp_path):
    DPOTrainer(config(base, data, tmp_path / "full", device="cuda", lora=False, learning_rate=1e-3,
                      max_steps=4)).train()
    losses = step_losses(tmp_path / "full")
    assert losses[0] == pytest.approx(math.log(2), abs=1e-5) and losses[-1] < losses[0] - 0.01
