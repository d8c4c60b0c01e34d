"""Reading a run's metrics feed (surogate/train/metrics.py writes it): tail the JSONL as it grows
and fold its lines into what the Train screen shows.

Lines: ``start`` (total_steps, start_step, tokens_per_step, output_dir), ``step`` (loss, lr,
grad_norm, tokens_per_second, epoch, elapsed; a DPO run adds rewards/chosen, rewards/rejected,
rewards/margins, rewards/accuracies; a distill run kl and ce; a GRPO run reward, rewards/<fn>/mean,
kl, clip_ratio/region_mean, completions/mean_length, rollout_tokens_per_second), ``eval``
(eval_loss), ``gpu`` (a list of per-GPU samples) and ``end`` (final loss, eval loss, output).
Unknown types and malformed lines are skipped: the feed is written by another process and may be
mid-line when read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path



class LineTail:
    """New complete lines of a growing file, from where the last read stopped."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.offset = 0
        self._partial = b""

    def read_lines(self) -> list[bytes]:
        try:
            size = self.path.stat().st_size
        except OSError:
            return []
        if size < self.offset:  # truncated or replaced: start over
            self.offset, self._partial = 0, b""
        if size == self.offset:
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read(size - self.offset)
        self.offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()  # b"" when the data ended with a newline
        return lines

    def read_text(self) -> list[str]:
        return [line.decode("utf-8", errors="replace").rstrip("\r") for line in self.read_lines()]


class MetricsTail(LineTail):
    """New records of a growing JSONL feed."""

    def read(self) -> list[dict]:
        return parse_lines(self.read_lines())


def parse_lines(lines: list[bytes]) -> list[dict]:
    out = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a partial or foreign line
        if isinstance(record, dict):
            out.append(record)
    return out


