"""A lagging consumer's batch: each answer's run of text outputs is merged into one (one SSE
chunk, not one per engine step), in order; tool calls, a finished output and reasoning after
content start a new one; other answers interleave untouched."""

from __future__ import annotations

from surogate.gateway.serving import coalesce
from surogate.serve import RequestOutput
from surogate.serve.parsers.base import ToolCallDelta


def out(index, ids, content="", reasoning="", finish=None, calls=()):
    o = RequestOutput(index, list(ids), None, None, finish, None, None, 4, 0, 0, index=index)
    o.content, o.reasoning, o.tool_calls = content, reasoning, list(calls)
    return o


def test_one_answers_text_steps_become_one_output_with_its_finish():
    got = coalesce([out(0, [1], "a"), out(1, [7], "x"), out(0, [2], "b"), out(0, [3], "c", finish="length")])
    assert [(o.index, o.new_token_ids, o.content, o.finish_reason) for o in got] == \
        [(0, [1, 2, 3], "abc", "length"), (1, [7], "x", None)]


def test_reasoning_then_content_merges_but_content_then_reasoning_or_a_tool_call_does_not():
    call = ToolCallDelta(index=0, name="f", arguments="{}")
    outs = [out(0, [1], reasoning="r1"), out(0, [2], content="c1"), out(0, [3], reasoning="r2"),
            out(0, [4], content="c2", calls=[call]), out(0, [5], content="c3")]
    got = coalesce(outs)
    assert [(o.reasoning, o.content) for o in got] == [("r1", "c1"), ("r2", ""), ("", "c2"), ("", "c3")]
    assert [o.new_token_ids for o in got] == [[1, 2], [3], [4], [5]]


def test_nothing_merges_after_an_answer_finished():
    got = coalesce([out(0, [1], "a", finish="stop"), out(0, [2], "b")])
    assert [o.content for o in got] == ["a", "b"]
