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


def test_the_folder_s_image_processor_feeds_the_tower(ours, ref, folder):
    """preprocessor_config.json (as the hub's folders have it) read by transformers' processor: a
    picture's pixel values give the same rows here and in HF."""
    from PIL import Image

    proc = transformers.AutoImageProcessor.from_pretrained(str(folder))
    rgb = np.random.default_rng(3).integers(0, 256, (40, 70, 3), dtype=np.uint8)
    px = proc(images=[Image.fromarray(rgb)], return_tensors="np")["pixel_values"]
    assert px.shape == (1, 3, 56, 56)
    with torch.no_grad():
        want = ref.model.get_image_features(torch.tensor(px)).pooler_output
    np.testing.assert_allclose(ours.encode_images(px), want.reshape(4, -1).numpy(), atol=ATOL, rtol=0)


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


def test_loss_and_language_model_grads_with_images_match_transformers(ours, ref):
    """The tower and projector are frozen (their rows are inputs of the text graph): every other
    gradient of a full fine-tune equals HF's."""
    ids, px = prompt(ours, 2, seed=2), pixels(2, seed=8)
    labels = np.where(ids == ours.spec.vision.image_token_index, -100, ids)
    t = torch.tensor(ids)[None]
    types = (t == ours.spec.vision.image_token_index).long()
    out = ref(input_ids=t, pixel_values=torch.tensor(px), token_type_ids=types, labels=torch.tensor(labels)[None])
    assert ours.loss(ids, labels, images=px) == pytest.approx(out.loss.item(), rel=1e-5, abs=1e-6)
    loss, grads = ours.loss_and_grads(ids, labels, images=px)
    assert loss == pytest.approx(out.loss.item(), rel=1e-5, abs=1e-6)
    ref.zero_grad()
    out.loss.backward()
    named = dict(ref.named_parameters())
    ours_hf = ours.to_hf(grads)  # the text model's names (model.*): HF's under model.language_model.*
    assert len(ours_hf) == len([n for n in named if n.startswith("model.language_model.")])
    for name, g in ours_hf.items():
        r = named[name.replace("model.", "model.language_model.", 1)].grad.numpy()
        err = np.abs(g - r).max() / (np.abs(r).max() + 1e-12)
        assert err < 1e-4, f"{name}: max error {err:.2e}"


def test_lora_grads_with_images_match_peft(folder, ours):
    """LoRA on the language model's projections (peft targeting language_model only; the tower has
    q_proj / k_proj / v_proj too), a two-image prompt: loss and every adapter gradient equal peft's."""
    pytest.importorskip("peft")
    from sgtest.peft_ref import peft_model, peft_tensors
    from surogate.dsl.nn import LoRAConfig
    from surogate.models.peft import from_peft_tensors

    ref = transformers.Gemma3ForConditionalGeneration.from_pretrained(str(folder), dtype=torch.float32).eval()
    targets = LoRAConfig().targets
    pm = peft_model(ref, r".*language_model.*\.(" + "|".join(targets) + ")")
    lora = LoRAConfig(rank=4, alpha=8, targets=targets)

    def ours_names(tensors):  # peft's names on the multimodal model -> the text model's
        return from_peft_tensors({k.replace("model.language_model.", "model."): v for k, v in tensors.items()}, lora)

    ids, px = prompt(ours, 2, seed=15), pixels(2, seed=15)
    loss, grads = ours.loss_and_grads(ids, lora=lora, lora_params=ours_names(peft_tensors(pm)), images=px)
    t = torch.tensor(ids)[None]
    types = (t == ours.spec.vision.image_token_index).long()
    out = pm(input_ids=t, pixel_values=torch.tensor(px), token_type_ids=types, labels=t)
    out.loss.backward()
    assert loss == pytest.approx(out.loss.item(), rel=1e-5)
    want = ours_names(peft_tensors(pm, "grad"))
    assert set(grads) == set(want) and len(want) == 2 * 7 * ours.spec.num_layers
    for name, g in grads.items():
        err = np.abs(g - want[name]).max() / (np.abs(want[name]).max() + 1e-12)
        assert err < 1e-4, f"{name}: {err:.2e}"


def test_a_text_only_prompt_matches_transformers(ours, ref):
    ids = prompt(ours, 0, seed=4)
    got = ours.forward(ids)
    np.testing.assert_allclose(got, hf_logits(ref, ids, None, 0).logits[0].numpy(), atol=ATOL, rtol=0)


def test_text_prompts_serve_as_transformers_generates(ours, ref):
    """The serving engine runs the language model of the vision checkpoint (text prompts; image
    rows in serving come through the engine's embeddings, not yet here)."""
    from sgtest.engine import engine, generate, hf_greedy, prompts

    ps = prompts(ours.spec.vision.boi_token_index, 6, seed=5)
    with engine(ours) as client:
        assert generate(client, ps, 8) == [hf_greedy(ref, p, 8) for p in ps]


