"""Request conversion: each API's request (decoded by msgspec from the JSON a client sends) becomes
the messages, tools, thinking settings and sampling options we expect, and the prompt ids are
what the tokenizer's own chat template gives for those messages."""

from __future__ import annotations

import msgspec
import pytest

from surogate.gateway.anthropic import protocol as a
from surogate.gateway.anthropic.convert import anthropic_messages, messages_job
from surogate.gateway.errors import ApiError
from surogate.gateway.models import GatewayConfig, ModelTable, ServedModel
from surogate.gateway.openai import protocol as p
from surogate.gateway.openai.convert import chat_job, chat_messages, completion_jobs, responses_job, responses_messages
from surogate.gateway.serving import Gateway

TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


@pytest.fixture
def gw(tiny_tokenizers):
    models = [ServedModel.from_tokenizer("qwen", tiny_tokenizers["chatml"], None, 1024),
              ServedModel.from_tokenizer("llama", tiny_tokenizers["llama3"], None, 1024, adapters=("llama-sql",))]
    return Gateway(ModelTable(models), GatewayConfig())


def decode(cls, obj):
    return msgspec.convert(obj, cls)


def test_chat_conversion(gw, tiny_tokenizers):
    tok = tiny_tokenizers["chatml"]
    req = decode(p.ChatCompletionRequest, {
        "model": "qwen",
        "messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Weather"}, {"type": "text", "text": "in Paris?"}]},
            {"role": "assistant", "content": None, "reasoning_content": "Use the tool.",
             "tool_calls": [{"id": "call_1", "type": "function",
                             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ],
        "tools": [TOOL], "max_tokens": 50, "max_completion_tokens": 40, "stop": "END", "n": 2, "seed": 3,
        "temperature": 0.3, "top_p": 0.9, "presence_penalty": 0.5, "frequency_penalty": -0.5, "logprobs": True,
        "top_logprobs": 2, "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "logit_bias": {"5": -100},
        "parallel_tool_calls": False, "reasoning_effort": "none",
    })
    job = chat_job(gw, req)
    expected = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather\nin Paris?"},
                {"role": "assistant", "content": "", "reasoning_content": "Use the tool.", "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}]
    assert chat_messages(req.messages) == expected
    assert job.prompt.token_ids == tok.apply_chat_template(
        [*expected[:2], {**expected[2], "tool_calls": [{**expected[2]["tool_calls"][0], "function": {
            "name": "get_weather", "arguments": {"city": "Paris"}}}]}, expected[3]],
        tools=[TOOL], add_generation_prompt=True, enable_thinking=False, reasoning_effort="none")
    assert job.prompt.text.endswith("<think>\n\n</think>\n\n")  # reasoning_effort "none" turned thinking off
    o = job.opts
    assert (o.max_tokens, o.stop, o.n, o.seed, o.temperature, o.top_p) == (40, ["END"], 2, 3, 0.3, 0.9)
    assert (o.presence_penalty, o.frequency_penalty, o.logprobs, o.top_k, o.min_p, o.repetition_penalty) == (
        0.5, -0.5, 2, 20, 0.05, 1.1)
    assert o.logit_bias == {5: -100.0}
    assert job.tools and job.max_tool_calls == 1 and job.adapter is None
    assert job.tools.tools == {"get_weather": TOOL["function"]["parameters"]}  # schemas for typed-argument parsers


def test_chat_defaults_and_tool_choice_none(gw, tiny_tokenizers):
    req = decode(p.ChatCompletionRequest, {"model": "llama-sql", "messages": [{"role": "user", "content": "hi"}],
                                           "tools": [TOOL], "tool_choice": "none"})
    job = chat_job(gw, req)
    assert job.adapter == "llama-sql" and not job.tools
    assert job.prompt.token_ids == tiny_tokenizers["llama3"].apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True)  # tools hidden from the template
    assert job.opts.max_tokens == 1024 - len(job.prompt.token_ids)  # the context left
    assert (job.opts.temperature, job.opts.n, job.opts.logprobs, job.opts.stop) == (1.0, 1, None, [])


def test_chat_continue_final_message(gw, tiny_tokenizers):
    req = decode(p.ChatCompletionRequest, {"model": "qwen", "continue_final_message": True, "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello the"}]})
    text = chat_job(gw, req).prompt.text
    assert text.endswith("Hello the") and "<|im_start|>assistant\n" in text  # no new turn: the message goes on


