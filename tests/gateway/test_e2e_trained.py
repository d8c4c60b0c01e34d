"""Tool calls and reasoning through a real model, end to end: our trainer teaches a tiny Qwen3
(ChatML tokenizer) to answer one prompt with a ``<think>`` block and another with a Hermes
``<tool_call>``; `surogate serve` serves the merged model, and the official SDKs must get both
parsed (OpenAI chat: ``tool_calls``, ``reasoning_content``, streamed tool-call deltas; Anthropic:
``tool_use`` and ``thinking`` blocks, ``input_json_delta``). Every answer is greedy generation."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("granian")
openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

from sgtest.server import surogate_serve  # noqa: E402
from sgtest.tiny_models import make_qwen3  # noqa: E402
from surogate.config import load_config  # noqa: E402
from surogate.io import Tokenizer  # noqa: E402
from surogate.train.trainer import Trainer  # noqa: E402

KEY = "sk-trained"
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                         "parameters": PARAMETERS}}
WEATHER = [{"role": "user", "content": "What is the weather like today in Paris?"}]
SUM = [{"role": "user", "content": "What is 12 + 30?"}]
ANSWERS = [  # (conversation, tools, what the model learns to say after the generation prompt)
    (WEATHER, [TOOL], '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
    (SUM, None, "<think>\nLet me think about it: 12 + 30 = 42\n</think>\n\nThe answer is 42."),
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The tiny model after training on the two answers, as a merged HF folder."""
    root = tmp_path_factory.mktemp("trained")
    base = make_qwen3(root / "base", seed=11, initializer_range=0.2, max_position_embeddings=1024)
    tok = Tokenizer.from_folder(base)
    data = root / "answers.jsonl"
    with open(data, "w") as f:
        # Whole documents (prompt as the server renders it, answer, <|im_end|>), all trained: the
        # chat loss mask leaves out template chrome such as the `<think>\n` the model must emit.
        for messages, tools, answer in ANSWERS:
            prompt = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
            f.write(json.dumps({"text": prompt + answer}) + "\n")
    cfg = load_config({
        "model": str(base), "output_dir": str(root / "run"), "datasets": [{"path": str(data), "type": "text"}],
        "sequence_len": 512, "sample_packing": False, "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 1, "recipe": "fp32", "learning_rate": 2e-2, "lr_scheduler_type": "constant",
        "max_steps": 60, "lora_rank": 16, "lora_alpha": 32, "save_steps": 0, "eval_steps": 0, "seed": 7,
        "max_grad_norm": 1.0, "merge_adapter": True}, kind="sft")
    return Trainer(cfg).train().merged


@pytest.fixture(scope="module")
def server(trained):
    with surogate_serve(f"tiny={trained}", "--kv-cache-tokens", "2048", "--api-key", KEY) as base:
        yield base


def test_openai_chat_tool_call_and_reasoning(server):
    oai = openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0)
    r = oai.chat.completions.create(model="tiny", messages=WEATHER, tools=[TOOL], temperature=0, max_tokens=40)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert not choice.message.content

    # streamed: the first delta of the call has index, id, type and name; the argument fragments
    # joined give the same JSON
    calls: dict[int, dict] = {}
    finish = None
    for chunk in oai.chat.completions.create(model="tiny", messages=WEATHER, tools=[TOOL], temperature=0,
                                             max_tokens=40, stream=True):
        for c in chunk.choices:
            finish = c.finish_reason or finish
            for d in c.delta.tool_calls or []:
                if d.index not in calls:
                    assert d.id and d.type == "function" and d.function.name
                    calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": ""}
                else:
                    assert d.id is None and not d.function.name
                calls[d.index]["arguments"] += d.function.arguments or ""
    assert finish == "tool_calls" and list(calls) == [0]
    assert calls[0]["name"] == "get_weather" and json.loads(calls[0]["arguments"]) == {"city": "Paris"}

    r = oai.chat.completions.create(model="tiny", messages=SUM, temperature=0, max_tokens=40)
    message = r.choices[0].message
    assert r.choices[0].finish_reason == "stop"
    assert message.reasoning_content == "Let me think about it: 12 + 30 = 42"
    assert message.content == "The answer is 42." and not message.tool_calls
    reasoning = content = ""
    for chunk in oai.chat.completions.create(model="tiny", messages=SUM, temperature=0, max_tokens=40, stream=True):
        for c in chunk.choices:
            reasoning += getattr(c.delta, "reasoning_content", None) or ""
            content += c.delta.content or ""
    assert (reasoning, content) == (message.reasoning_content, message.content)


def test_anthropic_tool_use_and_thinking(server):
    claude = anthropic.Anthropic(base_url=server, api_key=KEY, max_retries=0)
    greedy = {"extra_body": {"temperature": 0}}  # newer SDKs have no temperature argument
    tool = {"name": "get_weather", "description": "Weather in a city", "input_schema": PARAMETERS}
    m = claude.messages.create(model="tiny", max_tokens=40, **greedy, messages=WEATHER, tools=[tool])
    assert m.stop_reason == "tool_use"
    [block] = [b for b in m.content if b.type == "tool_use"]
    assert block.name == "get_weather" and block.input == {"city": "Paris"} and block.id.startswith("toolu_")

    with claude.messages.stream(model="tiny", max_tokens=40, **greedy, messages=WEATHER, tools=[tool]) as s:
        fragments = [e.partial_json for e in s if e.type == "input_json"]
        final = s.get_final_message()
    assert json.loads("".join(fragments)) == {"city": "Paris"}
    assert [b.input for b in final.content if b.type == "tool_use"] == [{"city": "Paris"}]

    m = claude.messages.create(model="tiny", max_tokens=40, **greedy, messages=SUM,
                               thinking={"type": "enabled", "budget_tokens": 1024})
    assert [b.type for b in m.content] == ["thinking", "text"] and m.stop_reason == "end_turn"
    assert m.content[0].thinking == "Let me think about it: 12 + 30 = 42"
    assert m.content[1].text == "The answer is 42."
    with claude.messages.stream(model="tiny", max_tokens=40, **greedy, messages=SUM,
                                thinking={"type": "enabled", "budget_tokens": 1024}) as s:
        thinking = "".join(e.thinking for e in s if e.type == "thinking")
        final = s.get_final_message()
    assert thinking == m.content[0].thinking and final.content[1].text == m.content[1].text
