"""`surogate serve [MODEL...]`: the OpenAI / Anthropic compatible HTTP gateway.

The gateway (granian) is an extra: it is imported inside the command, never at module level.
"""

from __future__ import annotations

from typing import Annotated

import typer

from surogate.cli.not_built import not_built


def serve(
    models: Annotated[
        list[str] | None,
        typer.Argument(metavar="MODEL", help="HF ids, local directories or GGUF files to serve.", show_default=False),
    ] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
) -> None:
    """Serve models over OpenAI- and Anthropic-compatible HTTP APIs."""
    not_built("serve", 'serving: issue #7 gateway')
