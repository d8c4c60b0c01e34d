"""`surogate sft` with LoRA on image chat rows for Qwen3-VL (Qwen3VLForConditionalGeneration)
against transformers and peft on a tiny random checkpoint (sgtest.vision make_qwen3_vl_chat: the
tokenizer with the vision tokens, a ChatML template, preprocessor_config.json): an image row's ids
and pixels as Qwen3VLProcessor's text rule and Qwen2VLImageProcessorPil give them, the LoRA
gradients of one row (f32, 1e-4), a packed micro-batch's loss as HF's document by document (each
document's images and MRoPE positions its own), a short run from YAML whose adapter peft loads and
whose merged model gives HF + peft's merged logits with an image, and the errors for image rows a
model cannot train on."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
pytest.importorskip("PIL")

import surogate  # noqa: E402
from sgtest.peft_ref import peft_model, peft_tensors  # noqa: E402
from sgtest.vision import image, make_qwen3_vl_chat  # noqa: E402
from sgtest.vision_sft import data_url, sft_trains, write_qwen3_vl_dataset, yaml_config  # noqa: E402
from surogate.config import load_config  # noqa: E402
from surogate.dsl.nn import LoRAConfig  # noqa: E402
from surogate.models.peft import LANGUAGE_MODEL_PREFIX, VISION_MODULES, from_peft_tensors  # noqa: E402
from surogate.train.trainer import Trainer  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_qwen3_vl_chat(tmp_path_factory.mktemp("q3vl"), seed=4)


@pytest.fixture(scope="module")
def ours(folder):
    return surogate.load_model(folder)


def hf_model(folder):
    return transformers.Qwen3VLForConditionalGeneration.from_pretrained(str(folder), dtype=torch.float32).eval()


def hf_inputs(folder, messages: list[dict], images: list, **template_kw) -> dict:
    """Qwen3VLProcessor's inputs (sgtest.vision qwen3_vl_reference's rule: the template's text, each
    <|image_pad|> repeated grid_t grid_h grid_w / merge^2 times, Qwen2VLImageProcessorPil's pixels,
    mm_token_type_ids 1 on image tokens) as torch tensors."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    proc = Qwen2VLImageProcessorPil.from_dict(json.loads((Path(folder) / "preprocessor_config.json").read_text()))
    template = (Path(folder) / "chat_template.jinja").read_text()
    text = tok.apply_chat_template(messages, chat_template=template, tokenize=False, **template_kw)
    kw = {}
    if images:
        out = proc(images, return_tensors="pt")
        pieces = text.split("<|image_pad|>")
        assert len(pieces) == len(images) + 1
        text = pieces[0] + "".join("<|image_pad|>" * int(g.prod() // proc.merge_size ** 2) + p
                                   for g, p in zip(out["image_grid_thw"], pieces[1:]))
        kw = {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}
    ids = tok(text, return_tensors="pt")["input_ids"]
    image_id = tok.convert_tokens_to_ids("<|image_pad|>")
    return {"input_ids": ids, **kw, **({"mm_token_type_ids": (ids == image_id).long()} if images else {})}


def encode_row(model, record: dict, base: Path):
    """Our data path for one row: normalize, resolve the images, render + expand + tokenize + mask."""
    from surogate.config.sft import DatasetConfig
    from surogate.train.data.formats import normalize
    from surogate.train.data.images import resolve_images
    from surogate.train.data.tokenize import ChatEncoder

    prompt = model.family.image_prompt(model.spec, model.tokenizer, str(model.path))
    sample = resolve_images(normalize(record, DatasetConfig(path=str(base))), base, prompt)
    return ChatEncoder(model.tokenizer, None, prompt).encode(sample), prompt


def test_lora_gradients_of_an_image_row_equal_peft(ours, folder, tmp_path):
    """Two images of different sizes in one row: ids and pixels as HF's, loss and every LoRA
    gradient as peft's on Qwen3VLForConditionalGeneration (the tower excluded)."""
    a, b = image(1, (40, 30)), image(2, (24, 56))
    a.save(tmp_path / "a.png")
    record = {"messages": [
        {"role": "user", "content": [{"type": "text", "text": "Compare"}, {"type": "image"},
                                     {"type": "text", "text": "with"}, {"type": "image"}]},
        {"role": "assistant", "content": "The first one is wider."}],
        "images": ["a.png", data_url(b)]}
    enc, prompt = encode_row(ours, record, tmp_path / "data.jsonl")
    msgs = [{"role": "user", "content": [{"type": "text", "text": "Compare"}, {"type": "image", "image": a},
                                         {"type": "text", "text": "with"}, {"type": "image", "image": b}]},
            {"role": "assistant", "content": "The first one is wider."}]
    ref_in = hf_inputs(folder, msgs, [a, b])
    np.testing.assert_array_equal(enc.input_ids, ref_in["input_ids"][0].numpy())
    from surogate.train.data.images import load_images

    px = prompt.processor(load_images(enc.images))
    np.testing.assert_allclose(px.pixel_values, ref_in["pixel_values"].numpy(), atol=1e-6, rtol=0)
    np.testing.assert_array_equal(px.image_grid_thw, ref_in["image_grid_thw"].numpy())
    assert len(set(map(tuple, px.image_grid_thw.tolist()))) == 2  # two grids: the positions differ per image

    labels = np.where(enc.loss_mask, enc.input_ids, -100)
    assert (labels[enc.input_ids == ours.spec.vision.image_token_id] == -100).all()  # never a target
    lora = LoRAConfig(4, 8.0, tuple(TARGETS))
    pm = peft_model(hf_model(folder), TARGETS, r=4, alpha=8, seed=2, exclude_modules=VISION_MODULES)
    assert not any("visual" in n for n, _ in pm.named_parameters() if "lora_" in n)
    params = from_peft_tensors(peft_tensors(pm), lora, LANGUAGE_MODEL_PREFIX)
    loss, grads = ours.loss_and_grads(enc.input_ids, labels, lora=lora, lora_params=params,
                                      images=(px.pixel_values, px.image_grid_thw))
    out = pm(**ref_in, labels=torch.tensor(labels.astype(np.int64))[None])
    out.loss.backward()
    assert loss == pytest.approx(out.loss.item(), rel=1e-5)
    ref = from_peft_tensors(peft_tensors(pm, "grad"), lora, LANGUAGE_MODEL_PREFIX)
    assert set(grads) == set(ref) and len(grads) == 2 * len(TARGETS) * ours.spec.num_layers
    for name, g in grads.items():
        r = ref[name]
        err = np.abs(g - r).max() / (np.abs(r).max() + 1e-12)
        assert err < 1e-4, f"{name}: {err:.2e}"




def hf_token_loss(folder, docs, indices) -> tuple[float, int]:
    """transformers' loss summed over the targets of these documents, each alone with its images
    (Qwen2VLImageProcessorPil's pixels, HF's own rope index from mm_token_type_ids), and the count."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from surogate.train.data.images import load_images

    ref = hf_model(folder)
    proc = Qwen2VLImageProcessorPil.from_dict(json.loads((Path(folder) / "preprocessor_config.json").read_text()))
    total, count = 0.0, 0
    for d in indices:
        ids, mask = docs[d]
        t = torch.tensor(ids.astype(np.int64))[None]
        labels = torch.tensor(np.where(mask, ids, -100).astype(np.int64))[None]
        kw = {}
        if docs.doc_images(d):
            out = proc(load_images(docs.doc_images(d)), return_tensors="pt")
            kw = {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"],
                  "mm_token_type_ids": (t == ref.config.image_token_id).long()}
        n = int((labels[0, 1:] != -100).sum())
        with torch.no_grad():
            total += ref(input_ids=t, labels=labels, **kw).loss.item() * n
        count += n
    return total, count


def test_a_packed_micro_batch_s_loss_equals_transformers_document_by_document(folder, tmp_path):
    """Packed rows of several documents with their images: the trainer's first-step loss (LoRA
    B = 0: the base model) is HF's token-summed loss of each document alone, with its images
    (Qwen2VLImageProcessorPil's pixels, HF's own rope index), over the step's targets."""
    data = write_qwen3_vl_dataset(tmp_path / "data")
    trainer = Trainer(load_config(yaml_config(folder, data, tmp_path / "out", sequence_len=256), kind="sft"))
    ds = trainer.train_data
    b = ds.batch([0, 1])
    docs = [int(d) for r in (0, 1) for d in ds.plan.row(r)]
    assert len(docs) > 2 and sum(len(ds.docs.doc_images(d)) for d in docs) == len(b.images) > 1
    image_token = trainer.model.spec.vision.image_token_id
    assert trainer.images >= int((b.input_ids == image_token).sum()) > 0
    assert not (b.targets == image_token).any()
    loss, targets = trainer._step([b])
    total, count = hf_token_loss(folder, ds.docs, docs)
    assert targets == count
    assert loss == pytest.approx(total / count, rel=1e-5)


