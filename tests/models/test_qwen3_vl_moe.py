"""Qwen3VLMoeForConditionalGeneration (surogate/models/qwen3_vl_moe.py) against transformers on a
tiny random checkpoint (tiny_models.make_qwen3_vl(moe=True): Qwen3-VL's tiny tower and text model
with three layers, the middle one dense, 6 experts of width 24, top 2, the load-balancing loss
on), f32 to 1e-4: logits of text, of two images of different grids and of a video with images;
the stacked experts read in the hub's layout ([E, in, out]) as in transformers 5's own; the loss
with its aux loss and every full fine-tune gradient with an image; LoRA on the attention and the
experts (peft's target_parameters layout) with an image against peft."""

import numpy as np
import pytest
import torch

pytest.importorskip("transformers.models.qwen3_vl_moe")
from transformers import Qwen3VLMoeForConditionalGeneration  # noqa: E402

import surogate  # noqa: E402
from surogate.dsl.nn import LoRAConfig  # noqa: E402
from surogate.errors import FileFormatError, UnsupportedError  # noqa: E402
from surogate.models import family_for  # noqa: E402
from surogate.models.qwen3_vl_moe import spec_from_config  # noqa: E402

from sgtest.tiny_models import (QWEN3_VL_END as END, QWEN3_VL_IMAGE as IMG, QWEN3_VL_START as START,  # noqa: E402
                                QWEN3_VL_VIDEO as VID, make_qwen3_vl, qwen3_vl_prompts)

