"""`surogate sft` with LoRA on image chat rows for Qwen3-VL-MoE (Qwen3VLMoeForConditionalGeneration),
against transformers and peft on a tiny random checkpoint (sgtest.vision make_qwen3_vl_chat(moe=True)):
a packed micro-batch's loss (with the load-balancing loss) equals HF's document by document; a
short run from YAML with LoRA on the attention and the experts trains; peft loads its adapter
(the experts as target_parameters) and gives, with an image, the logits of the run's merged folder
under transformers, and of our own model with the adapter."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
pytest.importorskip("PIL")
pytest.importorskip("transformers.models.qwen3_vl_moe")

import surogate  # noqa: E402
from sgtest.vision import image, make_qwen3_vl_chat  # noqa: E402
from sgtest.vision_sft import qwen3_vl_image_inputs, sft_trains, write_qwen3_vl_dataset, yaml_config  # noqa: E402
from surogate.config import load_config  # noqa: E402
from surogate.train.trainer import Trainer  # noqa: E402


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_qwen3_vl_chat(tmp_path_factory.mktemp("q3vlmoe"), seed=4, moe=True)


def hf_model(folder):
    return transformers.Qwen3VLMoeForConditionalGeneration.from_pretrained(str(folder), dtype=torch.float32).eval()


def test_a_packed_micro_batch_s_loss_equals_transformers_document_by_document(folder, tmp_path):
    """The trainer's first-step loss (LoRA B = 0: the base model) is HF's cross-entropy summed over
    each document alone with its images, plus router_aux_loss_coef times the aux loss of the
    micro-batch's tokens (HF's load_balancing_loss_func over the packed row's routers)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from surogate.train.data.images import load_images

    data = write_qwen3_vl_dataset(tmp_path / "data")
    trainer = Trainer(load_config(yaml_config(folder, data, tmp_path / "out", sequence_len=256), kind="sft"))
    ds = trainer.train_data
    b = ds.batch([0, 1])
    docs = [int(d) for r in (0, 1) for d in ds.plan.row(r)]
    assert sum(len(ds.docs.doc_images(d)) for d in docs) == len(b.images) > 1
    loss, targets = trainer._step([b])
    ref = hf_model(folder)
    proc = Qwen2VLImageProcessorPil.from_dict(json.loads((Path(folder) / "preprocessor_config.json").read_text()))
    total, count = 0.0, 0
    for d in docs:
        ids, mask = ds.docs[d]
        t = torch.tensor(ids.astype(np.int64))[None]
        labels = torch.tensor(np.where(mask, ids, -100).astype(np.int64))[None]
        kw = {}
        if ds.docs.doc_images(d):
            out = proc(load_images(ds.docs.doc_images(d)), return_tensors="pt")
            kw = {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"],
                  "mm_token_type_ids": (t == ref.config.image_token_id).long()}
        n = int((labels[0, 1:] != -100).sum())
        with torch.no_grad():
            res = ref(input_ids=t, labels=labels, output_router_logits=False, **kw)
        total += res.loss.item() * n
        count += n
    assert targets == count
    aux = float(trainer.exe.read("aux_loss")[0])
    coef = trainer.model.spec.moe.router_aux_loss_coef
    assert coef > 0 and aux > 0
    assert loss == pytest.approx(total / count + coef * aux, rel=1e-5)


def test_sft_on_image_rows_trains_and_peft_loads_its_expert_adapter(folder, tmp_path):
    """`surogate sft run.yaml` with LoRA on every projection (lora_target_modules: all: the
    attention and, on the sparse layers, the stacked experts): the loss falls; the adapter's
    config names the experts as target_parameters; peft loads it, and its logits with an image
    equal transformers' on the run's merged folder and our model's with the adapter."""
    from surogate.models.peft import load_peft_adapter

    data = write_qwen3_vl_dataset(tmp_path / "data")
    config = yaml_config(folder, data, tmp_path / "out", sequence_len=256, lora_target_modules="[all]")
    adapter, merged = sft_trains(config, tmp_path / "out")
    meta = json.loads((adapter / "adapter_config.json").read_text())
    assert sorted(meta["target_parameters"]) == ["down_proj", "gate_up_proj"]

    pm = peft.PeftModel.from_pretrained(hf_model(folder), str(adapter)).eval()
    assert any(".mlp.experts." in n for n, _ in pm.named_parameters() if "lora_" in n)
    inputs = qwen3_vl_image_inputs(folder, image(77, (32, 48)))
    with torch.no_grad():
        want = pm(**inputs).logits[0].numpy()
        base = hf_model(folder)(**inputs).logits[0].numpy()
        got = hf_model(merged)(**inputs).logits[0].numpy()
    assert np.abs(base - want).max() > 1e-3  # the adapter changed it
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)

    ours = surogate.load_model(folder)
    cfg, params = load_peft_adapter(adapter)
    ids = inputs["input_ids"][0].numpy().astype(np.int32)
    images = (inputs["pixel_values"].numpy(), inputs["image_grid_thw"].numpy())
    exe = ours._image_feed(*surogate.model.pack(ids), images, "logits", params, lora=cfg)
    exe.run()
    np.testing.assert_allclose(np.array(exe.read("logits")), want, atol=1e-4, rtol=0)
