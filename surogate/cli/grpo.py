"""`surogate grpo CONFIG`: group relative policy optimization: sample, reward, update."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from surogate.cli.options import NodesOption, RayOption


def grpo(
    config: Annotated[Path, typer.Argument(metavar="CONFIG", help="The run's YAML config.", show_default=False)],
    ray: RayOption = None,
    nodes: NodesOption = None,
) -> None:
    """Reinforcement learning with GRPO: sample with the co-located engine, reward, update."""
    from surogate.train.run import run

    run(config, "grpo", ray_address=ray, num_nodes=nodes)
