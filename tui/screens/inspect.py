"""Inspect one model: its config (config.json, adapter_config.json or GGUF metadata), its tensor
table (from the safetensors or GGUF header: no weights are read) and its chat template."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static, TabbedContent, TabPane

from surogate.tui.catalog import ModelEntry, format_params, format_size
from surogate.tui.notify import WorkerErrors, describe
from surogate.tui.paths import short_path


@dataclass
class Details:
    config: str = ""
    tensors: list[tuple[str, str, str]] = field(default_factory=list)  # name, dtype, shape
    template: str = ""
    error: str | None = None


def load_details(entry: ModelEntry) -> Details:
    d = Details()
    if entry.format == "gguf":
        from surogate.io import GGUFFile

        gguf = GGUFFile(entry.path)
        meta = gguf.metadata
        template = meta.pop("tokenizer.chat_template", "")
        d.config = "\n".join(f"{k} = {_short(v)}" for k, v in meta.items())
        d.tensors = [(t.name, t.type_name, "×".join(map(str, t.shape))) for t in gguf.tensors.values()]
        d.template = str(template or "")
        return d
    from surogate.io import ModelFolder, open_safetensors

    folder = Path(entry.path)
    config_file = folder / ("adapter_config.json" if entry.format == "adapter" else "config.json")
    d.config = json.dumps(json.loads(config_file.read_text(encoding="utf-8")), indent=2)
    weights = None
    for name in ("model.safetensors.index.json", "model.safetensors", "adapter_model.safetensors"):
        if (folder / name).is_file():
            weights = open_safetensors(folder / name)
            break
    if weights is not None:
        for name in weights.keys():
            info = weights.info(name)
            d.tensors.append((name, info.dtype, "×".join(map(str, info.shape))))
        weights.close()
    templates = ModelFolder(folder).chat_templates
    d.template = "\n\n".join(text if name == "default" else f"# {name}\n{text}" for name, text in templates.items())
    return d


def _short(value) -> str:
    """A metadata value for reading: long arrays (vocabularies, merges) as their length."""
    if isinstance(value, (list, tuple)) and len(value) > 8:
        return f"[{len(value)} items: {', '.join(map(repr, value[:3]))}, …]"
    return repr(value) if isinstance(value, str) else str(value)


class InspectScreen(WorkerErrors, ModalScreen[None]):
    BINDINGS = [Binding("escape,q", "close", "Close")]

    class Loaded(Message):
        def __init__(self, details: Details):
            super().__init__()
            self.details = details

    def __init__(self, entry: ModelEntry):
        super().__init__()
        self.entry = entry

    def compose(self) -> ComposeResult:
        e = self.entry
        with Vertical(classes="dialog wide tall"):
            yield Static(f"{e.name}  ·  {e.architecture or '?'}  ·  {format_params(e.params)} params  ·  "
                         f"{e.dtype or '?'}  ·  {format_size(e.size)}", classes="dialog-title", markup=False)
            yield Static(short_path(e.path), classes="dialog-detail", markup=False)
            with TabbedContent(id="inspect-tabs"):
                with TabPane("Config", id="tab-config"):
                    with VerticalScroll():
                        yield Static("loading…", id="inspect-config", markup=False)
                with TabPane("Tensors", id="tab-tensors"):
                    yield DataTable(id="inspect-tensors", cursor_type="row")
                with TabPane("Chat template", id="tab-template"):
                    with VerticalScroll():
                        yield Static("loading…", id="inspect-template", markup=False)
            yield Static("esc closes · ←/→ switch tabs", classes="dialog-detail")

    def on_mount(self) -> None:
        table = self.query_one("#inspect-tensors", DataTable)
        table.add_columns("Tensor", "Dtype", "Shape")
        self.load()

    @work(thread=True, exit_on_error=False)
    def load(self) -> None:
        try:
            details = load_details(self.entry)
        except Exception as e:
            message, hint = describe(e)
            details = Details(error=f"{message}\nhint: {hint}" if hint else message)
        self.post_message(self.Loaded(details))

    def on_inspect_screen_loaded(self, message: Loaded) -> None:
        d = message.details
        if d.error:
            self.query_one("#inspect-config", Static).update(d.error)
            self.query_one("#inspect-template", Static).update("")
            return
        self.query_one("#inspect-config", Static).update(d.config or "(empty)")
        self.query_one("#inspect-template", Static).update(d.template or "(this model has no chat template)")
        table = self.query_one("#inspect-tensors", DataTable)
        table.add_rows(d.tensors)
        tabs = self.query_one("#inspect-tabs", TabbedContent)
        tabs.get_tab("tab-tensors").label = f"Tensors ({len(d.tensors)})"

    def action_close(self) -> None:
        self.dismiss(None)
