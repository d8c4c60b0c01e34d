"""F1 / ?: every key of every screen, and what the command palette offers."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

SECTIONS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("Everywhere", (
        ("1 2 3 4  F2-F5", "Library, Train, Serve, Chat (digits when no text field has focus)"),
        ("tab  shift+tab", "move between fields and lists"),
        ("esc", "leave a text field / close a dialog"),
        ("ctrl+p", "command palette: every action by name"),
        ("F1  ?", "this help"),
        ("ctrl+q", "quit (training runs keep going; the gateway the TUI started is stopped)"),
    )),
    ("Library", (
        ("enter  i", "inspect: config, tensors, chat template"),
        ("s", "serve the model (starts the gateway on Serve)"),
        ("t", "train on it (opens Train with the model filled in)"),
        ("m", "merge a LoRA adapter found beside it"),
        ("k", "quantize to GGUF (surogate quantize)"),
        ("d", "delete from disk (asks first)"),
        ("g", "download from the Hugging Face Hub by id"),
        ("r", "rescan the cache and folders"),
        ("a", "add a folder to scan (saved in settings.toml)"),
    )),
    ("Train", (
        ("c  m  r", "Config, Monitor and Runs tabs"),
        ("ctrl+s", "save the form as YAML"),
        ("ctrl+l", "launch the config (surogate sft|pt)"),
        ("p", "pause / resume the attached run (SIGSTOP / SIGCONT)"),
        ("x", "stop the attached run (SIGTERM, then kill)"),
        ("enter", "in Runs: attach the selected run"),
    )),
    ("Serve", (
        ("s  enter", "start the gateway (surogate serve MODEL --port N)"),
        ("x", "stop it"),
        ("c", "chat with it"),
    )),
    ("Chat", (
        ("enter", "send the prompt"),
        ("esc", "stop the answer being streamed"),
        ("ctrl+n", "new conversation"),
        ("ctrl+r", "refresh the model list"),
        ("ctrl+o  /image PATH", "attach an image to the next message (/detach N removes it)"),
    )),
)


def help_table() -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for i, (title, rows) in enumerate(SECTIONS):
        table.add_row(Text(title, style="bold cyan"), "", end_section=False)
        for keys, what in rows:
            table.add_row(f"  {keys}", what)
        if i < len(SECTIONS) - 1:
            table.add_row("", "")
    return table


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,f1,question_mark", "close", "Close")]

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide"):
            yield Static("Keys", classes="dialog-title")
            with VerticalScroll(id="help-body"):
                yield Static(help_table())
            yield Static("esc closes", classes="dialog-detail")

    def action_close(self) -> None:
        self.dismiss(None)
