"""Qwen3-VL with images and a video on the GPU against the same model on the CPU backend (itself
checked against transformers in test_qwen3_vl.py): logits (merged rows by embed_rows, DeepStack,
MRoPE by rope_table in f32 and bf16), the loss, LoRA gradients and a full fine-tune's embedding
gradient through embed_rows' derivative. Skipped without a CUDA build and a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from surogate import _native

pytestmark = pytest.mark.cuda
if not (_native.build_info()["cuda"] and _native.cuda_devices()):
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)

pytest.importorskip("transformers.models.qwen3_vl")

import surogate  # noqa: E402
from surogate.dsl.nn import LoRAConfig  # noqa: E402
from surogate.train.lora import init_lora  # noqa: E402
from sgtest.ops import rel_err  # noqa: E402
from sgtest.tiny_models import make_qwen3_vl, qwen3_vl_prompts  # noqa: E402


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_qwen3_vl(tmp_path_factory.mktemp("qwen3vl"))


def test_images_and_video_on_the_gpu_match_the_cpu(folder):
    cpu, gpu = surogate.load_model(folder), surogate.load_model(folder, device="cuda")
    (img_ids, images), (vid_ids, vid) = qwen3_vl_prompts()
    ids = img_ids + vid_ids
    assert rel_err(gpu.forward(ids, images=images, videos=vid), cpu.forward(ids, images=images, videos=vid)) < 1e-4
    assert gpu.loss(ids, images=images, videos=vid) == pytest.approx(cpu.loss(ids, images=images, videos=vid),
                                                                      rel=1e-4)
    lora = LoRAConfig(rank=4, alpha=8.0)
    rng = np.random.default_rng(3)
    names = init_lora(cpu.arch.build(mode="train", lora=lora), 0)  # the adapter names and shapes
    params = {n: (0.1 * rng.standard_normal(a.shape)).astype(np.float32) for n, a in names.items()}
    _, want = cpu.loss_and_grads(img_ids, lora=lora, lora_params=params, images=images)
    _, got = gpu.loss_and_grads(img_ids, lora=lora, lora_params=params, images=images)
    for name in want:
        assert rel_err(got[name], want[name]) < 1e-3, name
    _, want = cpu.loss_and_grads(img_ids, images=images)
    _, got = gpu.loss_and_grads(img_ids, images=images)
    assert rel_err(got["embed_tokens.weight"], want["embed_tokens.weight"]) < 1e-3


def test_bf16_on_the_gpu_matches_the_cpu(folder):
    cpu, gpu = surogate.load_model(folder, dtype="bfloat16"), surogate.load_model(folder, device="cuda",
                                                                                  dtype="bfloat16")
    (ids, images), _ = qwen3_vl_prompts()
    a, b = gpu.forward(ids, images=images), cpu.forward(ids, images=images)
    # bf16 rounds at different points on the two backends (the CPU keeps f32 inside its kernels): the
    # bf16 tolerance of the other GPU tests, and no systematic drift on average
    assert rel_err(a, b) < 2e-2
    assert np.abs(a - b).mean() < 0.01 * b.std()
