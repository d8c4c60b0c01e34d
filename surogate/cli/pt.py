"""`surogate pt CONFIG`: continued pretraining: the loss covers every token."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def pt(
    config: Annotated[Path, typer.Argument(metavar="CONFIG", help="The run's YAML config.", show_default=False)],
    ray: Annotated[str | None, typer.Option(
        "--ray", metavar="ADDRESS", show_default=False,
        help="Train on the nodes of a Ray cluster, one rank per node: auto (the running cluster), local (a new "
             "one on this machine) or ray://HOST:PORT. Sets the config's distributed.ray_address.")] = None,
    nodes: Annotated[int | None, typer.Option(
        "--nodes", metavar="N", show_default=False,
        help="Ranks (one per node) with --ray; 0: every node. Sets distributed.num_nodes.")] = None,
) -> None:
    """Continued pretraining on raw text."""
    from surogate.train.run import run

    run(config, "pt", ray_address=ray, num_nodes=nodes)
