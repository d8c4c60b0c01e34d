"""The preference losses of `surogate dpo`, per pair, with their derivative: TRL's formulas.

Inputs are sequence log-probs of the completions (P pairs): the policy's and the reference's,
for chosen and rejected. With x = (policy_chosen - policy_rejected) - (ref_chosen - ref_rejected):

- sigmoid (DPO): -(1 - eps) log sigmoid(beta x) - eps log sigmoid(-beta x), eps = label_smoothing
  (cDPO); at x = 0 (policy = reference) every pair's loss is ln 2.
- ipo: (x - 1 / (2 beta))^2, on log-probs averaged over each completion's tokens (TRL divides
  them by the token count for ipo; `DPOTrainer` does that before calling here).

rewards: beta (policy - reference) for chosen and rejected, as TRL logs them. The derivative is
d loss / d x; d x / d policy_chosen = 1 and d x / d policy_rejected = -1. Computed in float64:
the numbers are P per step, the precision free.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class PreferenceLoss(NamedTuple):
    losses: np.ndarray  # [P]
    dx: np.ndarray  # [P]: d loss_i / d x_i
    chosen_rewards: np.ndarray  # [P]
    rejected_rewards: np.ndarray  # [P]


def _log_sigmoid(z: np.ndarray) -> np.ndarray:
    return -np.logaddexp(0.0, -z)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return np.exp(_log_sigmoid(z))


def preference_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, *, loss_type: str = "sigmoid",
                    beta: float = 0.1, label_smoothing: float = 0.0) -> PreferenceLoss:
    pc, pr, rc, rr = (np.asarray(a, np.float64) for a in (policy_chosen, policy_rejected, ref_chosen, ref_rejected))
    x = (pc - pr) - (rc - rr)
    if loss_type == "sigmoid":
        eps = label_smoothing
        losses = -(1 - eps) * _log_sigmoid(beta * x) - eps * _log_sigmoid(-beta * x)
        dx = -(1 - eps) * beta * _sigmoid(-beta * x) + eps * beta * _sigmoid(beta * x)
    elif loss_type == "ipo":
        d = x - 1.0 / (2.0 * beta)
        losses, dx = d * d, 2.0 * d
    else:
        raise ValueError(f"unknown loss_type {loss_type!r}")
    return PreferenceLoss(losses, dx, beta * (pc - rc), beta * (pr - rr))
