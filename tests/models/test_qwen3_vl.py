"""Qwen3VLForConditionalGeneration (surogate/models/qwen3_vl.py, dsl/nn_qwen3_vl.py) against
transformers on a tiny random checkpoint (the family's TinyModel config: text 2 layers, hidden 64,
heads 4 / 2 of 16, mrope_section [2, 3, 3]; the tower tests' tower, out 64), f32 to 1e-4: logits of
a text-only prompt, of a prompt with two images of different grids (merged rows, DeepStack after
layers 0 and 1, interleaved MRoPE), of a video with timestamps between its frames and of images
and a video together; the loss and the LoRA gradients with an image against peft; MRoPE positions
against HF's get_rope_index; the errors."""

import numpy as np
import pytest
import torch

pytest.importorskip("transformers.models.qwen3_vl")
from transformers import Qwen3VLForConditionalGeneration  # noqa: E402

import surogate  # noqa: E402
from surogate.dsl.nn import LoRAConfig  # noqa: E402
from surogate.errors import ConfigError, InvalidArgumentError  # noqa: E402
from surogate.models import family_for  # noqa: E402
from surogate.models.qwen3_vl import rope_index, spec_from_config  # noqa: E402

from sgtest.tiny_models import (QWEN3_VL_END as END, QWEN3_VL_IMAGE as IMG, QWEN3_VL_START as START,  # noqa: E402
                                QWEN3_VL_VIDEO as VID, make_qwen3_vl, qwen3_vl_prompts)
from sgtest.vision import qwen3_vl_hf_logits  # noqa: E402


