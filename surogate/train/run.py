"""Entry point of `surogate sft`, `pt`, `dpo`, `distill` and `grpo`: config file in, trained outputs out."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from surogate.config import load_config
from surogate.train.trainer import TrainResult, Trainer


def run(config_path: str | Path, kind: str) -> TrainResult:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    cfg = load_config(config_path, kind=kind)
    if kind == "dpo":
        from surogate.train.dpo import DPOTrainer

        trainer = DPOTrainer(cfg)
    elif kind == "distill":
        from surogate.train.distill import DistillTrainer

        trainer = DistillTrainer(cfg)
    elif kind == "grpo":
        from surogate.train.grpo import GRPOTrainer

        trainer = GRPOTrainer(cfg)
    else:
        trainer = Trainer(cfg)
    result = trainer.train()
    print(f"{kind}: {result.steps} steps, final loss {result.final_loss:.4f}"
          + (f", eval loss {result.eval_loss:.4f}" if result.eval_loss is not None else "")
          + f"; wrote {result.output}" + (f" and {result.merged}" if result.merged else ""))
    return result
