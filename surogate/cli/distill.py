"""`surogate distill CONFIG`: knowledge distillation from a teacher's top-k next-token distribution;
`surogate distill capture CONFIG`: store the teacher's top-k first (distillation.teacher_logprobs)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from surogate.cli.options import NodesOption, RayOption


def distill(
    config: Annotated[str, typer.Argument(metavar="[capture] CONFIG", help="The run's YAML config; `capture CONFIG` "
                                          "stores the teacher's top-k at distillation.teacher_logprobs.",
                                          show_default=False)],
    capture_config: Annotated[Path | None, typer.Argument(hidden=True, show_default=False)] = None,
    ray: RayOption = None,
    nodes: NodesOption = None,
) -> None:
    """Distill a teacher model into a student (the teacher's top-k on the fly, or from a capture)."""
    if config == "capture":
        if capture_config is None:
            raise typer.BadParameter("surogate distill capture needs the run's YAML config", param_hint="CONFIG")
        if ray is not None or nodes is not None:
            raise typer.BadParameter("the capture runs in this process", param_hint="--ray / --nodes")
        from surogate.config import load_config
        from surogate.train.distill_capture import capture

        folder = capture(load_config(capture_config, kind="distill"))
        print(f"distill capture: {folder}")
        return
    if capture_config is not None:
        raise typer.BadParameter(f"unexpected argument {capture_config}", param_hint="CONFIG")
    from surogate.train.run import run

    run(Path(config), "distill", ray_address=ray, num_nodes=nodes)
