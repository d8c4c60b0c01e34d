"""Serve: start and stop the gateway (`surogate serve MODEL --port N`) as a child process, show
its live numbers from /health and /metrics once a second, the LoRA adapters loaded on it (from
/v1/models), and its request log (the process's output, one JSON line per request, shown as a
table-like line). The LoRA field loads a PEFT adapter into the running gateway
(``NAME=PATH``: POST /v1/load_lora_adapter); requests then pick it with ``model: NAME``.

The gateway the TUI started is stopped when the TUI quits (a training run is not: it may take
hours; a server is easy to start again).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Input, Label, RichLog, Static
from textual.worker import get_current_worker

from surogate.tui.feed import LineTail
from surogate.tui.gateway_client import ServerStats, StatsPoller, load_adapter
from surogate.tui.notify import WorkerErrors, notify_error
from surogate.tui.paths import short_path
from surogate.tui.processes import ServerProcess
from surogate.tui.widgets.nav_bar import NavBar

POLL_SECONDS = 1.0


POLLED = ("/health", "/metrics", "/v1/models")  # this screen's own requests: not shown in the log


def format_log_line(line: str) -> Text | None:
    """An access-log JSON line as `status method path model prompt→completion tokens ms`; other lines
    as they are; None for the screen's own polling."""
    try:
        r = json.loads(line)
    except ValueError:
        r = None
    if not isinstance(r, dict) or "status" not in r or "path" not in r:
        return Text(line, style="dim")
    if r["path"] in POLLED and r.get("method") == "GET":
        return None
    status = int(r.get("status", 0))
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(f"{status} ", style="green" if status < 400 else "yellow" if status < 500 else "red")
    text.append(f"{r.get('method', '')} {r['path']}")
    if r.get("model"):
        text.append(f"  {r['model']}", style="cyan")
        text.append(f"  {r.get('prompt_tokens', 0)}→{r.get('completion_tokens', 0)} tok")
    text.append(f"  {r.get('ms', 0):.0f} ms", style="dim")
    if r.get("ttft_ms") is not None:
        text.append(f"  ttft {r['ttft_ms']:.0f} ms", style="dim")
    if r.get("disconnected"):
        text.append("  client left", style="yellow")
    if r.get("error"):
        text.append(f"  {r['error']}", style="red")
    return text


def format_stats(state: str, url: str | None, s: ServerStats | None) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    style = {"running": "green", "starting": "yellow", "stopping": "yellow", "stopped": "dim",
             "exited": "red"}.get(state, "")
    text.append("gateway  ")
    text.append(state, style=f"bold {style}")
    if url:
        text.append(f"  {url}/v1", style="cyan")
    text.append("\n")
    if s is None or (not s.healthy and not s.models):
        text.append("no numbers yet" if state in ("starting", "running") else "not running", style="dim")
        return text
    models = ", ".join(f"{n} ({st})" for n, st in s.models.items()) or "—"
    text.append(f"models   {models}\n")
    if s.adapters:
        several = len(set(s.adapters.values())) > 1
        names = ", ".join(f"{a} (on {base})" if several else a for a, base in s.adapters.items())
        text.append(f"LoRA     {names}\n")

    def n(v, fmt=".0f"):
        return f"{v:{fmt}}" if isinstance(v, (int, float)) else "—"

    text.append(f"requests running {n(s.running)}  waiting {n(s.waiting)}  done {n(s.requests)}\n")
    text.append(f"tokens/s generated {n(s.generation_tps, ',.1f')}  prompt {n(s.prompt_tps, ',.1f')}\n")
    kv = s.kv_usage
    text.append("KV cache ")
    if isinstance(kv, (int, float)):
        filled = round(min(max(kv, 0), 1) * 20)
        text.append("█" * filled, style="green" if kv < 0.8 else "yellow")
        text.append("░" * (20 - filled), style="dim")
        text.append(f" {kv * 100:.0f}%")
    else:
        text.append("—")
    hits = s.prefix_hit_rate
    text.append(f"   prefix-cache hits {f'{hits * 100:.0f}%' if hits is not None else '—'}")
    return text


