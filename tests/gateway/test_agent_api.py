"""The API agents use, through the official openai and anthropic SDKs on the real default model
(SmolLM2-135M-Instruct): logit_bias, structured outputs (response_format, structured_outputs,
Responses text.format) and forced tool calls, each checked on what a client receives."""

from __future__ import annotations

import importlib.util
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


# -- structured outputs ----------------------------------------------------------------------------

jsonschema = pytest.importorskip("jsonschema")
# the grammar engine is the serve extra's; without it only these tests skip
needs_llguidance = pytest.mark.skipif(importlib.util.find_spec("llguidance") is None, reason="llguidance not installed")

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 150},
                                           "city": {"type": "string", "enum": ["Paris", "Rome", "Berlin"]}},
          "required": ["name", "age", "city"], "additionalProperties": False}
PROMPTS = ["Describe a famous scientist.", "Invent a person who lives in Italy.", "Who are you?",
           "Give me a JSON object about a painter."]


@needs_llguidance
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_json_schema_answers_validate_over_prompts_and_seeds(client, seed):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    for prompt in PROMPTS:
        r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                           temperature=0 if seed == 0 else 1.0, seed=seed, max_tokens=80,
                                           response_format=fmt)
        choice = r.choices[0]
        assert choice.finish_reason == "stop", choice
        jsonschema.validate(json.loads(choice.message.content), PERSON)


@needs_llguidance
def test_metrics_count_the_grammar_rows_drawn_first_and_checked(server, client):
    """/metrics: a sampled json_schema answer's draws were checked against the grammar, some
    allowed as drawn (the real model mostly writes what the schema allows), the refused ones
    drawn again under their masks on the device."""
    import httpx

    def counter(name: str) -> float:
        for line in httpx.get(f"{server[0]}/metrics", timeout=5).text.splitlines():
            if line.startswith(f"surogate:{name}_total{{"):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"no surogate:{name}_total in /metrics")

    names = ("structured_output_draws_checked", "structured_output_draws_allowed",
             "structured_output_device_masked_rows")
    before = [counter(n) for n in names]
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPTS[1]}],
                                       temperature=0.8, seed=3, max_tokens=80, response_format=fmt)
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    checked, allowed, redrawn = (counter(n) - b for n, b in zip(names, before))
    assert checked == r.usage.completion_tokens  # every token of the answer, its EOS included
    assert 0 < allowed < checked and redrawn == checked - allowed


@needs_llguidance
def test_json_object_with_n_and_streaming(client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, n=3, temperature=0.7, seed=5, max_tokens=100,
                                       response_format={"type": "json_object"})
    assert len(r.choices) == 3
    # json_object bounds no string's length: a sampled answer may run to max_tokens, cut inside the
    # object (as vLLM's); every answer the grammar ended is one JSON object.
    for c in r.choices:
        if c.finish_reason == "length":
            assert c.message.content.lstrip().startswith("{"), c.message.content
        else:
            assert c.finish_reason == "stop" and isinstance(json.loads(c.message.content), dict), c
    assert any(c.finish_reason == "stop" for c in r.choices), r.choices
    text = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
        model=MODEL, messages=ASK, temperature=0, max_tokens=60, stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}) if chunk.choices)
    jsonschema.validate(json.loads(text), PERSON)


@needs_llguidance
def test_the_same_prompt_with_and_without_a_grammar_shares_the_prefix_cache(client):
    plain = client.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=5)
    again = client.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=40,
                                           response_format={"type": "json_object"})
    assert isinstance(json.loads(again.choices[0].message.content), dict)
    assert plain.choices[0].message.content != again.choices[0].message.content
    assert again.usage.prompt_tokens_details.cached_tokens > 0  # the prompt's blocks came from the cache


