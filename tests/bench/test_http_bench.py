"""`surogate bench serve --http`: the streaming client reads chunked SSE however the bytes are
split and counts what a server got wrong; the whole benchmark runs against a real `surogate
serve` of a named shape (random weights), and with --url against a running server with chat-set
prompts at a Poisson rate, printing `vllm bench serve`'s table with the engine's figure beside it."""

from __future__ import annotations

import asyncio
import json

import pytest

from surogate.bench.http import chat_prompts, random_prompts, report, run
from surogate.bench.serve import warmup_prompts
from surogate.bench.sse_client import post_request, stream


def sse(event: dict | str) -> bytes:
    data = event if isinstance(event, str) else json.dumps(event)
    return f"data: {data}\n\n".encode()


def chunked(parts: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def token(text: str) -> dict:
    return {"object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": None}]}


STREAM = chunked([sse(token(" a")), sse(token(" b")) + sse(token(" c")),
                  sse({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}), sse("[DONE]")])


async def serve_bytes(response: bytes, pieces: int, close_early: bool = False):
    """A server that answers every request with ``response``, written in ``pieces`` uneven parts."""
    async def handle(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        body = response[:len(response) // 2] if close_early else response
        cuts = sorted({(i * i * 7) % len(body) for i in range(1, pieces)} | {0, len(body)})
        try:
            for a, b in zip(cuts, cuts[1:]):
                writer.write(body[a:b])
                await writer.drain()
                await asyncio.sleep(0.002)
        except (ConnectionError, asyncio.CancelledError):  # the client had all it needed
            pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def fetch(response: bytes, pieces: int = 1, close_early: bool = False):
    async def go():
        server, port = await serve_bytes(response, pieces, close_early)
        async with server:
            host, port, req = post_request(f"http://127.0.0.1:{port}/v1/completions", b"{}")
            return await stream(host, port, req)

    return asyncio.run(go())


@pytest.mark.parametrize("pieces", [1, 7, 60, 400])
def test_the_client_reads_chunked_events_however_split(pieces):
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    r = fetch(head + STREAM, pieces)
    assert r.ok and not r.error
    assert r.text == " a b c" and r.chunks == 3
    assert (r.prompt_tokens, r.output_tokens) == (5, 3)
    assert r.ttft is not None and len(r.itl) == 2 and r.latency >= r.ttft


def test_the_client_reads_a_stream_without_chunked_encoding():
    body = sse(token("x")) + sse("[DONE]")
    r = fetch(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n" + body, pieces=3)
    assert r.ok and r.text == "x" and r.output_tokens is None and r.chunks == 1


def test_the_client_counts_what_went_wrong():
    err = b'{"error": {"message": "no model named m"}}'
    r = fetch(b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
              % (len(err), err))
    assert not r.ok and r.error.startswith("HTTP 404") and "no model named m" in r.error
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    r = fetch(head + STREAM, pieces=5, close_early=True)
    assert not r.ok and r.error
    r = fetch(head + chunked([sse({"error": {"message": "engine died"}})]))
    assert not r.ok and "engine died" in r.error


def test_both_sides_warm_up_each_shape_twice_with_prompts_of_their_own():
    # A GPU Program is captured into a CUDA graph the second time its shape runs: a single stream
    # warmed once would capture its prefill in the timed request (the engine's side did not).
    warm = warmup_prompts(100, 4, 8, seed=0)
    assert [len(w) for w in warm] == [4, 1] and all(len(p) == 8 for w in warm for p in w)
    timed = {tuple(p) for p in random_prompts(100, 4, 8, seed=0)}
    assert not timed & {tuple(p) for w in warm for p in w}  # else the prefix cache skips the prefill
    assert len(warmup_prompts(100, 1, 8)) == 2  # one stream: its shapes met twice before timing


def test_chat_set_prompts(tmp_path):
    rows = [{"conversations": [{"from": "system", "value": "be brief"}, {"from": "human", "value": "hi there"}]},
            {"messages": [{"role": "user", "content": "what is 2 + 2?"}]}, {"conversations": []}]
    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    assert chat_prompts(path, 3) == ["hi there", "what is 2 + 2?", "hi there"]


@pytest.mark.slow
def test_bench_http_against_surogate_serve_of_a_named_shape(capsys):
    h = run("tiny", n=6, prompt_len=8, output_len=4, dtype="float32", device="cpu")
    out = capsys.readouterr().out
    assert len(h.ok) == 6 and h.output_tokens == 24 and h.input_tokens == 48
    assert all(len(r.itl) == r.chunks - 1 for r in h.ok)
    for line in ("Serving Benchmark Result", "Successful requests:", "Failed requests:", "P90 TTFT (ms):",
                 "P99 ITL (ms):", "P50 E2EL (ms):", "Output token throughput (tok/s):", "of one core"):
        assert line in out
    throughput = next(x for x in out.splitlines() if x.startswith("Output token throughput"))
    assert len(throughput.split()) == 7  # label (4 words), HTTP, engine, ratio


@pytest.mark.slow
def test_bench_http_with_url_chat_prompts_and_a_request_rate(tmp_path, capsys):
    from sgtest.server import surogate_serve
    from sgtest.tiny_models import make_qwen3

    folder = make_qwen3(tmp_path / "q", seed=1)
    chat = tmp_path / "chat.json"
    chat.write_text(json.dumps([{"messages": [{"role": "user", "content": "Hello world! What is the weather?"}]},
                                {"messages": [{"role": "user", "content": "The quick brown fox."}]}]))
    with surogate_serve(str(folder), "--device", "cpu", "--max-num-seqs", "2") as url:
        h = run(str(folder), n=5, prompt_len=0, output_len=3, dtype="float32", device="cpu", url=url,
                request_rate=20.0, dataset=str(chat), max_num_seqs=2)
    out = capsys.readouterr().out
    assert len(h.ok) == 5 and h.output_tokens == 15
    assert h.input_tokens > 5  # the server's own count of the chat prompts' tokens
    assert f"against {url}" in out and "Poisson 20/s" in out and "engine" in out
    assert "Request rate configured (RPS):                 20.00" in out


def test_report_without_an_engine_figure_or_successes():
    from surogate.bench.http import HttpResult
    from surogate.bench.sse_client import StreamResult

    out = report(HttpResult([StreamResult(error="HTTP 500: boom")], 1.0, 0.1, float("inf")))
    assert "Failed requests:                                   1" in out and "HTTP 500: boom" in out
    assert "engine" not in out
