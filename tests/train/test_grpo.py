"""`surogate grpo` on a tiny model (CPU, f32): the loss and LoRA gradients equal TRL's GRPO loss
computed with torch + peft on the same rollouts (grpo / dapo / dr_grpo, KL, clip-higher); the
engine samples from the trainer's current weights (LoRA and full fine-tuning); a run from YAML
writes checkpoints and resumes on the uninterrupted curve; bad reward paths and keys are clear
errors; prompt rows become the prompts the rewards see."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from sgtest.grpo import grpo_config, write_prompts  # noqa: E402
from sgtest.qa import interrupt_after, step_records  # noqa: E402
from sgtest.tiny_models import make_qwen3  # noqa: E402
from surogate.errors import ConfigError  # noqa: E402
from surogate.train.checkpoint import latest_checkpoint  # noqa: E402
from surogate.train.grpo import GRPOTrainer  # noqa: E402
from surogate.train.grpo_env import arithmetic_exact, load_reward_functions  # noqa: E402
from surogate.train.grpo_loss import group_advantages  # noqa: E402
from surogate.train.lora import save_peft_adapter  # noqa: E402


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_qwen3(tmp_path_factory.mktemp("base"), seed=11, initializer_range=0.2)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_prompts(tmp_path_factory.mktemp("data") / "prompts.jsonl")


config = grpo_config


# -- the loss against torch --

def _torch_logps(model, rollouts, temperature=1.0):
    """[S, L] log-probs of each completion's sampled tokens (with grad) and the mask [S, L], over
    logits / temperature (TRL's _get_per_token_logps)."""
    L = max(len(r.ids) for r in rollouts)
    rows, mask = [], torch.zeros(len(rollouts), L)
    for i, r in enumerate(rollouts):
        p = len(r.sample.prompt_ids)
        ids = torch.tensor([r.sample.prompt_ids + r.ids])
        logits = model(ids).logits[0, p - 1:p - 1 + len(r.ids)]
        logp = torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(r.ids)[:, None])[:, 0]
        rows.append(torch.nn.functional.pad(logp, (0, L - len(r.ids))))
        mask[i, :len(r.ids)] = 1
    return torch.stack(rows), mask


def trl_grpo_loss(pm, rollouts, old, adv, micro_sizes, *, loss_type, beta, eps_low, eps_high, max_len,
                  temperature=1.0):
    """TRL's GRPOTrainer._compute_loss, summed over the step's micro-batches as the HF Trainer's
    gradient accumulation does (grpo and dr_grpo divide by the accumulation steps; dapo by the
    step's completion tokens)."""
    logp, mask = _torch_logps(pm, rollouts, temperature)
    with torch.no_grad(), pm.disable_adapter():
        ref, _ = _torch_logps(pm, rollouts, temperature)
    coef_1 = torch.exp(logp - old)
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    a = adv[:, None]
    per_token = -torch.min(coef_1 * a, coef_2 * a)
    kl = torch.exp(ref - logp) - (ref - logp) - 1
    if beta != 0:
        per_token = per_token + beta * kl
    ga, total, at = len(micro_sizes), 0.0, 0
    items = mask.sum()
    for n in micro_sizes:
        pt, m = per_token[at:at + n], mask[at:at + n]
        if loss_type == "grpo":
            loss = ((pt * m).sum(-1) / m.sum(-1).clamp(min=1)).mean() / ga
        elif loss_type == "dr_grpo":
            loss = (pt * m).sum() / (pt.size(0) * max_len) / ga
        else:  # dapo
            loss = (pt * m).sum() / items
        total = total + loss
        at += n
    low = ((coef_1 < 1 - eps_low) & (a < 0)).float()
    high = ((coef_1 > 1 + eps_high) & (a > 0)).float()
    metrics = {"kl": ((kl * mask).sum() / items).item(), "clip_ratio/low_mean": ((low * mask).sum() / items).item(),
               "clip_ratio/high_mean": ((high * mask).sum() / items).item()}
    return total, logp.detach(), mask, metrics


