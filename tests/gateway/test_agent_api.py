"""The API agents use, through the official openai and anthropic SDKs on the real default model
(SmolLM2-135M-Instruct): logit_bias, structured outputs (response_format, structured_outputs,
Responses text.format) and forced tool calls, each checked on what a client receives."""

from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("granian")

from sgtest.server import surogate_serve  # noqa: E402
from sgtest.smollm2 import smollm2_path  # noqa: E402
from surogate.io import Tokenizer  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
ASK = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server():
    path = smollm2_path()
    with surogate_serve() as base:
        yield base, Tokenizer.from_gguf(path)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server[0]}/v1", api_key="none", max_retries=0)


def one_token(tok: Tokenizer, text: str) -> int:
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == 1, (text, ids)
    return ids[0]


# -- logit_bias --------------------------------------------------------------------------------


def test_logit_bias_minus_100_on_the_greedy_token_changes_it(server, client):
    tok = server[1]
    first = client.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=1)
    greedy = one_token(tok, first.choices[0].message.content)
    banned = client.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=1,
                                            logit_bias={str(greedy): -100})
    assert banned.choices[0].message.content
    assert one_token(tok, banned.choices[0].message.content) != greedy
    done = client.completions.create(model=MODEL, prompt="The capital of France is", temperature=0, max_tokens=1)
    greedy = one_token(tok, done.choices[0].text)
    banned = client.completions.create(model=MODEL, prompt="The capital of France is", temperature=0, max_tokens=1,
                                       logit_bias={str(greedy): -100})
    assert tok.encode(banned.choices[0].text, add_special_tokens=False) != [greedy]


@pytest.mark.parametrize("temperature", [0, 1])
def test_logit_bias_plus_100_forces_a_token(server, client, temperature):
    banana = one_token(server[1], " banana")
    r = client.chat.completions.create(model=MODEL, messages=ASK, temperature=temperature, seed=1, max_tokens=4,
                                       logit_bias={str(banana): 100})
    assert r.choices[0].message.content.split(" ") == ["", "banana", "banana", "banana", "banana"]
    c = client.completions.create(model=MODEL, prompt="Hello", temperature=temperature, seed=1, max_tokens=3,
                                  logit_bias={str(banana): 100})
    assert c.choices[0].text == " banana" * 3


@pytest.mark.parametrize("bias,what", [({"99999999": 1}, "outside the vocabulary"), ({"5": 101}, "outside"),
                                       ({"x": 1}, "token ids")])
def test_bad_logit_bias_is_a_400_naming_the_field(client, bias, what):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=1, logit_bias=bias)
    assert e.value.body["param"] == "logit_bias" and what in e.value.body["message"]
