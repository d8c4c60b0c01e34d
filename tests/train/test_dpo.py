"""`surogate dpo` on a tiny model (CPU, f32): the first step's loss is ln 2, loss and LoRA
gradients equal TRL's DPO / IPO formulas computed with torch + peft on the same batch, chosen
wins after a short run, a full fine-tune's reference stays frozen, resume reproduces the curve,
and preference rows become completion-only masks (bad rows named)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from sgtest.preference import conversational, dpo_config, write_pairs, write_rows  # noqa: E402
from sgtest.qa import interrupt_after, step_losses, step_records  # noqa: E402
from sgtest.tiny_models import make_qwen3  # noqa: E402
from surogate.config import load_config  # noqa: E402
from surogate.errors import ConfigError, FileFormatError  # noqa: E402
from surogate.train.checkpoint import latest_checkpoint  # noqa: E402
from surogate.train.dpo import DPOTrainer  # noqa: E402
from surogate.train.lora import save_peft_adapter  # noqa: E402


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_qwen3(tmp_path_factory.mktemp("base"), seed=11, initializer_range=0.2)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_pairs(tmp_path_factory.mktemp("data") / "pref.jsonl")


config = dpo_config


# -- the loss against torch --

def test_first_step_loss_is_ln2(base, data, tmp_path):
    tr = DPOTrainer(config(base, data, tmp_path / "run", max_steps=1, label_smoothing=0.2))
    tr.train()
    (step,) = step_records(tmp_path / "run")
    assert step["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert step["rewards/margins"] == pytest.approx(0.0, abs=1e-6)
    for key in ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "logps/chosen", "logps/rejected"):
        assert key in step


def _torch_logps(model, batch, average: bool):
    """Summed (IPO: averaged) completion log-probs of each document of a PairBatch, with grad."""
    out = []
    cu = batch.cu_seqlens
    for d in range(2 * batch.pairs):
        s, e = int(cu[d]), int(cu[d + 1])
        ids = torch.tensor(batch.input_ids[s:e].astype(np.int64))[None]
        targets = torch.tensor(batch.targets[s:e].astype(np.int64))
        logits = model(ids).logits[0]
        valid = targets != -100
        logp = torch.log_softmax(logits, -1).gather(-1, targets.clamp(min=0)[:, None])[:, 0]
        total = (logp * valid).sum()
        out.append(total / valid.sum() if average else total)
    return torch.stack(out)


def trl_loss(pm, batches, loss_type, beta, label_smoothing):
    """TRL's DPOTrainer.dpo_loss on the batches: the mean over every pair of the step."""
    avg = loss_type == "ipo"
    pol = torch.cat([_torch_logps(pm, b, avg) for b in batches])
    with torch.no_grad(), pm.disable_adapter():
        ref = torch.cat([_torch_logps(pm, b, avg) for b in batches])
    logits = (pol[0::2] - pol[1::2]) - (ref[0::2] - ref[1::2])
    if loss_type == "sigmoid":
        losses = (-torch.nn.functional.logsigmoid(beta * logits) * (1 - label_smoothing)
                  - torch.nn.functional.logsigmoid(-beta * logits) * label_smoothing)
    else:
        losses = (logits - 1 / (2 * beta)) ** 2
    chosen_rewards = beta * (pol[0::2] - ref[0::2]).detach()
    rejected_rewards = beta * (pol[1::2] - ref[1::2]).detach()
    return losses.mean(), chosen_rewards, rejected_rewards


@pytest.mark.parametrize("loss_type,label_smoothing", [("sigmoid", 0.0), ("sigmoid", 0.1), ("ipo", 0.0)])
def test_loss_and_lora_grads_equal_trl_in_torch(base, data, tmp_path, loss_type, label_smoothing):
    beta = 0.5
    tr = DPOTrainer(config(base, data, tmp_path / "run", loss_type=loss_type, beta=beta,
                           label_smoothing=label_smoothing))
    rng = np.random.default_rng(3)  # an adapter away from zero: policy != reference, A and B both get grads
    for n, a in tr.trainable.items():
        a[...] = rng.normal(0, 0.3, a.shape).astype(a.dtype)
        tr.exe.push(n)
    it = tr.train_data.iterator(tr.B)
    batches = [next(it) for _ in range(2)]
    loss, pairs, metrics = tr._step_with_metrics(batches, 0)
    assert pairs == 4

    save_peft_adapter(tmp_path / "adapter", dict(tr.trainable), tr.lora, base_model=str(base))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    pm = peft.PeftModel.from_pretrained(hf, str(tmp_path / "adapter"), is_trainable=True).eval()
    ref_loss, chosen, rejected = trl_loss(pm, batches, loss_type, beta, label_smoothing)
    ref_loss.backward()
    assert loss == pytest.approx(ref_loss.item(), rel=1e-4, abs=1e-6)
    assert metrics["rewards/chosen"] == pytest.approx(chosen.mean().item(), abs=1e-4)
    assert metrics["rewards/margins"] == pytest.approx((chosen - rejected).mean().item(), abs=1e-4)
    assert metrics["rewards/accuracies"] == pytest.approx((chosen > rejected).float().mean().item())
    grads = {n.removeprefix("base_model.model.model.").replace(".default.weight", ""): p.grad.numpy()
             for n, p in pm.named_parameters() if "lora_" in n}
    assert set(grads) == {n.removeprefix("grad.") for n in tr.grads}
    scale = max(np.abs(g).max() for g in grads.values())
    assert scale > 0
    for n, g in grads.items():
        np.testing.assert_allclose(tr.grads["grad." + n], g, atol=1e-4 * scale, rtol=1e-4, err_msg=n)