@pytest.mark.parametrize("loss_type,beta,epsilon_high,scale", [("grpo", 0.04, None, "group"),
                                                                ("dapo", 0.0, 0.28, "group"),
                                                                ("dr_grpo", 0.1, None, "none")])
def test_loss_and_lora_grads_equal_trl_in_torch(base, data, tmp_path, loss_type, beta, epsilon_high, scale):
    tr = GRPOTrainer(config(base, data, tmp_path / "run", loss_type=loss_type, beta=beta, epsilon_high=epsilon_high,
                            scale_rewards=scale))
    try:
        rng = np.random.default_rng(3)  # an adapter away from zero: policy != reference
        for n, a in tr.trainable.items():
            a[...] = rng.normal(0, 0.3, a.shape).astype(a.dtype)
            tr.exe.push(n)
        it = tr.train_data.iterator(tr.B)
        batches = [next(it) for _ in range(2)]
        rollouts, _ = tr.rollout([s for b in batches for s in b], 0)
        assert len(rollouts) == 16 and len({tuple(r.ids) for r in rollouts}) > 4  # sampled, not greedy
        sampler = [r.logps.copy() for r in rollouts]
        for r in rollouts:  # off-policy old log-probs: the ratio moves, so both clips trigger somewhere
            r.logps = r.logps + rng.normal(0, 0.4, len(r.logps))
        per_fn = rng.integers(0, 3, (16, 2)).astype(np.float64)
        loss, tokens, metrics = tr.learn(rollouts, per_fn, [2, 2], 0)

        save_peft_adapter(tmp_path / "adapter", dict(tr.trainable), tr.lora, base_model=str(base))
        hf = transformers.AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
        pm = peft.PeftModel.from_pretrained(hf, str(tmp_path / "adapter"), is_trainable=True).eval()
        L = max(len(r.ids) for r in rollouts)
        old = torch.tensor(np.stack([np.pad(r.logps, (0, L - len(r.logps))) for r in rollouts]))
        total = torch.tensor(per_fn @ np.array([1.0, 0.5]))
        g = total.view(-1, 4)
        adv = (g - g.mean(1, keepdim=True)) / ((g.std(1, keepdim=True) + 1e-4) if scale == "group" else 1.0)
        ref_loss, logp, mask, ref_metrics = trl_grpo_loss(
            pm, rollouts, old, adv.reshape(-1), [8, 8], loss_type=loss_type, beta=beta, eps_low=0.2,
            eps_high=0.2 if epsilon_high is None else epsilon_high, max_len=8)
        ref_loss.backward()
    finally:
        tr.close()
    # the engine sampled from the trainer's adapter: its log-probs are the policy's
    for i, r in enumerate(rollouts):
        np.testing.assert_allclose(sampler[i], logp[i, :len(r.ids)].numpy(), atol=2e-4)
    assert tokens == int(mask.sum())
    assert loss == pytest.approx(ref_loss.item(), rel=1e-4, abs=1e-6)
    assert metrics["clip_ratio/low_mean"] == pytest.approx(ref_metrics["clip_ratio/low_mean"])
    assert metrics["clip_ratio/high_mean"] == pytest.approx(ref_metrics["clip_ratio/high_mean"])
    assert metrics["clip_ratio/low_mean"] > 0 and metrics["clip_ratio/high_mean"] > 0
    if beta:
        assert metrics["kl"] == pytest.approx(ref_metrics["kl"], rel=1e-4) and metrics["kl"] > 0
    grads = {n.removeprefix("base_model.model.model.").replace(".default.weight", ""): p.grad.numpy()
             for n, p in pm.named_parameters() if "lora_" in n}
    assert set(grads) == {n.removeprefix("grad.") for n in tr.grads}
    scale_ = max(np.abs(g).max() for g in grads.values())
    assert scale_ > 0
    for n, g in grads.items():
        np.testing.assert_allclose(tr.grads["grad." + n], g, atol=2e-4 * scale_, rtol=1e-3, err_msg=n)


