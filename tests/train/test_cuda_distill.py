"""`surogate distill` on the GPU against the CPU trainer: the same loss and KL curve in f32, with
the teacher's logits Program on the student's device input buffers. Skipped without a CUDA
build and a GPU; run on the lent H200."""

from __future__ import annotations

import pytest

from surogate import _native

pytestmark = pytest.mark.cuda
if not (_native.build_info()["cuda"] and _native.cuda_devices()):
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)

from sgtest.distill import distill_config  # noqa: E402
from sgtest.qa import step_records, write_qa  # noqa: E402
from sgtest.tiny_models import make_qwen3  # noqa: E402
from surogate.train.distill import DistillTrainer  # noqa: E402


def config(student, teacher, data, out, **kw):
    kw.setdefault("max_steps", 5)
    return distill_config(student, teacher, data, out, **kw)


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


def test_capture_on_cuda_holds_the_cpu_top_k_and_trains_on_its_curve(tmp_path):
    import numpy as np

    from surogate.train.distill_capture import capture, shard_path

    student = make_qwen3(tmp_path / "student", seed=11, initializer_range=0.2, head_dim=64)
    teacher = make_qwen3(tmp_path / "teacher", seed=29, initializer_range=0.2, head_dim=64)
    data = write_qa(tmp_path / "qa.jsonl")
    for dev in ("cpu", "cuda"):
        cfg = config(student, teacher, data, tmp_path / f"out-{dev}", device=dev,
                     distillation={"teacher_model": str(teacher), "top_k": 4, "kd_weight": 0.7, "ce_weight": 0.3,
                                   "teacher_logprobs": str(tmp_path / f"cap-{dev}")})
        capture(cfg, log=lambda *_: None)
        if dev == "cuda":
            DistillTrainer(cfg).train()  # from the GPU capture, the student on the GPU
    c, g = (np.load(shard_path(tmp_path / f"cap-{d}", 0)) for d in ("cpu", "cuda"))
    np.testing.assert_array_equal(c["keys"], g["keys"])
    np.testing.assert_array_equal(c["positions"], g["positions"])
    assert (c["ids"] == g["ids"]).mean() > 0.99  # near-ties may swap
    np.testing.assert_allclose(np.sort(c["logprobs"], 1), np.sort(g["logprobs"], 1), atol=1e-3)
    DistillTrainer(config(student, teacher, data, tmp_path / "fly", device="cpu")).train()
    for a, b in zip(step_records(tmp_path / "fly"), step_records(tmp_path / "out-cuda")):
        assert b["loss"] == pytest.approx(a["loss"], rel=2e-3), a["step"]
