"""`surogate merge --adapter DIR --output DIR [--base MODEL]`: fold a LoRA adapter into its base."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def merge(
    adapter: Annotated[Path, typer.Option(help="PEFT-format adapter folder.", show_default=False)],
    output: Annotated[Path, typer.Option(help="Folder for the merged HF checkpoint.", show_default=False)],
    base: Annotated[
        str | None,
        typer.Option(help="Base model (HF folder or cached hub id); default: the one the adapter names.",
                     show_default=False),
    ] = None,
) -> None:
    """Merge a LoRA adapter into its base model (HF checkpoint)."""
    from surogate.train.export import merge_adapter

    out = merge_adapter(base, adapter, output)
    typer.echo(f"merged {adapter} into {out}")
