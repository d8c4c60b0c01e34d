"""`surogate tui`: the terminal dashboard.

Textual is an extra: the `tui` package is imported inside the command, never at module level.
"""

from __future__ import annotations

from surogate.cli.not_built import not_built


def tui() -> None:
    """Terminal dashboard: launch and watch runs, chat with models."""
    not_built("tui", 'terminal UI: issue #9')
