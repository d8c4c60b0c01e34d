"""Output parsers: reasoning (``<think>``) and tool calls (Hermes / Qwen, Qwen3-Coder XML, Llama 3 JSON, Mistral, LFM2 pythonic, DeepSeek), incremental.

``make_output_parser(resolve_parsers(template, model_type), prompt_text, tools=True)`` gives the
parser for one answer; feed it text deltas, then ``finish()``.
"""

from __future__ import annotations

from surogate.serve.parsers.base import OutputParser, ParsedDelta, ToolCallDelta
from surogate.serve.parsers.deepseek_tool_calls import DeepSeekToolParser
from surogate.serve.parsers.forced_tool_calls import ForcedToolParser, ForcedTools, OfferedTools
from surogate.serve.parsers.lfm2_tool_calls import Lfm2ToolParser
from surogate.serve.parsers.mistral_tool_calls import MistralToolParser
from surogate.serve.parsers.qwen3_coder_tool_calls import Qwen3CoderToolParser
from surogate.serve.parsers.reasoning import ThinkReasoningParser, initial_state
from surogate.serve.parsers.registry import (
    REASONING_PARSERS,
    TOOL_PARSERS,
    ParserChoice,
    detect_parsers,
    make_output_parser,
    resolve_parsers,
)
from surogate.serve.parsers.tool_calls import HermesToolParser, Llama3JsonToolParser

__all__ = [
    "REASONING_PARSERS",
    "TOOL_PARSERS",
    "DeepSeekToolParser",
    "ForcedToolParser",
    "ForcedTools",
    "HermesToolParser",
    "Lfm2ToolParser",
    "Llama3JsonToolParser",
    "MistralToolParser",
    "OfferedTools",
    "OutputParser",
    "ParsedDelta",
    "ParserChoice",
    "Qwen3CoderToolParser",
    "ThinkReasoningParser",
    "ToolCallDelta",
    "detect_parsers",
    "initial_state",
    "make_output_parser",
    "resolve_parsers",
]
