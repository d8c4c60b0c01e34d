"""`surogate dpo`: the SFT trainer's loop, checkpoints and outputs, with a preference loss.

One micro-batch is B pairs (chosen and rejected as documents 2i, 2i+1, see
`train.data.preference`). Per micro-batch:

1. the reference runs its forward: per-token losses -> sequence log-probs of each completion;
2. the policy runs its ``forward`` phase (the same Program `surogate sft` trains), likewise;
3. Python computes the pair losses and d loss / d log-prob (`dpo_loss`), and writes them into
   the per-token loss seed ``dloss`` (log-prob = -loss per token, so a completion token of a
   chosen sequence gets -dloss/dx / P and one of a rejected sequence +dloss/dx / P, P the
   pairs of the whole step; IPO divides by the completion's token count too);
4. the policy runs its ``backward`` phase: the fused head + cross-entropy backward already takes
   a per-token upstream gradient, so no op changes.

The reference for LoRA is the same base weights through a Program built without the adapter
(no second copy of the weights); for full fine-tuning, a Program bound to a frozen copy of the
starting weights. Both read the policy's input buffers.

Data parallel (``gpus: R``): a global micro-batch of B * R pair slots is cut into the ranks' B
(`PreferencePairs.split`), each rank runs its own reference and policy over them, and the pair
values come back in the one-rank order; the seeds are over the whole step's pairs.

Step lines carry TRL's metric names: ``rewards/chosen``, ``rewards/rejected``,
``rewards/accuracies``, ``rewards/margins``, ``logps/chosen``, ``logps/rejected``
(evaluation: the same with an ``eval_`` prefix, and ``eval_loss``).
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from surogate.config.dpo import DPOConfig
from surogate.train.data.preference import PairBatch, build_preference_datasets
from surogate.train.dpo_loss import preference_loss
from surogate.train.trainer import Trainer

REWARD_KEYS = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
               "logps/rejected")


class DPOTrainer(Trainer):
    cfg: DPOConfig

    # ---- setup ------------------------------------------------------------------------------
    def _datasets(self):
        return build_preference_datasets(self.cfg, self.model.tokenizer)

    def _tokens_per_row(self) -> int:
        return 2 * self.cfg.max_length  # a "row" is one pair: chosen and rejected

    def _build_rank(self) -> None:
        super()._build_rank()
        self.ref_exe = self.reference_executable()  # (each data-parallel rank's, over its inputs)

    def fingerprint(self) -> str:
        c = self.cfg
        key = [super().fingerprint(), "dpo", c.loss_type, c.beta, c.label_smoothing, c.max_length,
               c.max_prompt_length, c.max_completion_length, c.truncation_mode]
        return hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]

    # ---- log-probs --------------------------------------------------------------------------
    def _sequence_logps(self, per_token_loss: np.ndarray, b: PairBatch) -> tuple[np.ndarray, np.ndarray]:
        """Summed completion log-probs [2P] (chosen, rejected interleaved) and their token counts."""
        valid = b.targets != -100
        logp = np.where(valid, -per_token_loss.astype(np.float64), 0.0)
        cu = b.cu_seqlens[:2 * b.pairs + 1].astype(np.int64)
        cs = np.concatenate([[0.0], np.cumsum(logp)])
        cv = np.concatenate([[0], np.cumsum(valid)])
        return cs[cu[1:]] - cs[cu[:-1]], cv[cu[1:]] - cv[cu[:-1]]

    def _pair_losses(self, b: PairBatch, policy_loss: np.ndarray, ref_loss: np.ndarray):
        c = self.cfg
        pol, counts = self._sequence_logps(policy_loss, b)
        ref, _ = self._sequence_logps(ref_loss, b)
        if c.loss_type == "ipo":  # TRL: IPO compares mean per-token log-probs
            scale = 1.0 / np.maximum(counts, 1)
            pol, ref = pol * scale, ref * scale
        else:
            scale = np.ones(len(counts))
        out = preference_loss(pol[0::2], pol[1::2], ref[0::2], ref[1::2], loss_type=c.loss_type, beta=c.beta,
                              label_smoothing=c.label_smoothing)
        return out, pol, scale

    def _forward_pair(self, b: PairBatch, policy_exe) -> tuple:
        self._load_batch(b)
        self.ref_exe.run()
        ref_loss = np.array(self.ref_exe.read("loss"))
        if policy_exe is self.exe:
            self.exe.run("forward")
        else:
            policy_exe.run()
        return self._pair_losses(b, np.array(policy_exe.read("loss")), ref_loss)

    # ---- one step (Trainer._step_with_metrics) ----------------------------------------------
    def _step_count(self, batches: list[PairBatch]) -> int:
        return sum(b.pairs for b in batches)  # the loss is the mean over the step's pairs

    def _split(self, batch: PairBatch) -> list[PairBatch]:
        return self.train_data.split(batch, self.world)

    def _micro_batches(self, batches: list[PairBatch], step: int, total: int) -> list[tuple]:
        """Per micro-batch: its pairs' values for `_Rewards` (``total``: the whole step's pairs)."""
        parts = []
        for micro, b in enumerate(batches):
            self._dropout_seed(step, micro)
            out, pol, scale = self._forward_pair(b, self.exe)
            # d loss / d (per-token loss) = -d loss / d logp; chosen +dx, rejected -dx per pair.
            per_doc = np.empty(2 * b.pairs)
            per_doc[0::2], per_doc[1::2] = -out.dx, out.dx
            per_doc *= scale / max(total, 1)
            seg = np.diff(b.cu_seqlens.astype(np.int64))
            coeff = np.concatenate([per_doc, np.zeros(len(seg) - 2 * b.pairs)])
            dloss = self.inputs["dloss"]
            dloss[:] = np.where(b.targets != -100, np.repeat(coeff, seg), 0.0)
            self.exe.push("dloss")
            self._last_backward(micro == len(batches) - 1)
            self.exe.run("backward")
            parts.append(_Rewards.part(out, pol))
        return parts

    def _reduce_step(self, parts: list[tuple], total: int) -> tuple[float, dict]:
        acc = _Rewards(parts)
        return acc.loss(), acc.metrics()

    def _eval_metrics(self) -> dict:
        acc = _Rewards()
        for b in self.eval_data.batches(self.B, shuffle=False):
            out, pol, _ = self._forward_pair(b, self.eval_exe)
            acc.add(out, pol)
        return {"eval_loss": acc.loss(), **{f"eval_{k}": v for k, v in acc.metrics().items()}}

    def evaluate(self) -> float | None:
        return None if self.eval_exe is None else self._eval_metrics()["eval_loss"]


class _Rewards:
    """Per-pair values of a step (or an evaluation), reduced to TRL's means."""

    def __init__(self, parts: list[tuple] | None = None):
        self.parts: list[tuple] = list(parts or [])

    @staticmethod
    def part(out, pol: np.ndarray) -> tuple:
        """One micro-batch's values (what a data-parallel rank hands back)."""
        return out.losses, out.chosen_rewards, out.rejected_rewards, pol[0::2], pol[1::2]

    def add(self, out, pol: np.ndarray) -> None:
        self.parts.append(self.part(out, pol))

    def _cat(self, i: int) -> np.ndarray:
        return np.concatenate([p[i] for p in self.parts]) if self.parts else np.zeros(0)

    def loss(self) -> float:
        losses = self._cat(0)
        return float(losses.mean()) if len(losses) else float("nan")

    def metrics(self) -> dict:
        chosen, rejected = self._cat(1), self._cat(2)
        if not len(chosen):
            return {}
        values = (chosen.mean(), rejected.mean(), (chosen > rejected).mean(), (chosen - rejected).mean(),
                  self._cat(3).mean(), self._cat(4).mean())
        return {k: float(v) for k, v in zip(REWARD_KEYS, values)}
