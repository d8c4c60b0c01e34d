"""`surogate sft CONFIG`: supervised fine-tuning on chat, instruction or text data."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from surogate.cli.options import NodesOption, RayOption


def sft(
    config: Annotated[Path, typer.Argument(metavar="CONFIG", help="The run's YAML config.", show_default=False)],
    ray: RayOption = None,
    nodes: NodesOption = None,
) -> None:
    """Supervised fine-tuning (LoRA, QLoRA or full weights)."""
    from surogate.train.run import run

    run(config, "sft", ray_address=ray, num_nodes=nodes)
