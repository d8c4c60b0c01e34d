"""Cases for the qkv_rope_cache op (its CPU test and its CUDA-vs-CPU test): rope variants and
one serving step's inputs."""

from __future__ import annotations

import numpy as np

from sgtest.ops import as_dtype

ROPE = {
    "default": {"theta": 1000000.0},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {"theta": 500000.0, "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position": 8192},
}


def make_case(seed, n, hq, hkv, d, dtype, num_blocks=7, block_size=4, pad=(1, 4)):
    """Inputs of one step: n tokens at scattered positions, distinct shuffled slots with the
    tokens at `pad` set to -1, garbage caches, norm weights around 1."""
    rng = np.random.default_rng(seed)

    def rand(*shape, scale=1.0, shift=0.0):
        return as_dtype((rng.standard_normal(shape) * scale + shift).astype(np.float32), dtype)

    slots = rng.permutation(num_blocks * block_size)[:n].astype(np.int32)
    slots[[i for i in pad if i < n]] = -1
    return {
        "q": rand(n, hq, d, scale=3.0), "k": rand(n, hkv, d, scale=3.0), "v": rand(n, hkv, d),
        "pos": rng.integers(0, 40_000, n).astype(np.int32), "slots": slots,
        "k_cache": rand(num_blocks, block_size, hkv, d), "v_cache": rand(num_blocks, block_size, hkv, d),
        "q_norm": rand(d, scale=0.2, shift=1.0), "k_norm": rand(d, scale=0.2, shift=1.0),
    }
