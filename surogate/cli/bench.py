"""`surogate bench`: measure this machine against the peer, as a table with ratios."""

from __future__ import annotations

from surogate.cli.not_built import not_built


def bench() -> None:
    """Benchmark kernels and a training step on this machine."""
    not_built("bench", 'benchmarks: issues #4 CUDA training speed and #6 inference engine')
