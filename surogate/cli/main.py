"""The `surogate` command: the typer app, its command table and the one place errors are rendered.

Exit status: 0 done, 1 a SurogateError or a bug, 2 a usage error or a command not built yet,
130 interrupted. A traceback shows only with SUROGATE_DEBUG=1.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Sequence
from typing import Annotated

import typer

import surogate
from surogate.cli import bench, distill, doctor, dpo, grpo, merge, models, pt, quantize, serve, sft, tui
from surogate.errors import NotBuiltYetError, SurogateError

app = typer.Typer(
    name="surogate",
    help="Train and serve large language models on one native C++/CUDA engine.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

for command, panel in [
    (sft.sft, "Train"),
    (pt.pt, "Train"),
    (dpo.dpo, "Train"),
    (grpo.grpo, "Train"),
    (distill.distill, "Train"),
    (serve.serve, "Serve"),
    (models.models, "Models"),
    (merge.merge, "Models"),
    (quantize.quantize, "Models"),
    (tui.tui, "Tools"),
    (doctor.doctor, "Tools"),
]:
    app.command(rich_help_panel=panel)(command)
app.add_typer(bench.app, name="bench", rich_help_panel="Tools",
              help="Benchmark a training step (or serving) against the peer, in the same run.")


def print_version(value: bool) -> None:
    if value:
        typer.echo(f"surogate {surogate.__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    pass  # the group's own options; the commands do the work


def main(argv: Sequence[str] | None = None) -> None:
    """Run the app; exits with the status of the run, as a console entry point does."""
    # Standalone mode: typer renders usage errors (status 2), --help and Ctrl-C (130) itself and
    # exits; what the commands raise comes out here.
    command = typer.main.get_command(app)
    try:
        command.main(args=argv, prog_name="surogate")
    except KeyboardInterrupt:
        sys.exit(130)
    except NotBuiltYetError as e:
        print_line(f"{e.message}; {e.hint}" if e.hint else e.message)
        sys.exit(2)
    except SurogateError as e:
        debug_traceback()
        print_error(f"{e.message} (at {e.where})" if e.where else e.message, e.hint)
        sys.exit(1)
    except Exception as e:
        if not debug_traceback():
            hint = "a bug in surogate: rerun with SUROGATE_DEBUG=1 to see the traceback"
            print_error(f"{type(e).__name__}: {e} ({hint})")
        sys.exit(1)


def debug_traceback() -> bool:
    if os.environ.get("SUROGATE_DEBUG") != "1":
        return False
    traceback.print_exc()
    return True


def print_error(message: str, hint: str | None = None) -> None:
    print_line(f"error: {message}")
    if hint:
        print_line(f"hint: {hint}")


def print_line(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
