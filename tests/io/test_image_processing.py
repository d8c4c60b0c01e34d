"""Pixel values against transformers' own processors.

Images: transformers' PIL/numpy processors (``Gemma3ImageProcessorPil``, ``Qwen2VLImageProcessorPil``,
the classes its auto mapping picks without torchvision) resize with Pillow too, so the match is
bit for bit (``assert_array_equal``), on odd sizes, elongated images, RGBA and L inputs.

torchvision backend and video: transformers' torchvision processors (``Gemma3ImageProcessor``,
``Qwen2VLImageProcessor``, and ``Qwen3VLVideoProcessor``, which has no other) need torchvision,
which is not installed here. The reference is each class's own source (the installed file,
executed with its relative imports made absolute, its base-class and annotation-only torchvision
imports and its docstring decorator dropped) on a stand-in for ``TorchvisionBackend`` holding the
methods they call, written from transformers' ``TorchvisionBackend`` and torchvision's
``resize_image`` / ``normalize`` (on CPU a uint8 bilinear or bicubic resize is torch's own kernel,
``torch.nn.functional.interpolate(uint8, antialias=True)``). Crops, frames, grids, timestamps and
pixel values match it bit for bit.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PIL")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if int(transformers.__version__.split(".")[0]) < 5:  # the ...Pil classes and backends file came with 5.0
    pytest.skip("needs transformers >= 5 (its PIL and torchvision image processing backends)", allow_module_level=True)

from PIL import Image  # noqa: E402

from surogate.errors import ConfigError, InvalidArgumentError  # noqa: E402
from surogate.io.image_processing import (  # noqa: E402
    Gemma3ImageProcessor,
    QwenVLImageProcessor,
    QwenVLVideoProcessor,
    num_placeholder_tokens,
    to_rgb,
)
from surogate.io.image_resize import resize_like_torch  # noqa: E402

# Gemma 3's preprocessor_config.json as the checkpoints ship it (gemma-3-4b-it), nulls included.
GEMMA3_CONFIG = {
    "do_convert_rgb": None, "do_normalize": True, "do_pan_and_scan": None, "do_rescale": True, "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "Gemma3ImageProcessor", "image_seq_length": 256,
    "image_std": [0.5, 0.5, 0.5], "pan_and_scan_max_num_crops": None, "pan_and_scan_min_crop_size": None,
    "pan_and_scan_min_ratio_to_activate": None, "processor_class": "Gemma3Processor", "resample": 2,
    "rescale_factor": 0.00392156862745098, "size": {"height": 896, "width": 896},
}
# Qwen2-VL's (top-level min/max_pixels) and Qwen3-VL's (size as pixel bounds, patch 16, mean 0.5).
QWEN2VL_CONFIG = {
    "min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
    "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2VLProcessor",
}
QWEN3VL_CONFIG = {
    "size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": 16, "temporal_patch_size": 2,
    "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor", "image_processor_type": "Qwen2VLImageProcessorFast",
}
QWEN3VL_VIDEO_CONFIG = {
    "size": {"longest_edge": 25165824, "shortest_edge": 4096}, "patch_size": 16, "temporal_patch_size": 2,
    "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor", "video_processor_type": "Qwen3VLVideoProcessor",
}


def random_image(rng, width, height, mode="RGB"):
    rgba = Image.fromarray(rng.integers(0, 256, (height, width, 4), dtype=np.uint8), "RGBA")
    return rgba if mode == "RGBA" else rgba.convert(mode)


@pytest.fixture
def images():
    rng = np.random.default_rng(23)
    # Small, elongated both ways (pan-and-scan on), RGBA (composited on white), L, P with transparency.
    palette = random_image(rng, 90, 40).convert("P")
    palette.info["transparency"] = 7
    return [random_image(rng, 37, 53), random_image(rng, 300, 120, "RGBA"), random_image(rng, 61, 400, "L"),
            random_image(rng, 500, 180), palette]


def hf_gemma3(config, images, **overrides):
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
    from transformers.models.gemma3.processing_gemma3 import Gemma3Processor

    kwargs = {**Gemma3Processor.images_kwargs, **overrides}  # what Gemma3Processor passes for the null keys
    out = Gemma3ImageProcessorPil.from_dict(config)(images, return_tensors="np", **kwargs)
    return out["pixel_values"], list(out["num_crops"])


def hf_qwen(config, images):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    hf = Qwen2VLImageProcessorPil.from_dict(config)
    out = hf(images, return_tensors="np")
    return hf, out["pixel_values"], out["image_grid_thw"]


# --- Gemma 3 ---------------------------------------------------------------------------------------

def test_gemma3_default_config_matches_transformers_at_896(tmp_path):
    rng = np.random.default_rng(0)
    image = random_image(rng, 301, 217, "RGBA")
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(GEMMA3_CONFIG))
    proc = Gemma3ImageProcessor.from_folder(tmp_path)
    assert (proc.height, proc.width, proc.do_pan_and_scan, proc.image_seq_length) == (896, 896, False, 256)
    batch = proc([image])
    want, crops = hf_gemma3(GEMMA3_CONFIG, [image])
    assert batch.pixel_values.shape == (1, 3, 896, 896) and batch.pixel_values.dtype == np.float32
    assert batch.pixel_values.flags.c_contiguous
    np.testing.assert_array_equal(batch.pixel_values, want)
    assert batch.num_crops == crops == [0]


def test_gemma3_pan_and_scan_matches_transformers(images):
    config = {**GEMMA3_CONFIG, "size": {"height": 48, "width": 48}, "do_pan_and_scan": True,
              "pan_and_scan_min_crop_size": 32, "pan_and_scan_max_num_crops": 3}
    batch = Gemma3ImageProcessor.from_config(config)(images)
    want, crops = hf_gemma3(config, images, do_pan_and_scan=True, pan_and_scan_min_crop_size=32,
                            pan_and_scan_max_num_crops=3)
    # 37x53: ratio under 1.2, no crops; 300x120 landscape and 61x400 portrait: the max 3; 500x180: 3.
    assert batch.num_crops == crops and sum(batch.num_crops) > 0 and 0 in batch.num_crops
    assert batch.pixel_values.shape == (len(images) + sum(crops), 3, 48, 48)
    np.testing.assert_array_equal(batch.pixel_values, want)


def test_gemma3_pan_and_scan_skips_small_crops_and_lays_out_row_major():
    rng = np.random.default_rng(1)
    wide = random_image(rng, 500, 180)
    proc = Gemma3ImageProcessor.from_config({**GEMMA3_CONFIG, "do_pan_and_scan": True})  # min crop 256
    assert proc([wide]).num_crops == [0]  # two crops would be 250 wide: under 256, so none
    proc = Gemma3ImageProcessor.from_config({**GEMMA3_CONFIG, "do_pan_and_scan": True,
                                             "pan_and_scan_min_crop_size": 100, "size": {"height": 32, "width": 32}})
    crops = proc.pan_and_scan(np.asarray(wide))
    assert [c.shape for c in crops] == [(180, 167, 3), (180, 167, 3), (180, 166, 3)]  # ceil(500 / 3), the rest
    np.testing.assert_array_equal(np.concatenate(crops, axis=1), np.asarray(wide))


def test_gemma3_without_normalize_or_rescale_matches_transformers(images):
    config = {**GEMMA3_CONFIG, "size": {"height": 40, "width": 24}, "do_normalize": False, "resample": 3}
    np.testing.assert_array_equal(Gemma3ImageProcessor.from_config(config)(images).pixel_values,
                                  hf_gemma3(config, images)[0])
    config = {**config, "do_rescale": False, "do_normalize": True, "image_mean": [100, 120, 140],
              "image_std": [50, 60, 70]}
    np.testing.assert_array_equal(Gemma3ImageProcessor.from_config(config)(images).pixel_values,
                                  hf_gemma3(config, images)[0])


# --- Qwen-VL images --------------------------------------------------------------------------------

@pytest.mark.parametrize("name,config", [
    ("qwen2_vl", QWEN2VL_CONFIG),
    ("qwen2_vl_small_max", {**QWEN2VL_CONFIG, "max_pixels": 28 * 28 * 12}),  # forces the shrink branch
    ("qwen3_vl", {**QWEN3VL_CONFIG, "size": {"shortest_edge": 64 * 64, "longest_edge": 32 * 32 * 64}}),
    ("qwen3_vl_file", QWEN3VL_CONFIG),  # its min pixels (65536) grows every test image
])
def test_qwen_images_match_transformers(name, config, images):
    proc = QwenVLImageProcessor.from_config(config)
    pixels, grid = proc(images)
    hf, want, want_grid = hf_qwen(config, images)
    np.testing.assert_array_equal(grid, want_grid)
    assert pixels.dtype == np.float32 and pixels.shape == want.shape
    np.testing.assert_array_equal(pixels, want)
    # The placeholder count without the pixels, as Qwen's processor computes it for the prompt.
    merge = config["merge_size"]
    for image, row in zip(images, grid):
        n = proc.num_image_tokens(image.height, image.width)
        hf_n = hf.get_number_of_image_patches(image.height, image.width) // merge**2
        assert n == num_placeholder_tokens(row, merge) == hf_n


def test_qwen_patch_rows_follow_the_merge_blocks():
    # An image whose pixel value says which patch it is in: row r of pixel_values must be patch
    # (block row, block col, row in block, col in block) in that nesting, each frame twice.
    proc = QwenVLImageProcessor.from_config({"patch_size": 2, "merge_size": 2, "temporal_patch_size": 2,
                                             "do_resize": False, "do_rescale": False, "do_normalize": False})
    gh, gw = 4, 6
    ids = np.arange(gh * gw, dtype=np.uint8).reshape(gh, gw)
    image = np.repeat(np.repeat(ids, 2, axis=0), 2, axis=1)  # [8, 12]: each patch one value
    pixels, grid = proc([image])
    assert grid.tolist() == [[1, gh, gw]] and pixels.shape == (gh * gw, 3 * 2 * 2 * 2)
    order = [i * 2 * gw + j * 2 + di * gw + dj for i in range(gh // 2) for j in range(gw // 2)
             for di in range(2) for dj in range(2)]
    np.testing.assert_array_equal(pixels[:, 0], order)
    assert (pixels == pixels[:, :1]).all()


# --- transformers' torchvision backend, run from its source --------------------------------------

class _TorchvisionBackendStandIn:
    """The methods transformers' torchvision-backend processors take from ``TorchvisionBackend``,
    written from it and from torchvision's ``resize_image`` and ``normalize``."""

    def __init__(self, **kwargs):
        for key, value in kwargs.items():
            setattr(self, key, value)

    def resize(self, image, size, resample, **kwargs):
        mode = {2: "bilinear", 3: "bicubic"}[int(resample)]
        assert image.dtype == torch.uint8
        shape = image.shape
        if (size.height, size.width) == tuple(shape[-2:]):
            return image
        # torchvision's resize_image on CPU: uint8 in, the native uint8 kernel (bicubic always, bilinear on
        # AVX2 / AVX512 CPUs), antialiased, align_corners False.
        out = torch.nn.functional.interpolate(image.reshape(-1, *shape[-3:]), size=[size.height, size.width],
                                              mode=mode, align_corners=False, antialias=True)
        return out.reshape(*shape[:-2], size.height, size.width)

    def rescale_and_normalize(self, images, do_rescale, rescale_factor, do_normalize, image_mean, image_std):
        if do_rescale and do_normalize:  # _fuse_mean_std_and_rescale_factor
            image_mean = torch.tensor(image_mean) * (1.0 / rescale_factor)
            image_std = torch.tensor(image_std) * (1.0 / rescale_factor)
            do_rescale = False
        if do_normalize:  # torchvision's normalize: sub_(mean).div_(std) per channel
            mean = torch.as_tensor(image_mean, dtype=torch.float32).view(-1, 1, 1)
            std = torch.as_tensor(image_std, dtype=torch.float32).view(-1, 1, 1)
            return images.to(torch.float32).sub(mean).div(std)
        return images * rescale_factor if do_rescale else images