@needs_llguidance
@pytest.mark.parametrize("constraint,check", [
    ({"choice": ["yes", "no", "maybe"]}, lambda t: t in ("yes", "no", "maybe")),
    ({"regex": "[0-9]{3}-[a-z]{2}"}, lambda t: len(t) == 6 and t[:3].isdigit() and t[3] == "-" and t[4:].isalpha()),
    ({"json": PERSON}, lambda t: jsonschema.validate(json.loads(t), PERSON) is None),
    ({"grammar": 'start: "The answer is " NUMBER "."\nNUMBER: /[1-9][0-9]?/'},
     lambda t: t.startswith("The answer is ") and t.endswith(".") and t[14:-1].isdigit()),
])
def test_vllm_structured_outputs_on_chat_and_completions(client, constraint, check):
    r = client.chat.completions.create(model=MODEL, messages=ASK, temperature=1.0, seed=3, max_tokens=60,
                                       extra_body={"structured_outputs": constraint})
    assert check(r.choices[0].message.content), r.choices[0].message.content
    c = client.completions.create(model=MODEL, prompt="Answer:", temperature=1.0, seed=4, max_tokens=60,
                                  extra_body={"structured_outputs": constraint})
    assert check(c.choices[0].text), c.choices[0].text


@needs_llguidance
def test_responses_text_format_json_schema(client):
    r = client.responses.create(model=MODEL, input="Describe a person.", max_output_tokens=80, temperature=0,
                                text={"format": {"type": "json_schema", "name": "person", "schema": PERSON,
                                                 "strict": True}})
    jsonschema.validate(json.loads(r.output_text), PERSON)


@needs_llguidance
def test_a_bad_schema_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=5,
                                       extra_body={"structured_outputs": {"regex": "(unclosed"}})
    assert "structured_outputs.regex" in e.value.body["message"]


# -- forced tool calls -----------------------------------------------------------------------------

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                     "unit": {"type": "string", "enum": ["c", "f"]}},
    "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "maxLength": 20}}, "required": ["zone"],
    "additionalProperties": False}}}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}


@needs_llguidance
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_forced_tool_choice_always_yields_a_valid_call(client, seed, choice):
    for prompt in ["What is the weather in Paris?", "Hello!"]:
        r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                           tools=[WEATHER, TIME], tool_choice=choice, temperature=1.0, seed=seed,
                                           max_tokens=100, parallel_tool_calls=False)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls" and c.message.tool_calls, c
        for call in c.message.tool_calls:
            if isinstance(choice, dict):
                assert call.function.name == "get_time"
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@needs_llguidance
def test_forced_tool_choice_streams_a_call(client):
    name, args = None, ""
    for chunk in client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], stream=True,
                                                tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                                temperature=0, max_tokens=100):
        for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            name = name or d.function.name
            args += d.function.arguments or ""
    assert name == "get_weather"
    jsonschema.validate(json.loads(args), SCHEMAS["get_weather"])


@needs_llguidance
def test_responses_forced_tool_choice(client):
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER["function"]["parameters"]}
    r = client.responses.create(model=MODEL, input="Weather in Rome?", tools=[tool], tool_choice="required",
                                max_output_tokens=100, temperature=0)
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), SCHEMAS["get_weather"])


@needs_llguidance
@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_time"}])
def test_anthropic_tool_choice_any_and_tool_yield_a_valid_call(server, choice):
    anthropic = pytest.importorskip("anthropic")
    c = anthropic.Anthropic(base_url=server[0], api_key="none", max_retries=0)
    tools = [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
              "input_schema": t["function"]["parameters"]} for t in (WEATHER, TIME)]
    for seed_prompt in ["What time is it in Tokyo?", "Tell me a joke."]:
        m = c.messages.create(model=MODEL, max_tokens=100, messages=[{"role": "user", "content": seed_prompt}],
                              tools=tools, tool_choice=choice,
                              extra_body={"temperature": 0})  # the SDK (2.x) dropped the argument; the API keeps it
        uses = [b for b in m.content if b.type == "tool_use"]
        assert m.stop_reason == "tool_use" and uses, m
        for u in uses:
            if choice["type"] == "tool":
                assert u.name == "get_time"
            jsonschema.validate(u.input, SCHEMAS[u.name])