def test_sft_on_image_rows_trains_and_its_adapter_and_merged_model_match_peft(folder, tmp_path):
    """`surogate sft run.yaml` on image rows, packed: the loss falls; peft loads the adapter (under
    model.language_model.*); the merged folder's logits with an image are HF + peft's merged."""
    data = write_qwen3_vl_dataset(tmp_path / "data")
    config = yaml_config(folder, data, tmp_path / "out", sequence_len=256)
    adapter, merged = sft_trains(config, tmp_path / "out")

    assert json.loads((adapter / "adapter_config.json").read_text())["exclude_modules"] == VISION_MODULES
    pm = peft.PeftModel.from_pretrained(hf_model(folder), str(adapter))
    loaded = from_peft_tensors(peft_tensors(pm), LoRAConfig(8, 16.0, tuple(TARGETS)), LANGUAGE_MODEL_PREFIX)
    assert len(loaded) == 2 * len(TARGETS) * 2 and all(np.abs(a).max() > 0 for a in loaded.values())

    hf_merged = pm.merge_and_unload().eval()
    mine = transformers.Qwen3VLForConditionalGeneration.from_pretrained(str(merged), dtype=torch.float32).eval()
    pic = image(77, (32, 48))
    msgs = [{"role": "user", "content": [{"type": "image", "image": pic},
                                         {"type": "text", "text": "Brightest channel?"}]}]
    inputs = hf_inputs(folder, msgs, [pic], add_generation_prompt=True)
    with torch.no_grad():
        want = hf_merged(**inputs).logits[0].numpy()
        got = mine(**inputs).logits[0].numpy()
        base = hf_model(folder)(**inputs).logits[0].numpy()
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    assert np.abs(base - want).max() > 1e-3  # the adapter changed it
    ours_merged = surogate.load_model(merged)
    np.testing.assert_allclose(ours_merged.forward(inputs["input_ids"][0].numpy(), images=(
        inputs["pixel_values"].numpy(), inputs["image_grid_thw"].numpy())), want, atol=1e-4, rtol=0)

    # Surogate's own adapter reader, and `surogate merge`, take the adapter as peft wrote it.
    from safetensors.numpy import load_file

    from surogate.models.peft import load_peft_adapter
    from surogate.train.export import merge_adapter

    _, params = load_peft_adapter(adapter)
    assert set(params) == set(loaded) and all(np.array_equal(params[n], loaded[n]) for n in params)
    again = load_file(merge_adapter(str(folder), adapter, tmp_path / "merged2") / "model.safetensors")
    first = load_file(merged / "model.safetensors")
    assert set(again) == set(first) and all(np.array_equal(again[k], first[k]) for k in first)


