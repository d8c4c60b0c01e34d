"""`surogate distill capture` on tiny models (CPU, f32): the stored top-k equal transformers'
log_softmax top-k of the teacher at every trained position; training from the capture gives the
loss curve of training with the teacher on the fly; a stopped capture resumes at its first
missing shard; a damaged shard, a capture of other data and a student of another tokenizer are
errors naming the file or the key."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from sgtest.distill import distill_config  # noqa: E402
from sgtest.qa import step_records, write_qa  # noqa: E402
from sgtest.tiny_models import make_llama, make_qwen3  # noqa: E402
from surogate.errors import ConfigError, FileFormatError  # noqa: E402
from surogate.train import distill_capture  # noqa: E402
from surogate.train.distill import DistillTrainer  # noqa: E402
from surogate.train.distill_capture import capture, shard_path  # noqa: E402


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    return make_qwen3(tmp_path_factory.mktemp("student"), seed=11, initializer_range=0.2)


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    return make_qwen3(tmp_path_factory.mktemp("teacher"), seed=29, initializer_range=0.2)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_qa(tmp_path_factory.mktemp("data") / "qa.jsonl")


def config(student, teacher, data, out, capture_dir=None, **kw):
    kw.setdefault("max_steps", 4)
    return distill_config(student, teacher, data, out, **kw,
                          distillation={"teacher_logprobs": str(capture_dir)} if capture_dir else None)


@pytest.fixture(scope="module")
def captured(student, teacher, data, tmp_path_factory):
    folder = tmp_path_factory.mktemp("capture") / "teacher-top4"
    capture(config(student, teacher, data, folder.parent / "out", folder), log=lambda *_: None)
    return folder


def test_the_capture_holds_transformers_top_k(student, teacher, data, captured, tmp_path):
    from surogate.model import load_model
    from surogate.train.data import build_datasets

    tok = load_model(str(student)).tokenizer
    ds, _ = build_datasets(config(student, teacher, data, tmp_path), tok)
    meta = json.loads((captured / "capture.json").read_text())
    assert meta["rows"] == ds.num_rows and meta["top_k"] == 4
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(teacher), dtype=torch.float32).eval()
    z = np.load(shard_path(captured, 0))
    checked = 0
    for r in range(ds.num_rows):
        b = ds.batch([r])
        a, e = z["offsets"][r], z["offsets"][r + 1]
        want_pos = np.nonzero(b.targets != -100)[0]
        np.testing.assert_array_equal(z["positions"][a:e], want_pos)
        for s, t in zip(b.cu_seqlens[:-1], b.cu_seqlens[1:]):  # each document alone, as transformers sees it
            with torch.no_grad():
                lp = torch.log_softmax(hf(torch.tensor(b.input_ids[s:t].astype(np.int64))[None]).logits[0], -1)
            for i, p in enumerate(z["positions"][a:e]):
                if s <= p < t:
                    top_lp, top = lp[p - s, :tok.vocab_size].topk(4)  # real tokens (the head may be padded)
                    np.testing.assert_array_equal(z["ids"][a + i], top.numpy())
                    np.testing.assert_allclose(z["logprobs"][a + i], top_lp.numpy(), atol=1e-5)
                    checked += 1
    assert checked == len(z["positions"]) > 30


def test_training_from_the_capture_follows_the_on_the_fly_curve(student, teacher, data, captured, tmp_path):
    DistillTrainer(config(student, teacher, data, tmp_path / "fly")).train()
    from_file = DistillTrainer(config(student, teacher, data, tmp_path / "file", captured))
    assert from_file.teacher is None and from_file.teacher_exe is None  # the teacher is never loaded
    from_file.train()
    fly, stored = step_records(tmp_path / "fly"), step_records(tmp_path / "file")
    assert len(fly) == len(stored) == 4
    for a, b in zip(fly, stored):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5), (a["step"], a["loss"], b["loss"])
        assert b["kl"] == pytest.approx(a["kl"], rel=1e-5, abs=1e-7)


def test_a_stopped_capture_resumes_and_checks_its_files(student, teacher, data, tmp_path, monkeypatch):
    monkeypatch.setattr(distill_capture, "SHARD_ROWS", 2)
    cfg = config(student, teacher, data, tmp_path / "out", tmp_path / "cap")
    calls = []

    def stop_after_two(msg):
        calls.append(msg)
        if len(calls) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        capture(cfg, log=stop_after_two)
    assert shard_path(tmp_path / "cap", 1).exists() and not shard_path(tmp_path / "cap", 2).exists()
    assert not list((tmp_path / "cap").glob("*.tmp"))
    with pytest.raises(FileFormatError) as info:  # training refuses an unfinished capture, naming the file
        DistillTrainer(cfg)
    assert "shard-00002.npz" in info.value.message
    before = shard_path(tmp_path / "cap", 0).stat().st_mtime_ns
    redone = []
    capture(cfg, log=redone.append)
    assert shard_path(tmp_path / "cap", 0).stat().st_mtime_ns == before  # kept, not redone
    assert "shard-00002" in redone[0]
    DistillTrainer(cfg)  # whole now

    shard_path(tmp_path / "cap", 1).write_bytes(b"not an npz")
    with pytest.raises(FileFormatError) as info:
        DistillTrainer(cfg)
    assert "shard-00001.npz" in info.value.message and "capture" in info.value.hint


def test_other_data_and_another_tokenizer_are_refused(student, teacher, data, captured, tmp_path):
    other = tmp_path / "other.jsonl"  # the same questions, other answers: other rows
    other.write_text("".join(json.dumps({"messages": [m, {**a, "content": a["content"] + " Indeed."}]}) + "\n"
                             for m, a in (json.loads(line)["messages"] for line in open(data))))
    with pytest.raises(ConfigError) as info:
        DistillTrainer(config(student, teacher, other, tmp_path / "run", captured)).train()
    assert info.value.where == "distillation.teacher_logprobs" and "no capture of a row" in info.value.message
    llama = make_llama(tmp_path / "llama", seed=1)
    from surogate.model import load_model
    from surogate.train.distill_capture import CapturedTeacher

    with pytest.raises(ConfigError) as info:  # a student of llama's tokenizer (what DistillTrainer builds)
        CapturedTeacher(captured, load_model(str(llama)).tokenizer, 4, 64)
    assert "another tokenizer" in info.value.message and info.value.where == "distillation.teacher_logprobs"
    with pytest.raises(ConfigError) as info:  # capturing needs a teacher of the student's tokenizer too
        capture(config(student, llama, data, tmp_path / "run3", tmp_path / "cap3"))
    assert "different tokenizers" in info.value.message
    with pytest.raises(ConfigError) as info:
        DistillTrainer(config(student, teacher, data, tmp_path / "run4", tmp_path / "nothing"))
    assert "capture.json" in info.value.message


def test_surogate_distill_capture_command(student, teacher, data, tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"""model: {student}
output_dir: {tmp_path / 'out'}
datasets:
  - path: {data}
    type: messages
