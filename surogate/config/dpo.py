"""The config of `surogate dpo`: the SFT tree (model, data, batch, optimizer, LoRA, checkpoints)
plus the preference loss, with TRL's key names (``beta``, ``loss_type``, ``label_smoothing``,
``max_length``, ``max_prompt_length``, ``max_completion_length``, ``truncation_mode``).

A micro-batch holds ``per_device_train_batch_size`` pairs, each pair's chosen and rejected
sequence as two documents of at most ``max_length`` tokens, so ``sequence_len``,
``sample_packing`` and ``train_on`` have no meaning here (``not_used`` says what to set instead).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from surogate.config.sft import SFTConfig


class DPOConfig(SFTConfig, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """`surogate dpo`: direct preference optimization on prompt / chosen / rejected rows."""

    kind: ClassVar[str] = "dpo"
    # Inherited keys a DPO run does not read -> what to use instead (loader: an error naming the key).
    not_used: ClassVar[dict[str, str]] = {
        "sequence_len": "set max_length (prompt + completion tokens of one sequence)",
        "sample_packing": "remove it: each pair is two documents of at most max_length tokens",
        "train_on": "remove it: DPO scores the completion tokens (chosen / rejected) only",
    }

    # -- the loss --
    loss_type: Literal["sigmoid", "ipo"] = "sigmoid"  # sigmoid: DPO (Rafailov et al.); ipo: Azar et al.
    beta: float = 0.1  # the strength of the tie to the reference (IPO: 1 / (2 beta) is the target margin)
    label_smoothing: float = 0.0  # sigmoid only: the assumed share of flipped preference labels (cDPO)

    # -- lengths (tokens), as TRL's DPOConfig --
    max_length: int = 1024  # prompt + completion
    max_prompt_length: int | None = 512  # the prompt keeps its last tokens
    max_completion_length: int | None = None  # the completion keeps its first tokens
    # When prompt + completion is still over max_length: keep_end drops the prompt's first tokens,
    # keep_start the completion's last ones.
    truncation_mode: Literal["keep_end", "keep_start"] = "keep_end"

    def dataset_train_on(self, dataset) -> str:
        return "completion"
