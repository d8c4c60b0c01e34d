"""Reasoning and tool-call parsers: the right answer all at once, and the same answer however the
text is chunked (per character, per token of a real tokenizer, random cuts with a fixed seed),
with the OpenAI streaming invariants on the way (a call's name exactly once and first, indices
0, 1, ... in order, arguments that join into JSON)."""

from __future__ import annotations

import json

import pytest
from sgtest import tiny_models
from sgtest.parsing import check_all_ways, chunkings, collect

from surogate.io import Tokenizer
from surogate.serve.parsers import (
    HermesToolParser,
    Lfm2ToolParser,
    Llama3JsonToolParser,
    MistralToolParser,
    OutputParser,
    ParserChoice,
    ThinkReasoningParser,
    detect_parsers,
    initial_state,
    make_output_parser,
    resolve_parsers,
)
from surogate.serve.parsers.json_call import JsonCallScanner



@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    return {style: Tokenizer.from_folder(tiny_models.make_tokenizer(tmp_path_factory.mktemp(style), style))
            for style in ("chatml", "llama3", "mistral")}


def calls(*pairs):
    return [(name, json.dumps(args) if not isinstance(args, str) else args) for name, args in pairs]


# -- reasoning ------------------------------------------------------------------------------------

REASONING_CASES = [
    # (initial state, generated text, reasoning, content)
    ("detect", "<think>\nLet me think: 12 + 30.\n</think>\n\nThe answer is 42.", "Let me think: 12 + 30.",
     "The answer is 42."),
    ("reasoning", "Let me think.\nStill 🙂 thinking.\n</think>\n\nHello world!", "Let me think.\nStill 🙂 thinking.",
     "Hello world!"),
    ("content", "The answer is 42.", "", "The answer is 42."),
    ("content", "<think>not a block here</think> text", "", "<think>not a block here</think> text"),
    ("detect", "<think>\n\n</think>\n\nHi", "", "Hi"),
    ("detect", "Hello <think> world", "", "Hello <think> world"),
    ("detect", "<think>\ncut off while thinking", "cut off while thinking", ""),
    ("detect", "  \n ", "", "  \n "),
    ("detect", "<thi", "", "<thi"),
    ("detect", "<thinking>not the tag</thinking>", "", "<thinking>not the tag</thinking>"),
    ("reasoning", "a </thin b </think> c", "a </thin b", "c"),
]


@pytest.mark.parametrize("state,text,reasoning,content", REASONING_CASES)
def test_reasoning_parser_all_chunkings(state, text, reasoning, content, tokenizers):
    expected = {"content": content, "reasoning": reasoning, "calls": []}
    check_all_ways(lambda: OutputParser(ThinkReasoningParser(state)), text, expected, tokenizers["chatml"])


def test_initial_state_reads_the_end_of_the_prompt(tokenizers):
    tok = tokenizers["chatml"]
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<think>\nx\n</think>\n\nhello"},
               {"role": "user", "content": "again"}]
    thinking_off = tok.apply_chat_template(history, add_generation_prompt=True, tokenize=False, enable_thinking=False)
    assert thinking_off.endswith("<think>\n\n</think>\n\n")
    assert initial_state(thinking_off) == "content"
    default = tok.apply_chat_template(history, add_generation_prompt=True, tokenize=False)
    assert initial_state(default) == "detect"  # earlier turns' closed blocks do not count
    assert initial_state(default + "<think>\n") == "reasoning"  # a template that opens the block (R1-0528 style)
    assert initial_state(None) == "detect"
    assert initial_state(default, force_reasoning=True) == "reasoning"
    assert initial_state(thinking_off, force_reasoning=True) == "content"


