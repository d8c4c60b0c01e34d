"""Errors as notifications: the message, then the hint on its own line, never a traceback.

A SurogateError carries both; anything else is shown by type and text (the TUI keeps running).
Thread-safe: App.notify may be called from a worker.
"""

from __future__ import annotations

from textual.app import App


def describe(exc: BaseException) -> tuple[str, str | None]:
    message = getattr(exc, "message", None)
    hint = getattr(exc, "hint", None)
    if isinstance(message, str):
        where = getattr(exc, "where", None)
        return (f"{message} (at {where})" if where else message), hint
    text = str(exc) or type(exc).__name__
    return (text if isinstance(exc, OSError) else f"{type(exc).__name__}: {text}"), None


def notify_error(app: App, exc: BaseException, title: str = "Error") -> None:
    message, hint = describe(exc)
    body = f"{message}\nhint: {hint}" if hint else message
    app.notify(body, title=title, severity="error", timeout=12, markup=False)