def _peft_policy(tr, base, path):
    save_peft_adapter(path, dict(tr.trainable), tr.lora, base_model=str(base))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    return peft.PeftModel.from_pretrained(hf, str(path), is_trainable=True).eval()


def _check_grads(tr, pm):
    grads = {n.removeprefix("base_model.model.model.").replace(".default.weight", ""): p.grad.numpy()
             for n, p in pm.named_parameters() if "lora_" in n}
    scale_ = max(np.abs(g).max() for g in grads.values())
    assert scale_ > 0
    for n, g in grads.items():
        np.testing.assert_allclose(tr.grads["grad." + n], g, atol=2e-4 * scale_, rtol=1e-3, err_msg=n)


def test_num_iterations_and_temperature_follow_trl(base, data, tmp_path):
    """temperature 0.7, two optimizer passes over one batch of rollouts: each pass's loss, KL,
    clip fractions and LoRA gradients equal TRL's loss in torch + peft over logits / T, the first
    pass's old log-probs being the policy's own (ratio 1), the second's ratio against them
    (the policy moved by the first update)."""
    T = 0.7
    tr = GRPOTrainer(config(base, data, tmp_path / "run", temperature=T, num_iterations=2, learning_rate=5e-2,
                            epsilon=0.05))
    try:
        rng = np.random.default_rng(5)
        for n, a in tr.trainable.items():
            a[...] = rng.normal(0, 0.3, a.shape).astype(a.dtype)
            tr.exe.push(n)
        it = tr.train_data.iterator(tr.B)
        rollouts, _ = tr.rollout([s for b in [next(it), next(it)] for s in b], 0)
        per_fn = rng.integers(0, 3, (16, 2)).astype(np.float64)
        total = torch.tensor(per_fn @ np.array([1.0, 0.5]))
        g = total.view(-1, 4)
        adv = ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-4)).reshape(-1)
        L = max(len(r.ids) for r in rollouts)
        kw = dict(loss_type="grpo", beta=0.04, eps_low=0.05, eps_high=0.05, max_len=8, temperature=T)

        loss0, _, m0 = tr.learn(rollouts, per_fn, [2, 2], 0, iteration=0)
        pm = _peft_policy(tr, base, tmp_path / "adapter0")
        with torch.no_grad():
            old, _ = _torch_logps(pm, rollouts, T)
        for i, r in enumerate(rollouts):  # the tempered policy's own log-probs, not the engine's raw ones
            np.testing.assert_allclose(r.old, old[i, :len(r.ids)].numpy(), atol=2e-4)
            assert np.abs(r.old - r.logps).max() > 1e-2
        ref0, _, _, ref_m0 = trl_grpo_loss(pm, rollouts, old, adv, [8, 8], **kw)
        ref0.backward()
        assert loss0 == pytest.approx(ref0.item(), rel=1e-4, abs=1e-6)
        assert m0["clip_ratio/low_mean"] == m0["clip_ratio/high_mean"] == 0.0  # ratio 1
        _check_grads(tr, pm)

        tr.opt.apply(5e-2)  # what the step does between its passes
        loss1, _, m1 = tr.learn(rollouts, per_fn, [2, 2], 0, iteration=1)
        pm = _peft_policy(tr, base, tmp_path / "adapter1")
        ref1, logp1, mask, ref_m1 = trl_grpo_loss(pm, rollouts, old, adv, [8, 8], **kw)
        ref1.backward()
    finally:
        tr.close()
    assert (torch.abs(logp1 - old) * mask).max() > 1e-2  # the update moved the ratio off 1
    assert loss1 == pytest.approx(ref1.item(), rel=1e-4, abs=1e-6)
    assert m1["kl"] == pytest.approx(ref_m1["kl"], rel=1e-4)
    for k in ("clip_ratio/low_mean", "clip_ratio/high_mean"):
        assert m1[k] == pytest.approx(ref_m1[k])
    assert m1["clip_ratio/low_mean"] + m1["clip_ratio/high_mean"] > 0
    assert "sampling/sampling_logp_difference/max" not in m1  # raw engine log-probs vs tempered: not comparable
    _check_grads(tr, pm)


