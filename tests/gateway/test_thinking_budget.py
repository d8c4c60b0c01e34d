"""Reasoning budgets end to end: a tiny Qwen3 whose template opens the reasoning span (as
Qwen3-Thinking-2507's does: the generation prompt ends with ``<think>\\n``), served for real and
driven by the anthropic and openai SDKs. The engine closes the span with ``\\n</think>`` after
the budget and the answer goes on."""

from __future__ import annotations

import json

import pytest

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")
pytest.importorskip("granian")

from sgtest.server import surogate_serve  # noqa: E402
from sgtest.tiny_models import make_qwen3  # noqa: E402
from surogate.io import Tokenizer  # noqa: E402

ASK = [{"role": "user", "content": "Hello world! What is the weather like today?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = make_qwen3(tmp_path_factory.mktemp("qwen3think"), seed=5, initializer_range=0.2)
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    opening = "{{- '<|im_start|>assistant\\n' }}"
    assert opening in config["chat_template"]
    config["chat_template"] = config["chat_template"].replace(opening, "{{- '<|im_start|>assistant\\n<think>\\n' }}")
    config_file.write_text(json.dumps(config))
    with surogate_serve(f"tiny={path}", "--kv-cache-tokens", "2048") as base:
        yield base, Tokenizer.from_folder(path)


@pytest.mark.parametrize("budget", [4, 12])
def test_anthropic_budget_tokens_ends_the_thinking_and_the_answer_goes_on(server, budget):
    base, _ = server
    c = anthropic.Anthropic(base_url=base, api_key="none", max_retries=0)
    greedy = {"temperature": 0}

    def blocks(thinking):
        m = c.messages.create(model="tiny", max_tokens=60, messages=ASK, thinking=thinking, extra_body=greedy)
        return m, "".join(b.thinking for b in m.content if b.type == "thinking"), [
            b.text for b in m.content if b.type == "text"]

    _, free, _ = blocks({"type": "enabled", "budget_tokens": 1000})
    m, thinking, text = blocks({"type": "enabled", "budget_tokens": budget})
    # the model's own greedy thinking, cut where the budget ran out; then an answer
    assert thinking and len(thinking) < len(free) and free.startswith(thinking), (thinking, free)
    assert text and text[0], m


@pytest.mark.parametrize("budget", [0, 3])
def test_openai_max_reasoning_tokens_forces_the_end_of_think_tokens(server, budget):
    base, _ = server
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
    r = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=30, temperature=0, logprobs=True,
                                       extra_body={"max_reasoning_tokens": budget, "skip_special_tokens": False})
    tokens = [t.token for t in r.choices[0].logprobs.content]  # one entry per generated token
    assert "</think>" in tokens and tokens.index("</think>") == budget + 1, tokens
    assert tokens[budget] == "\n"  # the forced "\n</think>"
    assert r.choices[0].message.content
    assert r.usage.completion_tokens_details.reasoning_tokens <= budget + 2


def test_reasoning_effort_maps_to_a_budget_on_responses(server):
    base, _ = server
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
    low = client.responses.create(model="tiny", input="Hi", max_output_tokens=40, temperature=0,
                                  extra_body={"max_reasoning_tokens": 2})
    assert any(o.type == "reasoning" for o in low.output) and low.output_text
    free = client.responses.create(model="tiny", input="Hi", max_output_tokens=40, temperature=0,
                                   reasoning={"effort": "low"})  # 1024 tokens: never reached here
    assert not free.output_text  # the random model thinks through all 40 tokens
