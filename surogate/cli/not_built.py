"""The one place that says a command is not built yet.

A command the product will have but this version does not calls `not_built` with the area of
work it waits for; `main()` prints that as one line and exits 2. Building a command replaces its
call here, one command at a time.
"""

from __future__ import annotations

from typing import NoReturn

from surogate.errors import NotBuiltYetError


def not_built(command: str, area: str) -> NoReturn:
    raise NotBuiltYetError(f"surogate {command}: not built yet ({area})", hint="see README.md")
