"""The trainer end to end on a tiny model (CPU, f32): memorization, step-1 loss against HF,
resume reproducing the uninterrupted curve, killed saves, outputs that peft and transformers
load, and the `surogate sft` command."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import surogate  # noqa: E402
from sgtest.qa import QA, interrupt_after, sft_config, step_losses, step_records, write_qa  # noqa: E402
from sgtest.tiny_models import make_qwen3  # noqa: E402
from surogate.config import load_config  # noqa: E402
from surogate.train.checkpoint import latest_checkpoint, list_checkpoints  # noqa: E402
from surogate.train.trainer import Trainer  # noqa: E402

@pytest.fixture(scope="module")
def base(tmp_path_factory):
    # initializer_range 0.2: a head with enough scale that frozen-base LoRA can drive the loss to 0
    return make_qwen3(tmp_path_factory.mktemp("base"), seed=11, initializer_range=0.2)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_qa(tmp_path_factory.mktemp("data") / "qa.jsonl")


config = sft_config


def greedy(model, prompt_ids, n=8, eos=None):
    ids = list(prompt_ids)
    for _ in range(n):
        nxt = int(model.forward(np.array(ids))[-1].argmax())
        ids.append(nxt)
        if eos is not None and nxt in eos:
            break
    return ids[len(prompt_ids):]


def test_lora_memorizes_and_outputs_load_in_peft_and_transformers(base, data, tmp_path):
    cfg = config(base, data, tmp_path / "run", max_steps=40, lr_scheduler_type="cosine", warmup_steps=2,
                 merge_adapter=True, per_device_train_batch_size=4, gradient_accumulation_steps=1)
    result = Trainer(cfg).train()
    losses = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    steps = [r for r in losses if r["type"] == "step"]
    assert steps[0]["loss"] > 1.0 and steps[-1]["loss"] < 0.05, (steps[0]["loss"], steps[-1]["loss"])

    merged = surogate.load_model(result.merged)
    tok = merged.tokenizer
    hits = 0
    for q, a in QA:
        prompt = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                         enable_thinking=False)
        out = tok.decode(greedy(merged, prompt, n=12, eos=set(tok.eos_token_ids)), skip_special_tokens=True)
        hits += a in out
    assert hits >= 7, hits

    # The adapter on top of the transformers model gives our merged model's logits.
    peft = pytest.importorskip("peft")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    pm = peft.PeftModel.from_pretrained(hf, str(result.output)).eval()
    ids = np.array(tok.encode("What is the capital of France? Paris."))
    with torch.no_grad():
        ref = pm(torch.tensor(ids)[None]).logits[0].numpy()
    np.testing.assert_allclose(merged.forward(ids), ref, atol=2e-4)


def test_first_step_loss_equals_transformers(base, data, tmp_path):
    cfg = config(base, data, tmp_path / "run", max_steps=1, sample_packing=False, per_device_train_batch_size=1,
                 gradient_accumulation_steps=1)
    tr = Trainer(cfg)
    batch = next(tr.train_data.iterator(1))
    ours, _ = tr._step([batch])
    n = int(batch.cu_seqlens[1])  # the document: the row's first segment
    ids = torch.tensor(batch.input_ids[:n].astype(np.int64))[None]
    targets = batch.targets[:n].astype(np.int64)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    with torch.no_grad():
        logits = hf(ids).logits[0]
    ref = torch.nn.functional.cross_entropy(logits, torch.tensor(targets), ignore_index=-100).item()
    assert ours == pytest.approx(ref, rel=1e-5)


def test_resume_reproduces_the_uninterrupted_curve(base, data, tmp_path):
    full = Trainer(config(base, data, tmp_path / "a", save_steps=3))
    full.train()
    losses_a = step_losses(tmp_path / "a")

    interrupted = Trainer(config(base, data, tmp_path / "b", save_steps=3))
    interrupt_after(interrupted, 4)
    with pytest.raises(KeyboardInterrupt):
        interrupted.train()
    assert latest_checkpoint(tmp_path / "b" / "checkpoints").name == "step_00000003"
    resumed = Trainer(config(base, data, tmp_path / "b", save_steps=3, resume_from_checkpoint=True))
    resumed.train()
    steps_b = step_records(tmp_path / "b")
    by_step = {r["step"]: r["loss"] for r in steps_b}  # the resumed run rewrites steps 4..6
    assert [by_step[s] for s in range(1, 7)] == losses_a


def test_a_killed_save_leaves_the_previous_checkpoint(base, data, tmp_path, monkeypatch):
    import surogate.train.checkpoint as ck

    tr = Trainer(config(base, data, tmp_path / "run", save_steps=2, max_steps=4))
    real = ck.save_safetensors
    count = {"n": 0}

    def dies_on_second_checkpoint(path, tensors, metadata=None):
        if "step_00000004" in str(path) or (count["n"] >= 2 and "optimizer" in str(path)):
            raise KeyboardInterrupt  # as if killed mid-write
        count["n"] += 1
        return real(path, tensors, metadata)

    monkeypatch.setattr(ck, "save_safetensors", dies_on_second_checkpoint)
    with pytest.raises(KeyboardInterrupt):
        tr.train()
    root = tmp_path / "run" / "checkpoints"
    assert [p.name for p in list_checkpoints(root)] == ["step_00000002"]
    assert latest_checkpoint(root).name == "step_00000002"
    assert not [p for p in root.iterdir() if p.name.startswith(".")]


def test_full_finetune_writes_a_model_transformers_loads(base, data, tmp_path):
    tr = Trainer(config(base, data, tmp_path / "run", lora=False, learning_rate=1e-3, max_steps=3))
    result = tr.train()
    assert result.output.name == "model"
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(result.output), dtype=torch.float32).eval()
    ours = surogate.load_model(result.output)
    ids = np.arange(5, 30)
    with torch.no_grad():
        ref = hf(torch.tensor(ids)[None]).logits[0].numpy()
    np.testing.assert_allclose(ours.forward(ids), ref, atol=1e-4)


def test_surogate_sft_command(base, data, tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"""model: {base}
output_dir: {tmp_path / 'out'}
datasets:
  - path: {data}
    type: messages
