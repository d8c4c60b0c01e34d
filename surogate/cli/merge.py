"""`surogate merge --adapter DIR --output DIR [--base MODEL] [--type FP8]`: fold a LoRA adapter into its base."""

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
    type_: Annotated[
        str | None,
        typer.Option("--type", help="FP8: write the merged model as a block-FP8 folder (as `surogate quantize "
                     "--type FP8` does); default: the base's dtype.", show_default=False),
    ] = None,
) -> None:
    """Merge a LoRA adapter into its base model (HF checkpoint)."""
    if type_ is not None and type_.upper() != "FP8":
        raise typer.BadParameter(f"{type_!r}: merge writes FP8 or the base's dtype", param_hint="'--type'")
    from surogate.train.export import merge_adapter

    out = merge_adapter(base, adapter, output, quantize=type_, warn=lambda m: typer.echo(f"warning: {m}", err=True))
    typer.echo(f"merged {adapter} into {out}" + (" (FP8)" if type_ else ""))
