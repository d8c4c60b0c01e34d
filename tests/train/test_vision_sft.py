"""`surogate sft` on image + text chat rows for Gemma 3 (Gemma3ForConditionalGeneration) against
transformers' Gemma3Processor and peft on a tiny random checkpoint (sgtest make_gemma3_vision,
with a tokenizer that has Gemma 3's image tokens and the hub's chat template): the token ids,
labels and pixel values of an image row, the LoRA gradients of one row (f32, 1e-4), a short run
from YAML whose adapter loads in peft and whose merged model gives HF + peft's merged logits,
packed rows with images, and the errors for rows that cannot be trained on; with train_projector
the projector's gradients beside the LoRA's (peft's modules_to_save) and a run's adapter and merged
model as HF + peft's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
pytest.importorskip("PIL")

import surogate  # noqa: E402
from sgtest.peft_ref import peft_model, peft_tensors  # noqa: E402
from sgtest.qa import step_losses  # noqa: E402
from sgtest.vision import image
from sgtest.vision_sft import data_url, make_folder, write_dataset, yaml_config  # noqa: E402
from surogate.config import load_config  # noqa: E402
from surogate.dsl.nn import LoRAConfig  # noqa: E402
from surogate.errors import FileFormatError  # noqa: E402
from surogate.models.peft import LANGUAGE_MODEL_PREFIX as GEMMA3_PEFT_PREFIX  # noqa: E402
from surogate.models.peft import VISION_MODULES as GEMMA3_PEFT_EXCLUDE  # noqa: E402
from surogate.models.peft import from_peft_tensors  # noqa: E402
from surogate.train.trainer import Trainer  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_folder(tmp_path_factory.mktemp("g3v"))


@pytest.fixture(scope="module")
def ours(folder):
    return surogate.load_model(folder)


@pytest.fixture(scope="module")
def processor(folder):
    return transformers.AutoProcessor.from_pretrained(str(folder))


def hf_model(folder):
    return transformers.Gemma3ForConditionalGeneration.from_pretrained(str(folder), dtype=torch.float32).eval()


def encode_row(model, record: dict, base: Path):
    """Our data path for one row: normalize, resolve the images, render + expand + tokenize + mask."""
    from surogate.config.sft import DatasetConfig
    from surogate.train.data.formats import normalize
    from surogate.train.data.images import resolve_images
    from surogate.train.data.tokenize import ChatEncoder

    prompt = model.family.image_prompt(model.spec, model.tokenizer, str(model.path))
    sample = resolve_images(normalize(record, DatasetConfig(path=str(base))), base, prompt)
    enc = ChatEncoder(model.tokenizer, None, prompt).encode(sample)
    return enc


def hf_assistant_labels(processor, ids: np.ndarray) -> np.ndarray:
    """Labels as TRL's assistant-only loss gives them, found on HF's ids: each model turn's tokens
    after "<start_of_turn>model\\n" up to its <end_of_turn>; image tokens -100."""
    tok = processor.tokenizer
    sot, eot = tok.convert_tokens_to_ids("<start_of_turn>"), tok.convert_tokens_to_ids("<end_of_turn>")
    header = tok.encode("model\n", add_special_tokens=False)
    labels = np.full(len(ids), -100, np.int64)
    for i in np.flatnonzero(ids == sot):
        start = i + 1 + len(header)
        if list(ids[i + 1:start]) == header:
            end = start + int(np.flatnonzero(ids[start:] == eot)[0])
            labels[start:end + 1] = ids[start:end + 1]
    labels[ids == tok.image_token_id] = -100
    return labels


def row_with_two_images(tmp_path: Path) -> tuple[dict, list]:
    """A TRL-style row: image parts, the images in the row's list (a relative path and a data URL)."""
    a, b = image(1, (40, 30)), image(2, (25, 50))
    a.save(tmp_path / "cat.png")
    record = {"messages": [
        {"role": "user", "content": [{"type": "text", "text": "Compare"}, {"type": "image"},
                                     {"type": "text", "text": "with"}, {"type": "image"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "The first one is wider."}]},
        {"role": "user", "content": "And the colours?"},
        {"role": "assistant", "content": "Both are noise."}],
        "images": ["cat.png", data_url(b)]}
    return record, [a, b]


