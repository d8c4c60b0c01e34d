"""`surogate quantize MODEL OUTPUT`: write a model as a quantized GGUF file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from surogate.cli.not_built import not_built


def quantize(
    model: Annotated[str, typer.Argument(metavar="MODEL", help="HF id or checkpoint directory.", show_default=False)],
    output: Annotated[Path, typer.Argument(metavar="OUTPUT", help="The .gguf file to write.", show_default=False)],
    type_: Annotated[str, typer.Option("--type", help="GGUF quantization type, e.g. Q8_0, Q4_K_M.")] = "Q8_0",
) -> None:
    """Quantize a model to a GGUF file."""
    not_built("quantize", 'GGUF: issue #8')
