"""Run `surogate serve` as a real server process on loopback for a test."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import httpx

_CODE = "import sys; sys.argv = ['surogate'] + sys.argv[1:]; from surogate.cli.main import main; main()"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def surogate_serve(*args: str, timeout: float = 180) -> Iterator[str]:
    """`surogate serve ARGS --port P`; yields the base URL once /health answers 200."""
    port = free_port()
    # The server's output goes to a file, not a pipe: nobody reads a pipe while the test runs, and
    # a server blocks on a full one (64 KiB of access log is a few hundred requests).
    log = tempfile.TemporaryFile(mode="w+")
    # -P and a neutral cwd: the installed surogate (or PYTHONPATH's), not the source folder.
    proc = subprocess.Popen([sys.executable, "-P", "-c", _CODE, "serve", *args, "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, text=True, env=dict(os.environ))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"surogate serve exited: {log.read()[-3000:]}")
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                raise RuntimeError("surogate serve did not become healthy")
            time.sleep(0.3)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.seek(0)
        print(log.read()[-20000:])  # pytest shows it when the test failed: tracebacks of any 500
        log.close()
