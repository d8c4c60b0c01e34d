"""`surogate sft` on Qwen3-VL image chat rows on the GPU against the same run on the CPU backend
(itself checked against transformers + peft in test_qwen3_vl_sft.py): the first packed
micro-batch's loss and LoRA gradients (merged rows, DeepStack rows and MRoPE tables fed per
micro-batch), the loss curve and the adapter. Skipped without a CUDA build and a GPU (not yet run
on one)."""

from __future__ import annotations

import numpy as np
import pytest

from surogate import _native

pytestmark = pytest.mark.cuda
if not (_native.build_info()["cuda"] and _native.cuda_devices()):
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)

pytest.importorskip("transformers.models.qwen3_vl")

from sgtest.qa import step_losses  # noqa: E402
from sgtest.vision import make_qwen3_vl_chat  # noqa: E402
from sgtest.vision_sft import yaml_config  # noqa: E402
from surogate.config import load_config  # noqa: E402
from surogate.train.trainer import Trainer  # noqa: E402

from tests.train.test_qwen3_vl_sft import write_dataset  # noqa: E402


def rel_err(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))


def test_qwen3_vl_image_rows_train_on_the_gpu_as_on_the_cpu(tmp_path):
    from safetensors.numpy import load_file

    folder = make_qwen3_vl_chat(tmp_path / "m", seed=4)
    data = write_dataset(tmp_path / "data")
    kw = dict(learning_rate=0.002, merge_adapter="false", save_steps=0, sequence_len=256)
    cpu = Trainer(load_config(yaml_config(folder, data, tmp_path / "cpu", device="cpu", **kw), kind="sft"))
    gpu = Trainer(load_config(yaml_config(folder, data, tmp_path / "gpu", device="cuda", **kw), kind="sft"))
    assert gpu.exe.device.startswith("cuda") and gpu.images == cpu.images > 0
    b = cpu.train_data.batch([0, 1])
    assert len(b.images) > 1
    (lc, _), (lg, _) = cpu._step([b]), gpu._step([b])
    assert abs(lg - lc) < 1e-4 * abs(lc)
    for n in cpu.grads:
        gpu.exe.pull(n)
        assert rel_err(gpu.grads[n], cpu.grads[n]) < 1e-3, n
    cpu = Trainer(load_config(yaml_config(folder, data, tmp_path / "cpu2", device="cpu", **kw), kind="sft"))
    gpu = Trainer(load_config(yaml_config(folder, data, tmp_path / "gpu2", device="cuda", **kw), kind="sft"))
    cpu.train()
    gpu.train()
    assert np.allclose(step_losses(tmp_path / "gpu2"), step_losses(tmp_path / "cpu2"), rtol=1e-4)
    a = load_file(tmp_path / "gpu2" / "adapter" / "adapter_model.safetensors")
    c = load_file(tmp_path / "cpu2" / "adapter" / "adapter_model.safetensors")
    assert set(a) == set(c) and max(rel_err(a[k], c[k]) for k in a) < 1e-2
