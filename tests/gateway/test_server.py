"""granian serves the app over real HTTP (in a subprocess: its embedded server installs signal
handlers, which only the main thread may do), and the openai SDK talks to it. Also: importing
the gateway's app does not start or even import granian."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

pytest.importorskip("granian")

try:
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx

ROOT = Path(__file__).resolve().parents[2]
SHIM = f"import runpy; runpy.run_path({str(Path(__file__).with_name('conftest.py'))!r})\n"

SERVER = SHIM + """
import sys, tempfile
from sgtest import tiny_models
from surogate.io import Tokenizer
from surogate.gateway.models import GatewayConfig, ServedModel
from surogate.gateway.server import serve
tok = Tokenizer.from_folder(tiny_models.make_tokenizer(tempfile.mkdtemp(), "chatml"))
serve([ServedModel.from_tokenizer("tiny", tok, None, 256)], GatewayConfig(api_keys=("k",)), port=int(sys.argv[1]),
      log_level="warning")
"""


def _env():
    # tests/ for sgtest; surogate itself comes from the environment (installed, or the caller's
    # PYTHONPATH in a development checkout), never from the source folder, which has no _native.
    # (An empty PYTHONPATH entry would mean the current folder: leave none.)
    paths = [str(ROOT / "tests"), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def test_importing_the_app_loads_no_server():
    code = SHIM + "import sys\nimport surogate.gateway.app\nprint(sorted(m for m in ('granian',) if m in sys.modules))"
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, env=_env(), cwd=ROOT,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_granian_serves_the_gateway():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-P", "-c", SERVER, str(port)], env=_env(), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                health = httpx.get(base + "/health", timeout=1)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stdout.read().decode()
                assert time.monotonic() < deadline, "the server did not start"
                time.sleep(0.1)
        assert health.status_code == 503 and health.json()["status"] == "loading"
        client = openai.OpenAI(api_key="k", base_url=base + "/v1", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["tiny"]
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(api_key="bad", base_url=base + "/v1", max_retries=0).models.list()
        with pytest.raises(openai.InternalServerError) as e:  # no engine yet: 503, in OpenAI's envelope
            client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
        assert e.value.status_code == 503
    finally:
        proc.terminate()
        proc.wait(timeout=10)
