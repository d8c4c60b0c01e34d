"""Serve a ``GatewayApp`` with granian, in this process.

Granian's embedded server runs the ASGI app on the caller's event loop, in the process that
owns the engines: the engine clients, their output channels and the app share one loop, with
no worker processes to ship models to. (Granian's multi-process server would start the app in
fresh workers, each of which would need its own engine.) It installs signal handlers, so it
runs in the main thread; Ctrl-C / SIGTERM stop it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from .app import GatewayApp
from .models import GatewayConfig, ServedModel


def make_server(app: GatewayApp, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info"):
    """The granian server for ``app`` (call ``await server.serve()`` on the engines' loop)."""
    from granian.constants import Interfaces
    from granian.log import LogLevels
    from granian.server.embed import Server

    return Server(app, address=host, port=port, interface=Interfaces.ASGI, log_level=LogLevels(log_level),
                  log_access=False)  # our own access log is one JSON line per request


def serve(models: Sequence[ServedModel], config: GatewayConfig | None = None, *, host: str = "127.0.0.1",
          port: int = 8000, log_level: str = "info") -> None:
    """Build the app and serve it until interrupted. Without a logging setup of the caller's, the
    access log (one JSON line per request) goes to stderr."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    server = make_server(GatewayApp(models, config), host=host, port=port, log_level=log_level)
    asyncio.run(server.serve())