def test_prompt_closing_the_block_keeps_the_answer_in_content():
    """vLLM #17349 / #53284: with enable_thinking=false the whole answer landed in reasoning."""
    parser = make_output_parser(ParserChoice("qwen3", None), "<|im_start|>assistant\n<think>\n\n</think>\n\n",
                                tools=False)
    assert collect(parser, ["The answer ", "is 42."]) == {"content": "The answer is 42.", "reasoning": "",
                                                          "calls": []}
    forced = make_output_parser(ParserChoice("deepseek_r1", None), "<|im_start|>assistant\n", tools=False)
    assert collect(forced, ["Thinking", "</think>", "Answer"]) == {"content": "Answer", "reasoning": "Thinking",
                                                                   "calls": []}


# -- Hermes / Qwen tool calls ------------------------------------------------------------------------

WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris"}}'

HERMES_CASES = [
    ("single call after text",
     f"I'll check.\n<tool_call>\n{WEATHER}\n</tool_call>",
     "I'll check.", calls(("get_weather", {"city": "Paris"}))),
    ("parallel calls",
     f'<tool_call>\n{WEATHER}\n</tool_call>\n<tool_call>\n{{"name": "get_time", "arguments": {{"tz": "CET"}}}}\n'
     "</tool_call>",
     "", calls(("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"}))),
    ("text around calls",
     f"Before.\n\n<tool_call>\n{WEATHER}\n</tool_call>\n\nAfter the call.\n",
     "Before.After the call.", calls(("get_weather", {"city": "Paris"}))),
    ("arguments before the name",
     '<tool_call>{"arguments": {"a": [1, 2, {"b": null}]}, "name": "f"}</tool_call>',
     "", calls(("f", '{"a": [1, 2, {"b": null}]}'))),
    ("braces and quotes inside strings",
     '<tool_call>{"name": "run", "arguments": {"code": "if (x) { print(\\"}\\") }", "n": -1.5e3}}</tool_call>',
     "", calls(("run", '{"code": "if (x) { print(\\"}\\") }", "n": -1.5e3}'))),
    ("unicode arguments",
     '<tool_call>\n{"name": "translate", "arguments": {"text": "Ünïcödé 中文 🙂"}}\n</tool_call>',
     "", calls(("translate", '{"text": "Ünïcödé 中文 🙂"}'))),
    ("arguments as a JSON string",
     '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>',
     "", calls(("f", '{"a": 1}'))),
    ("no arguments",
     '<tool_call>{"name": "now"}</tool_call>',
     "", calls(("now", "{}"))),
    ("not JSON: given back as text",
     "Text <tool_call>not json at all</tool_call> more",
     "Text<tool_call>not json at all</tool_call> more", []),
    ("cut off inside the arguments (max_tokens)",
     '<tool_call>\n{"name": "f", "arguments": {"city": "Par',
     "", calls(("f", '{"city": "Par'))),
    ("a tag that never completes",
     "use the <tool_ca",
     "use the <tool_ca", []),
    ("no calls: whitespace kept",
     "Just text.\n\n",
     "Just text.\n\n", []),
]


@pytest.mark.parametrize("name,text,content,expected_calls", HERMES_CASES, ids=[c[0] for c in HERMES_CASES])
def test_hermes_parser_all_chunkings(name, text, content, expected_calls, tokenizers):
    check_all_ways(lambda: OutputParser(None, HermesToolParser()), text,
                   {"content": content, "reasoning": "", "calls": expected_calls}, tokenizers["chatml"])


def test_tool_calls_inside_reasoning_are_reasoning(tokenizers):
    text = (f"<think>\nMaybe <tool_call>{WEATHER}</tool_call>?\n</think>\n\nSure.\n<tool_call>\n{WEATHER}\n"
            "</tool_call>")
    expected = {"content": "Sure.", "reasoning": f"Maybe <tool_call>{WEATHER}</tool_call>?",
                "calls": calls(("get_weather", {"city": "Paris"}))}
    check_all_ways(lambda: make_output_parser(ParserChoice("qwen3", "hermes"), None, tools=True), text, expected,
                   tokenizers["chatml"])


def test_parallel_tool_calls_false_keeps_the_first():
    text = f"<tool_call>{WEATHER}</tool_call><tool_call>{WEATHER}</tool_call>"
    parser = make_output_parser(ParserChoice(None, "hermes"), None, tools=True, max_tool_calls=1)
    assert collect(parser, list(text))["calls"] == calls(("get_weather", {"city": "Paris"}))