def hf_torchvision_class(model: str, file: str, name: str):
    """transformers' class ``name`` from models/``model``/``file``, on the stand-in base."""
    import transformers.models as package

    source = (Path(package.__file__).parent / model / file).read_text()
    bases = ("from ...image_processing_backends import TorchvisionBackend\n",
             "from ...video_processing_utils import BaseVideoProcessor\n")
    assert sum(base in source for base in bases) == 1
    for base in bases:
        source = source.replace(base, "")
    # A top-level torchvision import feeds quoted annotations only; the guarded one is skipped here.
    source = re.sub(r"^from torchvision.transforms.v2 import functional as tvF\n", "", source, flags=re.M)
    # auto_docstring only writes the docstring, and needs a module file this exec does not have.
    source = re.sub(r"^[ ]*@auto_docstring\n", "", source.replace("from ...", "from transformers."), flags=re.M)
    namespace = {"TorchvisionBackend": _TorchvisionBackendStandIn, "BaseVideoProcessor": _TorchvisionBackendStandIn,
                 "__name__": f"hf_{model}_{file[:-3]}"}
    exec(compile(source, file, "exec"), namespace)
    return namespace[name]


def hf_rgb_tensors(images):
    # TorchvisionBackend.process_image for PIL input: transformers' convert_to_rgb, then CHW.
    from transformers.image_transforms import convert_to_rgb

    return [torch.from_numpy(convert_to_rgb(im, return_numpy=True)).permute(2, 0, 1).contiguous() for im in images]


