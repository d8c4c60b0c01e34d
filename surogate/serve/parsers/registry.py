"""Which parsers a model gets: detected from its chat template and model type, overridable by name.

Detection reads what the template writes, since that is what the model was trained to answer
in: a template that renders ``<tool_call>`` gets the Hermes parser, one that speaks of
``<|python_tag|>`` / ``"parameters"`` under Llama 3 headers gets Llama 3 JSON, one that writes
``[TOOL_CALLS]`` gets Mistral's, one that writes ``<|tool_call>`` Gemma 4's, one that writes
``<|tool_call_start|>`` LFM2's pythonic calls, one that writes ``<function=`` Qwen3-Coder's XML
(before the Hermes check: those templates wrap it in ``<tool_call>``), one that writes DeepSeek's
``<｜tool▁calls▁begin｜>`` DeepSeek's (V3 with its fenced JSON, V3.1), one that writes ``<think>`` (Gemma 4: ``<|channel>``)
gets the reasoning parser. Where
the template does not show it, the model family's defaults decide (``Family.chat``, in the
family's file: Qwen templates that take tools answer in Hermes tags). The names are vLLM's and
SGLang's, so a flag copied from their documentation works here (``--reasoning-parser qwen3
--tool-call-parser hermes``).

A template that writes harmony's ``<|channel|>`` and ``<|message|>`` (GPT-OSS) gets the harmony
pair (harmony.py): analysis as reasoning, ``to=functions.NAME`` messages as calls.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from surogate.errors import NotFoundError
from surogate.models import chat_defaults_for
from surogate.serve.parsers.base import OutputParser, ReasoningParser, ToolParser
from surogate.serve.parsers.deepseek_tool_calls import CALLS_BEGIN as DEEPSEEK_CALLS
from surogate.serve.parsers.deepseek_tool_calls import DeepSeekToolParser
from surogate.serve.parsers.forced_tool_calls import ForcedToolParser, ForcedTools, OfferedTools
from surogate.serve.parsers.gemma4_tool_calls import Gemma4ToolParser
from surogate.serve.parsers.harmony import HarmonyReasoningParser, HarmonyToolParser
from surogate.serve.parsers.lfm2_tool_calls import Lfm2ToolParser
from surogate.serve.parsers.mistral_tool_calls import MistralToolParser
from surogate.serve.parsers.qwen3_coder_tool_calls import Qwen3CoderToolParser
from surogate.serve.parsers.reasoning import ThinkReasoningParser
from surogate.serve.parsers.tool_calls import HermesToolParser, Llama3JsonToolParser

GEMMA4_THOUGHT = ("<|channel>thought", "<channel|>")  # Gemma 4's thinking block

# name -> factory(prompt_text) ; deepseek_r1 starts in reasoning even when the prompt did not open it
REASONING_PARSERS: dict[str, Callable[[str | None], ReasoningParser]] = {
    "qwen3": lambda prompt: ThinkReasoningParser.for_prompt(prompt),
    "think": lambda prompt: ThinkReasoningParser.for_prompt(prompt),
    "glm45": lambda prompt: ThinkReasoningParser.for_prompt(prompt),
    "deepseek_r1": lambda prompt: ThinkReasoningParser.for_prompt(prompt, force_reasoning=True),
    "gemma4": lambda prompt: ThinkReasoningParser.for_prompt(prompt, start_tag=GEMMA4_THOUGHT[0],
                                                             end_tag=GEMMA4_THOUGHT[1]),
    "openai_gptoss": HarmonyReasoningParser.for_prompt,
    "harmony": HarmonyReasoningParser.for_prompt,
}
# name -> factory(); one with ``uses_schemas`` is given the request's tools' parameter schemas
TOOL_PARSERS: dict[str, Callable[..., ToolParser]] = {
    "hermes": HermesToolParser,
    "qwen3": HermesToolParser,
    "qwen25": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    "llama3": Llama3JsonToolParser,
    "openai": HarmonyToolParser,
    "harmony": HarmonyToolParser,
    "mistral": MistralToolParser,
    "gemma4": Gemma4ToolParser,
    "lfm2": Lfm2ToolParser,
    "qwen3_coder": Qwen3CoderToolParser,
    "qwen3_xml": Qwen3CoderToolParser,
    "deepseek_v3": DeepSeekToolParser,
    "deepseek_v31": DeepSeekToolParser,
}



# The harmony tool parser reads the calls its reasoning parser passes on (harmony.py).
HARMONY = ("openai_gptoss", "harmony")


class ParserChoice(msgspec.Struct, frozen=True):
    reasoning: str | None = None
    tool: str | None = None


def detect_parsers(chat_template: str | None, model_type: str | None = None) -> ParserChoice:
    text = chat_template or ""
    family = chat_defaults_for(model_type)
    reasoning = None
    if "<|channel|>" in text and "<|message|>" in text:  # harmony (GPT-OSS)
        return ParserChoice(reasoning="openai_gptoss", tool="openai" if "tools" in text else None)
    if "<think>" in text or "</think>" in text:
        reasoning = (family.reasoning_parser if family else None) or "qwen3"
    elif "<|channel>" in text:
        reasoning = "gemma4"
    if "<function=" in text:
        tool = "qwen3_coder"
    elif DEEPSEEK_CALLS in text:
        tool = "deepseek_v3" if "```json" in text else "deepseek_v31"
    elif "<tool_call>" in text:
        tool = "hermes"
    elif "<|python_tag|>" in text or ("<|start_header_id|>" in text and '"parameters"' in text):
        tool = "llama3_json"
    elif "[TOOL_CALLS]" in text:
        tool = "mistral"
    elif "<|tool_call>" in text:
        tool = "gemma4"
    elif "<|tool_call_start|>" in text:
        tool = "lfm2"
    elif family is not None and family.tool_parser and "tools" in text:
        tool = family.tool_parser
    else:
        tool = None
    return ParserChoice(reasoning=reasoning, tool=tool)


def resolve_parsers(chat_template: str | None, model_type: str | None = None, *,
                    reasoning: str = "auto", tool: str = "auto") -> ParserChoice:
    """``auto`` detects, ``none`` turns the parser off, a name picks one."""
    detected = detect_parsers(chat_template, model_type)
    return ParserChoice(reasoning=_pick(reasoning, detected.reasoning, REASONING_PARSERS, "reasoning"),
                        tool=_pick(tool, detected.tool, TOOL_PARSERS, "tool-call"))


def make_output_parser(choice: ParserChoice, prompt_text: str | None, *, tools: bool | OfferedTools | ForcedTools,
                       reasoning: bool = True, max_tool_calls: int | None = None) -> OutputParser | None:
    """The parser for one generated answer, or None when nothing is to be parsed. ``tools`` says
    whether the request offered tools (no tools, no tool parsing: vLLM does the same; OfferedTools
    carries their schemas, for the formats that need them to type the arguments); forced
    tools (a grammar wrote the call as JSON) are read by ForcedToolParser whatever the model."""
    r = REASONING_PARSERS[choice.reasoning](prompt_text) if reasoning and choice.reasoning else None
    if r is None and choice.reasoning in HARMONY:
        r = _Silent(REASONING_PARSERS[choice.reasoning](prompt_text))  # its headers still need reading
    if isinstance(tools, ForcedTools):
        t = ForcedToolParser(tools)
    else:
        factory = TOOL_PARSERS[choice.tool] if tools and choice.tool else None
        if factory is None:
            t = None
        elif getattr(factory, "uses_schemas", False):
            t = factory(tools.tools if isinstance(tools, OfferedTools) else None)
        else:
            t = factory()
    if r is None and t is None:
        return None
    return OutputParser(r, t, max_tool_calls=max_tool_calls)


class _Silent:
    """A reasoning parser whose reasoning is dropped (reasoning not wanted, the format still read)."""

    def __init__(self, inner: ReasoningParser):
        self.inner = inner

    @property
    def in_reasoning(self) -> bool:
        return self.inner.in_reasoning

    @property
    def tags(self) -> tuple[str, ...]:
        return getattr(self.inner, "tags", ())

    def feed(self, text: str) -> tuple[str, str]:
        return "", self.inner.feed(text)[1]

    def finish(self) -> tuple[str, str]:
        return "", self.inner.finish()[1]


def _pick(name: str, detected: str | None, table: dict, what: str) -> str | None:
    if name == "auto":
        return detected
    if name in ("none", ""):
        return None
    if name not in table:
        raise NotFoundError(f"no {what} parser named {name!r}",
                            hint=f"choose one of {sorted(table)}, 'auto' or 'none'")
    return name
