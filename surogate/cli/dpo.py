"""`surogate dpo CONFIG`: direct preference optimization on chosen / rejected pairs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from surogate.cli.options import NodesOption, RayOption


def dpo(
    config: Annotated[Path, typer.Argument(metavar="CONFIG", help="The run's YAML config.", show_default=False)],
    ray: RayOption = None,
    nodes: NodesOption = None,
) -> None:
    """Preference tuning (DPO / IPO) on prompt, chosen and rejected rows."""
    from surogate.train.run import run

    run(config, "dpo", ray_address=ray, num_nodes=nodes)
