"""Serve and Chat end to end: the Serve screen starts a real gateway (`surogate serve`) on a free
loopback port with a tiny model, shows its numbers and request log, and the Chat screen gets a
streamed answer from it; a LoRA adapter typed into the LoRA field is loaded into it and listed;
then the gateway is stopped. The Library's s starts serving, the Chat
screen lists the models of a gateway that came up after it was first shown (no ctrl+r), and it
never sends a request without a model."""

from __future__ import annotations

import json

import pytest
from textual.widgets import RichLog, Select

from surogate.tui.widgets.chat_message import ChatMessage


def test_serve_a_tiny_model_and_chat_with_it(world, settings, make_app, h):
    pytest.importorskip("granian")
    pytest.importorskip("prometheus_client")
    tiny_models = pytest.importorskip("sgtest.tiny_models")
    pytest.importorskip("transformers")
    tiny_models.make_llama(world / "models" / "tiny", seed=5)
    adapter = _adapter_for(world / "models" / "tiny", world / "output" / "run" / "adapter")
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

        await pilot.press("l")  # the LoRA field: NAME=PATH, enter loads it into the running gateway
        assert serve.focused is serve.query_one("#serve-lora")
        await pilot.press(*f"mine={adapter}", "enter")
        await h.wait_for(pilot, lambda: serve.stats is not None and serve.stats.adapters == {"mine": "tiny"},
                         timeout=60, what="the adapter listed")
        await h.wait_for(pilot, lambda: serve.query_one("#serve-lora").value == "", what="the field cleared")
        await pilot.press("x")
        await h.wait_for(pilot, lambda: serve.state == "stopped", timeout=30, what="the stop")

    h.drive(app, script)


def test_library_s_serves_and_chat_lists_the_model_without_ctrl_r(world, settings, make_app, h):
    """The issue's walk: Chat first (no gateway: no models, and enter says so instead of sending
    model "Select.NULL"), then the Library's s starts serving the selected model, and back on
    Chat the model is listed with no ctrl+r and answers."""
    pytest.importorskip("granian")
    pytest.importorskip("prometheus_client")
    tiny_models = pytest.importorskip("sgtest.tiny_models")
    pytest.importorskip("transformers")
    from textual.widgets import DataTable

    tiny_models.make_llama(world / "models" / "tiny", seed=5)
    app = make_app("chat")

    async def script(pilot):
        chat = app.screen
        await pilot.app.workers.wait_for_complete()
        assert chat.query_one("#chat-model", Select).is_blank()
        chat.query_one("#prompt").focus()
        await pilot.press(*"Hi", "enter")
        await h.wait_for(pilot, lambda: any("No model to send to" in n for n in h.notifications(app)),
                         what="the notice")
        assert not chat.query(ChatMessage) and chat.query_one("#prompt").value == "Hi"  # nothing sent, text kept

        await pilot.press("f2")  # Library
        library = app.screen
        await h.wait_for(pilot, lambda: library.query_one("#models", DataTable).row_count >= 1, what="the scan")
        await pilot.press("s")
        serve = app.screen
        assert serve.query_one("#serve-model").value == "models/tiny"
        await h.wait_for(pilot, lambda: serve.state in ("running", "exited"), timeout=120, what="the gateway")
        assert serve.state == "running", "\n".join(str(x.text) for x in serve.query_one("#serve-log", RichLog).lines)
        await h.wait_for(pilot, lambda: app.gateway_url is not None, what="the Ready message")

        await pilot.press("f5")  # Chat again: the list is asked again, no ctrl+r
        await h.wait_for(pilot, lambda: chat.query_one("#chat-model", Select).value == "tiny", what="the model list")
        chat.query_one("#max-tokens").value = "4"
        chat.query_one("#prompt").focus()
        await pilot.press("enter")  # "Hi" is still in the box
        await h.wait_for(pilot, lambda: len(chat.query(ChatMessage)) == 2 and not chat.streaming, timeout=60,
                         what="the answer")
        assert chat.query(ChatMessage)[1].footer.startswith("finish: ")
        await pilot.press("f4")
        await pilot.press("x")
        await h.wait_for(pilot, lambda: serve.state == "stopped", timeout=30, what="the stop")

    h.drive(app, script)


class FakeGateway:
    """/v1/models of a gateway that lists ``models`` (empty: none yet); counts chat requests."""

    def __init__(self, port: int):
        import http.server
        import threading

        gateway = self
        self.models: list[str] = []
        self.chat_requests = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = json.dumps({"object": "list", "data": [{"id": m, "object": "model"} for m in gateway.models]})
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def do_POST(self):
                gateway.chat_requests += 1
                self.send_response(404)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_chat_lists_the_models_when_the_gateway_comes_up_while_it_is_shown(world, settings, make_app, h):
    from surogate.tui.screens.serve import ServeScreen

    gateway = FakeGateway(settings.serve_port)  # up, serving nothing yet
    app = make_app("chat")
    try:
        async def script(pilot):
            chat = app.screen
            await pilot.app.workers.wait_for_complete()
            select = chat.query_one("#chat-model", Select)
            assert select.is_blank()
            chat.query_one("#prompt").focus()
            await pilot.press(*"Hello", "enter")
            await h.wait_for(pilot, lambda: any("No model to send to" in n for n in h.notifications(app)),
                             what="the notice")
            assert gateway.chat_requests == 0 and not chat.query(ChatMessage)

            gateway.models = ["tiny"]  # the Serve screen's gateway is ready while Chat is shown
            app.post_message(ServeScreen.Ready(f"http://127.0.0.1:{settings.serve_port}"))
            await h.wait_for(pilot, lambda: select.value == "tiny", what="the model list")

            gateway.models = ["other"]  # restarted with another model: shown again, Chat asks again
            await pilot.press("f2")
            await pilot.press("f5")
            await h.wait_for(pilot, lambda: select.value == "other", what="the refreshed list")

        h.drive(app, script)
    finally:
        gateway.close()


def _adapter_for(base, path):
    """A PEFT adapter for the tiny model (B zeros: the base model's answers)."""
    import surogate
    from surogate.dsl.nn import LoRAConfig
    from surogate.train.lora import init_lora, save_peft_adapter

    model = surogate.load_model(base)
    cfg = LoRAConfig(rank=4, alpha=8.0, targets=("q_proj", "v_proj"))
    params = init_lora(model.arch.build(mode="logits", dtype="float32", lora=cfg), 1)
    return save_peft_adapter(path, params, cfg, base_model=str(base))
