"""`surogate dpo CONFIG`: direct preference optimization on chosen / rejected pairs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from surogate.cli.not_built import not_built


def dpo(
    config: Annotated[Path, typer.Argument(metavar="CONFIG", help="The run's YAML config.", show_default=False)],
) -> None:
    """Preference tuning (DPO) on chosen / rejected pairs."""
    not_built("dpo", 'training: DPO, after issue #5 sft/pt')
