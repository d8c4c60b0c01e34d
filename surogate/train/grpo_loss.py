"""The GRPO loss of `surogate grpo`, per sampled token, with its derivative: TRL's formulas.

Shape letters: G completions per prompt (a group), S completions in the optimizer step, T
completion tokens (of this call: one micro-batch, flat). Per token t of completion i, with
r = exp(logp - old_logp) (old_logp: the sampler's log-prob of the token, which the engine
returned) and A_i the completion's advantage:

    l_t = -min(r A_i, clip(r, 1 - eps_low, 1 + eps_high) A_i) + beta kl_t,
    kl_t = exp(ref - logp) - (ref - logp) - 1     (k3, the reference: the base model)

and the step's loss is sum_t w_t l_t, the weights by ``loss_type``:

- grpo:    1 / (S * len_i)               (each completion's mean, then the mean over completions)
- dapo:    1 / (completion tokens of the step)   (token-level: long answers count per token)
- dr_grpo: 1 / (S * max_completion_length)       (Dr. GRPO: no length bias)

d l_t / d logp = -r A_i where the unclipped term is the minimum (clip's gradient is 0 outside
its range: the clipped tokens are those with r > 1 + eps_high and A > 0, or r < 1 - eps_low and
A < 0), plus beta (1 - exp(ref - logp)). Advantages: rewards minus their group's mean, divided
by the group's (``scale_rewards: group``) or the whole step's (``batch``) unbiased std + 1e-4, as
TRL does. Computed in float64: T numbers per micro-batch, the precision free.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

LOSS_TYPES = ("grpo", "dapo", "dr_grpo")


def group_advantages(rewards: np.ndarray, num_generations: int, scale: str = "group") -> np.ndarray:
    """[S] advantages of [S] rewards, groups of ``num_generations`` consecutive completions."""
    r = np.asarray(rewards, np.float64).reshape(-1, num_generations)
    adv = r - r.mean(axis=1, keepdims=True)
    if scale == "group":
        adv = adv / (r.std(axis=1, ddof=1, keepdims=True) + 1e-4)
    elif scale == "batch":
        adv = adv / (r.std(ddof=1) + 1e-4)
    elif scale != "none":
        raise ValueError(f"unknown scale_rewards {scale!r}")
    return adv.reshape(-1)


def token_weights(loss_type: str, seq_lens: np.ndarray, num_seqs: int, num_tokens: int,
                  max_completion_length: int) -> np.ndarray:
    """[S'] the weight of one token of each completion (``seq_lens`` of this call's completions):
    ``num_seqs`` / ``num_tokens`` are the whole step's completions and completion tokens."""
    lens = np.asarray(seq_lens, np.float64)
    if loss_type == "grpo":
        return 1.0 / (num_seqs * np.maximum(lens, 1.0))
    if loss_type == "dapo":
        return np.full(len(lens), 1.0 / max(num_tokens, 1))
    if loss_type == "dr_grpo":
        return np.full(len(lens), 1.0 / (num_seqs * max_completion_length))
    raise ValueError(f"unknown loss_type {loss_type!r}")


class GRPOTokenLoss(NamedTuple):
    loss: float  # sum_t w_t l_t over this call's tokens (its share of the step's loss)
    dlogp: np.ndarray  # [T] d loss / d logp_t
    kl: np.ndarray  # [T] kl_t (zeros without a reference)
    ratio: np.ndarray  # [T] r
    low_clipped: np.ndarray  # [T] bool: r < 1 - eps_low and A < 0
    high_clipped: np.ndarray  # [T] bool: r > 1 + eps_high and A > 0


def grpo_token_loss(logp, old_logp, ref_logp, advantages, weights, *, beta: float, eps_low: float,
                    eps_high: float) -> GRPOTokenLoss:
    """Per-token arrays [T]: the policy's, the sampler's and the reference's (None: beta is 0)
    log-probs of each sampled token, its completion's advantage and its weight (token_weights)."""
    logp, old, adv, w = (np.asarray(a, np.float64) for a in (logp, old_logp, advantages, weights))
    ratio = np.exp(logp - old)
    clipped = np.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    per_token = -np.minimum(ratio * adv, clipped * adv)
    low = (ratio < 1.0 - eps_low) & (adv < 0)
    high = (ratio > 1.0 + eps_high) & (adv > 0)
    dlogp = np.where(low | high, 0.0, -ratio * adv)
    kl = np.zeros_like(logp)
    if beta != 0.0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs the reference's log-probs")
        d = np.asarray(ref_logp, np.float64) - logp
        kl = np.exp(d) - d - 1.0
        per_token = per_token + beta * kl
        dlogp = dlogp + beta * (1.0 - np.exp(d))
    return GRPOTokenLoss(float((w * per_token).sum()), w * dlogp, kl, ratio, low, high)
