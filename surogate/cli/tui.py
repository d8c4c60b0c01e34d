"""`surogate tui`: the terminal dashboard (Library, Train, Serve, Chat).

Textual is an extra: the `tui` package is imported inside the command, never at module level.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Annotated

import typer

from surogate.errors import NotFoundError

SCREENS = ("library", "train", "serve", "chat")


def tui(
    screen: Annotated[str, typer.Option(help=f"Screen to open: {', '.join(SCREENS)}.")] = "library",
) -> None:
    """Terminal dashboard: models, training runs, the gateway and a chat playground."""
    if screen not in SCREENS:
        raise typer.BadParameter(f"{screen!r} is not one of {', '.join(SCREENS)}", param_hint="--screen")
    dev_layout()
    try:
        from surogate.tui.app import SurogateApp
    except ImportError as e:
        if (e.name or "").split(".")[0] in ("textual", "httpx"):
            raise NotFoundError(f"the TUI's dependencies are missing ({e.name})",
                                hint='pip install "surogate[tui]"') from None
        raise
    SurogateApp(start=screen).run()


def dev_layout() -> bool:
    """In a source checkout (PYTHONPATH=repo), register the top-level tui/ and gateway/ folders
    under the names the wheel gives them (surogate.tui, surogate.gateway); both use relative
    imports only. An installed surogate is left as it is. True when something was registered."""
    import surogate

    root = Path(surogate.__file__).resolve().parents[1]
    registered = False
    for name in ("gateway", "tui"):
        full = f"surogate.{name}"
        if full in sys.modules or importlib.util.find_spec(full) is not None:
            continue
        folder = root / name
        if not (folder / "__init__.py").is_file():
            continue
        spec = importlib.util.spec_from_file_location(full, folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[full] = module
        spec.loader.exec_module(module)
        setattr(surogate, name, module)
        registered = True
    return registered
