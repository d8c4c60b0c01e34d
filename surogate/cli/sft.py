"""`surogate sft CONFIG`: supervised fine-tuning on chat, instruction or text data."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from surogate.cli.not_built import not_built


def sft(
    config: Annotated[Path, typer.Argument(metavar="CONFIG", help="The run's YAML config.", show_default=False)],
) -> None:
    """Supervised fine-tuning (LoRA, QLoRA or full weights)."""
    not_built("sft", 'training: issue #5 sft/pt')
