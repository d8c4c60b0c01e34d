"""The tiny preference set the DPO tests train on (TRL's conversational rows) and the run config
they share."""

from __future__ import annotations

import json

PAIRS = [("What is the capital of France?", "Paris.", "London."), ("Name a primary color.", "Red.", "Green."),
         ("What is 2 + 2?", "4.", "5."), ("Say hello.", "Hello!", "Goodbye!"),
         ("Opposite of up?", "Down.", "Left."), ("Color of the sky?", "Blue.", "Orange."),
         ("First letter?", "A.", "Z."), ("Largest planet?", "Jupiter.", "Mars.")]


def conversational(prompt, chosen, rejected) -> dict:
    return {"prompt": [{"role": "user", "content": prompt}], "chosen": [{"role": "assistant", "content": chosen}],
            "rejected": [{"role": "assistant", "content": rejected}]}


def write_rows(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path


def write_pairs(path):
    return write_rows(path, [conversational(*p) for p in PAIRS])


def dpo_config(base, data, out, **kw):
    """A 6-step LoRA DPO run in f32: 2 pairs per micro-batch, 2 micro-batches per step."""
    from surogate.config import load_config

    c = {"model": str(base), "output_dir": str(out), "datasets": [{"path": str(data), "type": "preference"}],
         "max_length": 48, "max_prompt_length": 32, "per_device_train_batch_size": 2,
         "gradient_accumulation_steps": 2, "recipe": "fp32", "learning_rate": 1e-2, "lr_scheduler_type": "constant",
         "max_steps": 6, "lora_rank": 8, "lora_alpha": 16, "save_steps": 0, "eval_steps": 0, "seed": 7}
    c.update(kw)
    return load_config(c, kind="dpo")