def hf_pixel_kwargs(config, resample):
    return dict(do_rescale=config.get("do_rescale", True), rescale_factor=config.get("rescale_factor", 1 / 255),
                do_normalize=config.get("do_normalize", True), image_mean=tuple(config["image_mean"]),
                image_std=tuple(config["image_std"]), resample=config.get("resample", resample),
                disable_grouping=None, return_tensors=None)


@pytest.mark.parametrize("pixel_keys", [{}, {"do_normalize": False, "resample": 3},
                                        {"do_rescale": False, "image_mean": [100, 120, 140], "image_std": [50, 60, 70]}])
def test_gemma3_torchvision_backend_matches_transformers_torchvision_code(pixel_keys, images):
    from transformers.image_utils import SizeDict

    cls = hf_torchvision_class("gemma3", "image_processing_gemma3.py", "Gemma3ImageProcessor")
    config = {**GEMMA3_CONFIG, "size": {"height": 56, "width": 56}, "do_pan_and_scan": True,
              "pan_and_scan_min_crop_size": 32, "pan_and_scan_max_num_crops": 3, **pixel_keys}
    out = cls()._preprocess(hf_rgb_tensors(images), do_resize=True, size=SizeDict(height=56, width=56),
                            do_pan_and_scan=True, pan_and_scan_min_crop_size=32, pan_and_scan_max_num_crops=3,
                            pan_and_scan_min_ratio_to_activate=1.2, **hf_pixel_kwargs(config, 2))
    batch = Gemma3ImageProcessor.from_config(config, backend="torchvision")(images)
    assert batch.num_crops == list(out["num_crops"]) and sum(batch.num_crops) > 0
    np.testing.assert_array_equal(batch.pixel_values, torch.stack(out["pixel_values"]).numpy())
    # The two backends differ by the resize's rounding (and the normalize's float32 steps).
    pil = Gemma3ImageProcessor.from_config(config)(images).pixel_values
    assert 0 < np.abs(pil - batch.pixel_values).max() < 0.2 * (255 if config.get("do_rescale") is False else 1)


