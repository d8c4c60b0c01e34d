"""The tiny chat set the trainer tests teach, the run config they share, and helpers to read a
run's loss curve and to interrupt a run part way (resume tests)."""

from __future__ import annotations

import json
from pathlib import Path

QA = [("What is the capital of France?", "Paris."), ("Name a primary color.", "Red."),
      ("What is 2 + 2?", "4."), ("Say hello.", "Hello!"), ("Opposite of up?", "Down."),
      ("Color of the sky?", "Blue."), ("First letter of the alphabet?", "A."), ("Largest planet?", "Jupiter.")]


def write_qa(path: Path) -> Path:
    """QA as a messages-style .jsonl file."""
    with open(path, "w") as f:
        for q, a in QA:
            f.write(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]})
                    + "\n")
    return path


def sft_config(base, data, out, **kw):
    """A 6-step LoRA run on QA in f32 (what the trainer tests vary, they pass as keys)."""
    from surogate.config import load_config

    c = {"model": str(base), "output_dir": str(out), "datasets": [{"path": str(data), "type": "messages"}],
         "sequence_len": 64, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 2,
         "recipe": "fp32", "learning_rate": 2e-2, "lr_scheduler_type": "constant", "max_steps": 6,
         "lora_rank": 8, "lora_alpha": 16, "save_steps": 0, "eval_steps": 0, "seed": 7,
         "max_grad_norm": 1.0}
    c.update(kw)
    return load_config(c, kind="sft")


def step_records(out) -> list[dict]:
    with open(Path(out) / "metrics.jsonl") as f:
        return [r for r in map(json.loads, f) if r["type"] == "step"]


def step_losses(out) -> list[float]:
    return [r["loss"] for r in step_records(out)]


def fell(losses: list[float], by: float, epoch_steps: int = 2) -> bool:
    """Whether the mean loss of the run's last epoch lies ``by`` below its first epoch's (QA's 8
    rows are 2 steps of 2 x 2 rows: each step's loss is over other rows, so single steps are noisy)."""
    first, last = losses[:epoch_steps], losses[-epoch_steps:]
    return sum(last) / len(last) < sum(first) / len(first) - by


def interrupt_after(trainer, steps: int) -> None:
    """Make the run raise KeyboardInterrupt when it reaches optimizer step ``steps + 1``."""
    apply = trainer.opt.apply
    calls = {"n": 0}

    def apply_or_stop(lr):
        calls["n"] += 1
        if calls["n"] > steps:
            raise KeyboardInterrupt
        return apply(lr)

    trainer.opt.apply = apply_or_stop
