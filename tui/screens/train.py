"""Train: pick a YAML config or fill in the form, launch `surogate sft|pt CONFIG`, and watch the
run live from its metrics feed; pause, resume or stop it; browse past runs and reattach.

Three tabs. Config: the file list and path on the left, the form on the right, and a status
line that says what ctrl+l launches and what load_config thinks of it. Monitor: the attached run.
Runs: everything launched here or found under the run folders. Validation, launching, stopping,
scanning and tailing the feed happen in workers; each posts a message back.

Longer than the house's ~400 lines because the three tabs share one state (what ctrl+l
launches, the attached run and its process); what each tab shows is a widget (ConfigForm,
RunMonitor), the plain-data parts are feed.py, runs.py and processes.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import yaml
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, OptionList, Static, TabbedContent, TabPane
from textual.widgets.option_list import Option
from textual.worker import get_current_worker

from surogate.tui.feed import MetricsTail, RunMetrics
from surogate.tui.notify import WorkerErrors, describe, notify_error
from surogate.tui.paths import short_path
from surogate.tui.processes import TrainProcess
from surogate.tui.runs import RunRow, display_state, find_runs
from surogate.tui.settings import RunStore
from surogate.tui.widgets.config_form import ConfigForm
from surogate.tui.widgets.nav_bar import NavBar
from surogate.tui.widgets.run_monitor import RunMonitor
from surogate.tui.widgets.run_stats import STATE_STYLES

POLL_SECONDS = 0.5


def find_configs(folders: list[Path]) -> list[Path]:
    out: list[Path] = []
    for folder in folders:
        for pattern in ("*.yaml", "*.yml"):
            out += [p for p in sorted(folder.glob(pattern)) if p.is_file() and p not in out]
    return out


def summarize(cfg, path: str | None) -> str:
    steps = f"max_steps {cfg.max_steps}" if cfg.max_steps > 0 else f"{cfg.num_epochs} epochs"
    what = f"LoRA r={cfg.lora_rank}" if cfg.lora else "full fine-tune"
    return (f"✓ {cfg.kind} · {cfg.model or '(no model)'} · {len(cfg.datasets)} dataset(s) · {steps} · {what} · "
            f"{cfg.recipe} → {cfg.output_dir}" + (f"\nctrl+l launches {short_path(path)}" if path else ""))


class TrainScreen(WorkerErrors, Screen):
    BINDINGS = [
        Binding("ctrl+l", "launch", "Launch"),
        Binding("ctrl+s", "save", "Save"),
        Binding("p", "pause", "Pause/resume"),
        Binding("x", "stop", "Stop"),
        Binding("c", "tab('tab-config')", "Config", show=False),
        Binding("m", "tab('tab-monitor')", "Monitor", show=False),
        Binding("r", "tab('tab-runs')", "Runs", show=False),
        Binding("escape", "leave_field", "Leave field", show=False),
    ]

    class Checked(Message):
        def __init__(self, ok: bool, text: str, key_path: str | None = None):
            super().__init__()
            self.ok, self.text, self.key_path = ok, text, key_path

    class ConfigsFound(Message):
        def __init__(self, paths: list[Path]):
            super().__init__()
            self.paths = paths

    class RunsFound(Message):
        def __init__(self, rows: list[RunRow]):
            super().__init__()
            self.rows = rows

    class Launched(Message):
        def __init__(self, process: TrainProcess):
            super().__init__()
            self.process = process

    class RunUpdate(Message):
        def __init__(self, key: str, records: list[dict], state: str | None):
            super().__init__()
            self.key, self.records, self.state = key, records, state

    class LocalGPUs(Message):
        def __init__(self, gpus: list[dict] | None):
            super().__init__()
            self.gpus = gpus

    def __init__(self):
        super().__init__()
        self.store: RunStore | None = None
        self.source = "form"  # what ctrl+l launches: "form" (saved first) or "file" (the path field)
        self.processes: dict[str, TrainProcess] = {}  # launched in this session: their Popen reaps them
        self.rows: dict[str, RunRow] = {}
        self.attached: RunRow | None = None
        self.metrics: RunMetrics | None = None
        self.state = "—"

    def compose(self) -> ComposeResult:
        yield NavBar("train")
        with TabbedContent(id="train-tabs", initial="tab-config"):
            with TabPane("Config", id="tab-config"):
                with Horizontal():
                    with Vertical(id="config-files"):
                        yield Input(placeholder="config file (.yaml)", id="config-path", compact=True)
                        yield OptionList(id="config-list")
                    yield ConfigForm(id="config-form")
                yield Static("", id="config-status", markup=False)
            with TabPane("Monitor", id="tab-monitor"):
                yield RunMonitor(id="monitor")
            with TabPane("Runs", id="tab-runs"):
                yield DataTable(id="runs", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        self.store = RunStore(self.app.settings.folder)
        table = self.query_one("#runs", DataTable)
        for key, label in (("name", "Run"), ("state", "State"), ("steps", "Steps"), ("loss", "Loss"),
                           ("eval", "Eval"), ("started", "Started")):
            table.add_column(label, key=key)
        self.query_one(RunMonitor).show("no run attached: launch one (Config tab) or pick one (Runs tab)", None,
                                        "—")
        self._status("Pick a config file on the left, or fill in the form (ctrl+s saves it, ctrl+l launches)")
        self.query_one("#config-list").focus()
        self.scan_configs()
        self.scan_runs(reattach=True)
        self.sample_local_gpus()

    # -- tabs and focus --

    def action_tab(self, tab: str) -> None:
        self.query_one("#train-tabs", TabbedContent).active = tab
        # focus inside the shown pane: a focused widget in a hidden pane would switch back to it
        target = {"tab-config": "#config-list", "tab-monitor": "#train-tabs Tabs", "tab-runs": "#runs"}[tab]
        self.query_one(target).focus()

    def action_leave_field(self) -> None:
        if isinstance(self.focused, Input):
            self.query_one("#train-tabs Tabs").focus()

    # -- config: files, form, validation --

    @work(thread=True, exit_on_error=False, exclusive=True, group="configs")
    def scan_configs(self) -> None:
        s = self.app.settings
        self.post_message(self.ConfigsFound(find_configs(s.resolve(s.config_folders))))

    def on_train_screen_configs_found(self, message: ConfigsFound) -> None:
        options = self.query_one("#config-list", OptionList)
        options.clear_options()
        options.add_options([Option(short_path(p), id=str(p)) for p in message.paths])
        if not message.paths:
            options.add_option(Option("(no .yaml files here)", disabled=True))
        else:
            options.highlighted = 0

    @on(OptionList.OptionSelected, "#config-list")
    def _pick(self, event: OptionList.OptionSelected) -> None:
        self.use_file(event.option.id)

    @on(Input.Submitted, "#config-path")
    def _path_entered(self, event: Input.Submitted) -> None:
        self.use_file(event.value.strip())

    def use_file(self, path: str | None) -> None:
        if not path:
            return
        self.query_one("#config-path", Input).value = short_path(path)
        self.source = "file"
        self.check_file(str(Path(path).expanduser()), self.query_one(ConfigForm).kind)

    def use_model(self, target: str) -> None:
        """Start a form with this model (from the Library)."""
        form = self.query_one(ConfigForm)
        form.set("model", short_path(target) if Path(target).exists() else target)
        self.source = "form"
        self.action_tab("tab-config")
        form.query_one("#f-dataset_path").focus()
        self._status("Fill in the dataset; ctrl+s saves the config, ctrl+l saves and launches it")

    def on_config_form_changed(self, message: ConfigForm.Changed) -> None:
        # Only what the user typed (the form's own set-up posts changes too, with focus elsewhere).
        if message.form.has_focus_within:
            self.source = "form"
            self.check_mapping(message.form.values(), message.form.kind, message.form.save_path)

    @work(thread=True, exit_on_error=False, exclusive=True, group="check")
    def check_file(self, path: str, kind: str) -> None:
        from surogate.config import load_config

        try:
            cfg = load_config(path, kind=kind)
        except Exception as e:
            self._post_error(e)
            return
        self.post_message(self.Checked(True, summarize(cfg, path)))

    @work(thread=True, exit_on_error=False, exclusive=True, group="check")
    def check_mapping(self, data: dict, kind: str, save_as: str) -> None:
        from surogate.config import load_config

        time.sleep(0.15)  # typing: check once the keys stop
        if get_current_worker().is_cancelled:
            return
        try:
            cfg = load_config(data, kind=kind)
        except Exception as e:
            self._post_error(e)
            return
        text = summarize(cfg, None) + f"\nctrl+s saves {save_as}; ctrl+l saves and launches"
        self.post_message(self.Checked(True, text))

    def _post_error(self, e: Exception) -> None:
        message, hint = describe(e)
        key = message.split(":")[0] if ":" in message else None
        if message.startswith("missing required key"):
            key = message.split("'")[1] if "'" in message else None
        text = f"✗ {message}" + (f"\n  hint: {hint}" if hint else "")
        self.post_message(self.Checked(False, text, key))

    def on_train_screen_checked(self, message: Checked) -> None:
        self._status(message.text, ok=message.ok)
        self.query_one(ConfigForm).mark_error(message.key_path if self.source == "form" else None)

    def _status(self, text: str, ok: bool | None = None) -> None:
        status = self.query_one("#config-status", Static)
        status.update(text)
        status.set_class(ok is False, "error")
        status.set_class(ok is True, "ok")

    def action_save(self) -> Path | None:
        form = self.query_one(ConfigForm)
        path = Path(form.save_path).expanduser()
        if not form.save_path:
            self.notify("Fill in 'Save as'", severity="warning")
            return None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(yaml.safe_dump(form.values(), sort_keys=False), encoding="utf-8")
        except OSError as e:
            notify_error(self.app, e, "Save failed")
            return None
        self.query_one("#config-path", Input).value = short_path(path)
        self.notify(f"Saved {short_path(path)}", markup=False)
        self.scan_configs()
        return path

    # -- launch --

    def action_launch(self) -> None:
        form = self.query_one(ConfigForm)
        if self.source == "form":
            path = self.action_save()
            if path is None:
                return
            self.source = "file"
        else:
            text = self.query_one("#config-path", Input).value.strip()
            if not text:
                self.notify("Pick a config file, or fill in the form", severity="warning")
                return
            path = Path(text).expanduser()
        self._status(f"launching {short_path(path)} …")
        self.launch(path.absolute(), form.kind)

    @work(thread=True, exit_on_error=False, group="launch")
    def launch(self, path: Path, kind: str) -> None:
        from surogate.config import load_config

        try:
            cfg = load_config(path, kind=kind)
            process = TrainProcess.launch(kind, path, Path(cfg.output_dir).absolute(),
                                          Path(cfg.metrics_path).absolute(), self.store, cwd=Path.cwd())
        except Exception as e:
            self._post_error(e)
            self.app.call_from_thread(notify_error, self.app, e, "Launch failed")
            return
        self.post_message(self.Launched(process))

    def on_train_screen_launched(self, message: Launched) -> None:
        p = message.process
        self.processes[p.record.id] = p
        self._status(f"launched {p.record.kind} {short_path(p.record.config)} (pid {p.record.pid})", ok=True)
        self.notify(f"Launched {p.record.id}\nlog: {short_path(p.record.log_path)}", markup=False)
        row = RunRow(p.record.id, Path(p.record.output_dir).name, Path(p.record.metrics_path), RunMetrics(),
                     "starting", p.record.started, p, Path(p.record.log_path))
        self.attach(row)
        self.scan_runs()

    # -- runs list, attach, watch --

    @work(thread=True, exit_on_error=False, exclusive=True, group="runs")
    def scan_runs(self, reattach: bool = False) -> None:
        s = self.app.settings
        try:
            rows = find_runs(self.store, s.resolve(s.run_folders), self.processes)
        except Exception as e:
            self.app.call_from_thread(notify_error, self.app, e, "Runs scan failed")
            return
        self.post_message(self.RunsFound(rows))
        if reattach:
            live = [r for r in rows if r.process is not None and r.state in ("running", "paused")]
            if live:
                self.app.call_from_thread(self._reattach, live[0])

    def _reattach(self, row: RunRow) -> None:
        if self.attached is None:
            self.notify(f"Reattached to {row.key} (pid {row.process.record.pid})", markup=False)
            self.attach(row)

    def on_train_screen_runs_found(self, message: RunsFound) -> None:
        table = self.query_one("#runs", DataTable)
        table.clear()
        self.rows = {r.key: r for r in message.rows}
        for r in message.rows:
            m = r.metrics
            started = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.started)) if r.started else "—"
            table.add_row(Text(r.name, overflow="ellipsis"), Text(r.state, style=STATE_STYLES.get(r.state, "")),
                          f"{m.step}/{m.total_steps or '?'}", _num(m.loss), _num(m.eval_loss), started, key=r.key)

    @on(DataTable.RowSelected, "#runs")
    def _run_selected(self, event: DataTable.RowSelected) -> None:
        row = self.rows.get(event.row_key.value)
        if row is not None:
            self.attach(row)

    def attach(self, row: RunRow) -> None:
        """Show a run on the Monitor tab: a live one is tailed from where its launch began in the
        feed; a finished one shows what the runs scan read."""
        self.attached = row
        self.state = row.state
        live = row.process is not None and (row.state == "starting" or row.process.alive)
        self.metrics = RunMetrics() if live else row.metrics
        monitor = self.query_one(RunMonitor)
        monitor.show(self._title(row), self.metrics, self.state)
        monitor.show_gpus(self.metrics.gpus, "from the run's feed" if self.metrics.gpus else "")
        self.action_tab("tab-monitor")
        if live:
            self.watch_run(row, row.process.record.metrics_offset)
        else:
            self.workers.cancel_group(self, "watch")

    def _title(self, row: RunRow) -> str:
        pid = f" · pid {row.process.record.pid}" if row.process is not None else ""
        return f"{row.name} · {short_path(row.metrics_path)}{pid}"

    @work(thread=True, exit_on_error=False, exclusive=True, group="watch")
    def watch_run(self, row: RunRow, offset: int) -> None:
        worker = get_current_worker()
        tail = MetricsTail(row.metrics_path)
        tail.offset = offset
        last = None
        while not worker.is_cancelled:
            records = tail.read()
            state = row.process.state if row.process is not None else None
            if records or state != last:
                self.post_message(self.RunUpdate(row.key, records, state))
                last = state
            if row.process is None or not row.process.alive:
                # it may have ended between the state read above and this check: read both again,
                # or the screen keeps the stale "running" of a stopped run
                records = tail.read()  # what it wrote before exiting
                state = row.process.state if row.process is not None else None
                if records or state != last:
                    self.post_message(self.RunUpdate(row.key, records, state))
                return
            time.sleep(POLL_SECONDS)

    def on_train_screen_run_update(self, message: RunUpdate) -> None:
        if self.attached is None or message.key != self.attached.key or self.metrics is None:
            return
        was_live = self.state in ("running", "paused", "starting")
        self.metrics.extend(message.records)
        self.state = display_state(message.state, self.metrics)
        monitor = self.query_one(RunMonitor)
        monitor.show(self._title(self.attached), self.metrics, self.state)
        if self.metrics.gpus:
            monitor.show_gpus(self.metrics.gpus, "from the run's feed")
        elif any(r.get("type") == "start" for r in message.records):
            monitor.show_gpus(None)
        if was_live and self.state not in ("running", "paused", "starting"):
            self._announce_end()
            self.scan_runs()

    def _announce_end(self) -> None:
        row, m = self.attached, self.metrics
        if self.state == "finished":
            self.notify(f"{row.name} finished: loss {_num(m.loss)}" + (f", eval {_num(m.eval_loss)}"
                                                                       if m.eval_loss is not None else ""),
                        markup=False)
        elif self.state == "failed":
            tail = "\n".join(_last_lines(row.log_path, 2)) if row.log_path is not None else ""
            self.notify(f"{row.name} failed\n{tail}", severity="error", timeout=15, markup=False)

    # -- pause / resume / stop --

    def _live_process(self) -> TrainProcess | None:
        row = self.attached
        if row is None or row.process is None:
            self.notify("No run this TUI launched is attached (Runs tab: pick one)", severity="warning")
            return None
        if not row.process.alive:
            self.notify(f"{row.name} is not running", severity="warning", markup=False)
            return None
        return row.process

    def action_pause(self) -> None:
        if (p := self._live_process()) is None:
            return
        if p.state == "paused":
            p.resume()
            self.notify(f"Resumed {self.attached.name}", markup=False)
        else:
            p.pause()
            self.notify(f"Paused {self.attached.name} (p resumes)", markup=False)
        self.post_message(self.RunUpdate(self.attached.key, [], p.state))

    def action_stop(self) -> None:
        from surogate.tui.screens.confirm import ConfirmScreen

        if (p := self._live_process()) is None:
            return
        self.app.push_screen(ConfirmScreen(f"Stop {self.attached.name}?", "SIGTERM, then kill after 10 s", "Stop"),
                             lambda yes: self.stop_run(p) if yes else None)

    @work(thread=True, exit_on_error=False, group="stop")
    def stop_run(self, process: TrainProcess) -> None:
        try:
            how = process.stop(self.store)
        except Exception as e:
            self.app.call_from_thread(notify_error, self.app, e, "Stop failed")
            return
        self.app.call_from_thread(self.notify, f"Run {how}: {process.record.id}", markup=False)

    # -- GPUs with no run attached --

    @work(thread=True, exit_on_error=False, group="gpus")
    def sample_local_gpus(self) -> None:
        from surogate.train import gpu_monitor

        self.post_message(self.LocalGPUs(gpu_monitor.sample_gpus()))

    def on_train_screen_local_gpus(self, message: LocalGPUs) -> None:
        form = self.query_one(ConfigForm)
        if not message.gpus and not form.has_focus_within:
            form.set("recipe", "fp32")  # no GPU here: bf16 is the GPU recipe
        if self.attached is None:
            self.query_one(RunMonitor).show_gpus(message.gpus, "this machine (nvidia-smi)" if message.gpus else "")


def _last_lines(path: Path, n: int, size: int = 4096) -> list[str]:
    """The last ``n`` non-blank lines of a log (its last ``size`` bytes: a log may be long)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(f.seek(0, 2) - size, 0))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    return [x for x in text.splitlines() if x.strip()][-n:]


def _num(value: float | None) -> str:
    return f"{value:.4f}" if isinstance(value, (int, float)) else "—"
