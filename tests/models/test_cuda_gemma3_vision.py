"""Gemma 3 with images on the GPU against the same model on the CPU backend (itself checked against
transformers in test_gemma3_vision.py): the tower's hidden state, the projected rows, logits and
loss of a prompt with two images. Skipped without a CUDA build and a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from surogate import _native

pytestmark = pytest.mark.cuda
if not (_native.build_info()["cuda"] and _native.cuda_devices()):
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)

import surogate  # noqa: E402
from sgtest.ops import rel_err  # noqa: E402
from sgtest.tiny_models import make_gemma3_vision  # noqa: E402


def test_images_on_the_gpu_match_the_cpu(tmp_path):
    path = make_gemma3_vision(tmp_path / "m", seed=5, text={"head_dim": 64})
    cpu, gpu = surogate.load_model(path), surogate.load_model(path, device="cuda")
    v = cpu.spec.vision
    px = np.random.default_rng(0).standard_normal((2, 3, v.image_size, v.image_size)).astype(np.float32)
    assert rel_err(gpu.encode_images(px, hidden=True), cpu.encode_images(px, hidden=True)) < 1e-4
    assert rel_err(gpu.encode_images(px), cpu.encode_images(px)) < 1e-4
    ids = np.array([cpu.spec.bos_token_id, 5, 6, v.boi_token_index, *[v.image_token_index] * v.mm_tokens_per_image,
                    v.eoi_token_index, 7, 8, v.boi_token_index, *[v.image_token_index] * v.mm_tokens_per_image,
                    v.eoi_token_index, 9, 10, 11])
    assert rel_err(gpu.forward(ids, images=px), cpu.forward(ids, images=px)) < 1e-4
    assert gpu.loss(ids, images=px) == pytest.approx(cpu.loss(ids, images=px), rel=1e-4)