# -- training --

def test_chosen_is_preferred_after_a_short_run(base, data, tmp_path):
    DPOTrainer(config(base, data, tmp_path / "run", max_steps=12, beta=0.1)).train()
    steps = step_records(tmp_path / "run")
    assert steps[0]["rewards/accuracies"] == 0.0 and steps[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)
    last = steps[-3:]
    assert all(s["rewards/margins"] > 0 and s["rewards/accuracies"] == 1.0 for s in last), last
    assert last[-1]["loss"] < 0.3


def test_full_finetune_reference_stays_frozen(base, data, tmp_path):
    DPOTrainer(config(base, data, tmp_path / "run", lora=False, learning_rate=1e-3, max_steps=4)).train()
    losses = step_losses(tmp_path / "run")
    assert losses[0] == pytest.approx(math.log(2), abs=1e-6)
    assert losses[-1] < losses[0] - 0.01  # a reference moving with the policy would keep ln 2
    assert (tmp_path / "run" / "model" / "config.json").is_file()


def test_resume_reproduces_the_uninterrupted_curve(base, data, tmp_path):
    DPOTrainer(config(base, data, tmp_path / "a", save_steps=3)).train()
    full = step_records(tmp_path / "a")
    interrupted = DPOTrainer(config(base, data, tmp_path / "b", save_steps=3))
    interrupt_after(interrupted, 4)
    with pytest.raises(KeyboardInterrupt):
        interrupted.train()
    assert latest_checkpoint(tmp_path / "b" / "checkpoints").name == "step_00000003"
    DPOTrainer(config(base, data, tmp_path / "b", save_steps=3, resume_from_checkpoint=True)).train()
    by_step = {r["step"]: r for r in step_records(tmp_path / "b")}
    for r in full:
        for k in ("loss", "rewards/margins", "rewards/chosen"):
            assert by_step[r["step"]][k] == r[k], (r["step"], k)


def test_recompute_changes_nothing(base, data, tmp_path):
    DPOTrainer(config(base, data, tmp_path / "a", max_steps=3)).train()
    DPOTrainer(config(base, data, tmp_path / "b", max_steps=3, recompute=True)).train()
    assert step_losses(tmp_path / "b") == pytest.approx(step_losses(tmp_path / "a"), rel=1e-6)


def test_evaluation_reports_rewards(base, data, tmp_path):
    DPOTrainer(config(base, data, tmp_path / "run", max_steps=2, eval_steps=2, validation_split_ratio=0.25)).train()
    evals = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl")]
    evals = [x for x in evals if x["type"] == "eval"]
    assert len(evals) == 1 and math.isfinite(evals[0]["eval_loss"])
    assert {"eval_rewards/margins", "eval_rewards/accuracies"} <= set(evals[0])


def test_surogate_dpo_command(base, data, tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"""model: {base}
output_dir: {tmp_path / 'out'}
datasets:
  - path: {data}
    type: preference
max_length: 48
per_device_train_batch_size: 2
gradient_accumulation_steps: 1
max_steps: 2
recipe: fp32
save_steps: 0
eval_steps: 0
""")
    proc = subprocess.run([sys.executable, "-P", "-m", "surogate.cli.main", "dpo", str(cfg)], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "out" / "adapter" / "adapter_model.safetensors").is_file()
    assert [r["step"] for r in step_records(tmp_path / "out")] == [1, 2]


# -- data --

def _pairs(base, tmp_path, rows, **kw):
    from surogate.train.data.preference import build_preference_datasets

    cfg = config(base, write_rows(tmp_path / "rows.jsonl", rows), tmp_path / "out", **kw)
    import surogate

    tok = surogate.load_model(base).tokenizer
    train, _ = build_preference_datasets(cfg, tok)
    return train, tok


