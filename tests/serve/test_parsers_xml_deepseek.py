"""Qwen3-Coder's XML tool calls and DeepSeek's (V3 fenced, V3.1 bare): the right answer whole and
in every chunking, the arguments typed by the request's schemas as vLLM types them, detection from
the templates, and the gateway passing the offered tools' schemas down to the parser."""

from __future__ import annotations

import json

import pytest
from sgtest.parsing import check_all_ways, collect

from surogate.serve.parsers import (
    DeepSeekToolParser,
    OfferedTools,
    OutputParser,
    ParserChoice,
    Qwen3CoderToolParser,
    ThinkReasoningParser,
    detect_parsers,
    make_output_parser,
)
from surogate.serve.parsers.qwen3_coder_tool_calls import convert_value

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
    "temp": {"type": "number"}, "hours": {"type": "array"}, "opts": {"type": "object"},
    "note": {"type": ["string", "null"]}, "zip": {"type": "string"}, "unit": {"enum": ["c", "f"]}}}
SCHEMAS = {"get_weather": WEATHER, "get_time": {"type": "object", "properties": {"tz": {"type": "string"}}}}


def args(**kw) -> str:
    return json.dumps(kw, ensure_ascii=False)


XML_CASES = [
    # (name, text, content, calls)
    ("one", "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
     "", [("get_weather", args(city="Paris"))]),
    ("typed", "<tool_call>\n<function=get_weather>\n<parameter=city>\nSão Paulo\n</parameter>\n"
     "<parameter=days>\n3\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n<parameter=temp>\n21.5\n</parameter>\n"
     "<parameter=hours>\n[1, 2]\n</parameter>\n<parameter=opts>\n{\"a\": null}\n</parameter>\n"
     "<parameter=zip>\n01234\n</parameter>\n<parameter=unit>\nc\n</parameter>\n</function>\n</tool_call>",
     "", [("get_weather", args(city="São Paulo", days=3, metric=True, temp=21.5, hours=[1, 2], opts={"a": None},
                               zip="01234", unit="c"))]),
    ("text-then-two", "Checking both.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
     "</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n<parameter=tz>\nCET\n</parameter>\n</function>\n"
     "</tool_call>", "Checking both.", [("get_weather", args(city="Paris")), ("get_time", args(tz="CET"))]),
    ("multiline-value", "<tool_call>\n<function=get_weather>\n<parameter=city>\nline one\n  line two <b>\n"
     "</parameter>\n</function>\n</tool_call>", "", [("get_weather", args(city="line one\n  line two <b>"))]),
    ("no-wrapper", "<function=get_time>\n<parameter=tz>\nUTC\n</parameter>\n</function>", "",
     [("get_time", args(tz="UTC"))]),
    ("no-params", "<tool_call>\n<function=get_time>\n</function>\n</tool_call>", "", [("get_time", "{}")]),
    ("unclosed-param", "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n<parameter=days>\n2\n"
     "</function>\n</tool_call>", "", [("get_weather", args(city="Rome", days=2))]),
    ("cut-off", "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n4\n</par",
     "", [("get_weather", args(city="Oslo", days=4))]),
    ("null-and-bad-int", "<function=get_weather>\n<parameter=note>\nnull\n</parameter>\n<parameter=days>\nsoon\n"
     "</parameter>\n</function>", "", [("get_weather", args(note=None, days="soon"))]),
    ("untyped-stays-text", "<function=lookup>\n<parameter=n>\n5\n</parameter>\n</function>", "",
     [("lookup", args(n="5"))]),
    ("hermes-json-is-content", '<tool_call>\n{"name": "f"}\n</tool_call>', '<tool_call>\n{"name": "f"}\n</tool_call>', []),
    ("plain", "No tools needed: 2 < 3 and <b>bold</b>.", "No tools needed: 2 < 3 and <b>bold</b>.", []),
    ("call-then-text", "<function=get_time>\n<parameter=tz>\nCET\n</parameter>\n</function>\nDone.", "Done.",
     [("get_time", args(tz="CET"))]),
]


@pytest.mark.parametrize("name,text,content,expected", XML_CASES, ids=[c[0] for c in XML_CASES])
def test_qwen3_coder_parser_all_chunkings(name, text, content, expected):
    want = {"content": content, "reasoning": "", "calls": expected}
    check_all_ways(lambda: OutputParser(None, Qwen3CoderToolParser(SCHEMAS)), text, want)


def test_qwen3_coder_streams_the_name_before_the_arguments_and_each_parameter_as_it_closes():
    parser = OutputParser(None, Qwen3CoderToolParser(SCHEMAS))
    assert parser.feed("<tool_call>\n<function=get_weather>").tool_calls[0].name == "get_weather"
    d = parser.feed("\n<parameter=city>\nParis\n</parameter>\n")
    assert [c.arguments for c in d.tool_calls] == ['{"city": "Paris"']
    d = parser.feed("<parameter=days>\n2")
    assert d.tool_calls == []  # a value is known only once it closes
    tail = [parser.feed("\n</parameter>\n</function>"), parser.finish()]
    assert "".join(c.arguments for t in tail for c in t.tool_calls) == ', "days": 2}'


