"""The config of `surogate grpo`: the SFT tree (model, data, batch, optimizer, LoRA, checkpoints)
plus the rollouts, the rewards and the clipped policy-gradient loss, with TRL's GRPOConfig key
names (``num_generations``, ``max_prompt_length``, ``max_completion_length``, ``temperature``,
``beta``, ``epsilon``, ``epsilon_high``, ``loss_type``, ``scale_rewards``, ``reward_weights``).

Full fine-tuning (``lora: false``) is supported: the co-located engine reads the very weight
arrays the optimizer updates, so it samples from the current policy either way.

Where we differ from TRL: ``per_device_train_batch_size`` counts *prompts* per micro-batch (each
brings its ``num_generations`` completions), so a prompt's group never spans micro-batches; and
``reward_functions`` lists import paths (``pkg.module:fn``) or the names of the built-in rewards
(surogate.train.grpo_env), not callables; and one step is one batch of rollouts with its
``num_iterations`` optimizer updates (TRL counts each update as a step): ``max_steps`` counts
rollout batches and the learning-rate schedule advances once per step. The trainer's log-probs
are over logits / ``temperature``, as TRL's.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from surogate.config.sft import SFTConfig


class GRPOConfig(SFTConfig, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """`surogate grpo`: group relative policy optimization over prompts and reward functions."""

    kind: ClassVar[str] = "grpo"
    not_used: ClassVar[dict[str, str]] = {
        "sequence_len": "set max_prompt_length and max_completion_length",
        "sample_packing": "remove it: each completion is one document of its micro-batch",
        "train_on": "remove it: GRPO scores the sampled completion tokens only",
        "validation_datasets": "remove it: a GRPO run has no evaluation split (the rewards are its measure)",
        "validation_split_ratio": "remove it: a GRPO run has no evaluation split (the rewards are its measure)",
    }

    # -- rollouts (sampled by the serving engine in this process, over the trainer's weights) --
    num_generations: int = 8  # completions per prompt: one group
    max_prompt_length: int = 512  # a longer prompt keeps its last tokens
    max_completion_length: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off

    # -- rewards --
    reward_functions: list[str]  # "pkg.module:fn" (fn(prompt, completion, row) -> float) or a built-in name
    reward_weights: list[float] | None = None  # one per function; None: all 1
    scale_rewards: Literal["group", "batch", "none"] = "group"  # divide advantages by the std of ...

    # -- the loss --
    loss_type: Literal["grpo", "dapo", "dr_grpo"] = "grpo"  # how per-token losses are averaged (TRL's names)
    beta: float = 0.04  # the KL penalty to the reference (the base model, adapter off); 0: no reference pass
    epsilon: float = 0.2  # the ratio's lower clip: 1 - epsilon
    epsilon_high: float | None = None  # the upper clip 1 + epsilon_high (DAPO's clip-higher); None: epsilon
    num_iterations: int = 1  # optimizer updates per batch of rollouts (TRL's mu); > 1: the ratio moves off 1

    @property
    def clip_high(self) -> float:
        return self.epsilon if self.epsilon_high is None else self.epsilon_high
