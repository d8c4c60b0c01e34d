"""Entry point of `surogate sft`, `pt`, `dpo`, `distill` and `grpo`: config file in, trained outputs out."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import msgspec

from surogate.config import load_config
from surogate.config.sft import DistributedConfig
from surogate.errors import ConfigError
from surogate.train.trainer import TrainResult, Trainer


def run(config_path: str | Path, kind: str, ray_address: str | None = None,
        num_nodes: int | None = None) -> TrainResult:
    """``ray_address`` / ``num_nodes`` (`--ray`, `--nodes`): the config's distributed block's keys, overridden."""
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    cfg = load_config(config_path, kind=kind)
    d = cfg.distributed
    if ray_address is not None or num_nodes is not None:
        if num_nodes is not None and num_nodes < 0:
            raise ConfigError(f"--nodes {num_nodes}", where="--nodes", hint="one rank per node; 0: every node")
        d = DistributedConfig(ray_address=ray_address or (d.ray_address if d else "auto"),
                              num_nodes=num_nodes if num_nodes is not None else (d.num_nodes if d else 0))
        cfg = msgspec.structs.replace(cfg, distributed=d)
        if cfg.gpus > 1:  # (the loader's check of a distributed block)
            raise ConfigError(f"gpus: {cfg.gpus} with --ray: several ranks per node are not built yet", where="gpus",
                              hint="set gpus: 1 (one rank per node)")
    if d is not None:
        from surogate.train.ray_launch import launch

        result = launch(cfg, d.ray_address, d.num_nodes)
        _print_result(kind, result)
        return result
    trainer = trainer_class(kind)(cfg)
    result = trainer.train()
    _print_result(kind, result)
    return result


def trainer_class(kind: str) -> type[Trainer]:
    """The trainer of a config kind (this process's run, or a Ray actor's rank)."""
    if kind == "dpo":
        from surogate.train.dpo import DPOTrainer

        return DPOTrainer
    if kind == "distill":
        from surogate.train.distill import DistillTrainer

        return DistillTrainer
    if kind == "grpo":
        from surogate.train.grpo import GRPOTrainer

        return GRPOTrainer
    return Trainer


def _print_result(kind: str, result: TrainResult) -> None:
    print(f"{kind}: {result.steps} steps, final loss {result.final_loss:.4f}"
          + (f", eval loss {result.eval_loss:.4f}" if result.eval_loss is not None else "")
          + f"; wrote {result.output}" + (f" and {result.merged}" if result.merged else ""))
