"""`bench serve --images`: the program runs on the tiny vision shape on the CPU and prints its
table (timings not checked); its named configs are the checkpoints' architectures (our graphs
hold the parameters transformers builds for the same config.json); Qwen3-VL is refused by name
until its family serves images."""

from __future__ import annotations

import dataclasses
import math

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from surogate.bench.vision import VISION_CONFIGS, config_for, run  # noqa: E402
from surogate.errors import InvalidArgumentError, UnsupportedError  # noqa: E402
from surogate.models.registry import family_for  # noqa: E402


def test_bench_serve_images_prints_both_rows_and_the_speedup(capsys):
    results = run("tiny", n_images=2, n=2, prompt_len=8, output_len=3, dtype="float32", vs="hf", device="cpu",
                  image_size=(64, 48))
    out = capsys.readouterr().out
    lines = out.splitlines()
    # 8 text tokens + 2 x (boi + 4 image tokens + eoi)
    assert "2 requests x (8 text tokens + 2 images 64x48 = 20 prompt tokens, 3 output tokens), cpu" in out
    header = next(line for line in lines if "out tok/s" in line)
    for column in ("out tok/s", "TTFT p50/p99 (s)", "preprocess ms/img", "encode ms/img"):
        assert column in header
    names = [line.split("  ")[0] for line in lines]
    assert {"surogate", "HF generate (one batch)", "speed-up (ours vs peer)"} <= set(names)
    speedup = next(line for line in lines if line.startswith("speed-up"))
    assert speedup.count("x") == 5  # tok/s, TTFT p50 and p99, preprocess, encode
    assert [r.name for r in results] == ["surogate", "HF generate (one batch)"]
    for r in results:
        assert r.output_tokens_per_s > 0 and 0 < r.ttft_p50 <= r.ttft_p99
        assert r.preprocess_ms_per_image > 0 and r.encode_ms_per_image > 0  # the images went through both


def test_prompts_hold_each_image_as_the_processor_writes_it():
    from surogate.bench.vision import _IdNames, images, random_vision_model, write_prompts

    model = random_vision_model(config_for("tiny"), "float32", "cpu")
    v = model.spec.vision
    prompt = model.family.image_prompt(model.spec, _IdNames(), None)
    pictures = [images(3, (64, 48), seed=i) for i in range(2)]
    a, b = write_prompts(prompt, pictures, 5, seed=0)
    image = [v.boi_token_index, *[v.image_token_index] * v.mm_tokens_per_image, v.eoi_token_index]
    assert a[5:] == b[5:] == image * 3 and a[:5] != b[:5]
    assert all(3 <= t < v.boi_token_index for t in a[:5] + b[:5])


@pytest.mark.parametrize("shape", ["tiny", "tiny-qwen3-vl"])
def test_both_sides_see_the_same_pixels(shape):
    """The peer's transformers processor is set as ours is: the same pixel values (and grids)."""
    import numpy as np

    from surogate.bench.vision import _IdNames, hf_processor, images

    config = config_for(shape)
    family = family_for(config)
    if family.image_prompt is None:
        pytest.skip(f"{family.name} does not serve images on this branch")
    spec = family.spec_from_config(config)
    ours = family.image_prompt(spec, _IdNames(), None).processor
    pics = images(2, (640, 480), seed=5)
    theirs = hf_processor(family.name, ours)(images=pics, return_tensors="pt")
    batch = ours(pics)
    np.testing.assert_array_equal(batch.pixel_values, theirs["pixel_values"].numpy())
    if "image_grid_thw" in theirs:
        np.testing.assert_array_equal(batch.image_grid_thw, theirs["image_grid_thw"].numpy())


@pytest.mark.parametrize("name", list(VISION_CONFIGS))
def test_vision_configs_have_the_parameters_transformers_gives_them(name):
    config = config_for(name)
    family = family_for(config)
    spec = family.spec_from_config(config)
    arch = family.architecture(spec)
    ours = [*arch.build(mode="logits").params(), *arch.build(mode="vision").params()]
    rest = {k: v for k, v in config.items() if k not in ("architectures", "model_type")}
    with torch.device("meta"):
        ref = getattr(transformers, config["architectures"][0])(
            transformers.AutoConfig.for_model(config["model_type"], **rest))
    assert sum(math.prod(p.shape) for p in ours) == sum(p.numel() for p in ref.parameters())


def test_gemma3_4b_config_is_the_text_bench_shape_with_its_tower():
    from surogate.bench.shapes import spec_for

    config = config_for("gemma-3-4b")
    spec = family_for(config).spec_from_config(config)
    text = dataclasses.replace(spec, vision=None, bos_token_id=None, eos_token_id=None)
    assert text == spec_for("gemma-3-4b")
    v = spec.vision
    assert (v.image_size, v.patch_size, v.num_layers, v.hidden_size, v.mm_tokens_per_image) == (896, 14, 27, 1152, 256)


def test_qwen3_vl_runs_once_its_family_serves_images_and_is_refused_before(capsys):
    if family_for(config_for("qwen3-vl-2b")).image_prompt is None:
        with pytest.raises(UnsupportedError, match="qwen3-vl-2b: .* not served with images"):
            run("qwen3-vl-2b", n_images=4, n=1, prompt_len=8, output_len=1, dtype="float32", vs=None, device="cpu")
        return
    results = run("tiny-qwen3-vl", n_images=2, n=2, prompt_len=8, output_len=3, dtype="float32", vs="hf",
                  device="cpu", image_size=(64, 48))
    assert "speed-up (ours vs peer)" in capsys.readouterr().out
    assert all(r.output_tokens_per_s > 0 and r.encode_ms_per_image > 0 for r in results)


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(InvalidArgumentError, match="no vision shape 'qwen3-0.6b'"):
        run("qwen3-0.6b", n_images=1, n=1, prompt_len=8, output_len=1, dtype="float32", vs=None, device="cpu")
    with pytest.raises(InvalidArgumentError, match="--images 0"):
        run("tiny", n_images=0, n=1, prompt_len=8, output_len=1, dtype="float32", vs=None, device="cpu")


def test_cli_refuses_images_with_http():
    from typer.testing import CliRunner

    from surogate.cli.bench import app

    result = CliRunner().invoke(app, ["serve", "--images", "2", "--http"])
    assert result.exit_code != 0 and "--images runs the engine offline" in str(result.exception)