def check_merged_equals_peft_merged(pm, merged):
    """The merged folder (ours), read by transformers and by us, and HF + peft merged: the same
    logits for a prompt with an image. Returns the processor's inputs and HF + peft's logits."""
    hf_merged = pm.merge_and_unload().eval()
    mine = transformers.Gemma3ForConditionalGeneration.from_pretrained(str(merged), dtype=torch.float32).eval()
    proc = transformers.AutoProcessor.from_pretrained(str(merged))
    msgs = [{"role": "user", "content": [{"type": "image", "image": image(77)},
                                         {"type": "text", "text": "Which channel is brightest?"}]}]
    inputs = proc.apply_chat_template(msgs, tokenize=True, return_dict=True, return_tensors="pt",
                                      add_generation_prompt=True)
    with torch.no_grad():
        want = hf_merged(**inputs).logits[0].numpy()
        got = mine(**inputs).logits[0].numpy()
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    ours = surogate.load_model(merged).forward(inputs["input_ids"][0].numpy(), images=inputs["pixel_values"].numpy())
    np.testing.assert_allclose(ours, want, atol=1e-4, rtol=0)
    return inputs, want


def test_an_image_row_gives_the_processor_s_ids_labels_and_pixels(ours, processor, tmp_path):
    record, pics = row_with_two_images(tmp_path)
    enc = encode_row(ours, record, tmp_path / "data.jsonl")
    hf_messages = json.loads(json.dumps(record["messages"]))
    it = iter(pics)
    for m in hf_messages:
        for part in m["content"] if isinstance(m["content"], list) else []:
            if part["type"] == "image":
                part["image"] = next(it)
    out = processor.apply_chat_template(hf_messages, tokenize=True, return_dict=True, return_tensors="np")
    ids = out["input_ids"][0]
    np.testing.assert_array_equal(enc.input_ids, ids)
    v = ours.spec.vision
    assert int((ids == v.image_token_index).sum()) == 2 * v.mm_tokens_per_image
    np.testing.assert_array_equal(out["token_type_ids"][0], (ids == v.image_token_index).astype(int))
    labels = np.where(enc.loss_mask, enc.input_ids, -100)
    np.testing.assert_array_equal(labels, hf_assistant_labels(processor, ids))
    from surogate.io.image_processing import Gemma3ImageProcessor
    from surogate.train.data.images import pixel_values

    px = pixel_values(Gemma3ImageProcessor.from_folder(ours.path), enc.images)
    np.testing.assert_allclose(px, out["pixel_values"], atol=1e-6, rtol=0)


def test_lora_gradients_of_an_image_row_equal_peft(ours, folder, processor, tmp_path):
    record, pics = row_with_two_images(tmp_path)
    enc = encode_row(ours, record, tmp_path / "data.jsonl")
    from surogate.io.image_processing import Gemma3ImageProcessor
    from surogate.train.data.images import pixel_values

    px = pixel_values(Gemma3ImageProcessor.from_folder(ours.path), enc.images)
    labels = np.where(enc.loss_mask, enc.input_ids, -100)
    lora = LoRAConfig(4, 8.0, tuple(TARGETS))
    pm = peft_model(hf_model(folder), TARGETS, r=4, alpha=8, seed=2, exclude_modules=GEMMA3_PEFT_EXCLUDE)
    assert not any("vision_tower" in n for n, _ in pm.named_parameters() if "lora_" in n)
    params = from_peft_tensors(peft_tensors(pm), lora, GEMMA3_PEFT_PREFIX)
    loss, grads = ours.loss_and_grads(enc.input_ids, labels, lora=lora, lora_params=params, images=px)
    t = torch.tensor(enc.input_ids.astype(np.int64))[None]
    types = (t == ours.spec.vision.image_token_index).long()
    out = pm(input_ids=t, pixel_values=torch.tensor(px), token_type_ids=types,
             labels=torch.tensor(labels.astype(np.int64))[None])
    out.loss.backward()
    assert loss == pytest.approx(out.loss.item(), rel=1e-5)
    ref = from_peft_tensors(peft_tensors(pm, "grad"), lora, GEMMA3_PEFT_PREFIX)
    assert set(grads) == set(ref) and len(grads) == 2 * len(TARGETS) * ours.spec.num_layers
    for name, g in grads.items():
        r = ref[name]
        err = np.abs(g - r).max() / (np.abs(r).max() + 1e-12)
        assert err < 1e-4, f"{name}: {err:.2e}"