def test_num_iterations_updates_per_step(base, data, tmp_path):
    """A run of 2 steps at num_iterations 3 makes 6 optimizer updates (AdamW's step count)."""
    tr = GRPOTrainer(config(base, data, tmp_path / "run", num_iterations=3, max_steps=2, beta=0.0))
    tr.train()
    assert tr.opt.step == 6
    steps = step_records(tmp_path / "run")
    assert len(steps) == 2 and all(np.isfinite(s["loss"]) for s in steps)


def test_group_advantages_follow_trl():
    r = np.array([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    t = torch.tensor(r).view(-1, 4)
    want = ((t - t.mean(1, keepdim=True)) / (t.std(1, keepdim=True) + 1e-4)).reshape(-1).numpy()
    np.testing.assert_allclose(group_advantages(r, 4, "group"), want)
    np.testing.assert_allclose(group_advantages(r, 4, "batch"),
                               ((t - t.mean(1, keepdim=True)) / (t.std() + 1e-4)).reshape(-1).numpy())
    assert (group_advantages(r, 4, "none")[4:] == 0).all()  # a group of equal rewards teaches nothing


# -- co-location: the engine sees every update --

@pytest.mark.parametrize("lora", [True, False])
def test_rollouts_sample_from_the_current_weights(base, data, tmp_path, lora):
    """Every step's sampler log-probs equal the trainer's recomputed ones while the policy moves
    away from the reference (KL grows): the engine reads the weights the optimizer updates."""
    tr = GRPOTrainer(config(base, data, tmp_path / "run", lora=lora, learning_rate=1e-2 if lora else 2e-3))
    # The engine runs q/k/v fused, over the model's stack, which the trainer's q/k/v are views of.
    assert tr.runner.fuse_qkv and tr.runner.fused
    for name, (stack, _) in tr.runner.fused.items():
        assert stack is tr.model.stacks[name][0]
        for part, _, _ in tr.model.stacks[name][1]:
            assert np.shares_memory(tr.model.params[part], stack), part
    if lora:  # the engine's adapter is the trainer's arrays, not a copy
        _, host, _ = tr.runner.adapters[0]
        assert all(host[n] is tr.trainable[n] for n in tr.trainable)
    tr.train()
    steps = step_records(tmp_path / "run")
    assert len(steps) == 4
    assert steps[-1]["kl"] > 1e-3, steps[-1]
    for s in steps:
        assert s["sampling/sampling_logp_difference/max"] < 1e-4, s
    out = tmp_path / "run" / ("adapter/adapter_model.safetensors" if lora else "model/config.json")
    assert out.is_file()


def address(t) -> int:
    """Where a bound buffer's memory starts (a numpy array on the CPU, a device tensor on a GPU)."""
    return t.data_ptr if hasattr(t, "data_ptr") else t.__array_interface__["data"][0]


@pytest.mark.parametrize("lora", [True, False])
def test_the_engine_reads_the_trainers_arrays(base, data, tmp_path, lora):
    """No second copy: every weight the engine's Programs read is the array (on a GPU, the device
    tensor) the training Program reads and the optimizer updates."""
    tr = GRPOTrainer(config(base, data, tmp_path / "run", lora=lora, beta=0.0))
    try:
        tr.rollout(tr.train_data.batch([0, 1]), 0)
        assert tr.runner._programs and tr.runner.fused
        parts = {p: (name, first) for name, (_, rows) in tr.model.stacks.items() for p, first, _ in rows}
        for exe in tr.runner._programs.values():
            names = exe.external_names("param")
            assert not set(names) & set(parts), "the serving Programs read the fused stack, not the parts"
            for name in names:
                if name in tr.model.stacks:  # each part the trainer reads lies inside this very array
                    base = address(exe.tensor(name))
                    for part, (stack, first) in parts.items():
                        if stack == name:
                            row_bytes = tr.model.stacks[name][0][0:1].nbytes
                            assert address(tr.exe.tensor(part)) == base + first * row_bytes, part
                else:
                    assert exe.tensor(name) is tr.exe.tensor(name), name
    finally:
        tr.close()


def test_bind_adapter_refuses_arrays_it_would_have_to_copy(base, data, tmp_path):
    from surogate.errors import InvalidArgumentError

    tr = GRPOTrainer(config(base, data, tmp_path / "run", beta=0.0))
    try:
        name = next(iter(tr.trainable))
        cfg = tr.runner.adapters[0][0]
        for bad in ({**tr.trainable, name: tr.trainable[name].astype(np.float64)},  # another dtype: a copy
                    {**tr.trainable, name: np.asfortranarray(tr.trainable[name])},  # not contiguous: a copy
                    {k: v for k, v in tr.trainable.items() if k != name}):  # a tensor missing
            with pytest.raises(InvalidArgumentError, match="adapter 1"):
                tr.runner.bind_adapter(1, cfg, bad)
    finally:
        tr.close()


# -- runs from YAML, checkpoints, resume --

@pytest.mark.parametrize("num_iterations", [1, 2])
def test_resume_reproduces_the_uninterrupted_curve(base, data, tmp_path, num_iterations):
    kw = {"save_steps": 2, "num_iterations": num_iterations}
    GRPOTrainer(config(base, data, tmp_path / "a", **kw)).train()
    full = step_records(tmp_path / "a")
    interrupted = GRPOTrainer(config(base, data, tmp_path / "b", **kw))
    interrupt_after(interrupted, 3 * num_iterations)  # optimizer updates: into step 4
    with pytest.raises(KeyboardInterrupt):
        interrupted.train()
    assert latest_checkpoint(tmp_path / "b" / "checkpoints").name == "step_00000002"
    GRPOTrainer(config(base, data, tmp_path / "b", resume_from_checkpoint=True, **kw)).train()
    by_step = {r["step"]: r for r in step_records(tmp_path / "b")}
    for r in full:
        # The same completions (seeds are a function of the step and the prompt) ...
        for k in ("reward", "rewards/length/mean", "completions/mean_length"):
            assert by_step[r["step"]][k] == r[k], (r["step"], k)
        # ... and the same update, up to the sampler's f32 log-probs (~1e-6, should its steps'
        # shapes differ). (The loss, ~1e-3, is a sum of +-A r terms that nearly cancel: an
        # absolute bound.)
        assert by_step[r["step"]]["loss"] == pytest.approx(r["loss"], abs=2e-6), r["step"]
        for k in ("kl", "grad_norm"):
            assert by_step[r["step"]][k] == pytest.approx(r[k], rel=1e-4, abs=1e-7), (r["step"], k)


def test_surogate_grpo_command(base, tmp_path):
    data = write_prompts(tmp_path / "plain.jsonl", plain=True)
    cfg = tmp_path / "run.yaml"
    body = f"""model: {base}
output_dir: {tmp_path / 'out'}
datasets:
  - path: {data}
    type: prompt
  - path: builtin:arithmetic
    samples: 8
reward_functions: [arithmetic_exact, answer_format, length]
reward_weights: [1.0, 0.2, 0.1]
num_generations: 4
max_prompt_length: 48
max_completion_length: 8
per_device_train_batch_size: 2
gradient_accumulation_steps: 1
recipe: fp32
save_steps: 1
"""
    cmd = [sys.executable, "-P", "-m", "surogate.cli.main", "grpo", str(cfg)]
    cfg.write_text(body + "max_steps: 2\n")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "out" / "adapter" / "adapter_model.safetensors").is_file()
    assert latest_checkpoint(tmp_path / "out" / "checkpoints").name == "step_00000002"
    cfg.write_text(body + "max_steps: 3\nresume_from_checkpoint: true\n")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-2000:]
    steps = step_records(tmp_path / "out")
    assert [r["step"] for r in steps] == [1, 2, 3]
    for key in ("reward", "rewards/arithmetic_exact/mean", "rewards/answer_format/std", "completions/mean_length",
                "clip_ratio/region_mean", "kl", "rollout_tokens_per_second"):
        assert key in steps[-1], key


