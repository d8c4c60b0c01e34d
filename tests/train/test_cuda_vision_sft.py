"""`surogate sft` on image chat rows on the GPU against the same run on the CPU backend (itself
checked against transformers + peft in test_vision_sft.py): the loss curve, the adapter, and the
first micro-batch's loss with images. Skipped without a CUDA build and a GPU (not yet run on one)."""

from __future__ import annotations

import pytest

from surogate import _native

pytestmark = pytest.mark.cuda
if not (_native.build_info()["cuda"] and _native.cuda_devices()):
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)

from sgtest.ops import rel_err  # noqa: E402
from sgtest.vision_sft import check_sft_on_cuda, make_folder, write_dataset, yaml_config  # noqa: E402
from surogate.config import load_config  # noqa: E402
from surogate.train.trainer import Trainer  # noqa: E402


def test_image_rows_train_on_the_gpu_as_on_the_cpu(tmp_path):
    folder = make_folder(tmp_path / "m", seed=5, text={"head_dim": 64})
    data = write_dataset(tmp_path / "data")
    check_sft_on_cuda(folder, data, tmp_path, learning_rate=0.002, merge_adapter="false", save_steps=0)


def test_a_trainable_projector_s_step_on_the_gpu_equals_the_cpu(tmp_path):
    """train_projector: the first micro-batch's loss and every gradient (the projector's too)."""
    folder = make_folder(tmp_path / "m", seed=5, text={"head_dim": 64})
    data = write_dataset(tmp_path / "data")
    kw = dict(learning_rate=0.002, merge_adapter="false", save_steps=0, train_projector="true")
    cpu = Trainer(load_config(yaml_config(folder, data, tmp_path / "cpu", device="cpu", **kw), kind="sft"))
    gpu = Trainer(load_config(yaml_config(folder, data, tmp_path / "gpu", device="cuda", **kw), kind="sft"))
    assert {n for n in cpu.grads if "multi_modal_projector" in n} == {
        "grad.multi_modal_projector.mm_input_projection_weight", "grad.multi_modal_projector.mm_soft_emb_norm.weight"}
    b = cpu.train_data.batch([0, 1])
    (lc, _), (lg, _) = cpu._step([b]), gpu._step([b])
    assert abs(lg - lc) < 1e-4 * abs(lc)
    for n in cpu.grads:
        gpu.exe.pull(n)
        assert rel_err(gpu.grads[n], cpu.grads[n]) < 1e-3, n