def image_rows(path: Path) -> Path:
    data = path / "rows.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    row = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]},
                        {"role": "assistant", "content": "Noise."}], "images": [data_url(image(5))]}
    data.write_text(json.dumps(row) + "\n")
    return data


def test_image_rows_for_a_vision_family_without_a_training_feed_say_so(folder, tmp_path, monkeypatch):
    """A vision model whose family the trainer cannot feed images to (here: the feed check made
    to fail) refuses an image row saying that, not that the model has no vision tower; text rows
    still train."""
    import surogate.train.trainer as trainer_module
    from surogate.errors import FileFormatError

    monkeypatch.setattr(trainer_module, "has_feed", lambda family_name: False)
    data = tmp_path / "d" / "rows.jsonl"
    data.parent.mkdir()
    row = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]},
                        {"role": "assistant", "content": "Noise."}], "images": [data_url(image(5))]}
    data.write_text(json.dumps(row) + "\n")
    with pytest.raises(FileFormatError, match=r"rows.jsonl line 1: the row has 1 image\(s\), and this model's family "
                                              r"\(qwen3_vl\) has a vision tower but no training feed for images yet"):
        Trainer(load_config(yaml_config(folder, data, tmp_path / "out"), kind="sft"))


def test_evaluation_with_images_equals_transformers(folder, tmp_path):
    """The eval Program reads the same visual inputs: before any step (LoRA B = 0) the eval loss
    is HF's over the held-out documents, each with its images."""
    data = write_qwen3_vl_dataset(tmp_path / "data")
    trainer = Trainer(load_config(yaml_config(folder, data, tmp_path / "out", sequence_len=256,
                                              validation_split_ratio=0.5, eval_steps=2), kind="sft"))
    docs = trainer.eval_data.docs
    assert docs.images is not None and any(docs.images)
    total, count = hf_token_loss(folder, docs, range(len(docs)))
    assert trainer._eval_metrics()["eval_loss"] == pytest.approx(total / count, rel=1e-5)