def test_pan_and_scan_rows_equal_the_processor_and_peft(tmp_path):
    """preprocessor_config.json with pan-and-scan: a wide image becomes the original and its crops
    (the processor's text and views); ids, labels, pixel values and LoRA gradients as HF's."""
    from sgtest.vision import make_gemma3_vision_chat

    pan = {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 8, "pan_and_scan_max_num_crops": 3,
           "pan_and_scan_min_ratio_to_activate": 1.2}
    folder = make_gemma3_vision_chat(tmp_path / "pas", seed=3, preprocessor=pan)
    model = surogate.load_model(folder)
    wide, square = image(30, (64, 30)), image(31, (30, 30))
    wide.save(tmp_path / "wide.png")
    record = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "and"},
                                                        {"type": "image"}]},
                           {"role": "assistant", "content": "Two pictures."}],
              "images": ["wide.png", data_url(square)]}
    enc = encode_row(model, record, tmp_path / "data.jsonl")
    assert enc.views == (3, 1)  # the wide one and its two crops; the square one alone
    proc = transformers.AutoProcessor.from_pretrained(str(folder))
    msgs = [{"role": "user", "content": [{"type": "image", "image": wide}, {"type": "text", "text": "and"},
                                         {"type": "image", "image": square}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Two pictures."}]}]
    out = proc.apply_chat_template(msgs, tokenize=True, return_dict=True,
                                   processor_kwargs={**pan, "return_tensors": "np"})
    ids = out["input_ids"][0]
    np.testing.assert_array_equal(enc.input_ids, ids)
    labels = np.where(enc.loss_mask, enc.input_ids, -100)
    np.testing.assert_array_equal(labels, hf_assistant_labels(proc, ids))
    from surogate.train.data.images import pixel_values

    prompt = model.family.image_prompt(model.spec, model.tokenizer, str(folder))
    px = pixel_values(prompt.processor, enc.images)
    assert px.shape[0] == 4
    np.testing.assert_allclose(px, out["pixel_values"], atol=1e-6, rtol=0)
    lora = LoRAConfig(4, 8.0, tuple(TARGETS))
    pm = peft_model(hf_model(folder), TARGETS, r=4, alpha=8, seed=4, exclude_modules=GEMMA3_PEFT_EXCLUDE)
    params = from_peft_tensors(peft_tensors(pm), lora, GEMMA3_PEFT_PREFIX)
    loss, grads = model.loss_and_grads(enc.input_ids, labels, lora=lora, lora_params=params, images=px)
    t = torch.tensor(ids.astype(np.int64))[None]
    ref = pm(input_ids=t, pixel_values=torch.tensor(px), token_type_ids=torch.tensor(out["token_type_ids"]),
             labels=torch.tensor(labels.astype(np.int64))[None])
    ref.loss.backward()
    assert loss == pytest.approx(ref.loss.item(), rel=1e-5)
    want = from_peft_tensors(peft_tensors(pm, "grad"), lora, GEMMA3_PEFT_PREFIX)
    for name, g in grads.items():
        err = np.abs(g - want[name]).max() / (np.abs(want[name]).max() + 1e-12)
        assert err < 1e-4, f"{name}: {err:.2e}"


def test_sft_on_image_rows_trains_and_its_adapter_and_merged_model_match_peft(folder, tmp_path):
    """`surogate sft run.yaml` on rows of one or two images (and a text row), packed."""
    data = write_dataset(tmp_path / "data")
    config = yaml_config(folder, data, tmp_path / "out")
    proc = subprocess.run([sys.executable, "-P", "-m", "surogate.cli.main", "sft", str(config)], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = step_losses(tmp_path / "out")
    assert len(losses) == 8 and np.mean(losses[-2:]) < np.mean(losses[:2]) - 0.3, losses  # epoch 4 vs epoch 1
    adapter, merged = tmp_path / "out" / "adapter", tmp_path / "out" / "merged"

    adapter_cfg = json.loads((adapter / "adapter_config.json").read_text())
    assert adapter_cfg["exclude_modules"] == GEMMA3_PEFT_EXCLUDE
    pm = peft.PeftModel.from_pretrained(hf_model(folder), str(adapter))
    loaded = from_peft_tensors(peft_tensors(pm), LoRAConfig(8, 16.0, tuple(TARGETS)), GEMMA3_PEFT_PREFIX)
    assert len(loaded) == 2 * len(TARGETS) * 3 and all(np.abs(a).max() > 0 for a in loaded.values())

    inputs, want = check_merged_equals_peft_merged(pm, merged)
    base = hf_model(folder)
    with torch.no_grad():
        assert np.abs(base(**inputs).logits[0].numpy() - want).max() > 1e-3  # the adapter changed it

    # Surogate's own adapter reader, and `surogate merge`, take the adapter as peft wrote it.
    from safetensors.numpy import load_file

    from surogate.models.peft import load_peft_adapter
    from surogate.train.export import merge_adapter

    _, params = load_peft_adapter(adapter)
    assert set(params) == set(loaded) and all(np.array_equal(params[n], loaded[n]) for n in params)
    again = load_file(merge_adapter(str(folder), adapter, tmp_path / "merged2") / "model.safetensors")
    first = load_file(merged / "model.safetensors")
    assert set(again) == set(first) and all(np.array_equal(again[k], first[k]) for k in first)


def hf_token_loss(folder, docs, indices, **image_kwargs) -> tuple[float, int]:
    """transformers' loss summed over the targets of these documents, each alone with its images
    (transformers' own image processor; ``image_kwargs``: its call's keys), and the target count."""
    from surogate.train.data.images import load_images

    ref, proc = hf_model(folder), transformers.AutoImageProcessor.from_pretrained(str(folder))
    total, count = 0.0, 0
    for d in indices:
        ids, mask = docs[d]
        labels = torch.tensor(np.where(mask, ids, -100).astype(np.int64))[None]
        t = torch.tensor(ids.astype(np.int64))[None]
        kw = {}
        if docs.doc_images(d):
            px = proc(images=load_images(docs.doc_images(d)), return_tensors="pt", **image_kwargs)["pixel_values"]
            kw = {"pixel_values": px, "token_type_ids": (t == ref.config.image_token_index).long()}
        n = int((labels[0, 1:] != -100).sum())
        with torch.no_grad():
            total += ref(input_ids=t, labels=labels, **kw).loss.item() * n
        count += n
    return total, count


@pytest.mark.parametrize("projector", ["false", "true"], ids=["frozen_projector", "train_projector"])
def test_a_packed_micro_batch_s_loss_equals_transformers_document_by_document(folder, tmp_path, projector):
    """Rows of several documents, each with its own images in order: the trainer's first-step
    loss (LoRA B = 0: the base model) is HF's token-summed loss of each document alone, with its
    images through transformers' own image processor, over the step's targets."""
    data = write_dataset(tmp_path / "data")
    trainer = Trainer(load_config(yaml_config(folder, data, tmp_path / "out", train_projector=projector), kind="sft"))
    ds = trainer.train_data
    b = ds.batch([0, 1])
    docs = [int(d) for r in (0, 1) for d in ds.plan.row(r)]
    assert len(docs) > 2 and sum(len(ds.docs.doc_images(d)) for d in docs) == len(b.images) > 1
    image_token = trainer.model.spec.vision.image_token_index
    assert (b.input_ids == image_token).sum() == len(b.images) * trainer.model.spec.vision.mm_tokens_per_image
    assert not (b.targets == image_token).any()  # never a target
    loss, targets = trainer._step([b])
    total, count = hf_token_loss(folder, ds.docs, docs)
    assert targets == count
    assert loss == pytest.approx(total / count, rel=1e-5)


def test_training_with_pan_and_scan_crops_equals_transformers(tmp_path):
    """The Program reads every view (images and crops): a micro-batch's loss equals HF's."""
    from sgtest.vision import make_gemma3_vision_chat

    pan = {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 8, "pan_and_scan_max_num_crops": 3,
           "pan_and_scan_min_ratio_to_activate": 1.2}
    folder = make_gemma3_vision_chat(tmp_path / "pas", seed=3, preprocessor=pan)
    rows = [{"messages": [{"role": "user", "content": "What is it?"}, {"role": "assistant", "content": f"Noise {i}."}],
             "images": [data_url(image(40 + i, (30 + 30 * i, 30)))]} for i in range(3)]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    trainer = Trainer(load_config(yaml_config(folder, data, tmp_path / "out", per_device_train_batch_size=1,
                                              sample_packing="false"), kind="sft"))
    from surogate.train.data.images import pixel_values

    ds = trainer.train_data
    views = {len(pixel_values(trainer.image_feed.processor, ds.docs.doc_images(d))) for d in range(len(ds.docs))}
    assert views == {1, 3, 4} and trainer.images == 4  # 30 x 30: no crops; 60 wide: 2 crops; 90 wide: 3
    for r in range(ds.num_rows):
        b = ds.batch([r])
        loss, targets = trainer._step([b])
        total, count = hf_token_loss(folder, ds.docs, [int(d) for d in ds.plan.row(r)], **pan)
        assert targets == count and loss == pytest.approx(total / count, rel=1e-5)


@pytest.mark.parametrize("projector", ["false", "true"], ids=["frozen_projector", "train_projector"])
def test_evaluation_with_images_equals_transformers(folder, tmp_path, projector):
    """The eval Program reads the same image inputs: before any step (LoRA B = 0) the eval loss
    is HF's over the held-out documents, each with its images."""
    data = write_dataset(tmp_path / "data")
    trainer = Trainer(load_config(yaml_config(folder, data, tmp_path / "out", validation_split_ratio=0.5,
                                                  eval_steps=2, train_projector=projector),
                                  kind="sft"))
    docs = trainer.eval_data.docs
    assert docs.images is not None and any(docs.images)
    total, count = hf_token_loss(folder, docs, range(len(docs)))
    assert trainer.evaluate() == pytest.approx(total / count, rel=1e-5)


@pytest.mark.parametrize("projector", ["false", "true"], ids=["frozen_projector", "train_projector"])
def test_resume_with_images_reproduces_the_curve(folder, tmp_path, projector):
    from sgtest.qa import interrupt_after, step_records

    data = write_dataset(tmp_path / "data")
    kw = {"merge_adapter": "false", "train_projector": projector}
    full = Trainer(load_config(yaml_config(folder, data, tmp_path / "a", **kw), kind="sft"))
    full.train()
    interrupted = Trainer(load_config(yaml_config(folder, data, tmp_path / "b", **kw), kind="sft"))
    interrupt_after(interrupted, 4)
    with pytest.raises(KeyboardInterrupt):
        interrupted.train()
    resumed = Trainer(load_config(yaml_config(folder, data, tmp_path / "b", resume_from_checkpoint="true", **kw),
                                  kind="sft"))
    assert resumed.train_data.stats.cached == 1  # the images' sources come back from the tokenized cache
    assert resumed.train_data.docs.images == interrupted.train_data.docs.images
    resumed.train()
    by_step = {r["step"]: r["loss"] for r in step_records(tmp_path / "b")}
    assert [by_step[s] for s in range(1, 9)] == step_losses(tmp_path / "a")


def _config_for_rows(folder, tmp_path, rows, **kw):
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return load_config(yaml_config(folder, data, tmp_path / "out", **kw), kind="sft"), data


def _user_image(extra=None):
    return {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]},
                         {"role": "assistant", "content": "Noise."}], **(extra or {})}


@pytest.mark.parametrize("row, match", [
    (_user_image({"images": ["missing.png"]}), r"rows.jsonl line 1: images\[0\]: no such image file .*missing.png"),
    (_user_image(), r"rows.jsonl line 1: 'messages' holds 1 image part\(s\) .* field 'images' holds 0"),
    (_user_image({"images": [data_url(image(1)), data_url(image(2))]}),
     r"rows.jsonl line 1: 'messages' holds 1 image part\(s\) .* 'images' holds 2"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "image": "nope/x.png"}]},
                   {"role": "assistant", "content": "Hi."}]},
     r"rows.jsonl line 1: messages\[0\].content\[0\].image: no such image file"),
    (_user_image({"images": ["https://example.com/cat.png"]}), r"images\[0\]: remote image .* is not fetched"),
    ({"messages": [{"role": "user", "content": "a <start_of_image> in text"},
                   {"role": "assistant", "content": "Hi."}]},
     r"rows.jsonl line 1: .*2 image placeholder\(s\) .* for 1 image\(s\): the text itself contains"),
])
def test_rows_that_cannot_be_trained_on_name_file_line_and_field(folder, tmp_path, row, match):
    if "a <start_of_image> in text" in json.dumps(row):
        row = {**row, "images": [data_url(image(3))]}
    cfg, _ = _config_for_rows(folder, tmp_path, [row])
    with pytest.raises(FileFormatError, match=match):
        Trainer(cfg)


