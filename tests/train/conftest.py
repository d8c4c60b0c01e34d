"""Tiny tokenizers in both chat styles (built offline once per session)."""

from __future__ import annotations

import pytest
from sgtest import tiny_models

from surogate.io import Tokenizer


@pytest.fixture(scope="session")
def tokenizers_by_style(tmp_path_factory):
    return {style: Tokenizer.from_folder(tiny_models.make_tokenizer(tmp_path_factory.mktemp(f"tok_{style}"), style))
            for style in ("llama3", "chatml")}


@pytest.fixture(params=["llama3", "chatml"])
def tokenizer(request, tokenizers_by_style):
    return tokenizers_by_style[request.param]


@pytest.fixture
def llama3(tokenizers_by_style):
    return tokenizers_by_style["llama3"]