@pytest.mark.parametrize("config", [QWEN2VL_CONFIG, {**QWEN3VL_CONFIG, "size": {"shortest_edge": 64 * 64,
                                                                               "longest_edge": 32 * 32 * 64}}])
def test_qwen_torchvision_backend_matches_transformers_torchvision_code(config, images):
    from transformers.image_utils import SizeDict

    cls = hf_torchvision_class("qwen2_vl", "image_processing_qwen2_vl.py", "Qwen2VLImageProcessor")
    hf = cls(**{k: config[k] for k in ("patch_size", "merge_size", "temporal_patch_size")})
    proc = QwenVLImageProcessor.from_config(config, backend="torchvision")
    out = hf._preprocess(hf_rgb_tensors(images), do_resize=True,
                         size=SizeDict(shortest_edge=proc.min_pixels, longest_edge=proc.max_pixels),
                         patch_size=proc.patch_size, temporal_patch_size=proc.temporal_patch_size,
                         merge_size=proc.merge_size, **hf_pixel_kwargs(config, 3))
    pixels, grid = proc(images)
    np.testing.assert_array_equal(grid, out["image_grid_thw"].numpy())
    np.testing.assert_array_equal(pixels, out["pixel_values"].numpy())


# --- Qwen3-VL video --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hf_video_class():
    return hf_torchvision_class("qwen3_vl", "video_processing_qwen3_vl.py", "Qwen3VLVideoProcessor")


