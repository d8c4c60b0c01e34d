"""train_projector for Qwen3-VL and Qwen3-VL-MoE: the mergers (visual.merger and each
visual.deepstack_merger_list.j) train whole beside the LoRA, as peft's modules_to_save, on tiny
random checkpoints (tiny_models.make_qwen3_vl, sgtest.vision make_qwen3_vl_chat), f32: the loss,
the LoRA gradients and every merger gradient with two images equal peft's with those
modules_to_save (a full fine-tune's equal transformers'); `surogate sft` with train_projector
writes an adapter whose modules_to_save peft loads, and the logits with an image of peft's model,
of transformers on the run's merged folder, of our model on it, and of `surogate merge`'s folder
agree; the mergers changed, the rest of the tower did not. The text models have three layers, so
that the second DeepStack feature (added after layer 1) reaches the loss through later attention
(after the last layer it would reach only the image tokens' own logits, whose targets are ignored:
a zero gradient, in HF too)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

import surogate  # noqa: E402
from sgtest.peft_ref import peft_model, peft_tensors  # noqa: E402
from sgtest.tiny_models import (QWEN3_VL_END as END, QWEN3_VL_IMAGE as IMG, QWEN3_VL_START as START,  # noqa: E402
                                make_qwen3_vl, qwen3_vl_prompts)
from surogate.dsl.nn import LoRAConfig  # noqa: E402
from surogate.models.peft import LANGUAGE_MODEL_PREFIX, PEFT_PREFIX, VISION_MODULES, from_peft_tensors  # noqa: E402

ATTN = ["q_proj", "k_proj", "v_proj", "o_proj"]
THREE_LAYERS = {"text_config": {"num_hidden_layers": 3}}


def with_projector(model):
    """``model`` with train_projector set, as the trainer sets it."""
    model.spec = dataclasses.replace(model.spec, vision=dataclasses.replace(model.spec.vision, train_projector=True))
    model.arch = model.family.architecture(model.spec)
    model._cache.clear()
    return model


def hf_class(moe: bool):
    return transformers.Qwen3VLMoeForConditionalGeneration if moe else transformers.Qwen3VLForConditionalGeneration


def hf_inputs(ids, images, labels):
    return dict(input_ids=torch.tensor([ids]), labels=torch.tensor([labels]),
                mm_token_type_ids=torch.tensor([[1 if i == IMG else 0 for i in ids]]),
                pixel_values=torch.tensor(images[0]), image_grid_thw=torch.tensor(images[1]))


def rel(a, b) -> float:
    return float(np.abs(a - b).max() / (np.abs(b).max() + 1e-12))


@pytest.mark.parametrize("moe", [False, True], ids=["qwen3_vl", "qwen3_vl_moe"])
def test_lora_and_projector_grads_with_images_equal_peft_modules_to_save(tmp_path, moe):
    path = make_qwen3_vl(tmp_path / "m", moe=moe, seed=2, config=THREE_LAYERS)
    ours = with_projector(surogate.load_model(path))
    modules = list(ours.spec.vision.projector_modules)
    assert modules == ["visual.merger", "visual.deepstack_merger_list.0", "visual.deepstack_merger_list.1"]
    ids, images = qwen3_vl_prompts()[0]
    labels = [-100 if i in (IMG, START, END) else i for i in ids]
    lora = LoRAConfig(rank=4, alpha=8.0, targets=tuple(ATTN))
    pm = peft_model(hf_class(moe).from_pretrained(str(path), dtype=torch.float32), ATTN, seed=3,
                    exclude_modules=VISION_MODULES, modules_to_save=modules)
    values = peft_tensors(pm)
    whole = {n for n in values if ".visual." in n}
    assert whole and all(n.startswith(PEFT_PREFIX + "model.visual.") for n in whole)
    params = from_peft_tensors({n: a for n, a in values.items() if n not in whole}, lora, LANGUAGE_MODEL_PREFIX)
    loss, grads = ours.loss_and_grads(ids, labels, lora=lora, lora_params=params, images=images)
    out = pm(**hf_inputs(ids, images, labels))
    out.loss.backward()
    assert loss == pytest.approx(out.loss.item(), rel=1e-5)
    theirs = peft_tensors(pm, "grad")
    ref = from_peft_tensors({n: a for n, a in theirs.items() if n not in whole}, lora, LANGUAGE_MODEL_PREFIX)
    ref.update({n[len(PEFT_PREFIX + "model."):]: theirs[n] for n in whole})  # visual.merger.linear_fc1.weight ...
    assert set(grads) == set(ref) and sum(n.startswith("visual.") for n in grads) == 3 * 6
    for name, g in grads.items():
        assert rel(g, ref[name]) < 1e-4, f"{name}: {rel(g, ref[name]):.2e}"
        assert np.abs(g).max() > 0, name


def test_full_finetune_with_the_projector_equals_transformers(tmp_path):
    """lora: false with train_projector: the language model's and the mergers' gradients equal
    HF's full backward (whose tower blocks also get gradients, which ours do not compute)."""
    path = make_qwen3_vl(tmp_path / "m", seed=2, config=THREE_LAYERS)
    ours = with_projector(surogate.load_model(path))
    ref = transformers.Qwen3VLForConditionalGeneration.from_pretrained(str(path), dtype=torch.float32)
    ids, images = qwen3_vl_prompts()[0]
    labels = [-100 if i in (IMG, START, END) else i for i in ids]
    out = ref(**hf_inputs(ids, images, labels))
    out.loss.backward()
    loss, grads = ours.loss_and_grads(ids, labels, images=images)
    assert loss == pytest.approx(out.loss.item(), rel=1e-5)
    hf = dict(ref.named_parameters())
    mine = ours.to_hf(grads)
    assert {n for n in mine if n.startswith("model.visual.")} == {
        n for n in hf if n.startswith(("model.visual.merger.", "model.visual.deepstack_merger_list."))}
    for name, g in mine.items():
        assert rel(g, hf[name].grad.numpy()) < 1e-4, name
        assert np.abs(g).max() > 0 or "embed_tokens" in name, name


