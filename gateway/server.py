"""Serve a ``GatewayApp`` with granian, in this process.

Granian's embedded server runs the ASGI app on the caller's event loop, in the process that
owns the engines: the engine clients, their output channels and the app share one loop, with
no worker processes to ship models to. (Granian's multi-process server would start the app in
fresh workers, each of which would need its own engine.) Granian's embedded server installs no
signal handlers of its own: ``serve`` does, so it runs in the main thread. Ctrl-C / SIGTERM stop
it gracefully: new requests get 503, those in flight get ``grace`` seconds to finish, then their
generations are aborted (streams close with finish_reason "abort"), then the listener stops.
"""

from __future__ import annotations

import asyncio
import logging
import signal
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
          port: int = 8000, log_level: str = "info", grace: float = 5.0) -> None:
    """Build the app and serve it until SIGINT / SIGTERM, then shut down gracefully (``grace``
    seconds for requests in flight). Without a logging setup of the caller's, the access log (one
    JSON line per request) goes to stderr."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    app = GatewayApp(models, config)
    asyncio.run(_serve_until_signalled(app, make_server(app, host=host, port=port, log_level=log_level), grace))


async def _serve_until_signalled(app: GatewayApp, server, grace: float) -> None:
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    serving = asyncio.ensure_future(server.serve())
    signalled = asyncio.ensure_future(stopping.wait())
    await asyncio.wait({serving, signalled}, return_when=asyncio.FIRST_COMPLETED)
    if stopping.is_set():
        logging.getLogger("surogate.gateway").info("shutting down: %d request(s) in flight", app.in_flight)
        await app.drain(grace)
        server.stop()
    signalled.cancel()
    await serving
