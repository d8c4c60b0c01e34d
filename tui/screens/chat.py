"""Chat: a playground against any OpenAI-compatible gateway (the one the Serve screen started, by
default). Answers stream in over SSE; reasoning is folded, tool calls are listed, and the
sampling controls (temperature, top_p, max_tokens) apply to the next message.

Images: ``/image PATH`` in the prompt (or ctrl+o, which asks for the path) attaches a local file to
the next message, checked at once (surogate.tui.attachments: Pillow's header read); the list above
the prompt shows each one's name, size and pixels, ``/detach N`` (or ``/detach all``) removes them.
On send the files are read again, in a worker, and go as ``image_url`` parts with data URLs; a
file that fails says why and nothing is sent. A turn whose answer failed (a text-only model's 400
naming the image part, say) stays on screen but is not sent again with the history."""

from __future__ import annotations

import threading
import time

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Input, Label, Select, Static

from surogate.tui.attachments import Attachment, check_image, check_request_size, image_part
from surogate.tui.gateway_client import ChatDelta, list_models, stream_chat
from surogate.tui.notify import WorkerErrors, describe, notify_error
from surogate.tui.widgets.chat_message import ChatMessage
from surogate.tui.widgets.nav_bar import NavBar


class ChatScreen(WorkerErrors, Screen):
    BINDINGS = [
        Binding("escape", "stop", "Stop/leave field"),
        Binding("ctrl+n", "new_chat", "New chat"),
        Binding("ctrl+r", "refresh_models", "Models"),
        Binding("ctrl+o", "attach_image", "Image"),
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

    class Attached(Message):
        def __init__(self, attachment: Attachment):
            super().__init__()
            self.attachment = attachment

    class Prepared(Message):
        """The next message's images, read and encoded (``error``: why not; nothing is sent)."""

        def __init__(self, send: dict, images: list[tuple[str, dict]], error: Exception | None = None):
            super().__init__()
            self.send, self.images, self.error = send, images, error

    def __init__(self):
        super().__init__()
        self.cancel = threading.Event()
        self.streaming = False
        self.preparing = False
        self.attachments: list[Attachment] = []  # for the next message
        self.conversation = 0  # ctrl+n counts up: images read for an older conversation are not sent

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
        yield Static("", id="attachments", markup=False)
        yield Input(placeholder="Message (enter sends, esc stops the answer)", id="prompt")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#attachments").display = False
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
        command, _, arg = text.partition(" ")
        if command == "/image":
            event.input.value = ""
            path = arg.strip()
            if len(path) >= 2 and path[0] == path[-1] and path[0] in "'\"":  # a pasted, quoted path
                path = path[1:-1]
            if path:
                self.attach(path)
            else:
                self.action_attach_image()
            return
        if command == "/detach":
            self._remove_attachment(arg.strip(), event.input)
            return
        if not text and not self.attachments:
            return
        if self.streaming or self.preparing:
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
        transcript = self.query_one("#transcript", VerticalScroll)
        turns = [m for m in transcript.query(ChatMessage) if not m.failed and (m.content or m.tool_calls or m.images)]
        system = self.query_one("#system", Input).value.strip()
        send = {"conversation": self.conversation, "url": self.query_one("#chat-url", Input).value.strip(),
                "model": str(select.value), "text": text, "params": params,
                "history": ([{"role": "system", "content": system}] if system else []) +
                [m.as_message() for m in turns],
                "history_image_bytes": sum(len(part["image_url"]["url"]) * 3 // 4 for m in turns
                                           for _, part in m.images)}
        if self.attachments:  # read in a worker; _start when they are in
            self.preparing = True
            self.prepare(send, list(self.attachments))
        else:
            self._start(send, [])

    def _start(self, send: dict, images: list[tuple[str, dict]]) -> None:
        prompt = self.query_one("#prompt", Input)
        if prompt.value.strip() == send["text"]:
            prompt.value = ""
        question = ChatMessage("user", send["text"], images=images)
        messages = send["history"] + [question.as_message()]
        transcript = self.query_one("#transcript", VerticalScroll)
        transcript.mount(question)
        answer = ChatMessage("assistant")
        answer.question = question
        transcript.mount(answer)
        transcript.scroll_end(animate=False)
        self.streaming = True
        self.cancel.clear()
        self.stream(send["url"], send["model"], messages, send["params"], answer)

    @work(thread=True, exit_on_error=False, group="chat")
    def prepare(self, send: dict, attachments: list[Attachment]) -> None:
        images, total = [], send["history_image_bytes"]
        try:
            for att in attachments:
                part, now = image_part(att)
                images.append((now.label(), part))
                total += now.size
            check_request_size(total)
        except Exception as e:
            self.post_message(self.Prepared(send, [], e))
            return
        self.post_message(self.Prepared(send, images))

    def on_chat_screen_prepared(self, message: Prepared) -> None:
        self.preparing = False
        if message.send["conversation"] != self.conversation:
            return
        if message.error is not None:
            notify_error(self.app, message.error, "Image")
            return
        self.attachments.clear()
        self._show_attachments()
        self._start(message.send, message.images)

    # -- images --

    def action_attach_image(self) -> None:
        from surogate.tui.screens.ask import AskScreen

        def picked(path: str | None) -> None:
            if path:
                self.attach(path)
            self.query_one("#prompt").focus()

        self.app.push_screen(AskScreen("Attach an image to the next message",
                                       "a PNG, JPEG, WebP or GIF file; relative to the folder the TUI started in, "
                                       "~ works. enter attaches, esc cancels", placeholder="path/to/image.png"),
                             picked)

    @work(thread=True, exit_on_error=False, group="attach")
    def attach(self, path: str) -> None:
        try:
            self.post_message(self.Attached(check_image(path)))
        except Exception as e:
            notify_error(self.app, e, "Image")

    def on_chat_screen_attached(self, message: Attached) -> None:
        att = message.attachment
        if any(a.path == att.path for a in self.attachments):
            self.notify(f"{att.name} is attached already", title="Image", severity="warning", markup=False)
            return
        self.attachments.append(att)
        self._show_attachments()

    def _remove_attachment(self, arg: str, box: Input) -> None:
        if not self.attachments:
            self.notify("No images attached (/image PATH attaches one)", title="Image", severity="warning")
            return
        if arg in ("", "all"):
            self.attachments.clear()
        elif arg.isdigit() and 1 <= int(arg) <= len(self.attachments):
            del self.attachments[int(arg) - 1]
        else:
            self.notify(f"/detach {arg}: expected a number from 1 to {len(self.attachments)}, or all",
                        title="Image", severity="error", markup=False)
            return
        box.value = ""
        self._show_attachments()

    def _show_attachments(self) -> None:
        bar = self.query_one("#attachments", Static)
        bar.display = bool(self.attachments)
        items = "  ".join(f"[{i}] {a.label()}" for i, a in enumerate(self.attachments, 1))
        bar.update(f"images: {items}  · /detach N removes")

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
            message.widget.failed = True  # shown, but neither it nor its question goes with the next request
            if message.widget.question is not None:
                message.widget.question.failed = True
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
        self.conversation += 1
        self.query_one("#transcript", VerticalScroll).remove_children()
        self.attachments.clear()
        self._show_attachments()
        self.query_one("#prompt").focus()
