"""`surogate quantize MODEL --type Q4_K_M --output model.gguf`: write a model as a GGUF file;
`surogate quantize MODEL --type FP8 --output FOLDER`: as a block-FP8 HF folder (vLLM's and the
``*-FP8`` releases' layout).

The GGUF recipes (which tensor gets which type) are in surogate/io/gguf_writer.py's header, the
FP8 layout in surogate/train/fp8_export.py's.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

# Kept here as text so `surogate --help` does not import the io package; gguf_writer checks it too.
TYPES = ("Q8_0", "Q4_K_M", "Q5_K_M", "Q6_K", "BF16", "F16", "F32")
FOLDER_TYPES = ("FP8",)  # written as an HF folder, not a GGUF


def quantize(
    model: Annotated[str, typer.Argument(metavar="MODEL", help="HF model folder (e.g. a merged fine-tune) or "
                                         "cached hub id.", show_default=False)],
    output: Annotated[Path, typer.Option("--output", "-o", help="The .gguf file to write (a GGUF type), or the "
                                         "folder (FP8).", show_default=False)],
    type_: Annotated[str, typer.Option("--type", help="GGUF type: " + ", ".join(TYPES) + "; or FP8 (block-scaled "
                                       "e4m3 safetensors, as the *-FP8 releases, for vLLM).")] = "Q8_0",
) -> None:
    """Quantize a model to a GGUF file (for llama.cpp, Ollama, ...); a Gemma 3 with images also gets its
    vision tower as llama.cpp's mmproj-<output name> (F16) beside it. --type FP8 writes a block-FP8
    HF folder instead (vLLM, SGLang, transformers and surogate load it)."""
    qtype = type_.upper()
    if qtype not in TYPES + FOLDER_TYPES:
        raise typer.BadParameter(f"{type_!r} is not one of {', '.join(TYPES + FOLDER_TYPES)}", param_hint="'--type'")
    start, start_wall = time.perf_counter(), time.time()

    def progress(index: int, count: int, name: str, ggml_type: str, shape: tuple) -> None:
        width = len(str(count))
        typer.echo(f"[{index + 1:>{width}}/{count}] {ggml_type:<5} {name} {list(shape)}", err=True)

    if qtype == "FP8":
        from surogate.train.fp8_export import quantize_to_fp8

        out = quantize_to_fp8(model, output, progress=progress, warn=lambda m: typer.echo(f"warning: {m}", err=True))
        size = sum(f.stat().st_size for f in out.glob("*.safetensors"))
        typer.echo(f"wrote {out} (FP8, {size / 2**20:.1f} MiB of weights) in {time.perf_counter() - start:.1f} s")
        return
    from surogate.models.gguf_names import quantize_to_gguf

    out = quantize_to_gguf(model, output, qtype, progress=progress)
    size = out.stat().st_size
    typer.echo(f"wrote {out} ({qtype}, {size / 2**20:.1f} MiB) in {time.perf_counter() - start:.1f} s")
    from surogate.models.gguf_names import mmproj_path

    vision = mmproj_path(out)
    if vision.is_file() and vision.stat().st_mtime >= start_wall:
        typer.echo(f"wrote {vision} (its vision tower, F16, {vision.stat().st_size / 2**20:.1f} MiB)")
