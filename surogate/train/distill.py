"""`surogate distill`: the SFT trainer's loop with a teacher's top-k next-token distribution as
a second target, the teacher's log-probs computed on the fly by our engine, or read from a
capture (`surogate distill capture`, distill_capture.py; ``distillation.teacher_logprobs``).

Per micro-batch, the teacher's logits Program runs on the student's input buffers; at every
position the student is trained on (the SFT targets), the teacher's k most likely tokens t_1..t_k
and their probabilities renormalized over those k, w_1..w_k, are taken. The loss per position is

    ce_weight * CE(student, data target) + kd_weight * sum_j w_j (log w_j - log p_student(t_j))

averaged over the step's target positions. The KL's student part is a sum of cross-entropies
with per-position weights, so it needs no new op: the SFT training Program runs once per term,
with ``targets`` set to t_j and the per-token seed ``dloss`` to kd_weight * w_j / positions
(the data target with ce_weight / positions for the CE term); the gradients add up in the f32
accumulators exactly as micro-batches do. That costs k (+1) forward + backward passes per
micro-batch, which is why top_k is small; a fused head op taking k weighted targets per row
would do it in one pass (not built yet). Every pass of a micro-batch draws the same LoRA
dropout masks: they are passes over one student forward.

Data parallel (``gpus: R``): each rank runs the teacher's logits Program over its own rows (one
teacher model in memory per process), or looks its rows up in the capture; the positions, and
so the seeds, are the whole step's.

The teacher must share the student's tokenizer (same vocabulary): a mismatch is an error
naming distillation.teacher_model. Step lines add ``kl`` and ``ce`` (means over positions).
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from surogate.config.distill import DistillConfig
from surogate.errors import ConfigError
from surogate.model import Model, load_model
from surogate.train.data import Batch
from surogate.train.trainer import MICRO_BATCH, Trainer

IGNORE = -100


class DistillTrainer(Trainer):
    cfg: DistillConfig

    def __init__(self, cfg: DistillConfig, model: Model | None = None, stream=None, teacher: Model | None = None,
                 dist=None):
        self._teacher = teacher
        super().__init__(cfg, model, stream, dist=dist)

    def _build(self) -> None:
        d = self.cfg.distillation
        self.vocab = self.model.tokenizer.vocab_size  # real tokens: both models may pad their heads past it
        self.captured = self.teacher = None
        if d.teacher_logprobs:  # the teacher's top-k from `surogate distill capture`: no teacher loaded
            from surogate.train.distill_capture import CapturedTeacher

            self.captured = CapturedTeacher(d.teacher_logprobs, self.model.tokenizer, d.top_k, self.cfg.sequence_len)
        else:  # one teacher for every data-parallel rank of this process (read only)
            self.teacher = self._teacher or load_model(d.teacher_model, device=self.model.device,
                                                       dtype=self.model.dtype)
            check_same_tokenizer(self.model, self.teacher)
        super()._build()

    def _build_rank(self) -> None:
        super()._build_rank()
        self.teacher_exe = None
        if self.teacher is not None:  # each rank's logits Program over its own inputs
            self.teacher_exe = self.teacher.executable("logits", self.N, self.N, shared=self.local_rank == 0)
            for n in ("input_ids", "position_ids", "cu_seqlens"):
                self.teacher_exe.bind(n, self.inputs[n], self.exe.tensor(n))
            self.teacher_exe.use_graphs(self.cfg.cuda_graphs)

    def fingerprint(self) -> str:
        d = self.cfg.distillation
        key = [super().fingerprint(), "distill", d.teacher_model, d.top_k, d.kd_weight, d.ce_weight]
        if d.teacher_logprobs:  # appended only when set: older fingerprints stay valid
            key.append(["teacher_logprobs", d.teacher_logprobs])
        return hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]

    def teacher_top_k(self, b: Batch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(positions [M] with a target, teacher token ids [M, k], renormalized probabilities [M, k])."""
        self._load_batch(b)
        if self.captured is not None:
            return self.captured.top_k(b)
        self.teacher_exe.run()
        rows = np.nonzero(b.targets != IGNORE)[0]
        from surogate.train.distill_capture import top_k_logprobs

        # most likely first (a fixed pass order); the same numbers a capture stores
        top, lp = top_k_logprobs(np.asarray(self.teacher_exe.read("logits"), np.float32)[rows],
                                 self.cfg.distillation.top_k, self.vocab)
        lp = lp.astype(np.float64)
        w = np.exp(lp - lp.max(axis=1, keepdims=True))
        return rows, top, w / w.sum(axis=1, keepdims=True)

    # ---- one step (Trainer._step_with_metrics) ----------------------------------------------
    def _micro_batches(self, batches: list[Batch], step: int, total: int) -> list[tuple]:
        """Per micro-batch: (its CE sum or None, the terms of its KL sum in order); ``total``: the
        whole step's target positions."""
        d = self.cfg.distillation
        seed = 1.0 / max(total, 1)
        parts = []
        for micro, b in enumerate(batches):
            rows, top, w = self.teacher_top_k(b)
            valid = b.targets != IGNORE
            ce = None
            last = micro == len(batches) - 1  # (the micro-batch's last pass is the step's last backward)
            if d.ce_weight > 0:
                per_token = self._pass(step, micro, b.targets, np.where(valid, d.ce_weight * seed, 0.0),
                                       last and top.shape[1] == 0)
                ce = float(per_token[valid].sum(dtype=np.float64))
            kl = [float((w * np.log(w)).sum())]
            for j in range(top.shape[1]):
                targets = np.full(len(b.targets), IGNORE, np.int32)
                targets[rows] = top[:, j]
                dloss = np.zeros(len(b.targets))
                dloss[rows] = d.kd_weight * seed * w[:, j]
                per_token = self._pass(step, micro, targets, dloss, last and j == top.shape[1] - 1)
                kl.append(float((w[:, j] * per_token[rows]).sum(dtype=np.float64)))
            parts.append((ce, kl))
        return parts

    def _reduce_step(self, parts: list[tuple], total: int) -> tuple[float, dict]:
        d = self.cfg.distillation
        ce_sum = kl_sum = 0.0
        for ce, kl in parts:
            ce_sum += ce or 0.0
            for x in kl:
                kl_sum += x
        n = max(total, 1)
        kl, ce = kl_sum / n, ce_sum / n if d.ce_weight > 0 else None
        loss = d.kd_weight * kl + (d.ce_weight * ce if ce is not None else 0.0)
        return loss, {"kl": kl, **({"ce": ce} if ce is not None else {})}

    def _pass(self, step: int, micro: int, targets: np.ndarray, dloss: np.ndarray, last: bool) -> np.ndarray:
        """One forward + backward of the student with these targets and seed (``last``: the
        step's last backward on this rank); its per-token loss."""
        self._dropout_seed(step, micro)
        self.inputs["targets"][:] = targets
        self.inputs["dloss"][:] = dloss
        self.exe.push("targets")
        self.exe.push("dloss")
        self._last_backward(last)
        self.exe.run(*MICRO_BATCH)
        return np.array(self.exe.read("loss"), np.float64)


def check_same_tokenizer(student: Model, teacher: Model) -> None:
    s, t = student.tokenizer, teacher.tokenizer
    if t is None:
        raise ConfigError(f"the teacher {teacher.path} has no tokenizer.json", where="distillation.teacher_model",
                          hint="the teacher's folder needs the tokenizer it was trained with")
    if s.backend.get_vocab(with_added_tokens=True) != t.backend.get_vocab(with_added_tokens=True):
        raise ConfigError(f"the teacher {teacher.path} and the student {student.path} have different tokenizers "
                          f"(vocabularies of {t.vocab_size} and {s.vocab_size} tokens, or the same size with other "
                          "tokens)", where="distillation.teacher_model",
                          hint="top-k distillation compares token ids: pick a teacher of the student's family "
                               "(the same tokenizer)")