def hf_video(cls, config, frames, video_fps, *, cap=False):
    """The path Qwen3VLVideoProcessor.preprocess takes for one [F, H, W, 3] array with metadata."""
    from transformers.image_utils import SizeDict
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.video_utils import VideoMetadata

    hf = cls(max_video_tokens=config["max_video_tokens"])
    indices = hf.sample_frames(metadata=VideoMetadata(total_num_frames=len(frames), fps=video_fps),
                               num_frames=None, fps=hf.fps)
    video = torch.from_numpy(frames[indices]).permute(0, 3, 1, 2).contiguous()
    size = config["size"]
    out = hf._preprocess(videos=[video], do_resize=True, size=SizeDict(**size), resample=3, do_rescale=True,
                         rescale_factor=1 / 255, do_normalize=True, image_mean=config["image_mean"],
                         image_std=config["image_std"], patch_size=config["patch_size"],
                         temporal_patch_size=config["temporal_patch_size"], merge_size=config["merge_size"],
                         cap_pixels_per_frame=cap)
    stamps = Qwen3VLProcessor._calculate_timestamps(None, indices, video_fps, config["temporal_patch_size"])
    return out["pixel_values_videos"].numpy(), out["video_grid_thw"].numpy(), indices, stamps


VIDEO_CASES = [  # frames, height, width, the video's fps, pixel bounds, cap_pixels_per_frame (8 tokens a frame)
    (23, 45, 61, 8.0, {"shortest_edge": 4096, "longest_edge": 32 * 32 * 40}, False),  # 5 of 23 frames: last repeated
    (40, 120, 50, 24.0, {"shortest_edge": 4096, "longest_edge": 32 * 32 * 24}, False),  # 4 frames (min_frames)
    (9, 20, 70, 2.0, {"shortest_edge": 32 * 32 * 30, "longest_edge": 32 * 32 * 200}, False),  # 20 high: upscaled
    (9, 120, 150, 2.0, {"shortest_edge": 4096, "longest_edge": 32 * 32 * 200}, True),  # the per-frame cap shrinks it
]


@pytest.mark.parametrize("case", VIDEO_CASES)
def test_qwen3vl_video_matches_transformers_code(hf_video_class, case):
    n, h, w, video_fps, size, cap = case
    config = {**QWEN3VL_VIDEO_CONFIG, "size": size, "cap_pixels_per_frame": cap, "max_video_tokens": 8}
    frames = np.random.default_rng(n).integers(0, 256, (n, h, w, 3), dtype=np.uint8)
    got = QwenVLVideoProcessor.from_config(config)(frames, fps=video_fps)

    want, grid, indices, stamps = hf_video(hf_video_class, config, frames, video_fps, cap=cap)
    np.testing.assert_array_equal(got.frame_indices, indices)
    np.testing.assert_array_equal(got.video_grid_thw, grid)
    assert got.timestamps == stamps and len(stamps) == grid[0, 0]
    assert got.pixel_values_videos.dtype == np.float32
    np.testing.assert_array_equal(got.pixel_values_videos, want)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("shape", [(37, 53, 64, 96), (300, 120, 96, 32), (45, 61, 45, 30), (20, 70, 64, 70),
                                   (1000, 17, 37, 5), (45, 61, 32, 64)])
def test_resize_like_torch_equals_torch_interpolate(mode, shape):
    h, w, out_h, out_w = shape
    resample = Image.Resampling[mode.upper()]
    frames = np.random.default_rng(h * w).integers(0, 256, (2, h, w, 3), dtype=np.uint8)
    want = torch.nn.functional.interpolate(torch.from_numpy(frames).permute(0, 3, 1, 2).contiguous(),
                                           size=[out_h, out_w], mode=mode, align_corners=False, antialias=True)
    np.testing.assert_array_equal(resize_like_torch(frames, out_h, out_w, resample), want.permute(0, 2, 3, 1).numpy())


