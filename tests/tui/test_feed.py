"""Reading a run's metrics feed while another process writes it: partial last lines, a file that
is replaced, several runs appended to one file; and what the Train screen derives from it."""

from __future__ import annotations

import json

import pytest

from surogate.tui.feed import MetricsTail, RunMetrics, read_metrics
from surogate.tui.runs import display_state


def append(path, *records, raw: str = "") -> None:
    with open(path, "a") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        f.write(raw)


def test_tail_returns_only_complete_new_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    tail = MetricsTail(path)
    assert tail.read() == []  # not there yet
    append(path, {"type": "start", "total_steps": 4}, raw='{"type": "step", "st')
    assert [r["type"] for r in tail.read()] == ["start"]
    append(path, raw='ep": 1, "loss": 2.5}\nnot json\n[1, 2]\n')
    assert tail.read() == [{"type": "step", "step": 1, "loss": 2.5}]
    assert tail.read() == []
    path.write_text(json.dumps({"type": "start", "total_steps": 9}) + "\n")  # replaced by a shorter file
    assert tail.read() == [{"type": "start", "total_steps": 9}]


def test_metrics_follow_the_trainers_lines(tmp_path):
    m = RunMetrics()
    m.extend([{"type": "start", "total_steps": 10, "start_step": 0, "output_dir": "out"},
              {"type": "step", "step": 1, "loss": 3.0, "lr": 1e-4, "grad_norm": 2.0, "tokens_per_second": 100.0,
               "elapsed": 2.0},
              {"type": "step", "step": 2, "loss": 2.0, "lr": 2e-4, "grad_norm": 1.0, "tokens_per_second": 120.0,
               "elapsed": 4.0},
              {"type": "eval", "step": 2, "eval_loss": 2.2},
              {"type": "gpu", "gpus": [{"index": 0, "utilization": 50.0}]},
              {"type": "mystery"}])
    assert m.losses == [(1, 3.0), (2, 2.0)] and m.eval_losses == [(2, 2.2)]
    assert (m.step, m.lr, m.grad_norm, m.tokens_per_second) == (2, 2e-4, 1.0, 120.0)
    assert m.progress == pytest.approx(0.2) and m.eta == pytest.approx(16.0)  # 2 s per step, 8 to go
    assert m.gpus == [{"index": 0, "utilization": 50.0}]
    assert display_state(None, m) == "incomplete" and display_state("exited", m) == "failed"
    m.apply({"type": "end", "step": 2, "output": "out/adapter"})
    assert m.ended and m.eta is None and m.output == "out/adapter"
    assert display_state(None, m) == "finished" and display_state("running", m) == "running"


def test_a_resumed_run_keeps_its_curve_and_a_fresh_one_starts_over():
    m = RunMetrics()
    m.extend([{"type": "start", "total_steps": 4, "start_step": 0}, {"type": "step", "step": 1, "loss": 1.0},
              {"type": "start", "total_steps": 4, "start_step": 1}, {"type": "step", "step": 2, "loss": 0.9}])
    assert [s for s, _ in m.losses] == [1, 2]
    m.apply({"type": "start", "total_steps": 4, "start_step": 0})
    assert m.losses == [] and m.step == 0


def test_read_metrics_bounds_one_run_of_a_shared_feed(tmp_path):
    path = tmp_path / "metrics.jsonl"
    append(path, {"type": "start", "total_steps": 2}, {"type": "step", "step": 1, "loss": 5.0})
    middle = path.stat().st_size
    append(path, {"type": "start", "total_steps": 3}, {"type": "step", "step": 1, "loss": 4.0})
    assert read_metrics(path, 0, middle).losses == [(1, 5.0)]
    assert read_metrics(path, middle).losses == [(1, 4.0)] and read_metrics(path, middle).total_steps == 3
    assert read_metrics(tmp_path / "missing.jsonl").losses == []


def test_a_dpo_runs_reward_metrics_are_kept():
    m = RunMetrics()
    m.extend([{"type": "start", "total_steps": 4, "start_step": 0},
              {"type": "step", "step": 1, "loss": 0.69, "rewards/margins": 0.0, "rewards/accuracies": 0.0},
              {"type": "step", "step": 2, "loss": 0.5, "rewards/chosen": 0.3, "rewards/rejected": -0.2,
               "rewards/margins": 0.5, "rewards/accuracies": 1.0, "logps/chosen": -9.0}])
    assert m.rewards == {"chosen": 0.3, "rejected": -0.2, "margins": 0.5, "accuracies": 1.0}
    assert RunMetrics().rewards == {} and RunMetrics().kl is None  # an SFT run shows neither
    m.apply({"type": "step", "step": 3, "loss": 0.4, "kl": 0.25, "ce": 1.5})
    assert m.kl == 0.25 and m.kl_points == [(3, 0.25)]  # a distill run's KL is charted


def test_a_moe_runs_expert_load_is_charted_per_step():
    """The trainer's moe_* keys (surogate.train.trainer._moe_metrics) become the expert-load
    series, overall and worst layer; a fresh run starts them over; a dense run has none."""
    m = RunMetrics()
    m.apply({"type": "start", "total_steps": 2, "start_step": 0})
    for step, counts in ((1, [30, 10, 10, 14]), (2, [16, 16, 16, 16])):
        mean = sum(counts) / 4
        m.apply({"type": "step", "step": step, "loss": 1.0, "moe_tokens_per_expert": counts,
                 "moe_load_max": max(counts), "moe_load_mean": mean, "moe_load_imbalance": max(counts) / mean,
                 "moe_layer_imbalance": [max(counts) / mean, 1.0], "moe_z_loss": 2.5, "moe_aux_loss": 1.1})
    assert m.expert_load == [(1, 30 / 16), (2, 1.0)]
    assert m.expert_load_worst == [(1, 30 / 16), (2, 1.0)]
    assert m.tokens_per_expert == [16, 16, 16, 16] and m.moe_losses == {"z_loss": 2.5, "aux_loss": 1.1}
    m.apply({"type": "start", "total_steps": 2, "start_step": 0})
    m.apply({"type": "step", "step": 1, "loss": 1.0})
    assert m.expert_load == [] and m.expert_load_worst == []


def test_a_grpo_runs_rewards_are_charted():
    m = RunMetrics()
    m.extend([{"type": "start", "total_steps": 3, "start_step": 0},
              {"type": "step", "step": 1, "loss": 0.0, "reward": 0.25, "rewards/arithmetic_exact/mean": 0.25,
               "rewards/arithmetic_exact/std": 0.4, "kl": 0.0, "clip_ratio/region_mean": 0.0,
               "completions/mean_length": 5.5, "rollout_tokens_per_second": 900.0},
              {"type": "step", "step": 2, "loss": 0.01, "reward": 0.5, "rewards/arithmetic_exact/mean": 0.5,
               "rewards/length/mean": 0.9, "kl": 0.02, "clip_ratio/region_mean": 0.1,
               "completions/mean_length": 4.0, "rollout_tokens_per_second": 1000.0}])
    assert m.reward_points == [(1, 0.25), (2, 0.5)] and m.reward == 0.5
    assert m.kl_points == [(1, 0.0), (2, 0.02)]
    assert m.reward_fns == {"arithmetic_exact": 0.5, "length": 0.9}
    assert m.rewards == {}  # no DPO block for a GRPO run
    assert (m.kl, m.clip_ratio, m.completion_length, m.rollout_tokens_per_second) == (0.02, 0.1, 4.0, 1000.0)
