"""`surogate pt CONFIG`: continued pretraining: the loss covers every token."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from surogate.cli.not_built import not_built


def pt(
    config: Annotated[Path, typer.Argument(metavar="CONFIG", help="The run's YAML config.", show_default=False)],
) -> None:
    """Continued pretraining on raw text."""
    not_built("pt", 'training: issue #5 sft/pt')