def test_qwen3vl_video_frames_as_images_and_sampling_choices():
    rng = np.random.default_rng(5)
    frames = rng.integers(0, 256, (6, 40, 40, 3), dtype=np.uint8)
    proc = QwenVLVideoProcessor.from_config({**QWEN3VL_VIDEO_CONFIG, "size": {"shortest_edge": 4096,
                                                                             "longest_edge": 32 * 32 * 12}})
    as_array = proc(frames, fps=3.0)  # 2 s at 2 fps: 4 frames
    as_images = proc([Image.fromarray(f) for f in frames], fps=3.0)
    np.testing.assert_array_equal(as_array.pixel_values_videos, as_images.pixel_values_videos)
    assert as_array.frame_indices.tolist() == [0, 2, 3, 5] and as_array.video_grid_thw.tolist() == [[2, 2, 2]]
    assert as_array.timestamps == pytest.approx([(0 + 2 / 3) / 2, (1 + 5 / 3) / 2])
    every = proc(frames, sample=False)
    assert every.frame_indices.tolist() == list(range(6)) and every.video_grid_thw[0, 0] == 3
    assert proc(frames, num_frames=2).frame_indices.tolist() == [0, 5]
    with pytest.raises(InvalidArgumentError, match="frame rate"):
        proc(frames)
    assert num_placeholder_tokens(every.video_grid_thw[0], proc.merge_size) == 3


# --- shared pieces and errors ----------------------------------------------------------------------

def test_to_rgb_arrays_match_transformers():
    from transformers.image_transforms import convert_to_rgb

    rng = np.random.default_rng(3)
    for shape in [(7, 9, 4), (7, 9, 1), (7, 9, 3)]:
        array = rng.integers(0, 256, shape, dtype=np.uint8)
        np.testing.assert_array_equal(to_rgb(array), convert_to_rgb(array, return_numpy=True))
    gray = rng.integers(0, 256, (5, 6), dtype=np.uint8)
    np.testing.assert_array_equal(to_rgb(gray), np.repeat(gray[..., None], 3, axis=-1))


def test_config_errors_name_the_file_and_key(tmp_path):
    with pytest.raises(ConfigError, match="no preprocessor_config.json in") as e:
        Gemma3ImageProcessor.from_folder(tmp_path)
    assert "preprocessor_config.json" in e.value.hint
    with pytest.raises(ConfigError, match="video_preprocessor_config.json"):
        QwenVLVideoProcessor.from_folder(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({**GEMMA3_CONFIG, "size": {"height": 896}}))
    with pytest.raises(ConfigError, match=r"preprocessor_config.json: key 'size'"):
        Gemma3ImageProcessor.from_folder(tmp_path)
    with pytest.raises(ConfigError, match=r"key 'image_mean'.*3 numbers"):
        QwenVLImageProcessor.from_config({"image_mean": [0.5, 0.5]})
    with pytest.raises(ConfigError, match="key 'resample'"):
        Gemma3ImageProcessor.from_config({"resample": 9})
    with pytest.raises(ConfigError, match="key 'patch_size'"):
        QwenVLImageProcessor.from_config({"patch_size": "14"})
    with pytest.raises(ConfigError, match="exceeds longest_edge"):
        QwenVLImageProcessor.from_config({"size": {"shortest_edge": 100, "longest_edge": 10}})
    with pytest.raises(InvalidArgumentError, match="aspect ratio"):
        QwenVLImageProcessor.from_config(QWEN2VL_CONFIG)([np.zeros((1, 300, 3), np.uint8)])
    with pytest.raises(InvalidArgumentError, match="PIL.Image"):
        Gemma3ImageProcessor.from_config({})(["not an image"])


def test_imports_without_torch_or_transformers():
    import subprocess
    import sys

    code = ("import sys, surogate.io.image_processing; "
            "heavy = [m for m in ('torch', 'transformers') if m in sys.modules]; assert not heavy, heavy")
    subprocess.run([sys.executable, "-P", "-c", code], check=True)