def build(tmp_path_factory, tie: bool):
    path = make_qwen3_vl(tmp_path_factory.mktemp("qwen3vl-tied" if tie else "qwen3vl"), tie=tie)
    return path, Qwen3VLForConditionalGeneration.from_pretrained(str(path), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return build(tmp_path_factory, tie=False)


def pixels(grids, seed):
    n = sum(int(np.prod(g)) for g in grids)
    return np.random.default_rng(seed).standard_normal((n, 3 * 2 * 8 * 8)).astype(np.float32)


def two_images():
    return qwen3_vl_prompts()[0]


def video():
    return qwen3_vl_prompts()[1]


def test_registry_and_spec(checkpoint):
    path, model = checkpoint
    cfg = model.config.to_dict()
    assert family_for(cfg).name == "qwen3_vl"
    spec = spec_from_config(cfg)
    assert spec.vision.mrope_section == (2, 3, 3) and not spec.tie_word_embeddings and spec.qk_norm
    # transformers ties by the outer key only; the hub's v4 rope_scaling form reads the same.
    text = {**cfg["text_config"], "tie_word_embeddings": True}
    assert not spec_from_config({**cfg, "text_config": text}).tie_word_embeddings
    v4 = {**cfg["text_config"], "rope_parameters": None, "rope_theta": 5e6,
          "rope_scaling": {"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True}}
    s4 = spec_from_config({**cfg, "text_config": v4})
    assert s4.vision.rope_theta == 5e6 and s4.rope["theta"] == 5e6 and s4.vision.mrope_section == (2, 3, 3)
    with pytest.raises(ConfigError, match="mrope_section"):
        spec_from_config({**cfg, "text_config": {**cfg["text_config"], "rope_parameters": {
            "rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 4]}}})


def test_export_names_are_the_checkpoint_s(checkpoint):
    from surogate.io import ModelFolder

    path, _ = checkpoint
    ours = surogate.load_model(path)
    weights = ModelFolder(path).open_weights()
    out = ours.to_hf(ours.params)
    assert set(out) == set(weights.keys())  # the tower's fused qkv joined again, the text model's names
    for name, a in out.items():
        np.testing.assert_array_equal(a, np.asarray(weights.get(name)), err_msg=name)


def test_text_only_prompt_equals_hf(checkpoint):
    path, model = checkpoint
    ours = surogate.load_model(path)
    ids = [3, 17, 5, 60, 2, 44, 8, 1, 70, 12]
    np.testing.assert_allclose(ours.forward(ids), qwen3_vl_hf_logits(model, ids), atol=1e-4, rtol=0)


def test_text_prompts_serve_as_transformers_generates(checkpoint):
    """The serving engine runs the language model (text prompts: Qwen3's graph)."""
    from sgtest.engine import engine, generate, hf_greedy, prompts

    path, model = checkpoint
    ours = surogate.load_model(path)
    ps = prompts(IMG, 4, seed=5)  # ids below the placeholders
    with engine(ours) as client:
        assert generate(client, ps, 6) == [hf_greedy(model, p, 6) for p in ps]


def test_tied_head_equals_hf(tmp_path_factory):
    path, model = build(tmp_path_factory, tie=True)
    ours = surogate.load_model(path)
    assert ours.spec.tie_word_embeddings and "lm_head.weight" not in ours.params
    ids, images = two_images()
    np.testing.assert_allclose(ours.forward(ids, images=images), qwen3_vl_hf_logits(model, ids, images),
                               atol=1e-4, rtol=0)


def test_two_images_of_different_grids_equal_hf(checkpoint):
    path, model = checkpoint
    ours = surogate.load_model(path)
    ids, images = two_images()
    want = qwen3_vl_hf_logits(model, ids, images)
    np.testing.assert_allclose(ours.forward(ids, images=images), want, atol=1e-4, rtol=0)
    # Model.encode_images is the tower's encode (one set of weights, the Model's).
    from surogate.models.qwen3_vl_vision import Qwen3VLVision

    rows, deep = ours.encode_images(*images)
    want_rows, want_deep = Qwen3VLVision.from_folder(path).encode(*images)
    np.testing.assert_array_equal(rows, want_rows)
    assert len(deep) == 2 and all(np.array_equal(a, b) for a, b in zip(deep, want_deep))
    # The rows matter: other pixels change the logits after the first image.
    other = (pixels(images[1].tolist(), 7), images[1])
    assert np.abs(ours.forward(ids, images=other) - want)[4:].max() > 1e-2


def test_video_and_images_with_video_equal_hf(checkpoint):
    path, model = checkpoint
    ours = surogate.load_model(path)
    ids, vid = video()
    np.testing.assert_allclose(ours.forward(ids, videos=vid), qwen3_vl_hf_logits(model, ids, videos=vid),
                               atol=1e-4, rtol=0)
    img_ids, images = two_images()
    both = img_ids + ids
    np.testing.assert_allclose(ours.forward(both, images=images, videos=vid),
                               qwen3_vl_hf_logits(model, both, images, vid), atol=1e-4, rtol=0)


def test_packed_documents_with_images_and_a_video_equal_hf(checkpoint):
    """Two packed documents: each counts its positions from 0, the grids taken in order."""
    path, model = checkpoint
    ours = surogate.load_model(path)
    img_ids, images = two_images()
    vid_ids, vid = video()
    got = ours.forward([img_ids, vid_ids], images=images, videos=vid)
    want = np.concatenate([qwen3_vl_hf_logits(model, img_ids, images), qwen3_vl_hf_logits(model, vid_ids, videos=vid)])
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


def test_rope_index_equals_hf(checkpoint):
    path, model = checkpoint
    img_ids, images = two_images()
    vid_ids, vid = video()
    ids = img_ids + vid_ids
    types = torch.tensor([[1 if i == IMG else 2 if i == VID else 0 for i in ids]])
    want, _ = model.model.get_rope_index(torch.tensor([ids]), types, torch.tensor(images[1]), torch.tensor(vid[1]))
    spec = spec_from_config(model.config.to_dict())
    got = rope_index(np.array(ids), np.array([0, len(ids)]), images[1], vid[1], spec.vision)
    np.testing.assert_array_equal(got, want[:, 0].numpy())


def test_loss_and_lora_grads_with_an_image_equal_peft(checkpoint):
    from sgtest.peft_ref import peft_model, peft_tensors
    from surogate.models.peft import from_peft_tensors

    path, model = checkpoint
    ours = surogate.load_model(path)
    ids, images = two_images()
    labels = [-100 if i in (IMG, START, END) else i for i in ids]
    kw = dict(input_ids=torch.tensor([ids]), labels=torch.tensor([labels]),
              mm_token_type_ids=torch.tensor([[1 if i == IMG else 0 for i in ids]]),
              pixel_values=torch.tensor(images[0]), image_grid_thw=torch.tensor(images[1]))
    with torch.no_grad():
        want = model(**kw).loss.item()
    assert ours.loss(ids, labels, images=images) == pytest.approx(want, rel=1e-5)

    lora = LoRAConfig(rank=4, alpha=8.0, targets=("q_proj", "v_proj", "down_proj"))
    pm = peft_model(Qwen3VLForConditionalGeneration.from_pretrained(str(path), dtype=torch.float32),
                    list(lora.targets), seed=1)
    prefix = "model.language_model."
    params = from_peft_tensors(peft_tensors(pm), lora, module_prefix=prefix)
    loss, grads = ours.loss_and_grads(ids, labels, lora=lora, lora_params=params, images=images)
    out = pm(**kw)
    out.loss.backward()
    assert loss == pytest.approx(out.loss.item(), rel=1e-5)
    ref = from_peft_tensors(peft_tensors(pm, "grad"), lora, module_prefix=prefix)
    assert set(grads) == set(ref) and len(ref) == 2 * 3 * 2
    for name, g in grads.items():
        err = np.abs(g - ref[name]).max() / (np.abs(ref[name]).max() + 1e-12)
        assert err < 1e-4, f"{name}: {err:.2e}"


def test_errors(checkpoint):
    from surogate.dsl.nn import KVCache

    path, _ = checkpoint
    ours = surogate.load_model(path)
    ours.arch.build(mode="serve", kv=KVCache(num_blocks=4, block_size=16))  # text-only serving: Qwen3's graph
    # with request rows: the image rows' serving graph (tests/serve/test_qwen3_vl_serving.py runs it)
    g = ours.arch.build(mode="serve", kv=KVCache(num_blocks=4, block_size=16, embeds=True))
    assert g.values["embed_rows"].shape[1] == ours.arch.embed_width == 64 * 3 + 16  # merged, 2 DeepStack, cos + sin
    ids, images = two_images()
    with pytest.raises(InvalidArgumentError, match="no pixels were given"):
        ours.forward(ids)
    with pytest.raises(InvalidArgumentError, match="merged rows"):
        ours.forward(ids[:-6] + ids[-3:], images=images)  # one image token short
    with pytest.raises(InvalidArgumentError, match="do not fit the grids"):
        ours.forward(ids, images=(images[0][:-4], images[1]))


def test_full_finetune_grads_with_an_image_equal_hf(checkpoint):
    """Every language-model gradient (the embedding's through the replaced rows too) equals HF's,
    exported under the checkpoint's names (to_hf)."""
    path, _ = checkpoint
    ours = surogate.load_model(path)
    ref = Qwen3VLForConditionalGeneration.from_pretrained(str(path), dtype=torch.float32)
    ids, images = two_images()
    out = ref(input_ids=torch.tensor([ids]), labels=torch.tensor([ids]), pixel_values=torch.tensor(images[0]),
              image_grid_thw=torch.tensor(images[1]),
              mm_token_type_ids=torch.tensor([[1 if i == IMG else 0 for i in ids]]))
    out.loss.backward()
    loss, grads = ours.loss_and_grads(ids, images=images)
    assert loss == pytest.approx(out.loss.item(), rel=1e-5)
    hf_grads = dict(ref.named_parameters())
    assert not any(n.startswith("visual.") for n in grads)  # the tower is frozen
    theirs = ours.to_hf(grads)
    assert len(theirs) == 2 + 11 * 2 + 1
    for name, g in theirs.items():
        want = hf_grads[name].grad.numpy()
        err = np.abs(g - want).max() / (np.abs(want).max() + 1e-12)
        assert err < 1e-4, f"{name}: {err:.2e}"
    emb = theirs["model.language_model.embed_tokens.weight"]
    assert not emb[IMG].any() and emb[5].any()  # the image tokens' embeddings were replaced: no gradient


def test_bf16_agrees_with_hf_bf16(checkpoint):
    """bf16 weights and activations against transformers in bf16 (its MRoPE rounded as ours:
    rope_table round_products): logits of the two-image prompt within 10% of their standard
    deviation (measured 6.3%, about HF bf16's own distance from f32), the same top-1 on 90%."""
    path, model = checkpoint
    ids, images = two_images()
    ref = Qwen3VLForConditionalGeneration.from_pretrained(str(path), dtype=torch.bfloat16).eval()
    with torch.no_grad():
        want = ref(input_ids=torch.tensor([ids]), pixel_values=torch.tensor(images[0]).to(torch.bfloat16),
                   image_grid_thw=torch.tensor(images[1]),
                   mm_token_type_ids=torch.tensor([[1 if i == IMG else 0 for i in ids]])).logits[0].float().numpy()
    got = surogate.load_model(path, dtype="bfloat16").forward(ids, images=images)
    assert np.abs(got - want).max() < 0.1 * want.std()
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.9
