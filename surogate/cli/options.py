"""Options several commands share."""

from __future__ import annotations

from typing import Annotated

import typer

RayOption = Annotated[str | None, typer.Option(
    "--ray", metavar="ADDRESS", show_default=False,
    help="Train on the nodes of a Ray cluster, one rank per node: auto (the running cluster), local (a new "
         "one on this machine) or ray://HOST:PORT. Sets the config's distributed.ray_address.")]
NodesOption = Annotated[int | None, typer.Option(
    "--nodes", metavar="N", show_default=False,
    help="Ranks (one per node) with --ray; 0: every node. Sets distributed.num_nodes.")]
