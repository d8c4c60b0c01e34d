"""Serve a ``GatewayApp`` with granian, in this process.

Granian's embedded server runs the ASGI app on the caller's event loop, in the process that
owns the engines: the engine clients, their output channels and the app share one loop, with
no worker processes to ship models to. (Granian's multi-process server would start the app in
fresh workers, each of which would need its own engine.) Granian's embedded server installs no
signal handlers of its own: ``serve`` does, so it runs in the main thread.

Connection limits: granian's embedded server defaults to a listen backlog of 128 and a
backpressure (requests handled at once) of backlog / workers = 128. Past that it stops
accepting; connections wait in the kernel's backlog, and once that is full the kernel drops
their SYNs and clients retry after 1, 2, 4, 8, 16 s (a TTFT of ~31 s at 256 streams on the GPU).
The gateway has its own admission (``max_queued_requests``: a 429 past it), so granian is told
to accept at least that many requests beyond the ones running, and to keep a deep backlog. Ctrl-C / SIGTERM stop
it gracefully: new requests get 503, those in flight get ``grace`` seconds to finish, then their
generations are aborted (streams close with finish_reason "abort"), then the listener stops.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from collections.abc import Sequence

from .app import GatewayApp
from .models import GatewayConfig, ServedModel

# requests granian accepts at once (and connections it lets wait): beyond every queued request's
# room (max_queued_requests) the running ones, streams and plain requests alike; the kernel caps
# the backlog at net.core.somaxconn
_MIN_BACKLOG = 4096


def make_server(app: GatewayApp, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info"):
    """The granian server for ``app`` (call ``await server.serve()`` on the engines' loop)."""
    from granian.constants import Interfaces
    from granian.log import LogLevels
    from granian.server.embed import Server

    backlog = max(_MIN_BACKLOG, 2 * app.gw.config.max_queued_requests)
    return Server(app, address=host, port=port, interface=Interfaces.ASGI, log_level=LogLevels(log_level),
                  backlog=backlog, backpressure=backlog,  # admission is ours (429), not a closed door
                  log_access=False)  # our own access log is one JSON line per request


def serve(models: Sequence[ServedModel], config: GatewayConfig | None = None, *, host: str = "127.0.0.1",
          port: int = 8000, log_level: str = "info", grace: float = 5.0) -> None:
    """Build the app and serve it until SIGINT / SIGTERM, then shut down gracefully (``grace``
    seconds for requests in flight). Without a logging setup of the caller's, the access log (one
    JSON line per request) goes to stderr."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    app = GatewayApp(models, config)
    # Everything loaded so far (torch, the models, the tokenizers) lives until exit: out of the
    # collector's sight, so the collections that serving's many short-lived objects trigger do
    # not walk it again and again (vLLM does the same after loading).
    gc.collect()
    gc.freeze()
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