def test_an_image_row_for_a_model_without_a_vision_tower(tmp_path):
    from sgtest.tiny_models import make_model

    base = make_model("gemma3", tmp_path / "text")
    cfg, _ = _config_for_rows(base, tmp_path / "run", [_user_image({"images": [data_url(image(1))]})])
    with pytest.raises(FileFormatError, match=r"rows.jsonl line 1: the row has 1 image\(s\), and this model takes "
                                              r"no images \(it has no vision tower\)"):
        Trainer(cfg)


def test_lora_target_modules_naming_the_projector_are_refused(folder, tmp_path):
    from surogate.errors import ConfigError

    with pytest.raises(ConfigError, match=r"lora_target_modules\[0\]: .mm_input_projection. is not an allowed value"):
        _config_for_rows(folder, tmp_path, [_user_image()], lora_target_modules="[mm_input_projection]")


# ---- train_projector: the projector trained whole beside the LoRA (peft's modules_to_save) --------
PROJECTOR = ["multi_modal_projector"]


def with_trainable_projector(model):
    """``model`` with train_projector set, as the trainer sets it."""
    import dataclasses

    model.spec = dataclasses.replace(model.spec, vision=dataclasses.replace(model.spec.vision, train_projector=True))
    model.arch = model.family.architecture(model.spec)
    model._cache.clear()
    return model


