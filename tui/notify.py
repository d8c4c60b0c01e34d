"""Errors as notifications: the message, then the hint on its own line, never a traceback.

A SurogateError carries both; anything else is shown by type and text (the TUI keeps running).
Thread-safe: App.notify may be called from a worker.
"""

from __future__ import annotations

from textual.app import App
from textual.worker import Worker, WorkerState


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


class WorkerErrors:
    """Mixed into every screen: a worker that raises (workers run with exit_on_error=False) becomes
    an error notification, and the app keeps running."""

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR and event.worker.error is not None:
            notify_error(self.app, event.worker.error, "Unexpected error")
