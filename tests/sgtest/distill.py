"""The run config the distillation tests share: a tiny student and teacher, top-4 KL + CE, LoRA."""

from __future__ import annotations

from surogate.config import load_config


def distill_config(student, teacher, data, out, *, max_steps: int = 6, distillation: dict | None = None, **kw):
    """`surogate distill`'s config over ``data`` (messages); ``distillation`` keys override the
    teacher's defaults (e.g. ``teacher_logprobs``), ``kw`` the run's."""
    c = {"model": str(student), "output_dir": str(out), "datasets": [{"path": str(data), "type": "messages"}],
         "sequence_len": 64, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 2, "recipe": "fp32",
         "learning_rate": 1e-2, "lr_scheduler_type": "constant", "max_steps": max_steps, "lora_rank": 8,
         "lora_alpha": 16, "save_steps": 0, "eval_steps": 0, "seed": 7,
         "distillation": {"teacher_model": str(teacher), "top_k": 4, "kd_weight": 0.7, "ce_weight": 0.3,
                          **(distillation or {})}}
    c.update(kw)
    return load_config(c, kind="distill")