def split_projector(tensors: dict) -> tuple[dict, dict]:
    """peft's tensors: (the LoRA ones, the projector's under model-relative HF names)."""
    whole = {n[len("base_model.model."):]: a for n, a in tensors.items() if "multi_modal_projector" in n}
    return {n: a for n, a in tensors.items() if "multi_modal_projector" not in n}, whole


def test_projector_and_lora_gradients_of_an_image_row_equal_peft(folder, tmp_path):
    model = with_trainable_projector(surogate.load_model(folder))
    record, _ = row_with_two_images(tmp_path)
    enc = encode_row(model, record, tmp_path / "data.jsonl")
    from surogate.io.image_processing import Gemma3ImageProcessor
    from surogate.train.data.images import pixel_values

    px = pixel_values(Gemma3ImageProcessor.from_folder(model.path), enc.images)
    labels = np.where(enc.loss_mask, enc.input_ids, -100)
    lora = LoRAConfig(4, 8.0, tuple(TARGETS))
    pm = peft_model(hf_model(folder), TARGETS, r=4, alpha=8, seed=2, exclude_modules=GEMMA3_PEFT_EXCLUDE,
                    modules_to_save=PROJECTOR)
    adapters, _ = split_projector(peft_tensors(pm))
    params = from_peft_tensors(adapters, lora, GEMMA3_PEFT_PREFIX)
    loss, grads = model.loss_and_grads(enc.input_ids, labels, lora=lora, lora_params=params, images=px)
    t = torch.tensor(enc.input_ids.astype(np.int64))[None]
    types = (t == model.spec.vision.image_token_index).long()
    out = pm(input_ids=t, pixel_values=torch.tensor(px), token_type_ids=types,
             labels=torch.tensor(labels.astype(np.int64))[None])
    out.loss.backward()
    assert loss == pytest.approx(out.loss.item(), rel=1e-5)
    ref_lora, ref_whole = split_projector(peft_tensors(pm, "grad"))
    ref = from_peft_tensors(ref_lora, lora, GEMMA3_PEFT_PREFIX)
    ours_whole = {"model." + n: a for n, a in model.to_hf(
        {n: grads.pop(n) for n in list(grads) if n.startswith("multi_modal_projector.")}).items()}
    assert set(ours_whole) == set(ref_whole) == {"model.multi_modal_projector.mm_input_projection_weight",
                                                 "model.multi_modal_projector.mm_soft_emb_norm.weight"}
    assert set(grads) == set(ref)
    for name, g in [*grads.items(), *ours_whole.items()]:
        r = ref.get(name, ref_whole.get(name))
        assert np.abs(r).max() > 0, name
        err = np.abs(g - r).max() / (np.abs(r).max() + 1e-12)
        assert err < 1e-4, f"{name}: {err:.2e}"


