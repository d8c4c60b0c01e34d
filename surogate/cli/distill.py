"""`surogate distill CONFIG`: knowledge distillation from a teacher's top-k next-token distribution."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def distill(
    config: Annotated[Path, typer.Argument(metavar="CONFIG", help="The run's YAML config.", show_default=False)],
) -> None:
    """Distill a teacher model into a student (the teacher's top-k, computed on the fly)."""
    from surogate.train.run import run

    run(config, "distill")
