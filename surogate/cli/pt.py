"""`surogate pt CONFIG`: continued pretraining: the loss covers every token."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from surogate.cli.options import NodesOption, RayOption


def pt(
    config: Annotated[Path, typer.Argument(metavar="CONFIG", help="The run's YAML config.", show_default=False)],
    ray: RayOption = None,
    nodes: NodesOption = None,
) -> None:
    """Continued pretraining on raw text."""
    from surogate.train.run import run

    run(config, "pt", ray_address=ray, num_nodes=nodes)