def test_a_full_fine_tune_s_gradients_with_a_trainable_projector_equal_transformers(folder, tmp_path):
    """lora: false with train_projector: every language-model weight's gradient and the
    projector's equal transformers' (the tower gets none: it stays frozen)."""
    model = with_trainable_projector(surogate.load_model(folder))
    record, _ = row_with_two_images(tmp_path)
    enc = encode_row(model, record, tmp_path / "data.jsonl")
    from surogate.train.data.images import pixel_values

    px = pixel_values(model.family.image_prompt(model.spec, model.tokenizer, str(folder)).processor, enc.images)
    labels = np.where(enc.loss_mask, enc.input_ids, -100)
    loss, grads = model.loss_and_grads(enc.input_ids, labels, images=px)
    ref = hf_model(folder)
    t = torch.tensor(enc.input_ids.astype(np.int64))[None]
    out = ref(input_ids=t, pixel_values=torch.tensor(px), token_type_ids=(t == ref.config.image_token_index).long(),
              labels=torch.tensor(labels.astype(np.int64))[None])
    out.loss.backward()
    assert loss == pytest.approx(out.loss.item(), rel=1e-5)
    hf_grads = {n: p.grad.numpy() for n, p in ref.named_parameters() if p.grad is not None}
    mine = model.to_hf(grads)
    assert any("multi_modal_projector" in n for n in mine) and not any("vision_tower" in n for n in mine)
    for name, g in mine.items():
        key = next(k for k in model.family.checkpoint_aliases(name) if k in hf_grads)
        r = hf_grads[key]
        err = np.abs(g - r).max() / (np.abs(r).max() + 1e-12)
        assert err < 1e-4, f"{name}: {err:.2e}"


