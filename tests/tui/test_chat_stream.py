"""The Chat screen reads the gateway's own SSE: the golden transcript of a streamed answer with
reasoning and two tool calls (tests/gateway/golden) assembles into the same message as its
non-streamed golden, and the screen shows it folded, listed and finished."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import httpx

from surogate.tui import gateway_client
from surogate.tui.screens import chat as chat_screen
from surogate.tui.widgets.chat_message import ChatMessage

GOLDEN = Path(__file__).resolve().parents[1] / "gateway" / "golden"


def golden_client() -> httpx.Client:
    sse = (GOLDEN / "chat_tools_reasoning.sse").read_bytes()

    def handler(request: httpx.Request) -> httpx.Response:
        assert json.loads(request.content)["stream"] is True
        return httpx.Response(200, content=sse, headers={"content-type": "text/event-stream"})

    return httpx.Client(transport=httpx.MockTransport(handler))


def test_streamed_deltas_assemble_into_the_non_streamed_answer():
    expected = json.loads((GOLDEN / "chat_tools_reasoning.json").read_text())["choices"][0]
    content, reasoning, calls, finish = "", "", {}, None
    for d in gateway_client.stream_chat("http://gw", {"model": "tiny", "messages": []}, client=golden_client()):
        if d.kind == "content":
            content += d.text
        elif d.kind == "reasoning":
            reasoning += d.text
        elif d.kind == "tool_call":
            call = calls.setdefault(d.index, ["", ""])
            call[0] = d.name or call[0]
            call[1] += d.text
        elif d.kind == "finish":
            finish = d.finish_reason
    message = expected["message"]
    assert content == message["content"] and reasoning == message["reasoning_content"]
    assert [tuple(c) for c in calls.values()] == [(t["function"]["name"], t["function"]["arguments"])
                                                  for t in message["tool_calls"]]
    assert finish == expected["finish_reason"] == "tool_calls"


def test_the_chat_screen_shows_reasoning_folded_and_tool_calls(world, make_app, h, monkeypatch):
    monkeypatch.setattr(chat_screen, "stream_chat", functools.partial(gateway_client.stream_chat,
                                                                      client=golden_client()))
    monkeypatch.setattr(chat_screen, "list_models", lambda url: ["tiny"])
    app = make_app("chat")

    async def script(pilot):
        screen = app.screen
        await h.wait_for(pilot, lambda: screen.query_one("#chat-model").value == "tiny")
        await pilot.press(*"Weather in Paris and Zürich?", "enter")
        await h.wait_for(pilot, lambda: len(screen.query(ChatMessage)) == 2 and not screen.streaming)
        answer = screen.query(ChatMessage).last()
        assert answer.content == "Let me check both."
        assert answer.footer.startswith("finish: tool_calls · tiny")
        section = answer.query_one(".reasoning")
        assert section.display and section.collapsed and section.title == "Reasoning (11 words)"
        calls = str(answer.query_one(".tool-calls").render())
        assert 'tool call: get_weather({"city": "Paris"})' in calls and "Zürich" in calls
        history = answer.as_message()  # what the next request sends back
        assert [c["function"]["name"] for c in history["tool_calls"]] == ["get_weather", "get_weather"]

    h.drive(app, script)
