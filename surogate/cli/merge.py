"""`surogate merge ADAPTER OUTPUT`: fold a LoRA adapter into its base model's weights."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from surogate.cli.not_built import not_built


def merge(
    adapter: Annotated[
        Path, typer.Argument(metavar="ADAPTER", help="PEFT-format adapter directory.", show_default=False)
    ],
    output: Annotated[
        Path, typer.Argument(metavar="OUTPUT", help="Directory for the merged HF checkpoint.", show_default=False)
    ],
    base: Annotated[
        str | None,
        typer.Option(help="Base model (HF id or path); default: the one the adapter names.", show_default=False),
    ] = None,
) -> None:
    """Merge a LoRA adapter into its base model (HF checkpoint)."""
    not_built("merge", 'training: issue #5 sft/pt, merge')
