"""Qwen3-VL's vision tower on the GPU against the same tower on the CPU backend (itself checked
against transformers in test_qwen3_vl_vision.py): merged rows, DeepStack features and the last
hidden state for two images and a video in one call, f32 and bf16. Skipped without a CUDA build
and a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from surogate import _native

pytestmark = pytest.mark.cuda
if not (_native.build_info()["cuda"] and _native.cuda_devices()):
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)

from surogate.models.qwen3_vl_vision import Qwen3VLVision, Qwen3VLVisionTower, vision_spec_from_config  # noqa: E402
from sgtest.ops import rel_err  # noqa: E402

# The tiny tower of test_qwen3_vl_vision.py, with head dim 64 (the CUDA attention's common size).
VISION = {"depth": 3, "hidden_size": 128, "intermediate_size": 96, "num_heads": 2, "patch_size": 8,
          "temporal_patch_size": 2, "spatial_merge_size": 2, "out_hidden_size": 48, "num_position_embeddings": 16,
          "deepstack_visual_indexes": [0, 2]}


def tower_params(spec, rng) -> dict[str, np.ndarray]:
    """Random tower weights (norm weights near 1), float32."""
    params = {}
    for p in Qwen3VLVisionTower(spec).build(spec.merge_unit, 1).params():
        base = 1.0 if "norm" in p.name and p.name.endswith("weight") else 0.0
        params[p.name] = (base + 0.15 * rng.standard_normal(p.shape)).astype(np.float32)
    return params


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-4), ("bfloat16", 2e-2)])
def test_tower_on_the_gpu_matches_the_cpu(dtype, tol):
    spec = vision_spec_from_config({"vision_config": VISION})
    rng = np.random.default_rng(0)
    params = tower_params(spec, rng)
    grid = [[1, 4, 6], [1, 2, 2], [2, 4, 4]]
    px = rng.standard_normal((24 + 4 + 32, spec.patch_features)).astype(np.float32)
    cpu = Qwen3VLVision(spec, params, dtype=dtype).encode(px, grid, hidden=True)
    gpu = Qwen3VLVision(spec, params, device="cuda", dtype=dtype).encode(px, grid, hidden=True)
    embeds, deep, hidden = gpu
    assert rel_err(hidden, cpu[2]) < tol
    assert rel_err(embeds, cpu[0]) < tol
    for ours, theirs in zip(deep, cpu[1]):
        assert rel_err(ours, theirs) < tol


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-5), ("bfloat16", 1e-2)])
def test_padded_bucket_on_the_gpu_gives_the_unpadded_rows(dtype, tol):
    """The bucketed call (60 patches -> 64, 4 frames + the padding's segment -> 8 segments, three
    empty: zero-length documents in the CUDA attention) against the exact shape, both on the GPU;
    the pixel rows cast to bf16 in the graph."""
    from surogate.models.qwen3_vl_vision import bucket

    spec = vision_spec_from_config({"vision_config": VISION})
    rng = np.random.default_rng(1)
    params = tower_params(spec, rng)
    grid = [[1, 4, 6], [1, 2, 2], [2, 4, 4]]
    assert bucket(60, 4, spec) == (64, 8)
    px = rng.standard_normal((60, spec.patch_features)).astype(np.float32)
    tower = Qwen3VLVision(spec, params, device="cuda", dtype=dtype)
    exact = tower.encode(px, grid, hidden=True, padded=False)
    padded = tower.encode(px, grid, hidden=True)
    for a, b in zip([exact[0], *exact[1], exact[2]], [padded[0], *padded[1], padded[2]]):
        assert a.shape == b.shape and rel_err(b, a) < tol
