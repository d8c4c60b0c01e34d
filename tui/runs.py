"""The Train screen's runs list: runs this TUI launched (runs.json, with their processes) and
runs found on disk (an output_dir holding metrics.jsonl under the configured run folders),
each with its state and final numbers. No textual import: the screen calls ``find_runs`` in a
worker."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from surogate.tui.feed import RunMetrics, read_metrics
from surogate.tui.processes import TrainProcess
from surogate.tui.settings import RunStore

_MAX_DEPTH = 3


@dataclass
class RunRow:
    key: str
    name: str
    metrics_path: Path
    metrics: RunMetrics
    state: str
    started: float | None
    process: TrainProcess | None = None  # None: found on disk, not launched here (no pause / stop)
    log_path: Path | None = None


def display_state(process_state: str | None, m: RunMetrics) -> str:
    """What the list shows: a live process's state, else what its feed and exit tell."""
    if process_state in ("running", "paused", "stopped", "failed"):
        return process_state
    if m.ended or process_state == "finished":
        return "finished"
    if process_state is None:
        return "incomplete"  # found on disk, no end line: killed, crashed, or running elsewhere
    return "failed"  # launched here and gone without an end line


def find_runs(store: RunStore, folders: list[Path], live: dict[str, TrainProcess]) -> list[RunRow]:
    """Launched runs first (newest first), then the ones found in the folders (by path)."""
    rows: list[RunRow] = []
    seen: set[Path] = set()
    records = store.load()
    for i, record in reversed(list(enumerate(records))):
        process = live.get(record.id) or TrainProcess(record)
        path = Path(record.metrics_path)
        # the next launch into the same output_dir appended after this run's lines
        end = next((r.metrics_offset for r in records[i + 1:] if r.metrics_path == record.metrics_path), None)
        m = read_metrics(path, record.metrics_offset, end)
        seen.add(path.resolve())
        rows.append(RunRow(record.id, _run_name(Path(record.output_dir)), path, m, display_state(process.state, m),
                           record.started, process, Path(record.log_path)))
    for folder in folders:
        for path in _feeds(folder):
            if path.resolve() in seen:
                continue
            seen.add(path.resolve())
            m = read_metrics(path)
            rows.append(RunRow(str(path), _run_name(path.parent), path, m, display_state(None, m), m.started_at))
    return rows


def _run_name(output_dir: Path) -> str:
    return output_dir.name if output_dir.parent.name in ("", "output", ".") else \
        f"{output_dir.parent.name}/{output_dir.name}"


def _feeds(root: Path) -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        depth = len(Path(dirpath).relative_to(root).parts)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "checkpoints"
                             and depth < _MAX_DEPTH)
        if "metrics.jsonl" in filenames:
            out.append(Path(dirpath) / "metrics.jsonl")
    return sorted(out)
