"""Ahead-of-time autodiff: one derivative rule per op (rules.py), one reverse walk (transform.py)."""

from surogate.autodiff.transform import backward, needs_grad

__all__ = ["backward", "needs_grad"]