def test_sft_with_train_projector_saves_an_adapter_peft_loads_and_merged_logits_equal_peft(folder, tmp_path):
    data = write_dataset(tmp_path / "data")
    config = yaml_config(folder, data, tmp_path / "out", max_steps=4, train_projector="true")
    proc = subprocess.run([sys.executable, "-P", "-m", "surogate.cli.main", "sft", str(config)], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-3000:]
    adapter, merged = tmp_path / "out" / "adapter", tmp_path / "out" / "merged"
    adapter_cfg = json.loads((adapter / "adapter_config.json").read_text())
    assert adapter_cfg["modules_to_save"] == PROJECTOR
    pm = peft.PeftModel.from_pretrained(hf_model(folder), str(adapter))
    _, saved = split_projector(peft_tensors(pm))
    base = hf_model(folder)
    w = base.model.multi_modal_projector.mm_input_projection_weight.detach().numpy()
    assert np.abs(saved["model.multi_modal_projector.mm_input_projection_weight"] - w).max() > 1e-3  # it trained

    check_merged_equals_peft_merged(pm, merged)

    # `surogate merge` folds the projector in as the run did; serving reads it beside the LoRA
    # (tests/serve/test_projector_lora_serving.py serves such adapters against peft).
    from safetensors.numpy import load_file

    from surogate.models.peft import load_peft_adapter
    from surogate.train.export import merge_adapter

    again = load_file(merge_adapter(str(folder), adapter, tmp_path / "merged2") / "model.safetensors")
    first = load_file(merged / "model.safetensors")
    assert set(again) == set(first) and all(np.array_equal(again[k], first[k]) for k in first)
    _, params = load_peft_adapter(adapter)
    np.testing.assert_array_equal(params["multi_modal_projector.mm_input_projection_weight"],
                                  saved["model.multi_modal_projector.mm_input_projection_weight"])

    # served (the base model with the run's adapter) its image chat answers as peft's model does
    from sgtest.vision import hf_generate, image, template_messages, user
    from surogate.serve import SamplingParams
    from surogate.serve.launch import launch

    messages = user("What is this?", image(90))
    want, _ = hf_generate(pm, transformers.AutoProcessor.from_pretrained(str(folder)), messages, 6)
    m = launch(str(folder), kv_cache_tokens=1024, loras={"run": str(adapter)})
    try:
        chat, images = template_messages(messages)
        out = m.llm().chat(chat, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True), images=images,
                           adapter="run").result(timeout=120)[0]
    finally:
        m.client.close()
    assert out.new_token_ids == want


def test_train_projector_on_a_model_without_a_projector_is_refused(tmp_path):
    from sgtest.tiny_models import make_model
    from surogate.errors import ConfigError

    base = make_model("gemma3", tmp_path / "text")
    cfg, _ = _config_for_rows(base, tmp_path / "run", [{"messages": [{"role": "user", "content": "hi"},
                                                                    {"role": "assistant", "content": "yo"}]}],
                              train_projector="true")
    with pytest.raises(ConfigError, match="train_projector"):
        Trainer(cfg)
