"""Quantize a model to GGUF: pick the type and the output file. Dismisses with (type, output);
the Library runs `surogate quantize` in a worker."""

from __future__ import annotations

from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Static

from surogate.tui.catalog import ModelEntry
from surogate.tui.paths import short_path

TYPES = ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "BF16", "F16", "F32")  # surogate.io.QUANT_TYPES, common first


def default_output(entry: ModelEntry, qtype: str) -> Path:
    """<model>.<TYPE>.gguf beside a model folder; in the current directory for hub-cache models."""
    stem = entry.name.replace("/", "--") if entry.source == "hub" else Path(entry.path).name
    folder = Path.cwd() if entry.source == "hub" else Path(entry.path).parent
    return folder / f"{stem}.{qtype}.gguf"


class QuantizeScreen(ModalScreen[tuple[str, str] | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, entry: ModelEntry):
        super().__init__()
        self.entry = entry

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(f"Quantize {self.entry.name} to GGUF", classes="dialog-title", markup=False)
            with Horizontal(classes="form-row"):
                yield Label("Type", classes="form-label")
                yield Select([(t, t) for t in TYPES], value="Q8_0", allow_blank=False, id="quant-type", compact=True)
            with Horizontal(classes="form-row"):
                yield Label("Output", classes="form-label")
                yield Input(short_path(default_output(self.entry, "Q8_0")), id="quant-output", compact=True)
            yield Static("surogate quantize runs in the background; the file appears in the list when done",
                         classes="dialog-detail")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Quantize", variant="primary", id="quantize")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#quant-output").focus()  # enter accepts the defaults

    def on_select_changed(self, event: Select.Changed) -> None:
        self.query_one("#quant-output", Input).value = short_path(default_output(self.entry, str(event.value)))

    def on_input_submitted(self) -> None:
        self._submit()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "quantize":
            self._submit()
        else:
            self.dismiss(None)

    def _submit(self) -> None:
        output = self.query_one("#quant-output", Input).value.strip()
        if not output:
            self.notify("Name the output file", severity="warning")
            return
        self.dismiss((str(self.query_one("#quant-type", Select).value), str(Path(output).expanduser())))

    def action_cancel(self) -> None:
        self.dismiss(None)
