"""Import the gateway under its shipped name, ``surogate.gateway``, in the development layout.

The wheel maps the top-level ``gateway/`` folder to ``surogate/gateway`` (pyproject's
``wheel.packages``). In a source checkout run with ``PYTHONPATH=$PWD`` that mapping does not
exist, so when ``surogate.gateway`` is not importable we register the folder under that name,
exactly as the wheel lays it out (the package uses relative imports only). An installed
surogate that has the gateway is used as is.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

import surogate


def _install_dev_gateway() -> None:
    try:
        importlib.import_module("surogate.gateway")
        return
    except ImportError:
        pass
    root = Path(__file__).resolve().parents[2] / "gateway"
    spec = importlib.util.spec_from_file_location("surogate.gateway", root / "__init__.py",
                                                  submodule_search_locations=[str(root)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["surogate.gateway"] = module
    spec.loader.exec_module(module)
    surogate.gateway = module


_install_dev_gateway()


@pytest.fixture(scope="session")
def tiny_tokenizers(tmp_path_factory):
    """The tiny tokenizers of tests/sgtest, in both chat styles (Qwen3-like ChatML, Llama 3)."""
    from sgtest import tiny_models

    from surogate.io import Tokenizer

    return {style: Tokenizer.from_folder(tiny_models.make_tokenizer(tmp_path_factory.mktemp(f"gw_{style}"), style))
            for style in ("chatml", "llama3")}