# -- errors --

@pytest.mark.parametrize("spec,problem", [
    ("no_such_module_xyz:fn", "cannot import module 'no_such_module_xyz'"),
    ("sgtest.grpo:no_such_fn", "has no attribute 'no_such_fn'"),
    ("sgtest.grpo:NOT_A_FUNCTION", "not a function"),
    ("sgtest.grpo:", "not of the form"),
    ("exactish", "not a built-in reward")])
def test_bad_reward_function_paths_are_named(tmp_path, data, spec, problem):
    cfg = config(tmp_path / "no-model-here", data, tmp_path / "out", reward_functions=["length", spec],
                 reward_weights=None)
    with pytest.raises(ConfigError) as e:
        GRPOTrainer(cfg)  # before the (missing) model is loaded
    assert "reward_functions[1]" in str(e.value) and problem in str(e.value)


def test_a_reward_module_that_fails_to_import_is_named(tmp_path, data, monkeypatch):
    (tmp_path / "broken_rewards.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"reward_functions\[0\]: importing module 'broken_rewards' raised "
                                          r"RuntimeError: boom"):
        load_reward_functions(["broken_rewards:score"])


def test_bad_rows_and_sets_are_named(base, tmp_path):
    from surogate import load_model
    from surogate.errors import FileFormatError
    from surogate.train.data.prompts import build_prompt_dataset

    tok = load_model(base).tokenizer
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "ok"}\n{"question": "no prompt"}\n')
    with pytest.raises(FileFormatError, match=r"rows.jsonl line 2: no 'prompt' field \(fields: question\)"):
        build_prompt_dataset(config(base, rows, tmp_path / "out"), tok)
    assert build_prompt_dataset(config(base, rows, tmp_path / "out", skip_bad_rows=True), tok).num_rows == 1
    with pytest.raises(ConfigError, match=r"datasets\[0\].path: no generated set 'sums'"):
        build_prompt_dataset(config(base, rows, tmp_path / "out", datasets=[{"path": "builtin:sums"}]), tok)


