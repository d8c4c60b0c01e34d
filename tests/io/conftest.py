"""Tiny model folders, built once per test session (transformers and torch load only when a test asks)."""

from __future__ import annotations

import pytest

from sgtest import tiny_models


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory):
    return tiny_models.make_llama(tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="session")
def llama_sharded_dir(tmp_path_factory):
    # Same seed as llama_dir, so the same weights, spread over several shards.
    return tiny_models.make_llama(tmp_path_factory.mktemp("llama_sharded"), max_shard_size="60KB")


@pytest.fixture(scope="session")
def qwen3_dir(tmp_path_factory):
    return tiny_models.make_qwen3(tmp_path_factory.mktemp("qwen3"), dtype="bfloat16")


@pytest.fixture(scope="session", params=["llama3", "chatml"])
def tokenizer_dir(request, tmp_path_factory):
    """A tokenizer-only folder in each style."""
    return tiny_models.make_tokenizer(tmp_path_factory.mktemp(f"tok_{request.param}"), request.param)


@pytest.fixture(scope="session")
def hf_tokenizer():
    """transformers' AutoTokenizer for a folder, cached per folder."""
    from transformers import AutoTokenizer

    cache = {}

    def load(path):
        if str(path) not in cache:
            cache[str(path)] = AutoTokenizer.from_pretrained(str(path))
        return cache[str(path)]

    return load
