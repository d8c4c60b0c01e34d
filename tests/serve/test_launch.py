"""surogate.serve.launch: the KV cache's size (16,384 tokens on the CPU; on a GPU what fits in
--gpu-memory-utilization after the weights, split between the models) and its errors."""

from __future__ import annotations

import pytest

from sgtest.tiny_models import make_qwen3
from surogate.errors import InvalidArgumentError
from surogate.serve.launch import CPU_KV_TOKENS, GPU_RESERVE, kv_tokens_for, launch

GiB = 1 << 30
QWEN3_06B_BF16 = 2 * 28 * 8 * 128 * 2  # K and V bytes per token


def test_kv_tokens_for_an_h200():
    total = 140 * GiB
    tokens = kv_tokens_for(total, used=int(1.2 * GiB), fraction=0.9, share=1.0, bytes_per_token=QWEN3_06B_BF16,
                           block_size=16)
    assert tokens % 16 == 0
    assert tokens * QWEN3_06B_BF16 <= 0.9 * total - 1.2 * GiB - GPU_RESERVE < (tokens + 16) * QWEN3_06B_BF16
    assert 1_000_000 < tokens < 1_200_000


def test_models_sharing_a_gpu_split_what_is_left():
    args = dict(fraction=0.9, bytes_per_token=QWEN3_06B_BF16, block_size=16)
    first = kv_tokens_for(80 * GiB, used=2 * GiB, share=0.5, **args)
    # the second model sees the first one's KV as used, and takes all that is left
    second = kv_tokens_for(80 * GiB, used=2 * GiB + first * QWEN3_06B_BF16, share=1.0, **args)
    assert abs(first - second) <= 16


def test_no_room_gives_zero_not_a_negative_size():
    assert kv_tokens_for(4 * GiB, used=3 * GiB, fraction=0.9, share=1.0, bytes_per_token=QWEN3_06B_BF16,
                         block_size=16) == 0


def test_cpu_default_and_explicit_sizes(tmp_path):
    path = make_qwen3(tmp_path / "q")
    m = launch(str(path), device="cpu")
    try:
        assert m.kv_cache_tokens == CPU_KV_TOKENS
    finally:
        m.client.close()
    m = launch(str(path), device="cpu", kv_cache_tokens=1000)
    try:
        assert m.kv_cache_tokens == 992  # whole blocks of 16
    finally:
        m.client.close()
    with pytest.raises(InvalidArgumentError, match="gpu-memory-utilization"):
        launch(str(path), device="cpu", gpu_memory_utilization=1.5)
