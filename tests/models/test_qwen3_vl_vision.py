"""Qwen3-VL's vision tower (surogate/models/qwen3_vl.py) against transformers' Qwen3VLVisionModel
on a tiny random Qwen3VLForConditionalGeneration saved to a folder: the merged embeddings, every
DeepStack feature and the last hidden state, f32 to 1e-4, for two images of different grids in one
call (pixel rows from surogate's QwenVLImageProcessor), for a video grid (t > 1, each frame its own
attention segment) and for images and a video together; plus the load path's errors. The shape
buckets (`bucket`: a padding segment and empty segments) give the rows of the unpadded call, f32
to 1e-5, and the bf16 tower's pixel rows are rounded in the graph as a host astype would round them."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("transformers.models.qwen3_vl")
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration  # noqa: E402

from surogate.errors import FileFormatError, InvalidArgumentError  # noqa: E402
from surogate.io.image_processing import QwenVLImageProcessor, QwenVLVideoProcessor  # noqa: E402
from surogate.models.qwen3_vl_vision import (Qwen3VLVision, bucket, grid_tables, load_params,  # noqa: E402
                                           vision_name_table, vision_spec_from_config)

# depth 3, width 32 (2 heads of 16: 4 rope frequencies per axis), 8-pixel patches, 2 frames per
# temporal patch, 2 x 2 merge, DeepStack after blocks 0 and 2, out 48 = the text width, a 4 x 4
# learned position grid (resampled up and down to the test grids).
VISION = {"depth": 3, "hidden_size": 32, "intermediate_size": 48, "num_heads": 2, "in_channels": 3, "patch_size": 8,
          "temporal_patch_size": 2, "spatial_merge_size": 2, "out_hidden_size": 48, "num_position_embeddings": 16,
          "deepstack_visual_indexes": [0, 2], "hidden_act": "gelu_pytorch_tanh"}
TEXT = {"vocab_size": 96, "hidden_size": 48, "intermediate_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 24,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 4, 4],
                            "mrope_interleaved": True}}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    cfg = Qwen3VLConfig(vision_config=VISION, text_config=TEXT, image_token_id=90, video_token_id=91,
                        vision_start_token_id=92, vision_end_token_id=93)
    model = Qwen3VLForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # every weight random (HF's init leaves biases 0 and norms 1)
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("qwen3vl")
    model.save_pretrained(path)
    return path, model.model.visual


def hf(visual, pixels, grid):
    with torch.no_grad():
        out = visual(torch.tensor(pixels), grid_thw=torch.tensor(np.asarray(grid), dtype=torch.long))
    return out.pooler_output.numpy(), [d.numpy() for d in out.deepstack_features], out.last_hidden_state.numpy()


def check(tower, visual, pixels, grid):
    embeds, deep, hidden = tower.encode(pixels, grid, hidden=True)
    want_embeds, want_deep, want_hidden = hf(visual, pixels, grid)
    m = sum(int(np.prod(g)) for g in np.asarray(grid)) // 4
    assert embeds.shape == (m, 48) and len(deep) == 2
    np.testing.assert_allclose(hidden, want_hidden, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(embeds, want_embeds, rtol=1e-4, atol=1e-4)
    for ours, theirs in zip(deep, want_deep):
        assert ours.shape == (m, 48)
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)


def processor():
    return QwenVLImageProcessor.from_config({"patch_size": 8, "temporal_patch_size": 2, "merge_size": 2,
                                             "min_pixels": 16 * 16, "max_pixels": 64 * 64})


def test_two_images_of_different_grids_equal_hf(checkpoint):
    path, visual = checkpoint
    rng = np.random.default_rng(1)
    images = [Image.fromarray(rng.integers(0, 256, (32, 48, 3), dtype=np.uint8)),
              Image.fromarray(rng.integers(0, 256, (64, 32, 3), dtype=np.uint8))]
    pixels, grid = processor()(images)
    assert len({tuple(g) for g in grid.tolist()}) == 2 and all(g[1] != g[2] for g in grid.tolist())
    check(Qwen3VLVision.from_folder(path), visual, pixels, grid)


def test_video_grid_equals_hf(checkpoint):
    path, visual = checkpoint
    video = QwenVLVideoProcessor.from_config({"patch_size": 8, "temporal_patch_size": 2, "merge_size": 2,
                                              "min_pixels": 16 * 16, "max_pixels": 6 * 32 * 48,
                                              "do_sample_frames": False})
    frames = np.random.default_rng(2).integers(0, 256, (5, 32, 48, 3), dtype=np.uint8)
    out = video(frames)  # 5 frames, the last repeated: 3 temporal patches of a 4 x 6 grid
    assert out.video_grid_thw.tolist() == [[3, 4, 6]]
    check(Qwen3VLVision.from_folder(path), visual, out.pixel_values_videos, out.video_grid_thw)


def test_images_and_video_in_one_call_equal_hf(checkpoint):
    path, visual = checkpoint
    grid = [[1, 2, 2], [2, 6, 4], [1, 8, 2]]  # a grid larger than the 4 x 4 table, and one smaller
    pixels = np.random.default_rng(3).standard_normal((4 + 48 + 16, 384)).astype(np.float32)
    check(Qwen3VLVision.from_folder(path), visual, pixels, grid)


def test_bfloat16_tower_is_close_to_hf_float32(checkpoint):
    path, visual = checkpoint
    grid = [[1, 4, 6], [2, 2, 4]]
    pixels = np.random.default_rng(4).standard_normal((24 + 16, 384)).astype(np.float32)
    embeds, deep = Qwen3VLVision.from_folder(path, dtype="bfloat16").encode(pixels, grid)
    want_embeds, want_deep, _ = hf(visual, pixels, grid)
    for ours, theirs in zip([embeds, *deep], [want_embeds, *want_deep]):
        assert ours.dtype == np.float32
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=0.03 * np.abs(theirs).max())


def test_buckets_pad_under_a_quarter_in_whole_merge_blocks():
    v = vision_spec_from_config({"model_type": "qwen3_vl", "vision_config": VISION})
    assert bucket(16, 1, v) == (16, 1)  # up to 8 merged tokens exact; one image: no padding segment
    assert bucket(36, 2, v) == (40, 4)  # 9 -> 10 merged tokens; 2 frames + the padding's = 3 -> 4 segments
    assert bucket(64, 4, v) == (64, 4)
    seen = set()
    for n in range(4, 40_000, 4):
        padded, segments = bucket(n, 3, v)
        assert padded % 4 == 0 and n <= padded and (padded - n) < 0.25 * padded
        assert segments == 4  # 3 frames (and the padding's segment) -> 4
        seen.add(padded)
    assert len(seen) < 60  # a few Programs for any batch up to 10,000 merged tokens


def test_padded_bucket_gives_the_unpadded_rows(checkpoint):
    path, visual = checkpoint
    tower = Qwen3VLVision.from_folder(path)
    grid = [[1, 4, 4], [1, 2, 10]]  # 16 + 20 patches = 9 merged tokens: padded to 10, segments 2 + 1 -> 4
    v = tower.spec
    assert bucket(36, 2, v) == (40, 4)
    pixels = np.random.default_rng(7).standard_normal((36, 384)).astype(np.float32)
    exact = tower.encode(pixels, grid, hidden=True, padded=False)
    padded = tower.encode(pixels, grid, hidden=True)
    assert set(tower._cache) == {(36, 2), (40, 4)}  # the padded call ran the bucket's Program
    for a, b in zip([exact[0], *exact[1], exact[2]], [padded[0], *padded[1], padded[2]]):
        assert a.shape == b.shape
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
    want_embeds, want_deep, want_hidden = hf(visual, pixels, grid)
    np.testing.assert_allclose(padded[0], want_embeds, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(padded[2], want_hidden, rtol=1e-4, atol=1e-4)
    # another batch of the same bucket (36 patches in 3 images) reuses its Program
    other = np.random.default_rng(8).standard_normal((36, 384)).astype(np.float32)
    tower.encode(other, [[1, 2, 2], [1, 4, 4], [1, 4, 4]])
    assert set(tower._cache) == {(36, 2), (40, 4)}


def test_bfloat16_pixels_are_rounded_in_the_graph_as_on_the_host(checkpoint):
    import ml_dtypes

    path, _ = checkpoint
    tower = Qwen3VLVision.from_folder(path, dtype="bfloat16")
    grid = [[1, 4, 6]]
    pixels = np.random.default_rng(9).standard_normal((24, 384)).astype(np.float32)
    rounded = pixels.astype(ml_dtypes.bfloat16).astype(np.float32)  # what the graph sees either way
    for a, b in zip(tower.encode(pixels, grid, hidden=True)[::2], tower.encode(rounded, grid, hidden=True)[::2]):
        np.testing.assert_array_equal(a, b)
    exe = tower._cache[bucket(24, 1, tower.spec)]
    assert str(exe.bound("pixel_values").dtype) == "float32"


def test_host_tables_equal_transformers_helpers():
    from transformers.vision_utils import (get_vision_cu_seqlens, get_vision_interpolation_indices_and_weights,
                                           get_vision_position_ids)

    v = vision_spec_from_config({"vision_config": VISION})
    grid = torch.tensor([[1, 4, 6], [2, 2, 8]])
    t = grid_tables(grid.numpy(), v)
    idx, w = get_vision_interpolation_indices_and_weights(grid, num_grid_per_side=4, mode="bilinear",
                                                          align_corners=True, spatial_merge_size=2)
    np.testing.assert_array_equal(t["pos_ids"], idx.numpy())
    np.testing.assert_allclose(t["pos_weights"], w.numpy(), rtol=0, atol=1e-7)
    np.testing.assert_array_equal(t["vision_cu_seqlens"], get_vision_cu_seqlens(grid).numpy())
    pos = get_vision_position_ids(grid, 2).numpy()
    inv = 1.0 / (10000.0 ** (np.arange(0, 8, 2) / 8.0))
    np.testing.assert_allclose(t["rope_cos"], np.cos(np.concatenate([pos[:, :1] * inv, pos[:, 1:] * inv], 1)),
                               atol=1e-6)


def test_name_table_loads_and_exports_the_checkpoints_tensors(checkpoint):
    from safetensors.numpy import load_file

    path, _ = checkpoint
    tensors = load_file(str(path / "model.safetensors"))
    tower = Qwen3VLVision.from_folder(path)
    visual = {k: v for k, v in tensors.items() if k.startswith("model.visual.")}
    back = vision_name_table().export(tower.params, lambda name, r: [])
    assert sorted(back) == sorted(visual)  # every tensor of the tower read, the fused qkv joined again
    for k, v in visual.items():
        np.testing.assert_array_equal(back[k], v)
    # transformers 4.5x's layout (visual.*) loads the same.
    old = {k[len("model."):]: v for k, v in visual.items()}
    params = load_params(list(tower.params), old, "old layout")
    for k, v in params.items():
        np.testing.assert_array_equal(v, tower.params[k])


def test_wrong_inputs_and_missing_tensors_are_named(checkpoint, tmp_path):
    path, _ = checkpoint
    tower = Qwen3VLVision.from_folder(path)
    with pytest.raises(InvalidArgumentError, match="grid_thw gives 16 patches"):
        tower.encode(np.zeros((12, 384), np.float32), [[1, 4, 4]])
    with pytest.raises(InvalidArgumentError, match="multiples of spatial_merge_size 2"):
        tower.encode(np.zeros((12, 384), np.float32), [[1, 3, 4]])
    # A checkpoint without DeepStack merger 1: the missing tensor is named.
    from safetensors.numpy import load_file, save_file

    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    tensors = load_file(str(path / "model.safetensors"))
    gone = [k for k in tensors if "deepstack_merger_list.1.linear_fc2.bias" in k]
    assert gone
    save_file({k: v for k, v in tensors.items() if k not in gone}, str(tmp_path / "model.safetensors"))
    with pytest.raises(FileFormatError, match=r"visual\.deepstack_merger_list\.1\.linear_fc2\.bias"):
        Qwen3VLVision.from_folder(tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["vision_config"]["intermediate_size"] = 40
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(FileFormatError, match=r"visual\.blocks\.0\.mlp\.linear_fc1\.weight has shape \(48, 32\)"):
        Qwen3VLVision.from_folder(tmp_path)
    cfg["vision_config"]["intermediate_size"] = 48
    cfg["vision_config"]["num_position_embeddings"] = 15
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(Exception, match="num_position_embeddings 15 is not a square"):
        Qwen3VLVision.from_folder(tmp_path)