def test_streamed_arguments_are_raw_text_not_healed_json():
    """vLLM #10395: bracket-healing partial JSON corrupted streamed arguments. Fragments here
    are exactly the characters the model wrote, so every prefix is a prefix of the final JSON."""
    parser = HermesToolParser()
    text = '<tool_call>{"name": "f", "arguments": {"a": "x", "b": [1, 2]}}</tool_call>'
    sent = ""
    for ch in text:
        _, deltas = parser.feed(ch)
        for d in deltas:
            sent += d.arguments
            assert '{"a": "x", "b": [1, 2]}'.startswith(sent)
    assert sent == '{"a": "x", "b": [1, 2]}'


# -- Llama 3 JSON tool calls ------------------------------------------------------------------------

LLAMA_CASES = [
    ("python tag", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', "",
     calls(("get_weather", {"city": "Paris"}))),
    ("bare JSON", '{"name": "get_weather", "parameters": {"city": "Paris"}}', "",
     calls(("get_weather", {"city": "Paris"}))),
    ("leading whitespace and type", '\n {"type": "function", "name": "f", "parameters": {}}', "", calls(("f", "{}"))),
    ("several, separated by ;", '{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {"y": [2]}}', "",
     calls(("a", {"x": 1}), ("b", {"y": [2]}))),
    ("arguments key", '{"name": "a", "arguments": {"x": "}"}}', "", calls(("a", '{"x": "}"}'))),
    ("plain answer", "The weather in Paris is sunny.", "The weather in Paris is sunny.", []),
    ("JSON answer, not a call", '{"answer": 42, "name": "x"}', '{"answer": 42, "name": "x"}', []),
    ("object without a name", '{"parameters": {"x": 1}}', '{"parameters": {"x": 1}}', []),
    ("text after the call", '{"name": "a", "parameters": {}} and then text', "and then text", calls(("a", "{}"))),
    ("cut off", '{"name": "a", "parameters": {"q": "lon', "", calls(("a", '{"q": "lon'))),
]


@pytest.mark.parametrize("name,text,content,expected_calls", LLAMA_CASES, ids=[c[0] for c in LLAMA_CASES])
@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_llama3_parser_all_chunkings(name, text, content, expected_calls, skip_special_tokens, tokenizers):
    check_all_ways(lambda: OutputParser(None, Llama3JsonToolParser()), text,
                   {"content": content, "reasoning": "", "calls": expected_calls}, tokenizers["llama3"],
                   skip_special_tokens)


def test_json_call_scanner_reports_progress():
    s = JsonCallScanner()
    assert s.feed('{"name": "f", "arguments": {"a": ') == 33
    assert s.name == "f" and s.args_raw == '{"a": ' and not s.done
    assert s.feed('1}} trailing') == 3
    assert s.done and s.args_text == '{"a": 1}'
    bad = JsonCallScanner()
    bad.feed("[1, 2]")
    assert bad.failed


# -- Mistral tool calls ------------------------------------------------------------------------

