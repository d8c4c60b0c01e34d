"""Feeding an output parser in every chunking and checking the streaming invariants (the parser
tests' shared harness)."""

from __future__ import annotations

import random

from surogate.io import Tokenizer
from surogate.serve.detokenizer import IncrementalDetokenizer
from surogate.serve.parsers import OutputParser

SEED = 1234


def collect(parser: OutputParser, chunks) -> dict:
    """Feed ``chunks``, then finish; the joined result, with the stream invariants checked."""
    content, reasoning, calls, order = [], [], {}, []
    for delta in [*(parser.feed(c) for c in chunks), parser.finish()]:
        content.append(delta.content)
        reasoning.append(delta.reasoning)
        for call in delta.tool_calls:
            if call.index not in calls:
                assert call.name is not None, "a call's first delta names it"
                assert call.index == len(order), "indices count 0, 1, ... in order"
                calls[call.index] = [call.name, call.arguments]
                order.append(call.index)
            else:
                assert call.name is None, "the name comes once"
                assert call.index == order[-1], "deltas of an earlier call after a later one started"
                calls[call.index][1] += call.arguments
    return {"content": "".join(content), "reasoning": "".join(reasoning),
            "calls": [tuple(calls[i]) for i in order]}


def chunkings(text: str, tokenizer: Tokenizer | None = None, skip_special_tokens: bool = True):
    yield "whole", [text]
    yield "chars", list(text)
    rng = random.Random(SEED)
    for k in range(20):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12)))) if len(text) > 1 else []
        yield f"random{k}", [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    if tokenizer is not None:
        ids = tokenizer.encode(text, add_special_tokens=False)
        detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip_special_tokens)
        yield "tokens", [detok.push([i]) for i in ids] + [detok.flush()]


def check_all_ways(make, text, expected, tokenizer=None, skip_special_tokens=True):
    for name, chunks in chunkings(text, tokenizer, skip_special_tokens):
        assert collect(make(), chunks) == expected, f"chunking {name!r}: {chunks!r}"
