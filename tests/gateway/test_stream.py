"""SSE encoders: byte-exact golden transcripts, read back by the official SDKs' own parsers.

The deltas come from the real frontend: a sample answer is tokenized by the tiny Qwen3-style
tokenizer and fed, a few tokens per step, through ``OutputProcessor`` with the model's parsers,
exactly as engine outputs would be. The encoders' bytes are compared with
tests/gateway/golden/*.sse (``SUROGATE_UPDATE_GOLDEN=1`` rewrites them), then served through an
``httpx`` MockTransport to ``openai`` / ``anthropic`` clients, whose stream parsers and
accumulators (which check event order and item identities) must rebuild the same answer as the
non-streaming object built from the same state. No engine is involved.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import anthropic
import openai
import pytest

from surogate.gateway.anthropic.stream import MessageStream
from surogate.gateway.errors import ApiError, Kind
from surogate.gateway.openai import protocol as p
from surogate.gateway.openai.stream import ChatStream, CompletionStream, ResponsesStream, usage
from surogate.gateway.sse import Ids, encoder
from surogate.serve import SamplingParams, TokenLogprob
from surogate.serve.frontend import OutputProcessor
from surogate.serve.parsers import ParserChoice, make_output_parser

try:  # the SDKs' HTTP library (httpx, or its successor httpx2 in newer SDKs)
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx

GOLDEN = Path(__file__).parent / "golden"
CREATED = 1_700_000_000

ANSWER_TOOLS = ("<think>\nThe user wants the weather in two cities, so two calls.\n</think>\n\nLet me check both.\n"
                '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
                '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich", "unit": "C"}}\n</tool_call>')
ANSWER_TEXT = "<think>\nEasy: 12 + 30 = 42.\n</think>\n\nThe answer is 42 🙂. Hello world!"


def golden(name: str, data: bytes) -> None:
    path = GOLDEN / name
    if os.environ.get("SUROGATE_UPDATE_GOLDEN") == "1":
        GOLDEN.mkdir(exist_ok=True)
        path.write_bytes(data)
    assert path.exists(), f"no golden {name}: run with SUROGATE_UPDATE_GOLDEN=1 to write it"
    assert data == path.read_bytes(), f"{name} changed; rerun with SUROGATE_UPDATE_GOLDEN=1 if intended"


def answer(tok, text, *, tools=True, opts=None, batch=4, finish="stop", logprobs=False, eos=True):
    """Deltas for ``text`` as the engine would produce it, ``batch`` tokens per step."""
    opts = opts or SamplingParams()
    proc = OutputProcessor(tok, opts, make_output_parser(ParserChoice("qwen3", "hermes"), None, tools=tools))
    ids = tok.encode(text, add_special_tokens=False) + ([tok.eos_token_id] if eos else [])
    deltas = []
    for i in range(0, len(ids), batch):
        step = ids[i:i + batch]
        lp = [TokenLogprob(t, -0.25, 1, [TokenLogprob(t, -0.25, 1), TokenLogprob(0, -3.5, 2)]) for t in step] \
            if logprobs else None
        deltas.append(proc.step(step, lp, finish if i + batch >= len(ids) else None))
        if proc.finished:
            break
    return proc, deltas


def mock_response(body: bytes, sse: bool):
    def handler(request):
        return httpx.Response(200, content=body, headers={
            "content-type": "text/event-stream" if sse else "application/json"})
    return httpx.Client(transport=httpx.MockTransport(handler))


def openai_client(body: bytes, sse: bool = True) -> openai.OpenAI:
    return openai.OpenAI(api_key="k", base_url="http://test/v1", http_client=mock_response(body, sse), max_retries=0)


def anthropic_client(body: bytes, sse: bool = True) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="k", base_url="http://test", http_client=mock_response(body, sse),
                               max_retries=0)


MESSAGES = [{"role": "user", "content": "Weather in Paris and Zürich?"}]


# -- chat -----------------------------------------------------------------------------------------


def test_chat_stream_with_reasoning_and_parallel_tool_calls(tiny_tokenizers):
    tok = tiny_tokenizers["chatml"]
    proc, deltas = answer(tok, ANSWER_TOOLS)
    out = ChatStream(id="chatcmpl-t", created=CREATED, model="tiny", include_usage=True, ids=Ids("t"))
    body = out.start() + b"".join(out.delta(0, d) for d in deltas)
    final_usage = usage(20, proc.num_tokens, cached_tokens=16, reasoning_tokens=proc.reasoning_tokens)
    body += out.end(final_usage)
    golden("chat_tools_reasoning.sse", body)
    plain = encoder.encode(out.completion(final_usage))
    golden("chat_tools_reasoning.json", plain)

    # The raw stream, chunk by chunk, through the SDK's SSE decoder.
    chunks = list(openai_client(body).chat.completions.create(model="tiny", messages=MESSAGES, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    assert all(c.id == "chatcmpl-t" and c.created == CREATED and c.model == "tiny" for c in chunks)
    assert all(c.usage is None for c in chunks[:-1]) and chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == proc.num_tokens
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 16
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == proc.reasoning_tokens
    reasoning = "".join(c.choices[0].delta.model_extra.get("reasoning_content", "") for c in chunks if c.choices)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert reasoning == "The user wants the weather in two cities, so two calls."
    assert content == "Let me check both."
    calls: dict[int, dict] = {}
    for c in chunks:
        for tc in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            if tc.index not in calls:  # vLLM's invariants: id, type and name on the first delta only
                assert tc.id and tc.type == "function" and tc.function.name and tc.function.arguments == ""
                calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": ""}
            else:
                assert tc.id is None and tc.function.name is None
            calls[tc.index]["arguments"] += tc.function.arguments
    assert [json.loads(c["arguments"]) for c in calls.values()] == [{"city": "Paris"}, {"city": "Zürich", "unit": "C"}]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"

    # The SDK's accumulating helper ends with the same message as the non-streaming body.
    with openai_client(body).chat.completions.stream(model="tiny", messages=MESSAGES) as stream:
        streamed = stream.get_final_completion()
    whole = openai_client(plain, sse=False).chat.completions.create(model="tiny", messages=MESSAGES)
    for msg in (streamed.choices[0].message, whole.choices[0].message):
        assert msg.content == "Let me check both."
        assert [(t.id, t.function.name, json.loads(t.function.arguments)) for t in msg.tool_calls] == [
            (calls[0]["id"], "get_weather", {"city": "Paris"}), (calls[1]["id"], "get_weather",
                                                                  {"city": "Zürich", "unit": "C"})]
    assert whole.choices[0].finish_reason == streamed.choices[0].finish_reason == "tool_calls"
    assert whole.choices[0].message.model_extra["reasoning_content"] == reasoning
    assert whole.usage == chunks[-1].usage


def test_chat_stream_two_choices_stop_string_and_logprobs(tiny_tokenizers):
    tok = tiny_tokenizers["chatml"]
    opts = SamplingParams(stop=["world"], logprobs=1)
    procs, runs = zip(*(answer(tok, ANSWER_TEXT, tools=False, opts=opts, batch=b, logprobs=True, finish=f)
                        for b, f in ((3, "stop"), (5, "length"))), strict=True)
    out = ChatStream(id="chatcmpl-n", created=CREATED, model="tiny", n=2, logprobs=True, ids=Ids("n"),
                     reasoning_field="both")
    body = out.start()
    for step in range(max(map(len, runs))):  # the engine interleaves the two sequences
        for i, deltas in enumerate(runs):
            if step < len(deltas):
                body += out.delta(i, deltas[step])
    body += out.end(usage(20, sum(p.num_tokens for p in procs)))
    golden("chat_n2_stop_logprobs.sse", body)

    chunks = list(openai_client(body).chat.completions.create(model="tiny", messages=MESSAGES, stream=True, n=2))
    assert [c.choices[0].index for c in chunks[:2]] == [0, 1]  # one role chunk per choice
    for i in range(2):
        mine = [c.choices[0] for c in chunks if c.choices[0].index == i]
        assert "".join(ch.delta.content or "" for ch in mine) == "The answer is 42 🙂. Hello "  # "world" never sent
        assert "".join(ch.delta.model_extra["reasoning"] for ch in mine if ch.delta.model_extra.get("reasoning")) \
            == "Easy: 12 + 30 = 42."
        assert mine[-1].finish_reason == "stop" and mine[-1].model_extra["stop_reason"] == "world"
        tokens = [t for ch in mine if ch.logprobs for t in ch.logprobs.content]
        assert len(tokens) == procs[i].num_tokens and all(t.top_logprobs for t in tokens)
        assert bytes(b for t in tokens for b in t.bytes).decode().startswith("<think>\nEasy")
    assert chunks[-1].usage is None  # no include_usage: no usage chunk


def test_chat_stream_error_after_the_header_reaches_the_sdk():
    out = ChatStream(id="chatcmpl-e", created=CREATED, model="tiny", ids=Ids("e"))
    body = out.start() + out.error(ApiError(Kind.internal, "engine failed"))
    golden("chat_error.sse", body)
    with pytest.raises(openai.APIError, match="engine failed"):
        list(openai_client(body).chat.completions.create(model="tiny", messages=MESSAGES, stream=True))


# -- completions ----------------------------------------------------------------------------------


def test_completions_stream_with_echo_and_logprobs(tiny_tokenizers):
    tok = tiny_tokenizers["chatml"]
    proc, deltas = answer(tok, "Hello world! The quick brown fox", tools=False, opts=SamplingParams(logprobs=1),
                          logprobs=True, finish="length", eos=False)
    out = CompletionStream(id="cmpl-t", created=CREATED, model="tiny", num_choices=1, include_usage=True,
                           logprobs=True)
    body = out.echo(0, "Say: ") + b"".join(out.delta(0, d) for d in deltas)
    final_usage = usage(3, proc.num_tokens)
    body += out.end(final_usage)
    golden("completions_echo_logprobs.sse", body)
    chunks = list(openai_client(body).completions.create(model="tiny", prompt="Say: ", stream=True, echo=True,
                                                         logprobs=1))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "Say: Hello world! The quick brown fox"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    offsets = [o for c in chunks if c.choices and c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset]
    assert offsets == sorted(offsets) and offsets[0] == len("Say: ")
    assert chunks[-1].usage.completion_tokens == proc.num_tokens
    whole = openai_client(encoder.encode(out.completion(final_usage)), sse=False).completions.create(
        model="tiny", prompt="Say: ")
    assert whole.choices[0].text == "Say: Hello world! The quick brown fox"
    assert len(whole.choices[0].logprobs.tokens) == proc.num_tokens


# -- responses ------------------------------------------------------------------------------------


def responses_base() -> p.Response:
    return p.Response(id="resp_t", created_at=CREATED, model="tiny", status="in_progress")


def test_responses_stream_items_and_done_events(tiny_tokenizers):
    tok = tiny_tokenizers["chatml"]
    proc, deltas = answer(tok, ANSWER_TOOLS)
    out = ResponsesStream(responses_base(), Ids("r"))
    final_usage = p.ResponseUsage(input_tokens=20, input_tokens_details=p.InputTokensDetails(cached_tokens=0),
                                  output_tokens=proc.num_tokens,
                                  output_tokens_details=p.OutputTokensDetails(reasoning_tokens=proc.reasoning_tokens),
                                  total_tokens=20 + proc.num_tokens)
    body = out.start() + b"".join(out.delta(d) for d in deltas) + out.end("completed", final_usage)
    golden("responses_tools_reasoning.sse", body)

    events = list(openai_client(body).responses.create(model="tiny", input="weather?", stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    added = [e.item for e in events if e.type == "response.output_item.added"]
    done = [e.item for e in events if e.type == "response.output_item.done"]
    final = events[-1].response
    # Every item added is done, with the same id, and response.completed lists exactly those.
    assert [i.id for i in added] == [i.id for i in done] == [i.id for i in final.output]
    assert [i.type for i in final.output] == ["reasoning", "message", "function_call", "function_call"]
    for kind in ("output_text", "reasoning_text", "content_part", "function_call_arguments"):
        assert f"response.{kind}.done" in types, kind
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == final.output_text == "Let me check both."
    assert [(c.name, json.loads(c.arguments)) for c in final.output if c.type == "function_call"] == [
        ("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Zürich", "unit": "C"})]
    assert {c.call_id for c in final.output if c.type == "function_call"} == {
        i.call_id for i in added if i.type == "function_call"}

    # The SDK's strict accumulator (identity checks between added, done and completed).
    with openai_client(body).responses.stream(model="tiny", input="weather?") as stream:
        streamed = stream.get_final_response()
    assert streamed.output_text == "Let me check both." and streamed.usage.output_tokens == proc.num_tokens
    whole = openai_client(encoder.encode(out.response("completed", final_usage)), sse=False).responses.create(
        model="tiny", input="weather?")
    assert [i.id for i in whole.output] == [i.id for i in final.output]


def test_responses_incomplete_at_the_token_limit(tiny_tokenizers):
    tok = tiny_tokenizers["chatml"]
    proc, deltas = answer(tok, ANSWER_TEXT, tools=False, finish="length", eos=False)
    out = ResponsesStream(responses_base(), Ids("i"))
    final_usage = p.ResponseUsage(input_tokens=5, input_tokens_details=p.InputTokensDetails(),
                                  output_tokens=proc.num_tokens, output_tokens_details=p.OutputTokensDetails(),
                                  total_tokens=5 + proc.num_tokens)
    body = (out.start() + b"".join(out.delta(d) for d in deltas)
            + out.end("incomplete", final_usage, "max_output_tokens"))
    golden("responses_incomplete.sse", body)
    events = list(openai_client(body).responses.create(model="tiny", input="x", stream=True))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    assert events[-1].response.output_text == "The answer is 42 🙂. Hello world!"


# -- anthropic ------------------------------------------------------------------------------------


def test_anthropic_stream_thinking_text_and_tool_use(tiny_tokenizers):
    tok = tiny_tokenizers["chatml"]
    proc, deltas = answer(tok, ANSWER_TOOLS)
    out = MessageStream(id="msg_t", model="tiny", input_tokens=20, ids=Ids("a"))
    body = out.start() + b"".join(out.delta(d) for d in deltas)
    out.cached_tokens = 16
    body += out.end(proc.finish_reason, proc.stop_reason, proc.num_tokens)
    golden("anthropic_thinking_tools.sse", body)
    plain = encoder.encode(out.message(proc.finish_reason, proc.stop_reason, proc.num_tokens))
    golden("anthropic_thinking_tools.json", plain)

    kwargs = dict(model="tiny", max_tokens=100, messages=MESSAGES)
    events = list(anthropic_client(body).messages.create(stream=True, **kwargs))
    types = [e.type for e in events]
    assert types[0] == "message_start" and types[-2:] == ["message_delta", "message_stop"]
    starts = [e.content_block.type for e in events if e.type == "content_block_start"]
    assert starts == ["thinking", "text", "tool_use", "tool_use"]
    assert [e.index for e in events if e.type == "content_block_start"] == [0, 1, 2, 3]
    assert types.count("content_block_stop") == 4
    sig = [e for e in events if e.type == "content_block_delta" and e.delta.type == "signature_delta"]
    assert len(sig) == 1 and sig[0].index == 0

    with anthropic_client(body).messages.stream(**kwargs) as stream:
        streamed = stream.get_final_message()
    whole = anthropic_client(plain, sse=False).messages.create(**kwargs)
    for msg in (streamed, whole):
        assert [b.type for b in msg.content] == ["thinking", "text", "tool_use", "tool_use"]
        assert msg.content[0].thinking == "The user wants the weather in two cities, so two calls."
        assert msg.content[1].text == "Let me check both."
        assert [(b.name, b.input) for b in msg.content[2:]] == [("get_weather", {"city": "Paris"}),
                                                                 ("get_weather", {"city": "Zürich", "unit": "C"})]
        assert msg.stop_reason == "tool_use" and msg.usage.output_tokens == proc.num_tokens
        assert msg.usage.cache_read_input_tokens == 16
    assert [b.id for b in streamed.content[2:]] == [b.id for b in whole.content[2:]]


def test_anthropic_stop_sequence_and_stream_error(tiny_tokenizers):
    tok = tiny_tokenizers["chatml"]
    proc, deltas = answer(tok, ANSWER_TEXT, tools=False, opts=SamplingParams(stop=["Hello"]))
    out = MessageStream(id="msg_s", model="tiny", input_tokens=3, ids=Ids("s"))
    body = out.start() + b"".join(out.delta(d) for d in deltas) + out.end(proc.finish_reason, proc.stop_reason,
                                                                          proc.num_tokens)
    golden("anthropic_stop_sequence.sse", body)
    with anthropic_client(body).messages.stream(model="tiny", max_tokens=10, messages=MESSAGES) as stream:
        msg = stream.get_final_message()
    assert (msg.stop_reason, msg.stop_sequence) == ("stop_sequence", "Hello")
    assert msg.content[-1].text == "The answer is 42 🙂. "

    broken = MessageStream(id="msg_e", model="tiny", input_tokens=3)
    body = broken.start() + broken.error(ApiError(Kind.overloaded, "Overloaded"))
    with pytest.raises(anthropic.APIStatusError, match="Overloaded"):
        list(anthropic_client(body).messages.create(model="tiny", max_tokens=10, messages=MESSAGES, stream=True))