def test_convert_value_types_as_the_schema_says():
    s = {"properties": {"i": {"type": "integer"}, "f": {"type": "number"}, "b": {"type": "boolean"},
                        "o": {"type": "object"}, "s": {"type": "string"}, "any": {"description": "x"}}}
    assert convert_value("42", s, "i") == 42 and convert_value("-7", s, "i") == -7
    assert convert_value("2.50", s, "f") == 2.5 and convert_value("3", s, "f") == 3
    assert convert_value("false", s, "b") is False and convert_value("yes", s, "b") == "yes"
    assert convert_value("{'a': True}", s, "o") == {"a": True}  # a Python literal, as some models write
    assert convert_value("null", s, "s") == "null"  # a string parameter keeps the text
    assert convert_value("[1]", s, "any") == [1]
    assert convert_value("42", None, "i") == "42"


def test_qwen3_coder_gets_the_offered_tools_schemas_through_make_output_parser():
    text = "<function=get_weather>\n<parameter=days>\n3\n</parameter>\n</function>"
    typed = make_output_parser(ParserChoice(None, "qwen3_coder"), None, tools=OfferedTools(SCHEMAS))
    assert collect(typed, [text])["calls"] == [("get_weather", args(days=3))]
    untyped = make_output_parser(ParserChoice(None, "qwen3_coder"), None, tools=True)
    assert collect(untyped, [text])["calls"] == [("get_weather", args(days="3"))]


def test_qwen3_coder_calls_inside_reasoning_stay_reasoning():
    parser = OutputParser(ThinkReasoningParser("reasoning"), Qwen3CoderToolParser(SCHEMAS))
    text = "maybe <function=get_time> here</think>\n\n<function=get_time>\n<parameter=tz>\nCET\n</parameter>\n</function>"
    got = collect(parser, list(text))
    assert got == {"content": "", "reasoning": "maybe <function=get_time> here", "calls": [("get_time", args(tz="CET"))]}


B, E, CB, CE, SEP = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
                     "<｜tool▁sep｜>")
DEEPSEEK_CASES = [
    ("v3", f'{B}{CB}function{SEP}get_weather\n```json\n{{"city": "Paris"}}\n```{CE}{E}', "",
     [("get_weather", '{"city": "Paris"}')]),
    ("v3-two-after-text", f'Let me check.\n{B}{CB}function{SEP}get_weather\n```json\n{{"city": "Paris"}}\n```{CE}\n'
     f'{CB}function{SEP}get_time\n```json\n{{"tz": "CET"}}\n```{CE}{E}', "Let me check.",
     [("get_weather", '{"city": "Paris"}'), ("get_time", '{"tz": "CET"}')]),
    ("v31", f'{B}{CB}get_weather{SEP}{{"city": "Paris"}}{CE}{CB}get_time{SEP}{{}}{CE}{E}', "",
     [("get_weather", '{"city": "Paris"}'), ("get_time", "{}")]),
    ("v31-then-text", f'{B}{CB}get_time{SEP}{{"tz": "UTC"}}{CE}{E}\nDone.', "Done.", [("get_time", '{"tz": "UTC"}')]),
    ("cut-off", f'{B}{CB}get_weather{SEP}{{"city": "Par', "", [("get_weather", '{"city": "Par')]),
    ("no-sep-is-content", f"{B}{CB}nonsense{CE}{E}", f"{CB}nonsense{CE}", []),
    ("plain", "Nothing to call | here ▁.", "Nothing to call | here ▁.", []),
]


@pytest.mark.parametrize("name,text,content,expected", DEEPSEEK_CASES, ids=[c[0] for c in DEEPSEEK_CASES])
def test_deepseek_parser_all_chunkings(name, text, content, expected):
    want = {"content": content, "reasoning": "", "calls": expected}
    check_all_ways(lambda: OutputParser(None, DeepSeekToolParser()), text, want)


def test_templates_pick_the_parsers():
    coder = ("{% for tool in tools %}<function>{{ tool.name }}</function>{% endfor %}"
             "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n"
             "</parameter>\n</function>\n</tool_call>")
    assert detect_parsers(coder, "qwen3_moe").tool == "qwen3_coder"  # not hermes, though it writes <tool_call>
    v3 = f"{{{{'{B}{CB}' + tool['type'] + '{SEP}' + tool['function']['name'] + '\\n```json\\n'}}}}<think>"
    v31 = f"{{{{'{B}{CB}' + tool['function']['name'] + '{SEP}' + tool['function']['arguments']}}}}"
    assert detect_parsers(v3, None) == ParserChoice("qwen3", "deepseek_v3")
    assert detect_parsers(v31, None).tool == "deepseek_v31"
    assert detect_parsers("<tool_call>{{ x }}</tool_call>", None).tool == "hermes"