@dataclass
class RunMetrics:
    """A run as its feed tells it."""

    total_steps: int = 0
    start_step: int = 0
    tokens_per_step: int | None = None
    output_dir: str | None = None
    losses: list[tuple[int, float]] = field(default_factory=list)
    eval_losses: list[tuple[int, float]] = field(default_factory=list)
    step: int = 0
    lr: float | None = None
    grad_norm: float | None = None
    tokens_per_second: float | None = None
    epoch: float | None = None
    elapsed: float | None = None  # seconds since the run (or its resume) started, at the last step
    gpus: list[dict] | None = None
    started_at: float | None = None
    updated_at: float | None = None
    ended: bool = False
    output: str | None = None
    # Preference runs (surogate dpo): the last step's TRL metrics, by name without "rewards/".
    rewards: dict[str, float] = field(default_factory=dict)
    kl: float | None = None  # distillation runs: the student's KL to the teacher's top-k; GRPO: to the reference
    kl_points: list[tuple[int, float]] = field(default_factory=list)  # (step, kl): the chart's kl line
    # Mixture-of-experts runs: per step, the expert load's max / mean (1 = balanced; over the MoE
    # layers together) and its worst layer's; the last step's rows per expert and router losses.
    expert_load: list[tuple[int, float]] = field(default_factory=list)
    expert_load_worst: list[tuple[int, float]] = field(default_factory=list)
    tokens_per_expert: list[int] | None = None
    moe_losses: dict[str, float] = field(default_factory=dict)
    # GRPO runs (surogate grpo): the mean reward per step (the chart), the last step's per-function
    # means, clip fraction, completion length and rollout throughput.
    reward_points: list[tuple[int, float]] = field(default_factory=list)
    reward_fns: dict[str, float] = field(default_factory=dict)
    clip_ratio: float | None = None
    completion_length: float | None = None
    rollout_tokens_per_second: float | None = None

    def apply(self, record: dict) -> None:
        kind = record.get("type")
        if "time" in record:
            self.updated_at = record["time"]
        if kind == "start":
            if not record.get("start_step"):
                self.losses.clear()  # a fresh run appended to the same file starts the chart again
                self.eval_losses.clear()
                self.expert_load.clear()
                self.expert_load_worst.clear()
                self.reward_points.clear()
                self.kl_points.clear()
            self.total_steps = int(record.get("total_steps") or 0)
            self.start_step = int(record.get("start_step") or 0)
            self.step = self.start_step
            self.tokens_per_step = record.get("tokens_per_step")
            self.output_dir = record.get("output_dir")
            self.started_at = record.get("time")
            self.ended = False
        elif kind == "step":
            step = int(record.get("step", self.step))
            loss = record.get("loss")
            if isinstance(loss, (int, float)):
                self.losses.append((step, float(loss)))
            self.step = step
            self.lr = record.get("lr", self.lr)
            self.grad_norm = record.get("grad_norm", self.grad_norm)
            self.tokens_per_second = record.get("tokens_per_second", self.tokens_per_second)
            self.epoch = record.get("epoch", self.epoch)
            self.elapsed = record.get("elapsed", self.elapsed)
            self.kl = record.get("kl", self.kl)
            if isinstance(record.get("kl"), (int, float)):
                self.kl_points.append((step, float(record["kl"])))
            for key, value in record.items():
                if key.startswith("rewards/") and isinstance(value, (int, float)):
                    name = key.removeprefix("rewards/")
                    if name.endswith("/mean"):  # GRPO: one reward function's mean
                        self.reward_fns[name.removesuffix("/mean")] = float(value)
                    elif "/" not in name:  # DPO: TRL's preference metrics
                        self.rewards[name] = float(value)
            reward = record.get("reward")
            if isinstance(reward, (int, float)):
                self.reward_points.append((step, float(reward)))
            self.clip_ratio = record.get("clip_ratio/region_mean", self.clip_ratio)
            self.completion_length = record.get("completions/mean_length", self.completion_length)
            self.rollout_tokens_per_second = record.get("rollout_tokens_per_second", self.rollout_tokens_per_second)
            self._apply_moe(step, record)
        elif kind == "eval":
            value = record.get("eval_loss")
            if isinstance(value, (int, float)):
                self.eval_losses.append((int(record.get("step", self.step)), float(value)))
        elif kind == "gpu":
            gpus = record.get("gpus")
            if isinstance(gpus, list):
                self.gpus = gpus
        elif kind == "end":
            self.ended = True
            self.output = record.get("output")
            self.step = int(record.get("step", self.step))

    def _apply_moe(self, step: int, record: dict) -> None:
        """A MoE step line's expert load (surogate.train.trainer's moe_* keys)."""
        load = record.get("moe_load_imbalance")
        if isinstance(load, (int, float)):
            self.expert_load.append((step, float(load)))
        layers = record.get("moe_layer_imbalance")
        if isinstance(layers, list) and layers and all(isinstance(v, (int, float)) for v in layers):
            self.expert_load_worst.append((step, float(max(layers))))
        counts = record.get("moe_tokens_per_expert")
        if isinstance(counts, list):
            self.tokens_per_expert = [int(c) for c in counts if isinstance(c, (int, float))]
        for key in ("aux_loss", "z_loss"):
            value = record.get(f"moe_{key}")
            if isinstance(value, (int, float)):
                self.moe_losses[key] = float(value)

    def extend(self, records: list[dict]) -> None:
        for r in records:
            self.apply(r)

    @property
    def loss(self) -> float | None:
        return self.losses[-1][1] if self.losses else None

    @property
    def reward(self) -> float | None:
        return self.reward_points[-1][1] if self.reward_points else None

    @property
    def eval_loss(self) -> float | None:
        return self.eval_losses[-1][1] if self.eval_losses else None

    @property
    def progress(self) -> float:
        return min(self.step / self.total_steps, 1.0) if self.total_steps else 0.0

    @property
    def eta(self) -> float | None:
        """Seconds left at the pace so far (from the feed's own clock, not the reader's)."""
        done = self.step - self.start_step
        if self.ended or not self.elapsed or done <= 0 or not self.total_steps:
            return None
        return self.elapsed / done * max(self.total_steps - self.step, 0)


def hms(seconds: float) -> str:
    """The CLI progress line's duration format (h:mm:ss)."""
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def read_metrics(path: str | Path, start: int = 0, end: int | None = None) -> RunMetrics:
    """The run in bytes [start, end) of a feed (several runs may append to one file)."""
    m = RunMetrics()
    try:
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read() if end is None else f.read(max(end - start, 0))
    except OSError:
        return m
    m.extend(parse_lines(data.split(b"\n")))
    return m
