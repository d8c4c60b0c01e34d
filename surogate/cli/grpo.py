"""`surogate grpo CONFIG`: group relative policy optimization: sample, reward, update."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from surogate.cli.not_built import not_built


def grpo(
    config: Annotated[Path, typer.Argument(metavar="CONFIG", help="The run's YAML config.", show_default=False)],
) -> None:
    """Reinforcement learning with GRPO: sample, reward, update."""
    not_built("grpo", 'training: GRPO, after issue #5 sft/pt')
