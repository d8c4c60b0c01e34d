"""The processes the TUI starts: training runs (`surogate sft|pt CONFIG`) and the gateway
(`surogate serve MODEL --port N`), each a `surogate` command in a fresh interpreter.

A training run gets its own session (process group), so it outlives the TUI, and pause / resume /
stop signal the whole group. Its record (pid, the pid's start time, config, feed and log paths)
goes to runs.json, from which a restarted TUI reattaches. The methods that wait (stop) block:
call them from a worker.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from surogate.errors import InvalidArgumentError, NotFoundError
from surogate.tui.settings import RunRecord, RunStore

_DEV_BOOT = ("import sys; from surogate.cli.tui import dev_layout; dev_layout(); "
             "from surogate.cli.main import main; main(sys.argv[1:])")


def surogate_argv(*args: str) -> list[str]:
    """`surogate ARGS` as this interpreter runs it (-P: the surogate on PYTHONPATH or installed)."""
    import surogate
    import surogate.tui

    installed = Path(surogate.tui.__file__).resolve().parent.parent == Path(surogate.__file__).resolve().parent
    if installed:
        return [sys.executable, "-P", "-m", "surogate.cli.main", *args]
    # A source checkout: tui/ and gateway/ sit beside surogate/ and are registered at start-up.
    return [sys.executable, "-P", "-c", _DEV_BOOT, *args]


def process_start_time(pid: int) -> int | None:
    """Start time of a process in clock ticks since boot (Linux), to tell it from a reused pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ")"
    fields = stat[stat.rfind(")") + 2:].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def process_state(pid: int, start: int | None) -> str:
    """"running", "paused" (stopped by a signal) or "gone" (exited, a zombie, or a reused pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "gone"
    except PermissionError:
        return "running"  # someone else's process: it exists
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "running"  # no /proc (macOS): trust kill(0)
    if start is not None and process_start_time(pid) != start:
        return "gone"
    state = stat[stat.rfind(")") + 2:].split()[0]
    if state in ("Z", "X"):
        return "gone"
    return "paused" if state in ("T", "t") else "running"


class TrainProcess:
    """One training run: launched here, or reattached from its record."""

    def __init__(self, record: RunRecord, popen: subprocess.Popen | None = None):
        self.record = record
        self.popen = popen

    @classmethod
    def launch(cls, kind: str, config_path: Path, output_dir: Path, metrics_path: Path, store: RunStore,
               cwd: Path | None = None) -> TrainProcess:
        offset = metrics_path.stat().st_size if metrics_path.is_file() else 0
        if kind not in ("sft", "pt", "dpo", "distill", "grpo"):
            raise InvalidArgumentError(f"unknown run kind {kind!r}", hint="use sft, pt, dpo, distill or grpo")
        if not config_path.is_file():
            raise NotFoundError(f"config file not found: {config_path}", hint="save the form first, or pick a file")
        run_id = store.new_id(output_dir.name or config_path.stem)
        store.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = store.log_dir / f"{run_id}.log"
        with open(log_path, "wb") as log:
            popen = subprocess.Popen(surogate_argv(kind, str(config_path)), stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, cwd=cwd, start_new_session=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        record = RunRecord(id=run_id, kind=kind, config=str(config_path), output_dir=str(output_dir),
                           metrics_path=str(metrics_path), log_path=str(log_path), pid=popen.pid,
                           pid_start=process_start_time(popen.pid), started=time.time(), metrics_offset=offset)
        store.add(record)
        return cls(record, popen)

    @property
    def state(self) -> str:
        """running | paused | finished | failed | stopped."""
        if self.popen is not None:
            code = self.popen.poll()
            if code is None:
                return process_state(self.popen.pid, None)
            if code == 0:
                return "finished"
            return "stopped" if self.record.stopped or code < 0 else "failed"
        live = process_state(self.record.pid, self.record.pid_start)
        if live != "gone":
            return live
        return "stopped" if self.record.stopped else "exited"

    @property
    def alive(self) -> bool:
        return self.state in ("running", "paused")

    @property
    def exit_code(self) -> int | None:
        return self.popen.poll() if self.popen is not None else None

    def pause(self) -> None:
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def stop(self, store: RunStore | None = None, grace: float = 10.0) -> str:
        """SIGTERM the run's group, then SIGKILL after ``grace`` seconds. Blocks: call from a worker."""
        self.record.stopped = True
        if store is not None:
            store.update(self.record)
        self._signal(signal.SIGTERM)
        self._signal(signal.SIGCONT)  # a paused process handles SIGTERM only once it runs again
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not self.alive:
                return "stopped"
            time.sleep(0.1)
        self._signal(signal.SIGKILL)
        if self.popen is not None:
            self.popen.wait(timeout=5)
        return "killed"

    def _signal(self, sig: int) -> None:
        if not self.alive:
            return
        try:
            os.killpg(self.record.pid, sig)  # start_new_session: the pid is the group id
        except ProcessLookupError:
            pass
        except PermissionError:
            os.kill(self.record.pid, sig)


class ServerProcess:
    """The gateway as a child process, its output in a log file the Serve screen tails.
    An empty ``model`` serves the default model (`surogate serve` with no argument).

    Unlike a training run it stays in the TUI's process group: a terminal that hangs up (a
    dropped SSH session, a killed tmux window) takes it down with the TUI instead of leaving a
    server holding the port."""

    def __init__(self, model: str, port: int, log_path: Path, extra: tuple[str, ...] = ()):
        self.model, self.port, self.log_path = model, port, log_path
        self.url = f"http://127.0.0.1:{port}"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "wb") as log:
            argv = surogate_argv("serve", *([model] if model else []), "--port", str(port), *extra)
            self.popen = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          env={**os.environ, "PYTHONUNBUFFERED": "1"})

    @property
    def running(self) -> bool:
        return self.popen.poll() is None

    @property
    def exit_code(self) -> int | None:
        return self.popen.poll()

    def terminate(self) -> None:
        """Ask it to stop; returns at once."""
        if self.running:
            with contextlib.suppress(ProcessLookupError):
                self.popen.terminate()

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after ``grace`` seconds. Blocks: call from a worker."""
        self.terminate()
        try:
            return self.popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                self.popen.kill()
            return self.popen.wait(timeout=5)