class ServeScreen(WorkerErrors, Screen):
    BINDINGS = [
        Binding("s", "start", "Start"),
        Binding("x", "stop", "Stop"),
        Binding("c", "chat", "Chat"),
        Binding("l", "lora", "Load LoRA"),
        Binding("escape", "leave_field", "Leave field", show=False),
    ]

    class Stats(Message):
        def __init__(self, stats: ServerStats):
            super().__init__()
            self.stats = stats

    class LogLines(Message):
        def __init__(self, lines: list[str]):
            super().__init__()
            self.lines = lines

    class Exited(Message):
        def __init__(self, code: int | None):
            super().__init__()
            self.code = code

    class AdapterLoaded(Message):
        def __init__(self, name: str):
            super().__init__()
            self.name = name

    class Ready(Message):
        """The gateway answers /health: the app hands its URL to the Chat screen."""

        def __init__(self, url: str):
            super().__init__()
            self.url = url

    def __init__(self):
        super().__init__()
        self.server: ServerProcess | None = None
        self.state = "stopped"
        self.stats: ServerStats | None = None

    def compose(self) -> ComposeResult:
        yield NavBar("serve")
        with Horizontal(id="serve-controls"):
            yield Label("Model", classes="form-label short")
            yield Input(placeholder="HF folder or cached hub id; empty: the default model", id="serve-model",
                        compact=True)
            yield Label("Port", classes="form-label short")
            yield Input(str(self.app.settings.serve_port), id="serve-port", type="integer", compact=True)
        with Horizontal(id="serve-lora-row"):
            yield Label("LoRA", classes="form-label short")
            yield Input(placeholder="NAME=PATH of a PEFT adapter folder: enter loads it into the running gateway",
                        id="serve-lora", compact=True)
        yield Static("", id="serve-stats")
        yield RichLog(id="serve-log", max_lines=2000, wrap=False, markup=False)
        yield Footer()

    def on_mount(self) -> None:
        self._show()
        self.query_one("#serve-log").focus()  # s / x / c work at once; tab reaches the fields
        self.query_one("#serve-log", RichLog).write(Text("request log: one line per request once started",
                                                         style="dim"))

    def set_model(self, target: str) -> None:
        self.query_one("#serve-model", Input).value = short_path(target) if Path(target).exists() else target
        self.query_one("#serve-log").focus()

    def serve(self, target: str) -> None:
        """Start serving ``target`` (the Library's s). A gateway already running stays: it says
        what it serves, and how to serve this one instead."""
        shown = short_path(target) if Path(target).exists() else target
        if self.server is not None and self.server.running:
            running = self.server.model or "the default model"
            if running == shown:
                self.notify(f"Already serving {shown}", markup=False)
            else:
                self.notify(f"The gateway is serving {running}: x stops it, then s serves {shown}",
                            severity="warning", markup=False)
            return
        self.set_model(target)
        self.action_start()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "serve-lora":
            self.load_lora(event.value.strip())
        else:
            self.action_start()

    # -- LoRA adapters --

    def action_lora(self) -> None:
        self.query_one("#serve-lora", Input).focus()

    def load_lora(self, spec: str) -> None:
        name, sep, path = spec.partition("=")
        name, path = name.strip(), path.strip()
        if not sep or not name or not path:
            self.notify("Give the adapter as NAME=PATH (a PEFT folder: adapter_config.json + "
                        "adapter_model.safetensors)", severity="error", markup=False)
            return
        if self.server is None or not self.server.running or self.state != "running":
            self.notify("Start the gateway first (s), then load adapters into it", severity="warning")
            return
        self.notify(f"Loading {name} from {short_path(path)} ...", markup=False)
        self.run_load(self.server.url, name, str(Path(path).expanduser()))

    @work(thread=True, exit_on_error=False, group="lora")
    def run_load(self, url: str, name: str, path: str) -> None:
        try:
            load_adapter(url, name, path)
        except Exception as e:
            self.app.call_from_thread(notify_error, self.app, e, f"Could not load {name}")
            return
        self.post_message(self.AdapterLoaded(name))

    def on_serve_screen_adapter_loaded(self, message: AdapterLoaded) -> None:
        self.query_one("#serve-lora", Input).value = ""
        self.query_one("#serve-log").focus()
        if self.stats is not None:  # shown now; the next poll confirms it
            self.stats.adapters.setdefault(message.name, next(iter(self.stats.models), ""))
            self._show()
        self.notify(f"Loaded {message.name}: ask for it with model={message.name}", markup=False)

    def action_leave_field(self) -> None:
        if isinstance(self.focused, Input):
            self.query_one("#serve-log").focus()

    def _show(self) -> None:
        url = self.server.url if self.server is not None and self.state != "stopped" else None
        self.query_one("#serve-stats", Static).update(format_stats(self.state, url, self.stats))

    # -- start / stop --

    def action_start(self) -> None:
        if self.server is not None and self.server.running:
            self.notify("The gateway is already running (x stops it)", severity="warning")
            return
        model = self.query_one("#serve-model", Input).value.strip()
        try:
            port = int(self.query_one("#serve-port", Input).value)
            assert 0 < port < 65536
        except (ValueError, AssertionError):
            self.notify("The port must be a number from 1 to 65535", severity="error")
            return
        self.state, self.stats = "starting", None
        self._show()
        self.query_one("#serve-log").focus()  # keys (x, c) work while it starts
        log = self.query_one("#serve-log", RichLog)
        log.clear()
        log.write(Text(f"$ surogate serve {model or '(default model)'} --port {port}", style="bold"))
        self.run_server(model, port)

    @work(thread=True, exit_on_error=False, exclusive=True, group="server")
    def run_server(self, model: str, port: int) -> None:
        worker = get_current_worker()
        try:
            server = ServerProcess(model, port, self.app.settings.folder / "logs" / "serve.log")
        except Exception as e:
            self.app.call_from_thread(notify_error, self.app, e, "Could not start the gateway")
            self.post_message(self.Exited(None))
            return
        self.server = server
        poller = StatsPoller(server.url)
        tail = LineTail(server.log_path)
        ready = False
        while not worker.is_cancelled:
            lines = tail.read_text()
            if lines:
                self.post_message(self.LogLines(lines))
            if not server.running:
                self.post_message(self.LogLines(tail.read_text()))
                self.post_message(self.Exited(server.exit_code))
                return
            stats = poller.poll()
            self.post_message(self.Stats(stats))
            if stats.healthy and not ready:
                ready = True
                self.post_message(self.Ready(server.url))
            time.sleep(POLL_SECONDS)

    def on_serve_screen_stats(self, message: Stats) -> None:
        self.stats = message.stats
        if self.state == "starting" and message.stats.healthy:
            self.state = "running"
        self._show()

    def on_serve_screen_ready(self, message: Ready) -> None:
        self.notify(f"Gateway ready at {message.url}/v1 (4: chat with it)", markup=False)

    def on_serve_screen_log_lines(self, message: LogLines) -> None:
        log = self.query_one("#serve-log", RichLog)
        for line in message.lines:
            if line.strip() and (text := format_log_line(line)) is not None:
                log.write(text)

    def on_serve_screen_exited(self, message: Exited) -> None:
        code = message.code
        if self.state not in ("stopping", "stopped"):
            self.notify(f"The gateway exited (status {code}); its output is in the log below",
                        severity="error" if code else "information", timeout=10)
        self.state = "stopped" if self.state == "stopping" or code in (0, -15) else "exited"
        self.stats = None
        self._show()

    def action_stop(self) -> None:
        if self.server is None or not self.server.running:
            self.notify("The gateway is not running", severity="warning")
            return
        self.state = "stopping"
        self._show()
        self.stop_server(self.server)

    @work(thread=True, exit_on_error=False, group="server-stop")
    def stop_server(self, server: ServerProcess) -> None:
        try:
            server.stop()
        except Exception as e:
            self.app.call_from_thread(notify_error, self.app, e, "Stop failed")

    def action_chat(self) -> None:
        self.app.switch_mode("chat")

    def on_unmount(self) -> None:
        if self.server is not None:
            self.server.terminate()
