"""Serve and Chat end to end: the Serve screen starts a real gateway (`surogate serve`) on a free
loopback port with a tiny model, shows its numbers and request log, and the Chat screen gets a
streamed answer from it; then the gateway is stopped."""

from __future__ import annotations

import pytest
from textual.widgets import RichLog, Select

from surogate.tui.widgets.chat_message import ChatMessage


def test_serve_a_tiny_model_and_chat_with_it(world, settings, make_app, h):
    pytest.importorskip("granian")
    pytest.importorskip("prometheus_client")
    tiny_models = pytest.importorskip("sgtest.tiny_models")
    pytest.importorskip("transformers")
    tiny_models.make_llama(world / "models" / "tiny", seed=5)
    port = h.free_port()
    app = make_app("serve")

    async def script(pilot):
        serve = app.screen
        serve.set_model(str(world / "models" / "tiny"))
        serve.query_one("#serve-port").value = str(port)
        await pilot.press("s")
        await h.wait_for(pilot, lambda: serve.state in ("running", "exited"), timeout=120, what="the gateway")
        log = "\n".join(str(line.text) for line in serve.query_one("#serve-log", RichLog).lines)
        assert serve.state == "running", log
        assert serve.stats.models == {"tiny": "loaded"}
        await h.wait_for(pilot, lambda: app.gateway_url == f"http://127.0.0.1:{port}", what="the Ready message")

        await pilot.press("c")  # to Chat: it picks up the gateway's URL and models
        chat = app.screen
        await h.wait_for(pilot, lambda: chat.query_one("#chat-model", Select).value == "tiny", what="the model list")
        chat.query_one("#max-tokens").value = "12"
        chat.query_one("#temperature").value = "0"
        chat.query_one("#prompt").focus()
        await pilot.press(*"Hello world!", "enter")
        await h.wait_for(pilot, lambda: len(chat.query(ChatMessage)) == 2 and not chat.streaming, timeout=60,
                         what="the answer")
        user, answer = chat.query(ChatMessage)
        assert user.content == "Hello world!"
        assert answer.footer.startswith("finish: "), answer.footer
        assert "completion tokens" in answer.footer and answer.content

        await pilot.press("escape", "3")  # back to Serve: the request is in the log
        await h.wait_for(pilot, lambda: "POST /v1/chat/completions" in "\n".join(
            str(line.text) for line in serve.query_one("#serve-log", RichLog).lines), what="the request log line")
        await h.wait_for(pilot, lambda: (serve.stats.requests or 0) >= 1, what="/metrics counting the request")
        await pilot.press("x")
        await h.wait_for(pilot, lambda: serve.state == "stopped", timeout=30, what="the stop")

    h.drive(app, script)
