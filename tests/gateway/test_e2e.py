"""`surogate serve` end to end: a real server process on loopback serving a tiny real model
through the native engine, driven by the official openai and anthropic SDKs. Greedy answers
equal HF transformers' greedy generation on the same prompt tokens."""

from __future__ import annotations

import time

import httpx
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
pytest.importorskip("granian")

from sgtest.server import surogate_serve  # noqa: E402
from sgtest.tiny_models import make_qwen3  # noqa: E402
from surogate.io import Tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = make_qwen3(tmp_path_factory.mktemp("qwen3"), seed=5, initializer_range=0.2)
    with surogate_serve(f"tiny={path}", "--kv-cache-tokens", "2048", "--api-key", "sk-test") as base:
        yield base, path


def hf_greedy_text(path, prompt_ids: list[int], n: int, tok: Tokenizer) -> str:
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.no_grad():
        ids = torch.tensor([prompt_ids])
        # an explicit mask: generate would take pad_token_id (0) in the prompt for padding
        out = ref.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                           eos_token_id=list(tok.eos_token_ids), pad_token_id=0)
    return tok.decode(out[0, len(prompt_ids):].tolist(), skip_special_tokens=True)


def test_chat_completion_is_the_models_greedy_answer(server):
    base, path = server
    tok = Tokenizer.from_folder(path)
    messages = [{"role": "user", "content": "Hello world! What is the weather like today?"}]
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-test")
    r = client.chat.completions.create(model="tiny", messages=messages, temperature=0, max_tokens=12,
                                       extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=False)
    assert r.usage.prompt_tokens == len(prompt)
    expected = hf_greedy_text(path, prompt, 12, tok)
    assert r.choices[0].message.content == expected
    # Streaming gives the same text, chunk by chunk.
    chunks = client.chat.completions.create(model="tiny", messages=messages, temperature=0, max_tokens=12,
                                            stream=True,
                                            extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    streamed = "".join((c.choices[0].delta.content or "") for c in chunks if c.choices)
    assert streamed == (r.choices[0].message.content or "")


def test_completions_and_anthropic_messages(server):
    base, path = server
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-test")
    r = client.completions.create(model="tiny", prompt="The quick brown fox", max_tokens=6, temperature=0)
    assert r.choices[0].finish_reason in ("length", "stop") and r.usage.completion_tokens <= 6
    a = anthropic.Anthropic(base_url=base, api_key="sk-test")
    m = a.messages.create(model="tiny", max_tokens=8, messages=[{"role": "user", "content": "Say hello."}])
    assert m.stop_reason in ("max_tokens", "end_turn") and m.usage.output_tokens <= 8
    models = client.models.list()
    assert [x.id for x in models.data] == ["tiny"]


def test_wrong_key_and_unknown_model_get_the_apis_errors(server):
    base, _ = server
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{base}/v1", api_key="nope").models.list()
    with pytest.raises(openai.NotFoundError):
        openai.OpenAI(base_url=f"{base}/v1", api_key="sk-test").chat.completions.create(
            model="other", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=base, api_key="nope").messages.create(
            model="tiny", max_tokens=4, messages=[{"role": "user", "content": "hi"}])


def _gauge(base: str, name: str) -> float:
    text = httpx.get(f"{base}/metrics", headers={"Authorization": "Bearer sk-test"}, timeout=5).text
    for line in text.splitlines():
        if line.startswith(f"surogate:{name}{{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no surogate:{name} in /metrics")


def test_client_disconnect_aborts_and_frees_kv_blocks(server):
    base, _ = server
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Tell me a long story."}],
            "max_tokens": 200, "temperature": 0, "stream": True, "ignore_eos": True}
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", f"{base}/v1/chat/completions", json=body,
                         headers={"Authorization": "Bearer sk-test"}) as r:
            assert r.status_code == 200
            for _ in r.iter_lines():
                break  # one event, then hang up
    deadline = time.time() + 20
    while time.time() < deadline:
        if _gauge(base, "num_requests_running") == 0 and _gauge(base, "kv_cache_usage_perc") == 0:
            break
        time.sleep(0.1)
    assert _gauge(base, "num_requests_running") == 0
    assert _gauge(base, "kv_cache_usage_perc") == 0


def test_metrics_report_where_engine_time_goes(server):
    base, _ = server
    openai.OpenAI(base_url=f"{base}/v1", api_key="sk-test").completions.create(model="tiny", prompt="Hello",
                                                                                 max_tokens=4)
    model = _gauge(base, "engine_model_seconds_total")
    assert 0 < model <= _gauge(base, "engine_step_seconds_total")


def test_responses_carry_token_logprobs_when_asked(server):
    base, _ = server
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-test")
    kw = dict(model="tiny", input="Say something.", max_output_tokens=6, temperature=0, top_logprobs=2)
    r = client.responses.create(**kw)
    text = r.output[-1].content[0]
    assert text.type == "output_text" and text.logprobs
    assert len(text.logprobs) == r.usage.output_tokens
    assert b"".join(bytes(lp.bytes) for lp in text.logprobs).decode("utf-8", "replace") == text.text
    assert all(lp.logprob <= 0 and len(lp.top_logprobs) == 2 for lp in text.logprobs)
    assert all(lp.top_logprobs[0].logprob >= lp.logprob for lp in text.logprobs)  # greedy: the top choice
    streamed = [e for e in client.responses.create(stream=True, **kw) if e.type == "response.output_text.delta"]
    assert [lp.token for e in streamed for lp in e.logprobs] == [lp.token for lp in text.logprobs]
    plain = client.responses.create(model="tiny", input="Say something.", max_output_tokens=6, temperature=0)
    assert not plain.output[-1].content[0].logprobs
