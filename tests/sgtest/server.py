"""Run `surogate serve` as a real server process on loopback for a test."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
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
    # -P and a neutral cwd: the installed surogate (or PYTHONPATH's), not the source folder.
    proc = subprocess.Popen([sys.executable, "-P", "-c", _CODE, "serve", *args, "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"surogate serve exited: {proc.stdout.read()[-3000:]}")
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