def test_a_truncated_row_keeps_its_whole_images_and_trains_as_transformers(folder, tmp_path):
    """sequence_len cutting into a row's second image: the document ends before that image's
    run (its first image whole), and the micro-batch's loss is HF's on the cut document."""
    a, b = image(3, (32, 32)), image(4, (48, 32))
    row = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "then"},
                                                     {"type": "image"}]},
                        {"role": "assistant", "content": "Two."}],
           "images": [data_url(a), data_url(b)]}
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps(row) + "\n" + json.dumps({"messages": [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there."}]}) + "\n")
    model = surogate.load_model(folder)
    enc, _ = encode_row(model, row, data)
    image_id = model.spec.vision.image_token_id
    at = np.flatnonzero(enc.input_ids == image_id)
    first_end, cut = int(at[enc.views[0] - 1]), int(at[enc.views[0]]) + 2  # inside the second image's run
    assert enc.input_ids[cut - 1] == image_id and cut < len(enc.input_ids)
    trainer = Trainer(load_config(yaml_config(folder, data, tmp_path / "out", sequence_len=cut, train_on="all",
                                              per_device_train_batch_size=1, sample_packing="false"), kind="sft"),
                      model=model)
    ds = trainer.train_data
    d = next(i for i in range(len(ds.docs)) if ds.docs.doc_images(i))
    ids, _ = ds.docs[d]
    assert len(ds.docs.doc_images(d)) == 1 and int((ids == image_id).sum()) == enc.views[0]
    assert len(ids) < cut and image_id not in ids[first_end + 1:]
    r = next(r for r in range(ds.num_rows) if d in ds.plan.row(r).tolist())
    loss, targets = trainer._step([ds.batch([r])])
    total, count = hf_token_loss(folder, ds.docs, [int(x) for x in ds.plan.row(r)])
    assert targets == count and loss == pytest.approx(total / count, rel=1e-5)