ATTN = ["q_proj", "k_proj", "v_proj", "o_proj"]
EXPERTS = ["gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return make_qwen3_vl(tmp_path_factory.mktemp("qwen3vlmoe"), moe=True, seed=3)


@pytest.fixture(scope="module")
def model(path):
    return Qwen3VLMoeForConditionalGeneration.from_pretrained(str(path), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def ours(path):
    return surogate.load_model(path)


def types(ids):
    return torch.tensor([[1 if i == IMG else 2 if i == VID else 0 for i in ids]])


def hf_inputs(ids, images=None, videos=None, labels=None):
    kw = {"input_ids": torch.tensor([ids])}
    if images is not None or videos is not None:
        kw["mm_token_type_ids"] = types(ids)
    if images is not None:
        kw.update(pixel_values=torch.tensor(images[0]), image_grid_thw=torch.tensor(images[1]))
    if videos is not None:
        kw.update(pixel_values_videos=torch.tensor(videos[0]), video_grid_thw=torch.tensor(videos[1]))
    if labels is not None:
        kw["labels"] = torch.tensor([labels])
    return kw


def hf_logits(model, ids, images=None, videos=None):
    with torch.no_grad():
        return model(**hf_inputs(ids, images, videos)).logits[0].numpy()


def test_registry_and_spec(model):
    cfg = model.config.to_dict()
    assert family_for(cfg).name == "qwen3_vl_moe"
    spec = spec_from_config(cfg)
    m = spec.moe
    assert (m.num_experts, m.top_k, m.intermediate_size, m.layers) == (6, 2, 24, (0, 2))
    assert m.norm_topk_prob and m.router_aux_loss_coef == 0.05  # HF's router always renormalises
    assert spec.vision.mrope_section == (2, 3, 3) and spec.qk_norm and not spec.tie_word_embeddings
    text = cfg["text_config"]
    # decoder_sparse_step 2, no mlp_only_layers: layer 1 sparse only; without output_router_logits no aux loss
    s2 = spec_from_config({**cfg, "text_config": {**text, "decoder_sparse_step": 2, "mlp_only_layers": [],
                                                  "output_router_logits": False}})
    assert s2.moe.layers == (1,) and s2.moe.router_aux_loss_coef == 0
    # the language model alone (a qwen3_vl_moe_text config): no tower, the same experts
    alone = spec_from_config({**text, "architectures": ["Qwen3VLMoeForConditionalGeneration"]})
    assert alone.vision is None and alone.moe.layers == (0, 2)
    with pytest.raises(UnsupportedError, match="qwen3_vl_moe_text"):  # the dense family refuses the MoE text model
        family_for({"architectures": ["Qwen3VLForConditionalGeneration"]}).spec_from_config(cfg)


def test_text_two_images_and_a_video_equal_hf(model, ours):
    (img_ids, images), (vid_ids, vid) = qwen3_vl_prompts()
    text = [3, 17, 5, 60, 2, 44, 8, 1, 70, 12]
    np.testing.assert_allclose(ours.forward(text), hf_logits(model, text), atol=1e-4, rtol=0)
    np.testing.assert_allclose(ours.forward(img_ids, images=images), hf_logits(model, img_ids, images),
                               atol=1e-4, rtol=0)
    both = img_ids + vid_ids
    np.testing.assert_allclose(ours.forward(both, images=images, videos=vid),
                               hf_logits(model, both, images, vid), atol=1e-4, rtol=0)


def test_experts_in_the_hub_layout_load_and_export_as_the_hub_s(path, model, tmp_path):
    """transformers 5 saves [E, out, in]; the hub's files hold [E, in, out] (what transformers'
    conversion_mapping transposes at load): both load to the same model, and to_hf writes the hub's,
    which transformers reads back."""
    import shutil

    from surogate.io import ModelFolder, save_safetensors

    weights = ModelFolder(path).open_weights()
    hub = {n: np.ascontiguousarray(np.swapaxes(np.asarray(weights.get(n)), 1, 2)) if ".mlp.experts." in n
           else np.asarray(weights.get(n)) for n in weights.keys()}
    shutil.copytree(path, tmp_path / "hub")
    save_safetensors(tmp_path / "hub" / "model.safetensors", hub, metadata={"format": "pt"})
    ids, images = qwen3_vl_prompts()[0]
    want = hf_logits(model, ids, images)
    from_hub = surogate.load_model(tmp_path / "hub")
    np.testing.assert_allclose(from_hub.forward(ids, images=images), want, atol=1e-4, rtol=0)
    theirs = Qwen3VLMoeForConditionalGeneration.from_pretrained(str(tmp_path / "hub"), dtype=torch.float32).eval()
    np.testing.assert_allclose(hf_logits(theirs, ids, images), want, atol=1e-5, rtol=0)

    out = surogate.load_model(path).to_hf(from_hub.params)
    assert set(out) == set(hub)
    for name, a in out.items():
        np.testing.assert_array_equal(a, hub[name], err_msg=name)
    # A layer whose two expert tensors disagree is refused, not read half transposed.
    bad = dict(hub)
    key = "model.language_model.layers.0.mlp.experts.down_proj"
    bad[key] = np.ascontiguousarray(np.swapaxes(bad[key], 1, 2))
    save_safetensors(tmp_path / "hub" / "model.safetensors", bad, metadata={"format": "pt"})
    with pytest.raises(FileFormatError, match="share no hidden size"):
        surogate.load_model(tmp_path / "hub")


def test_loss_with_aux_loss_and_full_finetune_grads_with_an_image_equal_hf(path, ours):
    """HF's loss adds router_aux_loss_coef * aux_loss (text_config.output_router_logits); every
    language-model gradient (the routers' and the stacked experts' too) equals HF's."""
    ref = Qwen3VLMoeForConditionalGeneration.from_pretrained(str(path), dtype=torch.float32)
    ids, images = qwen3_vl_prompts()[0]
    labels = [-100 if i in (IMG, START, END) else i for i in ids]
    out = ref(**hf_inputs(ids, images, labels=labels))
    assert out.aux_loss is not None and out.aux_loss.item() > 0
    out.loss.backward()
    loss, grads = ours.loss_and_grads(ids, labels, images=images)
    assert loss == pytest.approx(out.loss.item(), rel=1e-5)
    assert not any(n.startswith("visual.") for n in grads)  # the tower is frozen
    theirs = ours.to_hf(grads)
    hf = dict(ref.named_parameters())
    assert {n for n in hf if n.startswith("model.language_model.") or n == "lm_head.weight"} == set(theirs)
    for name, g in theirs.items():
        want = hf[name].grad.numpy()
        if ".mlp.experts." in name:  # to_hf writes the hub's [E, in, out]; transformers holds [E, out, in]
            want = np.swapaxes(want, 1, 2)
        err = np.abs(g - want).max() / (np.abs(want).max() + 1e-12)
        assert err < 1e-4, f"{name}: {err:.2e}"


def peft_of(path, lora: LoRAConfig, seed: int = 1):
    """peft's model with the adapter config our adapter would write (surogate.models.peft
    peft_config): the attention projections as target_modules, the stacked experts as
    target_parameters (gate_up_proj at rank 2r for gate_proj + up_proj). transformers 5 has no
    v4 -> v5 conversion of Qwen3-VL-MoE's experts, so peft maps no target_modules onto them: this
    is how a peft user adapts them."""
    from sgtest.peft_ref import peft_model
    from surogate.models.peft import VISION_MODULES, peft_config

    attn = [t for t in lora.targets if t not in EXPERTS]
    experts = sorted({"gate_up_proj" if t in ("gate_proj", "up_proj") else t for t in lora.targets} - set(attn))
    c = peft_config(lora, attn, experts, str(path))
    return peft_model(Qwen3VLMoeForConditionalGeneration.from_pretrained(str(path), dtype=torch.float32),
                      attn, r=lora.rank, alpha=int(lora.alpha), seed=seed, exclude_modules=VISION_MODULES,
                      target_parameters=c["target_parameters"], rank_pattern=c["rank_pattern"],
                      alpha_pattern=c["alpha_pattern"])


@pytest.mark.parametrize("targets", [ATTN + EXPERTS, ["q_proj", "down_proj"]], ids=["all", "q-down"])
def test_lora_grads_on_attention_and_experts_with_an_image_equal_peft(path, ours, targets):
    pytest.importorskip("peft")
    from sgtest.peft_ref import peft_tensors
    from surogate.models.peft import LANGUAGE_MODEL_PREFIX, from_peft_tensors

    ids, images = qwen3_vl_prompts()[0]
    labels = [-100 if i in (IMG, START, END) else i for i in ids]
    lora = LoRAConfig(rank=4, alpha=8.0, targets=tuple(targets))
    pm = peft_of(path, lora)
    params = from_peft_tensors(peft_tensors(pm), lora, module_prefix=LANGUAGE_MODEL_PREFIX)
    assert any(".mlp.experts." in n for n in params)  # peft wrapped the stacked experts (target_parameters)
    loss, grads = ours.loss_and_grads(ids, labels, lora=lora, lora_params=params, images=images)
    out = pm(**hf_inputs(ids, images, labels=labels))
    out.loss.backward()
    assert loss == pytest.approx(out.loss.item(), rel=1e-5)
    ref = from_peft_tensors(peft_tensors(pm, "grad"), lora, module_prefix=LANGUAGE_MODEL_PREFIX)
    assert set(grads) == set(ref)
    for name, g in grads.items():
        err = np.abs(g - ref[name]).max() / (np.abs(ref[name]).max() + 1e-12)
        assert err < 1e-4, f"{name}: {err:.2e}"


def test_gguf_with_a_dense_layer_is_refused(path, tmp_path):
    """llama.cpp's qwen3vlmoe has experts in every layer: the tiny model's dense middle layer is
    refused by name before any file is written (tests/io/test_gguf_qwen3_vl.py writes and reads the
    all-sparse form)."""
    from surogate.models.gguf_names import mmproj_path, quantize_to_gguf

    with pytest.raises(UnsupportedError, match=r"qwen3vlmoe GGUF: layers \[1\] are dense"):
        quantize_to_gguf(path, tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists() and not mmproj_path(tmp_path / "x.gguf").exists()
