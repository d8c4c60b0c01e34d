"""Gemma 4's tool-call parser (``<|tool_call>call:NAME{...}<tool_call|>``, Gemma's argument
notation) and thinking block (``<|channel>thought ... <channel|>``), in every chunking of the text
(tests/serve/test_parsers.py's helpers), and their detection from the chat template."""

from __future__ import annotations

import json

import pytest

from surogate.serve.parsers.base import OutputParser
from surogate.serve.parsers.gemma4_tool_calls import Gemma4ToolParser, parse_call
from surogate.serve.parsers.registry import REASONING_PARSERS, detect_parsers

from tests.serve.test_parsers import check_all_ways  # noqa: E402 (the shared chunking helpers)

Q = '<|"|>'
CASES = [
    # (generated text, content, calls)
    (f"<|tool_call>call:get_weather{{city:{Q}Paris, FR{Q},days:3}}<tool_call|>", "",
     [("get_weather", {"city": "Paris, FR", "days": 3})]),
    ("Let me look.<|tool_call>call:a{x:true,y:null,z:-1.5e3}<tool_call|><|tool_call>call:b{}<tool_call|>",
     "Let me look.", [("a", {"x": True, "y": None, "z": -1500.0}), ("b", {})]),
    (f"<|tool_call>call:nest{{opts:{{unit:{Q}C{Q},levels:[1,2,{Q}x,y{Q}]}},{Q}odd key{Q}:{Q}}}{Q}}}<tool_call|>done",
     "done", [("nest", {"opts": {"unit": "C", "levels": [1, 2, "x,y"]}, "odd key": "}"})]),
    ("No calls here, only a < and <|tool", "No calls here, only a < and <|tool", []),
    (f"<|tool_call>call:cut{{a:{Q}unfinished", f"<|tool_call>call:cut{{a:{Q}unfinished", []),
    ("<|tool_call>not a call<tool_call|>", "<|tool_call>not a call<tool_call|>", []),
]


@pytest.mark.parametrize("text, content, expected", CASES)
def test_gemma4_tool_parser_all_chunkings(text, content, expected):
    want = {"content": content, "reasoning": "", "calls": [(n, json.dumps(a)) for n, a in expected]}
    check_all_ways(lambda: OutputParser(None, Gemma4ToolParser()), text, want)


def test_thinking_block_is_reasoning_and_calls_after_it_are_calls():
    text = (f"<|channel>thought\nThe user wants weather.\n<channel|>Sure.<|tool_call>call:w{{c:{Q}Oslo{Q}}}"
            "<tool_call|>")
    want = {"content": "Sure.", "reasoning": "The user wants weather.", "calls": [("w", json.dumps({"c": "Oslo"}))]}
    check_all_ways(lambda: OutputParser(REASONING_PARSERS["gemma4"](None), Gemma4ToolParser()), text, want)


def test_parse_call_refuses_what_is_not_a_call():
    assert parse_call("call:f{a:1}") == ("f", {"a": 1})
    assert parse_call("call:f") == ("f", {})
    assert parse_call("call:{a:1}") is None
    assert parse_call("call:f{a:1} trailing") is None


def test_gemma4_template_is_detected():
    template = ("{{ '<|turn>system\\n' }}{%- if tools %}...{%- endif %}{{ '<|tool_call>call:' + name }}"
                "{{ '<|channel>thought\\n' }}")
    choice = detect_parsers(template, "gemma4_text")
    assert (choice.tool, choice.reasoning) == ("gemma4", "gemma4")
