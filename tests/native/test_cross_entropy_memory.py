"""The fused LM head + cross-entropy never holds the [N, V] logits: what it takes from the
allocator, forward and backward, is a bounded block of them, the same at 512 and 4096 tokens."""

import numpy as np

from sgtest.ops import run_op
from surogate import _native

C, V = 32, 16384


def scratch_peak(n: int) -> int:
    rng = np.random.default_rng(0)
    h = rng.standard_normal((n, C)).astype(np.float32)
    w = (0.1 * rng.standard_normal((V, C))).astype(np.float32)
    t = rng.integers(0, V, n).astype(np.int32)
    _native.empty_cache("cpu")
    _native.reset_peak_stats("cpu")
    base = _native.allocator_stats("cpu")["allocated_bytes"]
    loss, lse = run_op("lm_head_ce_fwd", [h, w, t], [((n,), "float32"), ((n,), "float32")], chunk=4096)
    run_op("lm_head_ce_bwd", [h, w, t, lse, np.full(n, 1.0 / n, np.float32)],
           [((n, C), "float32"), ((V, C), "float32")], chunk=4096)
    assert np.isfinite(loss).all()
    return _native.allocator_stats("cpu")["peak_allocated_bytes"] - base


def test_the_head_takes_a_bounded_block_of_logits_whatever_the_tokens():
    small, large = scratch_peak(512), scratch_peak(4096)
    logits = 4096 * V * 4  # what the whole [N, V] f32 logits would take: 256 MiB
    assert large <= 16 << 20 < logits // 8, large
    assert large <= small + (1 << 20), (small, large)
