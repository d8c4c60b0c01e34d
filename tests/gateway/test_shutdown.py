"""Graceful shutdown of a real `surogate serve`: SIGTERM while a stream is being generated ends
that stream cleanly (a final chunk with a finish reason, then [DONE]), new connections are
refused, and the process exits 0 within a few seconds. With --shutdown-grace 0 the generation
is aborted at once (finish_reason "abort"); with a grace it may finish."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import httpx
import pytest

pytest.importorskip("transformers")

from sgtest.server import _CODE, free_port  # noqa: E402
from sgtest.tiny_models import make_qwen3  # noqa: E402


@pytest.mark.parametrize("grace", ["0", "5"])
def test_sigterm_ends_inflight_streams_and_exits(tmp_path, grace):
    path = make_qwen3(tmp_path / "tiny", seed=1)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen([sys.executable, "-P", "-c", _CODE, "serve", f"tiny={path}", "--port", str(port),
                             "--shutdown-grace", grace],
                            stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    try:
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None, "the server exited while starting"
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, "the server did not become healthy"
            time.sleep(0.3)

        events: list[dict] = []
        done = threading.Event()
        first = threading.Event()

        def stream() -> None:
            body = {"model": "tiny", "prompt": "hello", "max_tokens": 250, "ignore_eos": True, "stream": True,
                    "temperature": 0}
            try:
                with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=60) as r:
                    for line in r.iter_lines():
                        if line.startswith("data: "):
                            data = line[len("data: "):]
                            events.append({"done": True} if data == "[DONE]" else json.loads(data))
                            first.set()
            except httpx.HTTPError as e:
                events.append({"error": repr(e)})
            finally:
                done.set()

        threading.Thread(target=stream, daemon=True).start()
        assert first.wait(60), "no tokens streamed"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert time.monotonic() - t0 < 20
        assert done.wait(10)
        assert events[-1] == {"done": True}, events[-3:]
        finals = [e for e in events if e.get("choices") and e["choices"][0].get("finish_reason")]
        reason = finals[-1]["choices"][0]["finish_reason"] if finals else None
        assert reason == "abort" if grace == "0" else reason in ("abort", "length"), events[-3:]
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{base}/health", timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.seek(0)
        print(log.read()[-5000:])
        log.close()
