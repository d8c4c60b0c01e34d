"""Merge a LoRA adapter into its base: pick the adapter (when the model has several), confirm the
base and the output folder. Dismisses with (base, adapter, output); the Library runs the merge."""

from __future__ import annotations

from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Static

from surogate.tui.catalog import ModelEntry
from surogate.tui.paths import short_path


def default_output(adapter: Path) -> Path:
    """<run>/merged beside <run>/adapter, or <adapter>-merged; never an existing folder."""
    base = adapter.parent / "merged" if adapter.name == "adapter" else adapter.parent / f"{adapter.name}-merged"
    out, n = base, 2
    while out.exists():
        out, n = base.with_name(f"{base.name}-{n}"), n + 1
    return out


class MergeScreen(ModalScreen[tuple[str | None, str, str] | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, entry: ModelEntry):
        super().__init__()
        self.entry = entry
        self.adapters = [entry.path] if entry.format == "adapter" else list(entry.adapters)

    def compose(self) -> ComposeResult:
        e = self.entry
        base = e.base if e.format == "adapter" else e.serve_target
        if base and Path(base).exists():
            base = short_path(base)
        with Vertical(classes="dialog"):
            yield Static("Merge a LoRA adapter into its base", classes="dialog-title")
            with Horizontal(classes="form-row"):
                yield Label("Adapter", classes="form-label")
                yield Select([(short_path(a), str(a)) for a in self.adapters], value=str(self.adapters[0]),
                             allow_blank=False, id="merge-adapter", compact=True)
            with Horizontal(classes="form-row"):
                yield Label("Base", classes="form-label")
                yield Input(base or "", placeholder="empty: the base adapter_config.json names", id="merge-base",
                            compact=True)
            with Horizontal(classes="form-row"):
                yield Label("Output", classes="form-label")
                yield Input(short_path(default_output(self.adapters[0])), id="merge-output", compact=True)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Merge", variant="primary", id="merge")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#merge-output").focus()  # enter accepts the defaults

    def on_select_changed(self, event: Select.Changed) -> None:
        self.query_one("#merge-output", Input).value = short_path(default_output(Path(str(event.value))))

    def on_input_submitted(self) -> None:
        self._submit()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "merge":
            self._submit()
        else:
            self.dismiss(None)

    def _submit(self) -> None:
        output = self.query_one("#merge-output", Input).value.strip()
        if not output:
            self.notify("Name the output folder", severity="warning")
            return
        base = self.query_one("#merge-base", Input).value.strip() or None
        self.dismiss((base, str(self.query_one("#merge-adapter", Select).value), str(Path(output).expanduser())))

    def action_cancel(self) -> None:
        self.dismiss(None)
