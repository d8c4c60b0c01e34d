"""`surogate grpo` on the real default model (SmolLM2-135M-Instruct, CPU, f32): the built-in
length reward's mean rises within a few steps. Slow (about 30 s a step on a loaded 2-core box):
each step samples 16 completions with the engine and trains on them."""

from __future__ import annotations

import json

import pytest

from sgtest.qa import step_records
from sgtest.smollm2 import smollm2_path
from surogate.config import load_config
from surogate.train.grpo import GRPOTrainer
from surogate.train.grpo_env import arithmetic_rows


@pytest.mark.slow
def test_the_length_reward_rises_on_smollm2(tmp_path):
    gguf = smollm2_path()
    data = tmp_path / "prompts.jsonl"
    with open(data, "w") as f:  # "3 + 4 =": plain prompts of a few tokens, an answer of 4 characters wanted
        for r in arithmetic_rows(16, 0):
            question = r["prompt"][0]["content"].split("?")[0].removeprefix("What is ")
            f.write(json.dumps({"prompt": f"{question} =", "answer": r["answer"], "target_length": 4}) + "\n")
    cfg = load_config({"model": str(gguf), "output_dir": str(tmp_path / "run"), "datasets": [{"path": str(data)}],
                       "reward_functions": ["length", "arithmetic_exact"], "reward_weights": [1.0, 0.0],
                       "num_generations": 8, "max_prompt_length": 8, "max_completion_length": 8,
                       "per_device_train_batch_size": 2, "gradient_accumulation_steps": 1, "recipe": "fp32",
                       "learning_rate": 5e-3, "lr_scheduler_type": "constant", "max_steps": 3, "lora_rank": 16,
                       "lora_alpha": 32, "save_steps": 0, "seed": 7, "beta": 0.0}, kind="grpo")
    GRPOTrainer(cfg).train()
    steps = step_records(tmp_path / "run")
    rewards = [s["rewards/length/mean"] for s in steps]
    # Measured: 0.28, 0.48, 0.50 (the completions learn to spend their 8 tokens on short pieces).
    assert rewards[-1] > rewards[0] + 0.1, rewards
    assert all(s["sampling/sampling_logp_difference/max"] < 1e-3 for s in steps)