def test_completion_prompts(gw, tiny_tokenizers):
    tok = tiny_tokenizers["llama3"]
    for prompt, expected in [("Hello", [tok.encode("Hello")]), (["a", "b"], [tok.encode("a"), tok.encode("b")]),
                             ([1, 2, 3], [[1, 2, 3]]), ([[1, 2], [3]], [[1, 2], [3]])]:
        jobs = completion_jobs(gw, decode(p.CompletionRequest, {"model": "llama", "prompt": prompt}))
        assert [j.prompt.token_ids for j in jobs] == expected
        assert all(j.opts.max_tokens == 16 for j in jobs)  # the API's default
    jobs = completion_jobs(gw, decode(p.CompletionRequest, {"model": "llama", "prompt": "Hello", "echo": True,
                                                            "logprobs": 2, "add_special_tokens": False}))
    assert jobs[0].prompt.token_ids == tok.encode("Hello", add_special_tokens=False)
    assert (jobs[0].opts.logprobs, jobs[0].opts.prompt_logprobs) == (2, 2)
    assert not jobs[0].tools
    err = completion_jobs(gw, decode(p.CompletionRequest, {"model": "llama", "prompt": "x", "max_tokens": 2000}))
    assert isinstance(err, ApiError) and (err.param, err.code) == ("max_tokens", "context_length_exceeded")


def test_responses_conversion(gw, tiny_tokenizers):
    req = decode(p.ResponsesRequest, {
        "model": "qwen", "instructions": "Be brief.", "max_output_tokens": 64, "reasoning": {"effort": "high"},
        "tools": [{"type": "function", "name": "get_weather", "description": "Weather",
                   "parameters": TOOL["function"]["parameters"]}],
        "input": [
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Use the tool."}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sunny."}]},
            {"role": "user", "content": [{"type": "input_text", "text": "Thanks"}]},
        ]})
    expected = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "", "reasoning_content": "Use the tool.", "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
                {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "Thanks"}]
    assert responses_messages(req) == expected
    job = responses_job(gw, req)
    assert job.tools and job.opts.max_tokens == 64
    assert job.tools.tools == {"get_weather": TOOL["function"]["parameters"]}
    assert job.prompt.token_ids == tiny_tokenizers["chatml"].apply_chat_template(
        [*expected[:2], {**expected[2], "tool_calls": [{**expected[2]["tool_calls"][0], "function": {
            "name": "get_weather", "arguments": {"city": "Paris"}}}]}, *expected[3:]],
        tools=[TOOL], add_generation_prompt=True, reasoning_effort="high")
    # A reasoning item as this server streams it (text in reasoning_text content) goes back the same way.
    ours = decode(p.ResponsesRequest, {"model": "qwen", "input": [
        {"role": "user", "content": "hi"},
        {"type": "reasoning", "id": "rs_2", "summary": [], "content": [{"type": "reasoning_text", "text": "Hmm."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello."}]}]})
    assert responses_messages(ours)[1] == {"role": "assistant", "content": "Hello.", "reasoning_content": "Hmm."}
    bad = responses_job(gw, decode(p.ResponsesRequest, {"model": "qwen", "input": [{"role": "tool",
                                                                                    "content": "x"}]}))
    assert isinstance(bad, ApiError) and bad.param == "input[0].role"


def test_anthropic_conversion(gw, tiny_tokenizers):
    req = decode(a.MessagesRequest, {
        "model": "qwen", "max_tokens": 100, "system": [{"type": "text", "text": "Be brief."}],
        "stop_sequences": ["\n\nHuman:"], "top_k": 10, "temperature": 0.5,
        "thinking": {"type": "disabled"}, "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
        "tools": [{"name": "get_weather", "description": "Weather",
                   "input_schema": TOOL["function"]["parameters"]}],
        "messages": [
            {"role": "ctx", "content": "Context from Claude Code."},
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?",
                                          "cache_control": {"type": "ephemeral"}}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Use the tool.", "signature": "abc"},
                {"type": "redacted_thinking", "data": "xyz"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "rain"}],
                 "is_error": True},
                {"type": "text", "text": "And tomorrow?"}]},
        ]})
    expected = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Context from Claude Code."},
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "Checking.", "reasoning_content": "Use the tool.", "tool_calls": [
                    {"id": "toolu_1", "type": "function", "function": {"name": "get_weather",
                                                                       "arguments": {"city": "Paris"}}}]},
                {"role": "tool", "tool_call_id": "toolu_1", "content": "Error: rain"},
                {"role": "user", "content": "And tomorrow?"}]
    assert anthropic_messages(req.system, req.messages) == expected
    job = messages_job(gw, req)
    assert job.tools.tools == {"get_weather": TOOL["function"]["parameters"]}
    assert job.prompt.token_ids == tiny_tokenizers["chatml"].apply_chat_template(
        expected, tools=[TOOL], add_generation_prompt=True, enable_thinking=False)
    assert job.prompt.text.endswith("<think>\n\n</think>\n\n")
    o = job.opts
    assert (o.max_tokens, o.stop, o.top_k, o.temperature) == (100, ["\n\nHuman:"], 10, 0.5)
    assert job.tools and job.max_tool_calls == 1
    err = messages_job(gw, decode(a.MessagesRequest, {"model": "qwen", "max_tokens": 5000, "messages": [
        {"role": "user", "content": "hi"}]}))
    assert isinstance(err, ApiError) and err.param == "max_tokens"
