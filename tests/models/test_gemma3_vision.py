"""Gemma 3 with images (Gemma3ForConditionalGeneration) against transformers on a tiny random
checkpoint (tests/sgtest/tiny_models.py make_gemma3_vision: a 2-layer SigLIP tower over 56-pixel
images, 14-pixel patches, pooled 2 x 2 to 4 tokens per image; the gemma3 family's tiny text model
with its window of 4): the tower's last hidden state, the projector's rows, logits and loss of a
prompt with two images (the bidirectional image spans from HF's token_type_ids), a text-only
prompt, packed documents with images, the checkpoint layouts transformers writes, and the
configs it refuses. f32, 1e-4."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import surogate  # noqa: E402
from sgtest.tiny_models import make_gemma3_vision  # noqa: E402
from surogate.errors import ConfigError, InvalidArgumentError, UnsupportedError  # noqa: E402

ATOL = 1e-4


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_gemma3_vision(tmp_path_factory.mktemp("gemma3v"), seed=3)


@pytest.fixture(scope="module")
def ours(folder):
    return surogate.load_model(folder)


@pytest.fixture(scope="module")
def ref(folder):
    m = transformers.Gemma3ForConditionalGeneration.from_pretrained(str(folder), dtype=torch.float32)
    return m.eval()


def pixels(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 3, 56, 56)).astype(np.float32)


def prompt(model, n_images: int, seed: int = 1) -> np.ndarray:
    """bos, text, then per image: text, <start_of_image>, the image tokens, <end_of_image>; text."""
    v = model.spec.vision
    rng = np.random.default_rng(seed)
    text_vocab = v.boi_token_index  # ids below boi are the tokenizer's
    ids = [model.spec.bos_token_id, *rng.integers(3, text_vocab, 3)]
    for _ in range(n_images):
        ids += [*rng.integers(3, text_vocab, 2), v.boi_token_index, *[v.image_token_index] * v.mm_tokens_per_image,
                v.eoi_token_index]
    ids += list(rng.integers(3, text_vocab, 4))
    return np.array(ids, np.int64)


def hf_logits(ref, ids: np.ndarray, px: np.ndarray | None, image_token: int, labels=None):
    t = torch.tensor(ids)[None]
    kw = {}
    if px is not None:
        kw = {"pixel_values": torch.tensor(px), "token_type_ids": (t == image_token).long()}
    if labels is not None:
        kw["labels"] = torch.tensor(labels)[None]
    with torch.no_grad():
        return ref(input_ids=t, **kw)


def test_vision_tower_last_hidden_state_matches_transformers(ours, ref):
    px = pixels(2)
    got = ours.encode_images(px, hidden=True)
    with torch.no_grad():
        want = ref.model.vision_tower(pixel_values=torch.tensor(px)).last_hidden_state
    v = ours.spec.vision
    assert got.shape == (2 * v.patches, v.hidden_size)
    np.testing.assert_allclose(got, want.reshape(got.shape).numpy(), atol=ATOL, rtol=0)


def test_projected_image_rows_match_transformers(ours, ref):
    px = pixels(3, seed=5)
    got = ours.encode_images(px)
    with torch.no_grad():
        want = ref.model.get_image_features(torch.tensor(px)).pooler_output
    v = ours.spec.vision
    assert got.dtype == np.float32 and got.shape == (3 * v.mm_tokens_per_image, ours.spec.hidden_size)
    np.testing.assert_allclose(got, want.reshape(got.shape).numpy(), atol=ATOL, rtol=0)


def test_logits_of_a_prompt_with_two_images_match_transformers(ours, ref):
    ids, px = prompt(ours, 2), pixels(2, seed=7)
    got = ours.forward(ids, images=px)
    want = hf_logits(ref, ids, px, ours.spec.vision.image_token_index).logits[0].numpy()
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)
    # The spans attend both ways: HF without token_type_ids (causal everywhere) differs.
    t = torch.tensor(ids)[None]
    with torch.no_grad():
        causal = ref(input_ids=t, pixel_values=torch.tensor(px)).logits[0].numpy()
    assert np.abs(causal - want).max() > 1e-3


def test_loss_with_images_matches_transformers(ours, ref):
    ids, px = prompt(ours, 2, seed=2), pixels(2, seed=8)
    labels = np.where(ids == ours.spec.vision.image_token_index, -100, ids)
    want = hf_logits(ref, ids, px, ours.spec.vision.image_token_index, labels).loss.item()
    assert ours.loss(ids, labels, images=px) == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_a_text_only_prompt_matches_transformers(ours, ref):
    ids = prompt(ours, 0, seed=4)
    got = ours.forward(ids)
    np.testing.assert_allclose(got, hf_logits(ref, ids, None, 0).logits[0].numpy(), atol=ATOL, rtol=0)


def test_packed_documents_with_images_equal_each_alone(ours):
    a, b = prompt(ours, 1, seed=11), prompt(ours, 2, seed=12)
    px = pixels(3, seed=9)
    packed = ours.forward([a, b], images=px)
    alone = np.concatenate([ours.forward(a, images=px[:1]), ours.forward(b, images=px[1:])])
    np.testing.assert_allclose(packed, alone, atol=1e-5, rtol=0)


def _rewrite(folder, dest, rename):
    import shutil

    from safetensors.numpy import load_file, save_file

    shutil.copytree(folder, dest)
    tensors = load_file(str(dest / "model.safetensors"))
    save_file({rename(k): v for k, v in tensors.items()}, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest


@pytest.mark.parametrize("layout", ["hub", "transformers-4.5x"])
def test_checkpoint_layouts_load_the_same_weights(ours, folder, tmp_path, layout):
    def hub(k):  # google/gemma-3-4b-it's names: the tower under vision_tower.vision_model.
        return k.replace("vision_tower.", "vision_tower.vision_model.", 1) if k.startswith("vision_tower.") else k

    def v45(k):  # model.language_model.*, model.vision_tower.vision_model.*, model.multi_modal_projector.*
        k = hub(k)
        return "model.language_model." + k[len("language_model.model."):] if k.startswith("language_model.model.") \
            else "model." + k

    other = surogate.load_model(_rewrite(folder, tmp_path / layout, hub if layout == "hub" else v45))
    assert set(other.params) == set(ours.params)
    for name, arr in ours.params.items():
        np.testing.assert_array_equal(other.params[name], arr, err_msg=name)


def test_image_token_count_must_match_the_images(ours):
    with pytest.raises(InvalidArgumentError, match="8 image tokens.*4 rows"):
        ours.forward(prompt(ours, 2), images=pixels(1))
    with pytest.raises(InvalidArgumentError, match="image tokens .* no images"):
        ours.forward(prompt(ours, 1))
    with pytest.raises(InvalidArgumentError, match=r"pixel_values has shape \(1, 3, 28, 28\)"):
        ours.encode_images(np.zeros((1, 3, 28, 28), np.float32))


def _config_with(folder, tmp_path, edit):
    import shutil

    dest = tmp_path / "edited"
    shutil.copytree(folder, dest)
    cfg = json.loads((dest / "config.json").read_text())
    edit(cfg)
    (dest / "config.json").write_text(json.dumps(cfg))
    return dest


@pytest.mark.parametrize("edit, match", [
    (lambda c: c["vision_config"].update(vision_use_head=True), "vision_config.vision_use_head"),
    (lambda c: c["vision_config"].pop("vision_use_head"), "vision_config.vision_use_head"),
    (lambda c: c["vision_config"].update(hidden_act="quick_gelu"), "vision_config.hidden_act 'quick_gelu'"),
    (lambda c: c["vision_config"].update(model_type="clip_vision_model"), "vision_config.model_type"),
    (lambda c: c.update(mm_tokens_per_image=9), "mm_tokens_per_image 9"),
    (lambda c: c.update(mm_tokens_per_image=5), "mm_tokens_per_image 5 is not a square"),
])
def test_configs_it_cannot_run_name_the_key(folder, tmp_path, edit, match):
    with pytest.raises((UnsupportedError, ConfigError), match=match):
        surogate.load_model(_config_with(folder, tmp_path, edit))
