"""The harmony parsers (GPT-OSS; surogate/serve/parsers/harmony.py): analysis messages as
reasoning, final and plain commentary as content, ``to=functions.NAME`` messages as tool calls,
the same result however the text is chunked (whole, per character, every cut into two and three
pieces, random cuts), detected from a harmony chat template."""

from __future__ import annotations

import itertools
import json
import random

import pytest
from sgtest.parsing import collect

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


def test_the_generation_api_keeps_harmonys_special_tokens(tmp_path):
    """Harmony's headers are special tokens (as in GPT-OSS's tokenizer): under the request's default
    skip_special_tokens a request parsed as harmony still sees them (they are the parsers' tags),
    while other special tokens stay out of the answer."""
    from sgtest import tiny_models
    from tokenizers import AddedToken

    from surogate.io import Tokenizer
    from surogate.serve import LLM, EngineClient, EngineConfig, SamplingParams
    from surogate.serve.parsers.harmony import HarmonyReasoningParser

    tok = Tokenizer.from_folder(tiny_models.make_tokenizer(tmp_path, "chatml"))
    tok.backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                    for t in HarmonyReasoningParser.tags])
    tok.__dict__.pop("special_ids", None)  # cached before the tokens were added
    assert {tok.token_to_id(t) for t in ("<|channel|>", "<|message|>", "<|call|>")} <= tok.special_ids

    class Runner:
        vocab_size = len(tok)

        def run(self, step):
            import numpy as np

            return np.zeros((len(step.logits_rows), len(tok)), np.float32)

    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    llm = LLM(EngineClient(Runner(), EngineConfig(num_blocks=16, block_size=4)), tok, max_model_len=64,
              parsers=HARMONY)
    with llm.client:
        gen = llm.submit("hi", params, tools=True)
        gen.close()
    proc = gen.processors[0]
    assert proc.opts.skip_special_tokens
    text = CASES[1][0] + "<|im_end|>"  # a special token that is not harmony's: skipped
    outs = [proc.step([t]) for t in tok.encode(text, add_special_tokens=False)] + [proc.step([], None, "stop")]
    assert "".join(o.reasoning for o in outs) == "Need the weather."
    assert [c.name for o in outs for c in o.tool_calls if c.name] == ["get_weather"]
    assert "<|im_end|>" not in "".join(o.content for o in outs)
