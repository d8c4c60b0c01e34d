"""The prebuilt chunk templates (sse.Template) give the bytes the Structs encode to: any text
(quotes, escapes, control characters, non-ASCII, emoji), any index, usage on or off, every
reasoning field."""

from __future__ import annotations

import pytest

from surogate.gateway.openai import protocol as p
from surogate.gateway.openai.stream import ChatStream, CompletionStream
from surogate.gateway.sse import Template, data

TEXTS = ["", "plain", 'q"uote\\back', "line\nbreak\ttab\r", "\x01\x1f ctl", "héllo 世界 🙂", "</script>&<", "\u2028"]


@pytest.mark.parametrize("include_usage", [False, True])
def test_completion_text_chunks_match_the_structs(include_usage):
    s = CompletionStream(id="cmpl-1", created=7, model='m"odel', num_choices=3, include_usage=include_usage)
    for index in range(3):
        for text in TEXTS:
            assert s._text_chunk(index, text) == s._chunk(index, text)


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning", "both"])
@pytest.mark.parametrize("include_usage", [False, True])
def test_chat_content_and_reasoning_chunks_match_the_structs(field, include_usage):
    s = ChatStream(id="chatcmpl-1", created=7, model="m", n=2, include_usage=include_usage, reasoning_field=field)
    for index in range(2):
        for text in TEXTS:
            assert s._text_chunk("content", index, text) == s._chunk(index, p.ChoiceDelta(content=text))
            assert s._text_chunk("reasoning", index, text) == s._chunk(index, s._reasoning_delta(text))


def test_a_struct_without_the_mark_has_no_template_and_every_mark_is_filled():
    assert Template.build(p.Model(id="m", created=1, owned_by="x", root="m", parent=None, max_model_len=8)) is None
    t = Template.build({"a": Template.MARK, "n": 3, "b": Template.MARK})
    assert t.fill('x"\n') == data({"a": 'x"\n', "n": 3, "b": 'x"\n'})
