"""Admission on a real server: a full queue is a 429 and an asleep model a 503 (OpenAI) / 529
(Anthropic), each in its API's envelope as the official SDKs read it; the server keeps serving."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

pytest.importorskip("torch")
pytest.importorskip("granian")
openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

from sgtest.server import surogate_serve  # noqa: E402
from sgtest.tiny_models import make_qwen3  # noqa: E402

KEY = "sk-adm"
AUTH = {"Authorization": f"Bearer {KEY}"}
HI = [{"role": "user", "content": "Hello world!"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # a long context, so one request can keep the only running slot busy for the whole test
    path = make_qwen3(tmp_path_factory.mktemp("qwen3_adm"), seed=5, max_position_embeddings=8192)
    with surogate_serve(f"tiny={path}", "--kv-cache-tokens", "8192", "--max-num-seqs", "1",
                        "--max-queued-requests", "1", "--api-key", KEY) as base:
        yield base


def clients(base):
    # no retries: the SDKs would retry 429 / 503 / 529 on their own
    return (openai.OpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0),
            anthropic.Anthropic(base_url=base, api_key=KEY, max_retries=0))


def gauge(base: str, name: str) -> float:
    for line in httpx.get(f"{base}/metrics", headers=AUTH, timeout=5).text.splitlines():
        if line.startswith(f"surogate:{name}{{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no surogate:{name} in /metrics")


def wait_for(condition, what: str, seconds: float = 30) -> None:
    deadline = time.time() + seconds
    while not condition():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_full_queue_is_429_in_each_apis_envelope(server):
    oai, claude = clients(server)
    long = {"model": "tiny", "messages": HI, "max_tokens": 6000, "ignore_eos": True, "stream": True}
    queued_result = {}
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{server}/v1/chat/completions", json=long, headers=AUTH) as running:
            assert running.status_code == 200
            lines = running.iter_lines()
            data = [line for line in (next(lines) for _ in range(6)) if line.startswith("data:")]
            assert len(data) >= 2  # the role chunk, then engine output: it runs, it does not wait

            # the only slot is taken: this one waits in the engine's queue, which is then full
            def queued():
                queued_result["r"] = oai.chat.completions.create(model="tiny", messages=HI, max_tokens=3)

            waiter = threading.Thread(target=queued)
            waiter.start()
            wait_for(lambda: gauge(server, "num_requests_waiting") == 1, "the second request to wait")

            with pytest.raises(openai.RateLimitError) as e:
                oai.chat.completions.create(model="tiny", messages=HI, max_tokens=3)
            assert e.value.status_code == 429
            assert e.value.body["type"] == "rate_limit_error" and e.value.body["code"] == "rate_limit_exceeded"
            assert e.value.response.headers["retry-after"] == "1"
            with pytest.raises(anthropic.RateLimitError) as e:
                claude.messages.create(model="tiny", max_tokens=3, messages=HI)
            assert e.value.status_code == 429
            assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "rate_limit_error"
        # the long request's client left: it is aborted, and the waiting one runs
    waiter.join(timeout=60)
    assert queued_result["r"].choices[0].finish_reason in ("stop", "length")
    r = oai.chat.completions.create(model="tiny", messages=HI, max_tokens=3)
    assert r.usage.completion_tokens <= 3


def test_sleep_and_wake_up(server):
    oai, claude = clients(server)
    before = oai.chat.completions.create(model="tiny", messages=HI, max_tokens=8, temperature=0)
    assert httpx.post(f"{server}/sleep?model=tiny", timeout=5).status_code == 401  # admin needs the key
    r = httpx.post(f"{server}/sleep?model=nope", headers=AUTH, timeout=5)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = httpx.post(f"{server}/sleep?model=tiny", headers=AUTH, timeout=5)
    assert r.status_code == 200 and r.json() == {"model": "tiny", "status": "sleeping"}
    health = httpx.get(f"{server}/health", timeout=5)
    assert health.status_code == 200 and health.json()["models"] == {"tiny": "sleeping"}

    with pytest.raises(openai.InternalServerError) as e:
        oai.chat.completions.create(model="tiny", messages=HI, max_tokens=3)
    assert e.value.status_code == 503 and e.value.body["code"] == "model_asleep"
    assert e.value.body["type"] == "server_error"
    with pytest.raises(anthropic.APIStatusError) as e:
        claude.messages.create(model="tiny", max_tokens=3, messages=HI)
    assert isinstance(e.value, getattr(anthropic, "OverloadedError", anthropic.InternalServerError))
    assert e.value.status_code == 529 and e.value.body["error"]["type"] == "overloaded_error"
    assert oai.models.list().data[0].id == "tiny"  # what needs no generation still answers

    r = httpx.post(f"{server}/wake_up", headers=AUTH, timeout=5)  # the only model, when none is named
    assert r.status_code == 200 and r.json() == {"model": "tiny", "status": "loaded"}
    assert httpx.get(f"{server}/health", timeout=5).json()["models"] == {"tiny": "loaded"}
    m = claude.messages.create(model="tiny", max_tokens=3, messages=HI)
    assert m.usage.output_tokens <= 3
    # The sleep gave the KV cache back and forgot its prefixes: the same answer, computed afresh.
    after = oai.chat.completions.create(model="tiny", messages=HI, max_tokens=8, temperature=0)
    assert after.choices[0].message.content == before.choices[0].message.content
