"""The config of `surogate distill`: the SFT tree plus a ``distillation:`` block (the original
Surogate's names): the teacher, how many of its top tokens per position the student matches,
and the weights of the KL and cross-entropy terms."""

from __future__ import annotations

from typing import ClassVar

import msgspec

from surogate.config.sft import SFTConfig


class DistillationConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    teacher_model: str  # a local HF model folder with the student's tokenizer
    top_k: int = 8  # teacher tokens per position (renormalized over them); each costs one pass
    kd_weight: float = 0.5  # the KL term: sum_k p_teacher(k) (log p_teacher(k) - log p_student(k))
    ce_weight: float = 0.5  # the ordinary next-token cross-entropy on the data
    # A folder of the teacher's top-k, written by `surogate distill capture` (the same config):
    # training reads it instead of running the teacher. None: the teacher runs on the fly.
    teacher_logprobs: str | None = None


class DistillConfig(SFTConfig, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """`surogate distill`: a student trained towards a teacher's top-k next-token distribution."""

    kind: ClassVar[str] = "distill"

    distillation: DistillationConfig
