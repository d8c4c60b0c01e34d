"""Many more concurrent streams than --max-num-seqs through a real `surogate serve` (a tiny model
on the CPU): every stream completes, no request waits longer than the queue in front of it
explains and the token stream never stalls, clients that leave mid-stream free their place, and
the KV cache is empty after (/metrics)."""

from __future__ import annotations

import asyncio
import json
import math
import time
import urllib.request

import pytest

pytest.importorskip("granian")

from sgtest.server import surogate_serve  # noqa: E402
from sgtest.tiny_models import make_qwen3  # noqa: E402
from surogate.bench.sse_client import post_request, stream  # noqa: E402

pytestmark = pytest.mark.slow

MAX_NUM_SEQS, STREAMS, QUITTERS, OUTPUT = 4, 64, 8, 32


def body(prompt: list[int]) -> bytes:
    return json.dumps({"model": "q", "prompt": prompt, "max_tokens": OUTPUT, "temperature": 0.0, "ignore_eos": True,
                       "stream": True, "stream_options": {"include_usage": True}}).encode()


async def quit_after_first_event(url: str, prompt: list[int]) -> bool:
    """A client that reads until its first token, then hangs up (the server aborts the request)."""
    host, port, req = post_request(f"{url}/v1/completions", body(prompt))
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(req)
    while b"data: {" not in await reader.read(4096):
        pass
    writer.close()
    return True


def metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("surogate:") and 'model_name="q"' in line:
            name, value = line.split("{")[0], float(line.rsplit(" ", 1)[1])
            out[name] = value
    return out


def test_streams_past_max_num_seqs_complete_without_a_stall(tmp_path):
    folder = make_qwen3(tmp_path / "q", seed=2)
    prompts = [[3 + (7 * i + j) % 200 for j in range(8 + i % 5)] for i in range(STREAMS + QUITTERS)]
    with surogate_serve(f"q={folder}", "--device", "cpu", "--max-num-seqs", str(MAX_NUM_SEQS)) as url:
        async def load():
            reqs = [post_request(f"{url}/v1/completions", body(p)) for p in prompts[:STREAMS]]
            t0 = time.perf_counter()
            results = await asyncio.gather(*(stream(h, p, r, timeout=600) for h, p, r in reqs),
                                           *(quit_after_first_event(url, p) for p in prompts[STREAMS:]))
            return results[:STREAMS], time.perf_counter() - t0

        asyncio.run(load())  # warm-up: compiles the Programs of the buckets these steps use
        results, duration = asyncio.run(load())

        bad = [r.error for r in results if not r.ok]
        assert not bad, bad[:3]
        assert all(r.output_tokens == OUTPUT and r.chunks >= 1 for r in results)
        # No request waits longer than the queue explains: MAX_NUM_SEQS run at once, each for at
        # most the longest decode seen, so the k-th to start waits about k / MAX_NUM_SEQS of those.
        decode = max(r.latency - r.ttft for r in results)
        waves = math.ceil((STREAMS + QUITTERS) / MAX_NUM_SEQS)
        ttft = sorted(r.ttft for r in results)
        assert ttft[-1] <= waves * decode + 1.0, (ttft[-1], waves, decode)
        # ... and the server never sits idle while requests wait: tokens keep coming.
        arrivals = sorted(r.start + r.ttft + sum(r.itl[:i]) for r in results for i in range(len(r.itl) + 1))
        gap = max(b - a for a, b in zip(arrivals, arrivals[1:]))
        assert gap < 2.0, f"no token for {gap:.2f} s in a {duration:.1f} s run"

        deadline = time.time() + 30  # the quitters' aborts reach the engine between its steps
        while True:
            m = metrics(url)
            if m["surogate:num_requests_running"] == 0 or time.time() > deadline:
                break
            time.sleep(0.2)
        assert m["surogate:num_requests_running"] == 0 and m["surogate:num_requests_waiting"] == 0
        assert m["surogate:kv_cache_usage_perc"] == 0.0