def _scored_text(tok, batch, d):
    s, e = int(batch.cu_seqlens[d]), int(batch.cu_seqlens[d + 1])
    t = batch.targets[s:e]
    return tok.decode(t[t != -100].tolist())


def test_the_loss_sees_the_completion_only(base, tmp_path):
    rows = [{k: json.dumps(v) for k, v in conversational("Say hi.", "Hi there.", "No.").items()},  # JSON strings
            {"prompt": "Q: 2+2? A:", "chosen": " 4", "rejected": "[5]"},
            {"chosen": [{"role": "user", "content": "Yes?"}, {"role": "assistant", "content": "Yes."}],
             "rejected": [{"role": "user", "content": "Yes?"}, {"role": "assistant", "content": "No."}]}]
    train, tok = _pairs(base, tmp_path, rows, max_prompt_length=None)
    b = train.batch([0, 1, 2])
    assert b.pairs == 3 and len(b.input_ids) == 3 * 2 * 48
    chosen, rejected = _scored_text(tok, b, 0), _scored_text(tok, b, 1)
    assert chosen.strip().endswith("Hi there.<|im_end|>") and "Say hi." not in chosen
    assert rejected.strip().endswith("No.<|im_end|>")
    assert _scored_text(tok, b, 2) == " 4" + tok.eos_token  # plain strings: TRL appends eos
    assert _scored_text(tok, b, 3) == "[5]" + tok.eos_token  # text that starts with "[" stays text
    implicit = _scored_text(tok, b, 4)  # no prompt field: the shared start is the prompt
    assert implicit.strip().endswith("Yes.<|im_end|>") and "Yes?" not in implicit


def test_truncation_keeps_the_prompt_end(base, tmp_path):
    long_prompt = " ".join(["word"] * 60)
    train, tok = _pairs(base, tmp_path, [conversational(long_prompt, "Short.", "Other.")], max_prompt_length=8)
    b = train.batch([0])
    s, e = int(b.cu_seqlens[0]), int(b.cu_seqlens[1])
    assert e - s <= 48
    assert _scored_text(tok, b, 0).strip().endswith("Short.<|im_end|>")
    text = tok.decode(b.input_ids[s:e].tolist())
    assert not text.startswith("<|im_start|>user")  # the prompt's start was dropped (keep_end)


@pytest.mark.parametrize("row,expected", [
    ({"prompt": "Q", "chosen": "A"}, "no 'rejected' field"),
    ({"prompt": [{"role": "user", "content": "Q"}], "chosen": "A", "rejected": "B"}, "all messages or all strings"),
    ({"prompt": "Q", "chosen": [{"role": "assistant", "content": "A"}], "rejected": "B"}, "both be messages"),
    ({"prompt": "Q", "chosen": "", "rejected": "B"}, "'chosen' is empty"),
    ({"chosen": "A", "rejected": "B"}, "no 'prompt' field"),
    ({"prompt": "Q", "chosen": [{"role": "robot", "content": "A"}], "rejected": [{"role": "assistant"}]},
     "chosen[0]: role must be one of"),
])
def test_bad_rows_name_the_row_and_field(base, tmp_path, row, expected):
    rows = [{"prompt": "ok", "chosen": "yes", "rejected": "no"}, row]
    with pytest.raises(FileFormatError) as info:
        _pairs(base, tmp_path, rows)
    assert "rows.jsonl line 2" in info.value.message and expected in info.value.message, info.value.message


def test_a_prompt_that_leaves_no_room_is_a_row_error(base, tmp_path):
    rows = [conversational(" ".join(["word"] * 80), "A.", "B.")]
    with pytest.raises(FileFormatError) as info:
        _pairs(base, tmp_path, rows, max_prompt_length=None, truncation_mode="keep_start")
    assert "line 1" in info.value.message and "max_length=48" in info.value.message
    assert "max_prompt_length" in info.value.hint
    train, _ = _pairs(base, tmp_path, rows + [conversational("Hi", "A.", "B.")], max_prompt_length=None,
                      truncation_mode="keep_start", skip_bad_rows=True)
    assert train.num_rows == 1


def test_config_errors_name_the_key(base, data, tmp_path):
    for kw, key in [({"sequence_len": 64}, "sequence_len"), ({"beta": -1}, "beta"), ({"loss_type": "kto"}, "loss_type"),
                    ({"max_prompt_length": 0}, "max_prompt_length"),
                    ({"loss_type": "ipo", "label_smoothing": 0.1}, "label_smoothing")]:
        with pytest.raises(ConfigError) as info:
            config(base, data, tmp_path, **kw)
        assert info.value.message.startswith(key), info.value.message
    with pytest.raises(ConfigError) as info:
        load_config({"model": "m", "datasets": [{"path": "d", "type": "messages"}]}, kind="dpo")
    assert "datasets[0].type" in info.value.message
