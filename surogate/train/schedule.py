"""Learning-rate schedules: warmup, then constant, linear, cosine or warmup-stable-decay (wsd).

`lr_at(step)` takes the 1-based optimizer step; warmup ramps linearly from lr/warmup to lr
(as HF's schedulers do, so the first step does not train at lr 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from surogate.errors import ConfigError

SCHEDULES = ("constant", "linear", "cosine", "wsd")


@dataclass(frozen=True)
class Schedule:
    kind: str
    lr: float
    total_steps: int
    warmup_steps: int = 0
    final_lr_fraction: float = 0.0  # where linear / cosine / wsd end, as a fraction of lr
    decay_fraction: float = 0.1  # wsd: the last fraction of steps decays

    def __post_init__(self):
        if self.kind not in SCHEDULES:
            raise ConfigError(f"lr_scheduler_type {self.kind!r} is not known", hint=f"use one of {', '.join(SCHEDULES)}")
        if self.total_steps < 1:
            raise ConfigError(f"the run has {self.total_steps} optimizer steps", hint="check max_steps / num_epochs")

    def lr_at(self, step: int) -> float:
        if self.warmup_steps > 0 and step <= self.warmup_steps:
            return self.lr * step / self.warmup_steps
        floor = self.lr * self.final_lr_fraction
        if self.kind == "constant":
            return self.lr
        span = max(self.total_steps - self.warmup_steps, 1)
        t = min(max(step - self.warmup_steps, 0) / span, 1.0)
        if self.kind == "linear":
            return floor + (self.lr - floor) * (1.0 - t)
        if self.kind == "cosine":
            return floor + (self.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * t))
        decay_start = 1.0 - self.decay_fraction  # wsd
        if t <= decay_start:
            return self.lr
        return floor + (self.lr - floor) * (1.0 - (t - decay_start) / max(self.decay_fraction, 1e-12))