distillation:
  teacher_model: {teacher}
  top_k: 2
  teacher_logprobs: {tmp_path / 'cap'}
sequence_len: 64
per_device_train_batch_size: 2
max_steps: 2
recipe: fp32
save_steps: 0
eval_steps: 0
""")
    for args in (["distill", "capture", str(cfg)], ["distill", str(cfg)]):
        proc = subprocess.run([sys.executable, "-P", "-m", "surogate.cli.main", *args], capture_output=True,
                              text=True, timeout=300, env=dict(os.environ))
        assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "cap" / "capture.json").is_file()
    assert [r["step"] for r in step_records(tmp_path / "out")] == [1, 2]


def test_training_from_the_capture_resumes_on_its_curve(student, teacher, data, captured, tmp_path):
    from sgtest.qa import interrupt_after

    kw = {"save_steps": 2, "max_steps": 4}
    DistillTrainer(config(student, teacher, data, tmp_path / "a", captured, **kw)).train()
    full = step_records(tmp_path / "a")
    interrupted = DistillTrainer(config(student, teacher, data, tmp_path / "b", captured, **kw))
    interrupt_after(interrupted, 3)
    with pytest.raises(KeyboardInterrupt):
        interrupted.train()
    DistillTrainer(config(student, teacher, data, tmp_path / "b", captured, resume_from_checkpoint=True, **kw)).train()
    by_step = {r["step"]: r for r in step_records(tmp_path / "b")}
    for r in full:
        assert (by_step[r["step"]]["loss"], by_step[r["step"]]["kl"]) == (r["loss"], r["kl"]), r["step"]