def test_packed_documents_with_images_equal_each_alone(ours):
    a, b = prompt(ours, 1, seed=11), prompt(ours, 2, seed=12)
    px = pixels(3, seed=9)
    packed = ours.forward([a, b], images=px)
    alone = np.concatenate([ours.forward(a, images=px[:1]), ours.forward(b, images=px[1:])])
    np.testing.assert_allclose(packed, alone, atol=1e-5, rtol=0)


def test_an_image_token_past_the_vocabulary(ours, tmp_path):
    """HF reads an image token id >= vocab_size as 0 before the embedding (its row is replaced)."""
    v = ours.spec.vision.boi_token_index  # the tokenizer's size; boi, eoi follow
    path = make_gemma3_vision(tmp_path / "oov", seed=4, text={"vocab_size": v + 2}, image_token_index=v + 2)
    model = surogate.load_model(path)
    assert model.spec.vision.image_token_index == model.spec.vocab_size
    ref = transformers.Gemma3ForConditionalGeneration.from_pretrained(str(path), dtype=torch.float32).eval()
    ids, px = prompt(model, 2, seed=6), pixels(2, seed=6)
    want = hf_logits(ref, ids, px, model.spec.vision.image_token_index).logits[0].numpy()
    np.testing.assert_allclose(model.forward(ids, images=px), want, atol=ATOL, rtol=0)


def test_an_untied_head(ours, tmp_path):
    """tie_word_embeddings false: the head is saved as language_model.lm_head.weight."""
    path = make_gemma3_vision(tmp_path / "untied", seed=5, text={"tie_word_embeddings": False},
                              tie_word_embeddings=False)
    model = surogate.load_model(path)
    assert not model.spec.tie_word_embeddings and "lm_head.weight" in model.params
    ref = transformers.Gemma3ForConditionalGeneration.from_pretrained(str(path), dtype=torch.float32).eval()
    ids, px = prompt(model, 1, seed=8), pixels(1, seed=8)
    want = hf_logits(ref, ids, px, model.spec.vision.image_token_index).logits[0].numpy()
    np.testing.assert_allclose(model.forward(ids, images=px), want, atol=ATOL, rtol=0)


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


# google/gemma-3-4b-it's config.json: text_config and vision_config list only what differs from
# Gemma3TextConfig's and SiglipVisionConfig's defaults.
HUB_4B = {
    "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "boi_token_index": 255999,
    "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144, "initializer_range": 0.02,
    "mm_tokens_per_image": 256,
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                    "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024},
    "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                      "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
                      "patch_size": 14, "vision_use_head": False},
}


def test_a_hub_config_reads_as_transformers_fills_it_in():
    from surogate.models.gemma3 import spec_from_config

    sparse = spec_from_config(HUB_4B)
    full = transformers.Gemma3Config(**{k: v for k, v in HUB_4B.items() if k not in ("architectures", "model_type")})
    assert sparse == spec_from_config({"architectures": HUB_4B["architectures"], **full.to_dict()})
    assert (sparse.vocab_size, sparse.num_heads, sparse.num_kv_heads, sparse.head_dim) == (262208, 8, 4, 256)
    assert sparse.sliding_windows == [0 if (i + 1) % 6 == 0 else 1024 for i in range(34)]
    v = sparse.vision
    assert (v.grid, v.pool_kernel, v.head_dim, v.text_hidden_size) == (64, 4, 72, 2560)


def test_bf16_agrees_with_f32(folder, ours):
    """bf16 weights and activations (f32 accumulation): the image rows within 2% of their f32 scale
    (measured 0.65%), the logits of a two-image prompt within 10% of the f32 logits' standard
    deviation (measured 6.2%; a text-only prompt on this tiny model 5.6%: its logits spread little),
    the same top-1 on 85% of positions (measured 22 of 24)."""
    bf16 = surogate.load_model(folder, dtype="bfloat16")
    px, ids = pixels(2, seed=13), prompt(ours, 2, seed=14)
    a, b = ours.encode_images(px), bf16.encode_images(px)
    assert np.abs(a - b).max() < 0.02 * np.abs(a).max()
    la, lb = ours.forward(ids, images=px), bf16.forward(ids, images=px)
    assert np.abs(la - lb).max() < 0.1 * la.std()
    assert (la.argmax(-1) == lb.argmax(-1)).mean() >= 0.85


def test_quantize_of_a_model_with_images_checks_before_writing(folder, tmp_path):
    # A model with images is written as a text GGUF and an mmproj (tests/io/test_gguf_mmproj.py); this
    # tiny text config (a sliding pattern of 2) is not one llama.cpp can hold: refused, and no file left.
    from surogate.models.gguf_names import quantize_to_gguf

    with pytest.raises(UnsupportedError, match="layer_types"):
        quantize_to_gguf(folder, tmp_path / "x.gguf", "Q8_0")
    assert list(tmp_path.iterdir()) == []
