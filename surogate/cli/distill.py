"""`surogate distill CONFIG`: knowledge distillation from a teacher's top-k logits."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from surogate.cli.not_built import not_built


def distill(
    config: Annotated[Path, typer.Argument(metavar="CONFIG", help="The run's YAML config.", show_default=False)],
) -> None:
    """Distill a teacher model into a student (top-k logits)."""
    not_built("distill", 'training: distillation, after issue #5 sft/pt')
