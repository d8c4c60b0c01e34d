"""`surogate sft` on Qwen3-VL image chat rows on the GPU against the same run on the CPU backend
(itself checked against transformers + peft in test_qwen3_vl_sft.py): the first packed
micro-batch's loss and LoRA gradients (merged rows, DeepStack rows and MRoPE tables fed per
micro-batch), the loss curve and the adapter; with train_projector and for Qwen3-VL-MoE too.
Skipped without a CUDA build and a GPU (not yet run on one)."""

from __future__ import annotations

import pytest

from surogate import _native

pytestmark = pytest.mark.cuda
if not (_native.build_info()["cuda"] and _native.cuda_devices()):
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)

pytest.importorskip("transformers.models.qwen3_vl")

from sgtest.vision import make_qwen3_vl_chat  # noqa: E402
from sgtest.vision_sft import check_sft_on_cuda, write_qwen3_vl_dataset  # noqa: E402


def test_qwen3_vl_image_rows_train_on_the_gpu_as_on_the_cpu(tmp_path):
    folder = make_qwen3_vl_chat(tmp_path / "m", seed=4)
    data = write_qwen3_vl_dataset(tmp_path / "data")
    check_sft_on_cuda(folder, data, tmp_path, learning_rate=0.002, merge_adapter="false", save_steps=0, sequence_len=256)


@pytest.mark.parametrize("moe", [False, True], ids=["qwen3_vl", "qwen3_vl_moe"])
def test_train_projector_and_moe_image_rows_train_on_the_gpu_as_on_the_cpu(tmp_path, moe):
    """train_projector (the mergers per token in the training graph, their gradients too) and
    Qwen3-VL-MoE's experts on the GPU against the CPU."""
    folder = make_qwen3_vl_chat(tmp_path / "m", seed=4, moe=moe, text={"num_hidden_layers": 3})
    data = write_qwen3_vl_dataset(tmp_path / "data")
    check_sft_on_cuda(folder, data, tmp_path, learning_rate=0.002, merge_adapter="false", save_steps=0, sequence_len=256,
                      train_projector="true")
