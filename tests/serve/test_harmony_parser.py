"""The harmony parsers (GPT-OSS; surogate/serve/parsers/harmony.py): analysis messages as
reasoning, final and plain commentary as content, ``to=functions.NAME`` messages as tool calls,
the same result however the text is chunked (whole, per character, every cut into two and three
pieces, random cuts), detected from a harmony chat template."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from surogate.serve.parsers import ParserChoice, detect_parsers, make_output_parser


def chunkings(text: str):
    yield [text]
    yield list(text)
    for a in range(1, len(text)):
        yield [text[:a], text[a:]]
    step = max(1, len(text) // 25)  # every pair of cuts on a grid, and the cuts right at the tokens
    cuts = sorted(set(range(1, len(text), step)) | {i for i in range(len(text)) if text[i] in "<>|"})
    for a, b in itertools.combinations(cuts, 2):
        yield [text[:a], text[a:b], text[b:]]
    rng = random.Random(7)
    for _ in range(30):
        cs = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(2, 15))))
        yield [text[i:j] for i, j in zip([0, *cs], [*cs, len(text)])]


def collect(parser, chunks) -> dict:
    content, reasoning, calls, order = [], [], {}, []
    for d in [*(parser.feed(c) for c in chunks), parser.finish()]:
        content.append(d.content)
        reasoning.append(d.reasoning)
        for c in d.tool_calls:
            if c.index not in calls:
                assert c.name is not None and c.index == len(order)
                calls[c.index] = [c.name, c.arguments]
                order.append(c.index)
            else:
                assert c.name is None and c.index == order[-1]
                calls[c.index][1] += c.arguments
    return {"content": "".join(content), "reasoning": "".join(reasoning), "calls": [tuple(calls[i]) for i in order]}


HARMONY = ParserChoice(reasoning="openai_gptoss", tool="openai")
CASES = [
    ("<|channel|>analysis<|message|>Easy: 12 + 30.<|end|><|start|>assistant<|channel|>final<|message|>The answer "
     "is 42.<|return|>", "Easy: 12 + 30.", "The answer is 42.", []),
    ('<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary '
     'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>', "Need the weather.", "",
     [("get_weather", '{"city": "Paris"}')]),
    # the recipient before the channel, a preamble on commentary, no analysis
    ('<|channel|>commentary<|message|>Checking both.<|end|><|start|>assistant to=functions.get_time'
     '<|channel|>commentary json<|message|>{"tz": "CET"}<|call|>', "", "Checking both.", [("get_time", '{"tz": "CET"}')]),
    # cut off by max_tokens inside the analysis
    ("<|channel|>analysis<|message|>Let me think about <it>", "Let me think about <it>", "", []),
    # no header at all: plain text is content
    ("Hello 🙂 world", "", "Hello 🙂 world", []),
]


@pytest.mark.parametrize("text,reasoning,content,calls", CASES)
def test_every_chunking_gives_the_whole_answer(text, reasoning, content, calls):
    want = {"content": content, "reasoning": reasoning, "calls": calls}
    for chunks in chunkings(text):
        assert collect(make_output_parser(HARMONY, "<|start|>assistant", tools=True), chunks) == want, chunks
    for c in calls:
        json.loads(c[1])


def test_without_tools_or_reasoning():
    text = CASES[1][0]
    got = collect(make_output_parser(HARMONY, None, tools=False), [text])
    assert got["reasoning"] == "Need the weather." and got["calls"] == []
    got = collect(make_output_parser(HARMONY, None, tools=True, reasoning=False), [text])
    assert got["reasoning"] == "" and got["calls"] == [("get_weather", '{"city": "Paris"}')]
    text = CASES[0][0]
    assert collect(make_output_parser(HARMONY, None, tools=True, reasoning=False), list(text))["content"] == \
        "The answer is 42."


def test_detected_from_a_harmony_template():
    template = ("{%- for m in messages %}<|start|>{{ m.role }}<|channel|>final<|message|>{{ m.content }}<|end|>"
                "{%- endfor %}{%- if tools %}# Tools{%- endif %}<|start|>assistant")
    assert detect_parsers(template, "gpt_oss") == HARMONY
    assert detect_parsers(template.replace("{%- if tools %}# Tools{%- endif %}", ""), "gpt_oss") == \
        ParserChoice(reasoning="openai_gptoss", tool=None)


def test_the_generation_api_keeps_special_tokens_for_harmony(tmp_path):
    """Harmony's headers are special tokens: a request parsed as harmony is detokenized with them
    (skip_special_tokens off for its processor); other parsers keep the request's setting."""
    from sgtest import tiny_models

    from surogate.io import Tokenizer
    from surogate.serve import LLM, EngineClient, EngineConfig, SamplingParams

    tok = Tokenizer.from_folder(tiny_models.make_tokenizer(tmp_path, "chatml"))

    class Runner:
        vocab_size = tok.vocab_size

        def run(self, step):
            import numpy as np

            return np.zeros((len(step.logits_rows), tok.vocab_size), np.float32)

    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    for choice, skip in ((HARMONY, False), (ParserChoice(reasoning="qwen3", tool="hermes"), True)):
        llm = LLM(EngineClient(Runner(), EngineConfig(num_blocks=16, block_size=4)), tok, max_model_len=64,
                  parsers=choice)
        with llm.client:
            gen = llm.submit("hi", params, tools=True)
            gen.close()
        assert gen.processors[0].opts.skip_special_tokens is skip
        text = CASES[1][0]
        proc = gen.processors[0]
        if choice == HARMONY:
            outs = [proc.step([t]) for t in tok.encode(text, add_special_tokens=False)] + [proc.step([], None, "stop")]
            assert "".join(o.reasoning for o in outs) == "Need the weather."
            assert [c.name for o in outs for c in o.tool_calls if c.name] == ["get_weather"]
