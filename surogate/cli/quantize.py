"""`surogate quantize MODEL --type Q4_K_M --output model.gguf`: write a model as a GGUF file.

The recipes (which tensor gets which type) are in surogate/io/gguf_writer.py's header.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

# Kept here as text so `surogate --help` does not import the io package; gguf_writer checks it too.
TYPES = ("Q8_0", "Q4_K_M", "Q5_K_M", "Q6_K", "BF16", "F16", "F32")


def quantize(
    model: Annotated[str, typer.Argument(metavar="MODEL", help="HF model folder (e.g. a merged fine-tune) or "
                                         "cached hub id.", show_default=False)],
    output: Annotated[Path, typer.Option("--output", "-o", help="The .gguf file to write.", show_default=False)],
    type_: Annotated[str, typer.Option("--type", help="GGUF type: " + ", ".join(TYPES) + ".")] = "Q8_0",
) -> None:
    """Quantize a model to a GGUF file (for llama.cpp, Ollama, ...); a Gemma 3 with images also gets its
    vision tower as llama.cpp's mmproj-<output name> (F16) beside it."""
    if type_.upper() not in TYPES:
        raise typer.BadParameter(f"{type_!r} is not one of {', '.join(TYPES)}", param_hint="'--type'")
    from surogate.models.gguf_names import quantize_to_gguf

    start, start_wall = time.perf_counter(), time.time()

    def progress(index: int, count: int, name: str, ggml_type: str, shape: tuple) -> None:
        width = len(str(count))
        typer.echo(f"[{index + 1:>{width}}/{count}] {ggml_type:<5} {name} {list(shape)}", err=True)

    out = quantize_to_gguf(model, output, type_.upper(), progress=progress)
    size = out.stat().st_size
    typer.echo(f"wrote {out} ({type_.upper()}, {size / 2**20:.1f} MiB) in {time.perf_counter() - start:.1f} s")
    from surogate.models.gguf_names import mmproj_path

    vision = mmproj_path(out)
    if vision.is_file() and vision.stat().st_mtime >= start_wall:
        typer.echo(f"wrote {vision} (its vision tower, F16, {vision.stat().st_size / 2**20:.1f} MiB)")