MISTRAL_CASES = [
    # (name, text, content, calls, needs the special tokens in the text)
    ("v3 single", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]', "",
     calls(("get_weather", {"city": "Paris"})), False),
    ("v3 parallel",
     '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", '
     '"arguments": {"tz": "CET"}}]', "", calls(("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"})), False),
    ("v3 with an id and arguments first",
     '[TOOL_CALLS][{"arguments": {"q": "a]}"}, "name": "search", "id": "a1b2c3d4e"}]', "",
     calls(("search", '{"q": "a]}"}')), False),
    ("v3 no arguments", '[TOOL_CALLS][{"name": "now"}]', "", calls(("now", "{}")), False),
    ("v3 after text", 'Let me look.\n\n[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}]', "Let me look.",
     calls(("f", {"a": 1})), True),
    ("v3 cut off", '[TOOL_CALLS][{"name": "f", "arguments": {"city": "Par', "", calls(("f", '{"city": "Par')), False),
    ("v11 single", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', "", calls(("get_weather", {"city": "Paris"})),
     True),
    ("v11 parallel, text around",
     'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"tz": "CET"} Done.',
     "Sure.Done.", calls(("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"})), True),
    ("v11 call id", '[TOOL_CALLS]f[CALL_ID]a1b2c3d4e[ARGS]{"x": [1, {"y": "}"}]}', "",
     calls(("f", '{"x": [1, {"y": "}"}]}')), True),
    ("v11 cut off in the arguments", '[TOOL_CALLS]f[ARGS]{"q": "lon', "", calls(("f", '{"q": "lon')), True),
    ("v11 cut off before [ARGS]", "[TOOL_CALLS]get_wea", "[TOOL_CALLS]get_wea", [], True),
    ("not a name after the tag", "[TOOL_CALLS]well, no call here", "[TOOL_CALLS]well, no call here", [], True),
    ("plain answer", "The weather in Paris is sunny.", "The weather in Paris is sunny.", [], False),
    ("an array answer, not calls", "[1, 2] are the numbers", "[1, 2] are the numbers", [], False),
    ("objects without names", '[{"city": "Paris"}]', '[{"city": "Paris"}]', [], False),
    ("an empty array", "[] nothing", "[] nothing", [], False),
    ("a tag that never completes", "see [TOOL_CA", "see [TOOL_CA", [], False),
]


@pytest.mark.parametrize("name,text,content,expected_calls,special", MISTRAL_CASES, ids=[c[0] for c in MISTRAL_CASES])
@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_mistral_parser_all_chunkings(name, text, content, expected_calls, special, skip_special_tokens, tokenizers):
    """Every chunking of the text, and token by token through the tiny Mistral tokenizer, where
    [TOOL_CALLS] / [ARGS] / [CALL_ID] are special tokens: skipped, a v3 answer is still calls
    (the bare array); the v11 form and calls after text need them kept."""
    if skip_special_tokens and special:
        pytest.skip("the v11 form and calls after text need the special tokens in the text")
    check_all_ways(lambda: OutputParser(None, MistralToolParser()), text,
                   {"content": content, "reasoning": "", "calls": expected_calls}, tokenizers["mistral"],
                   skip_special_tokens)


def test_mistral_template_round_trip(tokenizers):
    """What the tiny Mistral template renders for an assistant's calls parses back to those calls."""
    tok = tokenizers["mistral"]
    tool_calls = [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                  {"type": "function", "function": {"name": "get_time", "arguments": '{"tz": "CET"}'}}]
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": tool_calls}]
    rendered = tok.apply_chat_template(chat, tokenize=False)
    answer = rendered[rendered.index("[/INST]") + len("[/INST]"):].removesuffix(tok.eos_token)
    assert answer.startswith("[TOOL_CALLS][")
    assert collect(OutputParser(None, MistralToolParser()), list(answer))["calls"] == calls(
        ("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"}))


# -- registry -------------------------------------------------------------------------------------


def test_registry_detects_families_from_the_chat_template(tokenizers):
    assert detect_parsers(tokenizers["chatml"].chat_template) == ParserChoice("qwen3", "hermes")
    assert detect_parsers(tokenizers["llama3"].chat_template) == ParserChoice(None, "llama3_json")
    assert detect_parsers(None) == ParserChoice(None, None)
    assert resolve_parsers(tokenizers["chatml"].chat_template, tool="none") == ParserChoice("qwen3", None)
    assert resolve_parsers(None, reasoning="deepseek_r1", tool="llama3") == ParserChoice("deepseek_r1", "llama3")
    assert detect_parsers(tokenizers["mistral"].chat_template) == ParserChoice(None, "mistral")
    assert resolve_parsers(None, tool="mistral") == ParserChoice(None, "mistral")
    with pytest.raises(LookupError, match="no tool-call parser named 'mistral_v99'"):
        resolve_parsers(None, tool="mistral_v99")
    assert make_output_parser(ParserChoice("qwen3", "hermes"), None, tools=False).tools is None
    assert make_output_parser(ParserChoice(None, "hermes"), None, tools=False) is None


