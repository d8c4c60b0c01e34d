"""The prompt set and run config the GRPO tests share, and a reward function importable by path
(``sgtest.grpo:ends_with_a`` ...) for the reward-loading tests."""

from __future__ import annotations

import json

PROMPTS = ["Say a word.", "Count to three.", "Name a color.", "What is 2 + 2?", "Greet me.", "Spell cat.",
           "Pick a number.", "Name an animal."]


def write_prompts(path, plain: bool = False):
    with open(path, "w") as f:
        for p in PROMPTS:
            prompt = p if plain else [{"role": "user", "content": p}]
            f.write(json.dumps({"prompt": prompt, "answer": 4}) + "\n")
    return path


def ends_with_a(prompt, completion: str, row: dict) -> float:
    return 1.0 if completion.rstrip().endswith("a") else 0.0


def raises(prompt, completion, row):
    raise KeyError("no such field")


NOT_A_FUNCTION = 3


def grpo_config(base, data, out, **kw):
    """A 4-step LoRA GRPO run in f32: 2 prompts x 4 completions per micro-batch, 2 micro-batches."""
    from surogate.config import load_config

    c = {"model": str(base), "output_dir": str(out), "datasets": [{"path": str(data)}],
         "reward_functions": ["length", "sgtest.grpo:ends_with_a"], "reward_weights": [1.0, 0.5],
         "num_generations": 4, "max_prompt_length": 32, "max_completion_length": 8,
         "per_device_train_batch_size": 2, "gradient_accumulation_steps": 2, "recipe": "fp32",
         "learning_rate": 1e-2, "lr_scheduler_type": "constant", "max_steps": 4, "lora_rank": 8, "lora_alpha": 16,
         "save_steps": 0, "seed": 7, "beta": 0.04}
    c.update(kw)
    return load_config(c, kind="grpo")