def test_the_command_names_a_bad_reward_path(base, data, tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"model: {base}\ndatasets: [{{path: {data}}}]\nreward_functions: [length, mypkg.rewards:score]\n")
    proc = subprocess.run([sys.executable, "-P", "-m", "surogate.cli.main", "grpo", str(cfg)], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "reward_functions[1]: cannot import module 'mypkg.rewards'" in proc.stderr, proc.stderr


def test_a_reward_that_raises_names_itself(base, data, tmp_path):
    tr = GRPOTrainer(config(base, data, tmp_path / "run", reward_functions=["sgtest.grpo:raises"],
                            reward_weights=None, max_steps=1))
    with pytest.raises(RuntimeError, match="reward function raises raised KeyError"):
        tr.train()


@pytest.mark.parametrize("key,value,problem", [
    ("num_generations", 1, "num_generations: must be at least 2"),
    ("reward_weights", [1.0], "reward_weights: 1 weights for 2 reward functions"),
    ("reward_functions", [], "reward_functions: no reward functions given"),
    ("sequence_len", 128, "sequence_len: not used by surogate grpo"),
    ("epsilon", 1.5, "epsilon: must be in (0, 1)"),
    ("loss_type", "ppo", "loss_type: 'ppo' is not an allowed value"),
    ("num_iterations", 0, "num_iterations: must be at least 1")])
def test_config_errors_name_the_key(base, data, tmp_path, key, value, problem):
    with pytest.raises(ConfigError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        config(base, data, tmp_path / "out", **{key: value})


def test_rows_of_other_commands_are_refused(base, data, tmp_path):
    with pytest.raises(ConfigError, match=r"datasets\[0\].type: surogate grpo samples completions for prompts"):
        config(base, data, tmp_path / "out", datasets=[{"path": str(data), "type": "messages"}])
    with pytest.raises(ConfigError, match=r"datasets\[0\].type: preference rows train with surogate dpo"):
        config(base, data, tmp_path / "out", datasets=[{"path": str(data), "type": "preference"}])


# -- prompts and the built-in environment --

def test_prompts_keep_their_rows_and_their_end(base, tmp_path):
    from surogate import load_model
    from surogate.train.data.prompts import build_prompt_dataset

    tok = load_model(base).tokenizer
    rows = write_prompts(tmp_path / "chat.jsonl")
    cfg = config(base, rows, tmp_path / "out", max_prompt_length=512,
                 datasets=[{"path": str(rows)}, {"path": str(write_prompts(tmp_path / "plain.jsonl", plain=True))},
                           {"path": "builtin:arithmetic", "samples": 5}])
    ds = build_prompt_dataset(cfg, tok)
    assert ds.num_rows == 8 + 8 + 5
    chat, plain, arith = ds.samples[0], ds.samples[8], ds.samples[16]
    assert tok.decode(chat.prompt_ids).endswith("Say a word.<|im_end|>\n<|im_start|>assistant\n")
    assert chat.prompt == [{"role": "user", "content": "Say a word."}] and chat.row["answer"] == 4
    assert tok.decode(plain.prompt_ids) == "Say a word." and plain.prompt == "Say a word."
    a, op, b = arith.prompt[0]["content"].split("?")[0].split()[-3:]
    assert arith.row["answer"] == (int(a) + int(b) if op == "+" else int(a) - int(b))
    short = build_prompt_dataset(config(base, rows, tmp_path / "out2", max_prompt_length=6), tok)
    assert short.samples[0].prompt_ids == chat.prompt_ids[-6:]  # TRL keeps the prompt's end


def test_builtin_rewards():
    fns = dict(load_reward_functions(["arithmetic_exact", "answer_format", "length"]))
    row = {"answer": 7}
    assert arithmetic_exact(None, "7", row) == 1.0 and arithmetic_exact(None, "3 + 4 = 7.", row) == 1.0
    assert arithmetic_exact(None, "<answer>7</answer> or 8", row) == 1.0 and arithmetic_exact(None, "8", row) == 0.0
    assert arithmetic_exact(None, "seven", row) == 0.0
    assert fns["answer_format"](None, "x <answer>7</answer>", row) == 1.0
    assert fns["answer_format"](None, "<answer>7", row) == 0.5 and fns["answer_format"](None, "7", row) == 0.0
    assert fns["length"](None, "a" * 64, {}) == 1.0 and fns["length"](None, "a" * 32, {}) == 0.5
    assert fns["length"](None, "a" * 10, {"target_length": 10}) == 1.0


def test_delayed_fp8_scaling_on_several_ranks_is_refused(base, data, tmp_path):
    cfg = config(base, data, tmp_path / "out", recipe="fp8_hybrid", fp8_amax_history=4, gpus=2, device="cpu")
    with pytest.raises(ConfigError, match="a rank without prompts") as e:
        GRPOTrainer(cfg)
    assert e.value.where == "fp8_amax_history"