sequence_len: 64
per_device_train_batch_size: 2
gradient_accumulation_steps: 1
max_steps: 3
recipe: fp32
save_steps: 0
eval_steps: 0
""")
    proc = subprocess.run([sys.executable, "-P", "-m", "surogate.cli.main", "sft", str(cfg)], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "out" / "adapter" / "adapter_model.safetensors").is_file()
    lines = [json.loads(x) for x in open(tmp_path / "out" / "metrics.jsonl")]
    assert [x["step"] for x in lines if x["type"] == "step"] == [1, 2, 3]
    assert "3 steps" in proc.stdout


def test_pt_trains_on_every_token(base, tmp_path):
    text = tmp_path / "text.jsonl"
    with open(text, "w") as f:
        for i in range(12):
            f.write(json.dumps({"text": f"Line {i}: the quick brown fox jumps over the lazy dog."}) + "\n")
    cfg = load_config({"model": str(base), "output_dir": str(tmp_path / "pt"), "datasets": [{"path": str(text)}],
                       "sequence_len": 64, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 1,
                       "recipe": "fp32", "max_steps": 4, "save_steps": 0, "eval_steps": 0, "lora": False,
                       "learning_rate": 1e-3}, kind="pt")
    tr = Trainer(cfg)
    batch = next(tr.train_data.iterator(2))
    real = batch.input_ids != tr.train_data.pad_id
    # every real token but the last of each document predicts the next one
    assert batch.num_target_tokens >= real.sum() - (len(batch.cu_seqlens) - 1)
    result = tr.train()
    assert result.output.name == "model" and (result.output / "model.safetensors").is_file()


def test_wandb_offline_run_logs_steps(base, data, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = config(base, data, tmp_path / "run", max_steps=2, report_to=["jsonl", "wandb"], wandb_project="surogate-test")
    Trainer(cfg).train()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    assert (tmp_path / "run" / "wandb_id.txt").read_text().strip() in runs[0].name
    assert list(runs[0].glob("*.wandb"))  # the run's history file
