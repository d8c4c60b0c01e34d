"""Chat: a playground against any OpenAI-compatible gateway (the one the Serve screen started, by
default). Answers stream in over SSE; reasoning is folded, tool calls are listed, and the
sampling controls (temperature, top_p, max_tokens) apply to the next message."""

from __future__ import annotations

import threading
import time

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Input, Label, Select

from surogate.tui.gateway_client import ChatDelta, list_models, stream_chat
from surogate.tui.notify import WorkerErrors, describe, notify_error
from surogate.tui.widgets.chat_message import ChatMessage
from surogate.tui.widgets.nav_bar import NavBar


class ChatScreen(WorkerErrors, Screen):
    BINDINGS = [
        Binding("escape", "stop", "Stop/leave field"),
        Binding("ctrl+n", "new_chat", "New chat"),
        Binding("ctrl+r", "refresh_models", "Models"),
    ]

    class Models(Message):
        def __init__(self, models: list[str], error: str | None = None):
            super().__init__()
            self.models, self.error = models, error

    class Delta(Message):
        def __init__(self, widget: ChatMessage, delta: ChatDelta):
            super().__init__()
            self.widget, self.delta = widget, delta

    class Done(Message):
        def __init__(self, widget: ChatMessage, footer: str, error: Exception | None = None):
            super().__init__()
            self.widget, self.footer, self.error = widget, footer, error

    def __init__(self):
        super().__init__()
        self.cancel = threading.Event()
        self.streaming = False

    def compose(self) -> ComposeResult:
        yield NavBar("chat")
        with Horizontal(classes="chat-row"):
            yield Label("URL", classes="form-label short")
            yield Input(self.app.gateway_url or f"http://127.0.0.1:{self.app.settings.serve_port}", id="chat-url",
                        compact=True)
            yield Label("Model", classes="form-label short")
            yield Select([], prompt="(no models)", id="chat-model", compact=True)
        with Horizontal(classes="chat-row"):
            yield Label("temp", classes="form-label tiny")
            yield Input("0.7", id="temperature", compact=True, classes="num")
            yield Label("top_p", classes="form-label tiny")
            yield Input("1.0", id="top-p", compact=True, classes="num")
            yield Label("max", classes="form-label tiny")
            yield Input("", placeholder="auto", id="max-tokens", compact=True, classes="num")
            yield Label("system", classes="form-label tiny")
            yield Input("", placeholder="system prompt (optional)", id="system", compact=True)
        yield VerticalScroll(id="transcript")
        yield Input(placeholder="Message (enter sends, esc stops the answer)", id="prompt")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#prompt").focus()
        self.action_refresh_models()

    def on_screen_resume(self) -> None:
        """Shown again: the gateway may have started (or changed) meanwhile, so ask it again."""
        url = self.app.gateway_url
        if url:
            self.set_url(url)
        else:
            self.action_refresh_models()

    def set_url(self, url: str) -> None:
        """The Serve screen's gateway became ready: point here at it and list its models."""
        box = self.query_one("#chat-url", Input)
        if box.value != url:
            box.value = url
        self.action_refresh_models()

    # -- models --

    def action_refresh_models(self) -> None:
        self.fetch_models(self.query_one("#chat-url", Input).value.strip())

    @on(Input.Submitted, "#chat-url")
    def _url_entered(self) -> None:
        self.action_refresh_models()

    @work(thread=True, exit_on_error=False, exclusive=True, group="models")
    def fetch_models(self, url: str) -> None:
        try:
            self.post_message(self.Models(list_models(url)))
        except Exception as e:
            self.post_message(self.Models([], describe(e)[0]))

    def on_chat_screen_models(self, message: Models) -> None:
        select = self.query_one("#chat-model", Select)
        current = select.value
        select.set_options([(m, m) for m in message.models])
        if message.models:
            select.value = current if current in message.models else message.models[0]

    # -- sending --

    @on(Input.Submitted, "#prompt")
    def _send(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if not text:
            return
        if self.streaming:
            self.notify("Still answering: esc stops it", severity="warning")
            return
        try:
            params = self._sampling()
        except ValueError as e:
            self.notify(str(e), title="Sampling", severity="error", markup=False)
            return
        select = self.query_one("#chat-model", Select)
        if select.is_blank():  # never a request for no model: say why, and ask the gateway again
            url = self.query_one("#chat-url", Input).value.strip()
            self.notify(f"No model to send to: {url} lists none yet. Start the gateway on Serve (3), or check "
                        "the URL; the list refreshes when it answers (ctrl+r asks now)", title="Chat",
                        severity="warning", markup=False)
            self.action_refresh_models()
            return
        model = str(select.value)
        event.input.value = ""
        transcript = self.query_one("#transcript", VerticalScroll)
        history = [m.as_message() for m in transcript.query(ChatMessage) if m.content or m.tool_calls]
        system = self.query_one("#system", Input).value.strip()
        messages = ([{"role": "system", "content": system}] if system else []) + history + \
            [{"role": "user", "content": text}]
        transcript.mount(ChatMessage("user", text))
        answer = ChatMessage("assistant")
        transcript.mount(answer)
        transcript.scroll_end(animate=False)
        self.streaming = True
        self.cancel.clear()
        self.stream(self.query_one("#chat-url", Input).value.strip(), model, messages, params, answer)

    def _sampling(self) -> dict:
        def read(widget_id: str, cast, name: str, lo: float, hi: float):
            raw = self.query_one(f"#{widget_id}", Input).value.strip()
            try:
                value = cast(raw)
            except ValueError:
                raise ValueError(f"{name} must be a number, got {raw!r}") from None
            if not lo <= value <= hi:
                raise ValueError(f"{name} must be between {lo} and {hi}, got {value}")
            return value

        params = {"temperature": read("temperature", float, "temperature", 0.0, 2.0),
                  "top_p": read("top-p", float, "top_p", 0.0, 1.0)}
        if self.query_one("#max-tokens", Input).value.strip():  # empty: up to the model's context
            params["max_tokens"] = read("max-tokens", int, "max_tokens", 1, 1 << 20)
        return params

    @work(thread=True, exit_on_error=False, group="chat")
    def stream(self, url: str, model: str, messages: list[dict], params: dict, widget: ChatMessage) -> None:
        t0 = time.monotonic()
        finish, usage, error = None, None, None
        try:
            for delta in stream_chat(url, {"model": model, "messages": messages, **params},
                                     cancelled=self.cancel.is_set):
                if delta.kind == "finish":
                    finish = delta.finish_reason
                elif delta.kind == "usage":
                    usage = delta.usage
                else:
                    self.post_message(self.Delta(widget, delta))
        except Exception as e:
            error = e
        dt = time.monotonic() - t0
        parts = [model, f"{dt:.1f} s"]
        if self.cancel.is_set():
            parts.insert(0, "stopped")
        elif finish:
            parts.insert(0, f"finish: {finish}")
        if usage:
            done = usage.get("completion_tokens") or 0
            parts.append(f"{usage.get('prompt_tokens', 0)} prompt + {done} completion tokens")
            if dt > 0 and done:
                parts.append(f"{done / dt:.1f} tok/s")
        self.post_message(self.Done(widget, " · ".join(parts), error))

    def on_chat_screen_delta(self, message: Delta) -> None:
        d, w = message.delta, message.widget
        if d.kind == "content":
            w.add_content(d.text)
        elif d.kind == "reasoning":
            w.add_reasoning(d.text)
        elif d.kind == "tool_call":
            w.add_tool_call(d.index, d.name, d.text)
        transcript = self.query_one("#transcript", VerticalScroll)
        if transcript.scroll_y >= transcript.max_scroll_y - 3:
            transcript.scroll_end(animate=False)

    def on_chat_screen_done(self, message: Done) -> None:
        self.streaming = False
        if message.error is not None:
            message.widget.finish("error: " + describe(message.error)[0])
            notify_error(self.app, message.error, "Chat")
        else:
            message.widget.finish(message.footer)
        self.query_one("#transcript", VerticalScroll).scroll_end(animate=False)

    # -- keys --

    def action_stop(self) -> None:
        if self.streaming:
            self.cancel.set()
        elif isinstance(self.focused, Input) and self.focused.id != "prompt":
            self.query_one("#prompt").focus()
        elif isinstance(self.focused, Input):
            self.query_one("#transcript").focus()

    def action_new_chat(self) -> None:
        if self.streaming:
            self.cancel.set()
        self.query_one("#transcript", VerticalScroll).remove_children()
        self.query_one("#prompt").focus()