def test_family_defaults_decide_where_the_template_does_not_show_the_format():
    # A template that takes tools without showing their format: Qwen's family default is Hermes.
    template = "{% if tools %}{{ tools | tojson }}{% endif %}{{ messages[0].content }}"
    assert detect_parsers(template, "qwen3") == ParserChoice(None, "hermes")
    assert detect_parsers(template, "qwen2") == ParserChoice(None, "hermes")
    assert detect_parsers(template, "qwen2_moe") == ParserChoice(None, "hermes")
    assert detect_parsers(template, "mistral") == ParserChoice(None, "mistral")
    assert detect_parsers(template, "llama") == ParserChoice(None, None)
    assert detect_parsers(template) == ParserChoice(None, None)
    assert detect_parsers("<think>" + template, "qwen3") == ParserChoice("qwen3", "hermes")


# -- LFM2 pythonic tool calls ------------------------------------------------------------------

S, E = "<|tool_call_start|>", "<|tool_call_end|>"
LFM2_CASES = [
    # (name, text, content, calls)
    ("single", f'{S}[get_weather(city="Paris")]{E}', "", calls(("get_weather", {"city": "Paris"}))),
    ("parallel, literals of every kind",
     f'{S}[f(a=1, b=-2.5, c=True, d=None), g(xs=[1, "two", (3, 4)], m={{"k": "v]"}})]{E}', "",
     calls(("f", {"a": 1, "b": -2.5, "c": True, "d": None}), ("g", {"xs": [1, "two", [3, 4]], "m": {"k": "v]"}}))),
    ("no arguments, text around", f"Checking.\n{S}[now()]{E}\nDone.", "Checking.Done.", calls(("now", {}))),
    ("two sections", f"{S}[a(x=1)]{E} and {S}[b(y='q)')]{E}", "and", calls(("a", {"x": 1}), ("b", {"y": "q)"}))),
    ("a bare call without brackets", f"{S}lookup(q=\"x\"){E}", "", calls(("lookup", {"q": "x"}))),
    ("unicode argument", f'{S}[say(text="héllo ✓")]{E}', "", [("say", json.dumps({"text": "héllo ✓"},
                                                                                 ensure_ascii=False))]),
    ("cut off after a complete list", f'{S}[f(a=1)]', "", calls(("f", {"a": 1}))),
    ("cut off inside a call", f'{S}[f(a="Par', f'{S}[f(a="Par', []),
    ("positional arguments are not calls", f"x {S}[f(1, 2)]{E}", f"x {S}[f(1, 2)]{E}", []),
    ("a non-literal value is not a call", f"{S}[f(a=b)]{E}", f"{S}[f(a=b)]{E}", []),
    ("not a list of calls", f"{S}hello there{E}", f"{S}hello there{E}", []),
    ("plain answer", "The weather in Paris is sunny.", "The weather in Paris is sunny.", []),
    ("a tag that never completes", "see <|tool_ca", "see <|tool_ca", []),
]


@pytest.mark.parametrize("name,text,content,expected_calls", LFM2_CASES, ids=[c[0] for c in LFM2_CASES])
def test_lfm2_parser_all_chunkings(name, text, content, expected_calls):
    check_all_ways(lambda: OutputParser(None, Lfm2ToolParser()), text,
                   {"content": content, "reasoning": "", "calls": expected_calls})


def test_lfm2_detected_from_its_template_and_by_family():
    template = ("{%- if tools %}<|tool_list_start|>{{ tools | tojson }}<|tool_list_end|>{%- endif %}"
                "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
                "{# calls are written <|tool_call_start|>[f(a=1)]<|tool_call_end|> #}")
    assert detect_parsers(template) == ParserChoice(None, "lfm2")
    assert detect_parsers("{{ tools }}<|im_start|>", "lfm2") == ParserChoice(None, "lfm2")
    assert resolve_parsers(None, tool="lfm2") == ParserChoice(None, "lfm2")
