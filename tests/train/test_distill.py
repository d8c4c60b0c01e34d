"""`surogate distill` on tiny models (CPU, f32): loss, KL and LoRA gradients against a torch +
peft computation of the top-k KL (+ CE) on the same batch, the student's KL to the teacher
falling over a short run, and a teacher with another tokenizer refused by name."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from sgtest.distill import distill_config  # noqa: E402
from sgtest.qa import step_records, write_qa  # noqa: E402
from sgtest.tiny_models import make_llama, make_qwen3  # noqa: E402
from surogate.config import load_config  # noqa: E402
from surogate.errors import ConfigError  # noqa: E402
from surogate.train.distill import DistillTrainer  # noqa: E402
from surogate.train.lora import save_peft_adapter  # noqa: E402


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    return make_qwen3(tmp_path_factory.mktemp("student"), seed=11, initializer_range=0.2)


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    return make_qwen3(tmp_path_factory.mktemp("teacher"), seed=29, initializer_range=0.2)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_qa(tmp_path_factory.mktemp("data") / "qa.jsonl")


def config(student, teacher, data, out, **kw):
    return distill_config(student, teacher, data, out, **kw)


def torch_reference(pm, hf_teacher, batches, k, kd_weight, ce_weight, vocab):
    """kd_weight * mean KL(teacher top-k renormalized || student) + ce_weight * mean CE, over every target."""
    kl_terms, ce_terms = [], []
    for b in batches:
        cu = b.cu_seqlens
        for s, e in zip(cu[:-1], cu[1:]):
            targets = torch.tensor(b.targets[s:e].astype(np.int64))
            valid = targets != -100
            if not valid.any():
                continue
            ids = torch.tensor(b.input_ids[s:e].astype(np.int64))[None]
            logp = torch.log_softmax(pm(ids).logits[0], -1)[valid]
            with torch.no_grad():
                z = hf_teacher(ids).logits[0][valid][:, :vocab]
            zk, top = z.topk(k, dim=-1)
            w = torch.softmax(zk, -1)
            kl_terms.append((w * (torch.log(w) - logp.gather(-1, top))).sum(-1))
            ce_terms.append(-logp.gather(-1, targets[valid][:, None])[:, 0])
    kl, ce = torch.cat(kl_terms).mean(), torch.cat(ce_terms).mean()
    return kd_weight * kl + ce_weight * ce, kl, ce


def test_loss_and_lora_grads_equal_torch(student, teacher, data, tmp_path):
    tr = DistillTrainer(config(student, teacher, data, tmp_path / "run"))
    rng = np.random.default_rng(5)
    for n, a in tr.trainable.items():  # away from the base: A and B both get gradients
        a[...] = rng.normal(0, 0.3, a.shape).astype(a.dtype)
        tr.exe.push(n)
    it = tr.train_data.iterator(tr.B)
    batches = [next(it) for _ in range(2)]
    loss, targets, metrics = tr._step_with_metrics(batches, 0)
    assert targets == sum(b.num_target_tokens for b in batches)

    save_peft_adapter(tmp_path / "adapter", dict(tr.trainable), tr.lora, base_model=str(student))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(student), dtype=torch.float32)
    pm = peft.PeftModel.from_pretrained(hf, str(tmp_path / "adapter"), is_trainable=True).eval()
    hf_teacher = transformers.AutoModelForCausalLM.from_pretrained(str(teacher), dtype=torch.float32).eval()
    ref, kl, ce = torch_reference(pm, hf_teacher, batches, 4, 0.7, 0.3, tr.vocab)
    ref.backward()
    assert loss == pytest.approx(ref.item(), rel=1e-4)
    assert metrics["kl"] == pytest.approx(kl.item(), rel=1e-4, abs=1e-6)
    assert metrics["ce"] == pytest.approx(ce.item(), rel=1e-4)
    grads = {n.removeprefix("base_model.model.model.").replace(".default.weight", ""): p.grad.numpy()
             for n, p in pm.named_parameters() if "lora_" in n}
    scale = max(np.abs(g).max() for g in grads.values())
    for n, g in grads.items():
        np.testing.assert_allclose(tr.grads["grad." + n], g, atol=1e-4 * scale, rtol=1e-4, err_msg=n)


def test_the_students_kl_to_the_teacher_falls(student, teacher, data, tmp_path):
    cfg = config(student, teacher, data, tmp_path / "run", max_steps=10,
                 distillation={"kd_weight": 1.0, "ce_weight": 0.0})
    DistillTrainer(cfg).train()
    steps = step_records(tmp_path / "run")
    kls = [s["kl"] for s in steps]
    assert all(math.isfinite(x) and x >= 0 for x in kls) and "ce" not in steps[0]
    assert kls[-1] < 0.7 * kls[0], kls
    assert steps[-1]["loss"] == pytest.approx(kls[-1])


def test_a_teacher_with_another_tokenizer_is_refused(student, data, tmp_path):
    other = make_llama(tmp_path / "llama", seed=1)
    with pytest.raises(ConfigError) as info:
        DistillTrainer(config(student, other, data, tmp_path / "run"))
    assert "distillation.teacher_model" in str(info.value) and "different tokenizers" in info.value.message


def test_config_errors_name_the_key(student, teacher, data, tmp_path):
    for kw, key in [({"top_k": 0}, "distillation.top_k"), ({"kd_weight": -1}, "distillation.kd_weight"),
                    ({"kd_weight": 0, "ce_weight": 0}, "distillation.kd_weight")]:
        with pytest.raises(ConfigError) as info:
            config(student, teacher, data, tmp_path, distillation=kw)
        assert info.value.message.startswith(key), info.value.message
    with pytest.raises(ConfigError) as info:
        load_config({"model": "m", "datasets": [{"path": "d"}]}, kind="distill")
    assert "distillation" in info.value.message


def test_resume_reproduces_the_uninterrupted_curve(student, teacher, data, tmp_path):
    from sgtest.qa import interrupt_after

    DistillTrainer(config(student, teacher, data, tmp_path / "a", save_steps=3)).train()
    full = step_records(tmp_path / "a")
    interrupted = DistillTrainer(config(student, teacher, data, tmp_path / "b", save_steps=3))
    interrupt_after(interrupted, 4)
    with pytest.raises(KeyboardInterrupt):
        interrupted.train()
    DistillTrainer(config(student, teacher, data, tmp_path / "b", save_steps=3, resume_from_checkpoint=True)).train()
    by_step = {r["step"]: r for r in step_records(tmp_path / "b")}
    for r in full:
        assert (by_step[r["step"]]["loss"], by_step[r["step"]]["kl"]) == (r["loss"], r["kl"]), r["step"]


def test_surogate_distill_command(student, teacher, data, tmp_path):
    import os
    import subprocess
    import sys

    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"""model: {student}
output_dir: {tmp_path / 'out'}
datasets:
  - path: {data}
    type: messages
distillation:
  teacher_model: {teacher}
  top_k: 2
sequence_len: 64
per_device_train_batch_size: 2
gradient_accumulation_steps: 1
max_steps: 2
recipe: fp32
save_steps: 0
eval_steps: 0
""")
    proc = subprocess.run([sys.executable, "-P", "-m", "surogate.cli.main", "distill", str(cfg)], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "out" / "adapter" / "adapter_model.safetensors").is_file()
    assert [r["step"] for r in step_records(tmp_path / "out")] == [1, 2]
