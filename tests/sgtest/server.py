"""Run `surogate serve` as a real server process on loopback for a test (the benchmark's
launcher, surogate.bench.http.surogate_serve, with the server's output printed at the end)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from surogate.bench.http import SERVE_CODE as _CODE  # noqa: F401  (tests start servers of their own with it)
from surogate.bench.http import free_port  # noqa: F401
from surogate.bench.http import surogate_serve as _surogate_serve


@contextlib.contextmanager
def surogate_serve(*args: str, timeout: float = 180) -> Iterator[str]:
    """`surogate serve ARGS --port P`; yields the base URL once /health answers 200."""
    # pytest shows what a test printed when it failed: the server's tracebacks of any 500
    with _surogate_serve(*args, timeout=timeout, show_log=lambda text: print(text[-20000:])) as base:
        yield base
