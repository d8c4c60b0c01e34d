"""`surogate distill` on the GPU against the CPU trainer: the same loss and KL curve in f32, with
the teacher's logits Program on the student's device input buffers. Skipped without a CUDA
build and a GPU; run on the lent H200."""

from __future__ import annotations

import pytest

from surogate import _native

pytestmark = pytest.mark.cuda
if not (_native.build_info()["cuda"] and _native.cuda_devices()):
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)

from sgtest.qa import step_records, write_qa  # noqa: E402
from sgtest.tiny_models import make_qwen3  # noqa: E402
from surogate.config import load_config  # noqa: E402
from surogate.train.distill import DistillTrainer  # noqa: E402


def config(student, teacher, data, out, **kw):
    c = {"model": str(student), "output_dir": str(out), "datasets": [{"path": str(data), "type": "messages"}],
         "distillation": {"teacher_model": str(teacher), "top_k": 4, "kd_weight": 0.7, "ce_weight": 0.3},
         "sequence_len": 64, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 2, "recipe": "fp32",
         "learning_rate": 1e-2, "lr_scheduler_type": "constant", "max_steps": 5, "lora_rank": 8, "lora_alpha": 16,
         "save_steps": 0, "eval_steps": 0, "seed": 7, **kw}
    return load_config(c, kind="distill")


def test_distill_on_cuda_follows_the_cpu_curve(tmp_path):
    student = make_qwen3(tmp_path / "student", seed=11, initializer_range=0.2, head_dim=64)
    teacher = make_qwen3(tmp_path / "teacher", seed=29, initializer_range=0.2, head_dim=64)
    data = write_qa(tmp_path / "qa.jsonl")
    DistillTrainer(config(student, teacher, data, tmp_path / "cpu", device="cpu")).train()
    gpu = DistillTrainer(config(student, teacher, data, tmp_path / "gpu", device="cuda"))
    assert gpu.exe.device.startswith("cuda") and gpu.teacher_exe.device.startswith("cuda")
    gpu.train()
    for c, g in zip(step_records(tmp_path / "cpu"), step_records(tmp_path / "gpu")):
        assert g["loss"] == pytest.approx(c["loss"], rel=2e-3), c["step"]
        assert g["kl"] == pytest.approx(c["kl"], rel=5e-3, abs=1e-4), c["step"]