def test_sft_with_train_projector_saves_modules_to_save_peft_loads_and_merges(tmp_path):
    from safetensors.numpy import load_file

    from sgtest.vision import image, make_qwen3_vl_chat
    from sgtest.vision_sft import qwen3_vl_image_inputs, sft_trains, write_qwen3_vl_dataset, yaml_config
    from surogate.train.export import merge_adapter

    folder = make_qwen3_vl_chat(tmp_path / "base", seed=4, text=THREE_LAYERS["text_config"])
    data = write_qwen3_vl_dataset(tmp_path / "data")
    config = yaml_config(folder, data, tmp_path / "out", sequence_len=256, train_projector="true")
    adapter, merged = sft_trains(config, tmp_path / "out")
    meta = json.loads((adapter / "adapter_config.json").read_text())
    assert meta["modules_to_save"] == ["visual.merger", "visual.deepstack_merger_list.0",
                                       "visual.deepstack_merger_list.1"]
    saved = load_file(adapter / "adapter_model.safetensors")
    assert PEFT_PREFIX + "model.visual.merger.linear_fc1.weight" in saved

    base = transformers.Qwen3VLForConditionalGeneration.from_pretrained(str(folder), dtype=torch.float32).eval()
    pm = peft.PeftModel.from_pretrained(
        transformers.Qwen3VLForConditionalGeneration.from_pretrained(str(folder), dtype=torch.float32),
        str(adapter)).eval()
    inputs = qwen3_vl_image_inputs(folder, image(77, (32, 48)))
    hf_merged = transformers.Qwen3VLForConditionalGeneration.from_pretrained(str(merged), dtype=torch.float32).eval()
    with torch.no_grad():
        want = pm(**inputs).logits[0].numpy()
        got = hf_merged(**inputs).logits[0].numpy()
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    mine = surogate.load_model(merged).forward(inputs["input_ids"][0].numpy(), images=(
        inputs["pixel_values"].numpy(), inputs["image_grid_thw"].numpy()))
    np.testing.assert_allclose(mine, want, atol=1e-4, rtol=0)

    # The mergers trained (the rest of the tower did not); `surogate merge` gives the run's folder.
    before, after = dict(base.named_parameters()), dict(hf_merged.named_parameters())
    for name in before:
        if name.startswith("model.visual."):
            changed = not torch.equal(before[name], after[name])
            assert changed == (".merger." in name or "deepstack_merger_list" in name), name
    again = load_file(merge_adapter(str(folder), adapter, tmp_path / "merged2") / "model.safetensors")
    first = load_file(merged / "model.safetensors")
    assert set(again) == set(first) and all(np.array_equal(again[k], first[k]) for k in first)


def test_packed_loss_and_eval_with_the_projector_equal_the_frozen_ones(tmp_path):
    """Before any step the mergers are the tower's: a packed micro-batch's loss (several documents,
    their images) and the eval loss (fewer image tokens than the Program holds: padded visual rows)
    with train_projector equal those without it; the trainable state adds exactly the mergers'."""
    from sgtest.vision import make_qwen3_vl_chat
    from sgtest.vision_sft import write_qwen3_vl_dataset, yaml_config
    from surogate.config import load_config
    from surogate.train.trainer import Trainer

    folder = make_qwen3_vl_chat(tmp_path / "base", seed=4, text=THREE_LAYERS["text_config"])
    data = write_qwen3_vl_dataset(tmp_path / "data", n=9)
    runs = {}
    for projector in ("false", "true"):
        t = Trainer(load_config(yaml_config(folder, data, tmp_path / f"out-{projector}", sequence_len=256,
                                            validation_split_ratio=0.3, eval_steps=2, train_projector=projector),
                                kind="sft"))
        b = t.train_data.batch([0, 1])
        assert len(b.images) > 1 and t.images >= int((b.input_ids == t.model.spec.vision.image_token_id).sum())
        e = t.eval_data.batch(list(range(t.eval_data.num_rows)))
        assert 0 < int((e.input_ids == t.model.spec.vision.image_token_id).sum()) < t.images
        runs[projector] = (t._step([b])[0], t._eval_metrics()["eval_loss"], set(t._trainable_state()))
    (loss, eval_loss, state), (loss_p, eval_p, state_p) = runs["false"], runs["true"]
    assert loss_p == pytest.approx(loss, rel=1e-5) and eval_p == pytest.approx(eval_loss, rel=1e-5)
    assert {n.split(".")[1] for n in state_p - state} == {"merger", "deepstack_merger_list"}
    assert len(state_p - state) == 3 * 6 and state <= state_p
