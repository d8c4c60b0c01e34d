"""Where the TUI keeps what it must remember: a settings file a user may edit, and the runs it
launched (so a restarted TUI reattaches to them).

The folder is ``$SUROGATE_HOME`` when set, else ``$XDG_CONFIG_HOME/surogate`` (``~/.config/surogate``).
It holds ``settings.toml`` (read with tomllib; written back only when the TUI changes a
setting), ``runs.json`` (one record per launched run: pid, config, output and log paths) and
``logs/`` (each launched process's stdout and stderr). No textual import here: plain data.
"""

from __future__ import annotations

import json
import os
import time
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from surogate.errors import ConfigError

SETTINGS_FILE = "settings.toml"
RUNS_FILE = "runs.json"

_HEADER = "# surogate tui settings; relative folders are taken from the directory the TUI starts in\n"


def home() -> Path:
    if os.environ.get("SUROGATE_HOME"):
        return Path(os.environ["SUROGATE_HOME"]).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "surogate"


@dataclass
class Settings:
    # folders scanned for models: HF folders, GGUF files and adapters, up to three levels down
    model_folders: list[str] = field(default_factory=lambda: ["output"])
    # folders scanned for past runs (a run is an output_dir that holds metrics.jsonl)
    run_folders: list[str] = field(default_factory=lambda: ["output"])
    # folders listed for YAML run configs
    config_folders: list[str] = field(default_factory=lambda: [".", "configs"])
    hf_cache: str = ""  # empty: huggingface_hub's default cache
    serve_port: int = 8000
    path: Path = field(default_factory=lambda: home() / SETTINGS_FILE, repr=False, compare=False)

    @classmethod
    def load(cls, folder: Path | None = None) -> Settings:
        path = (folder or home()) / SETTINGS_FILE
        settings = cls(path=path)
        if not path.is_file():
            return settings
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"cannot read {path}: {e}",
                              hint="fix the file or delete it to get the defaults") from None
        for key, value in data.items():
            default = getattr(settings, key, None)
            if key == "path" or default is None:
                raise ConfigError(f"{path}: unknown key {key!r}",
                                  hint=f"allowed keys: {', '.join(k for k in asdict(settings) if k != 'path')}")
            if isinstance(default, list) and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
                raise ConfigError(f"{path}: {key} must be a list of strings", hint=f'{key} = ["output"]')
            if isinstance(default, (str, int)) and type(value) is not type(default):
                raise ConfigError(f"{path}: {key} must be {'an integer' if isinstance(default, int) else 'a string'}",
                                  hint=f"{key} = {json.dumps(default)}")
            setattr(settings, key, value)
        return settings

    def save(self) -> None:
        lines = [_HEADER]
        for key, value in asdict(self).items():
            if key != "path":
                lines.append(f"{key} = {json.dumps(value)}\n")  # JSON strings and lists are valid TOML
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(lines), encoding="utf-8")
        tmp.replace(self.path)

    @property
    def folder(self) -> Path:
        return self.path.parent

    def resolve(self, folders: list[str]) -> list[Path]:
        """Existing folders, absolute, each once, in order."""
        seen: list[Path] = []
        for f in folders:
            p = Path(f).expanduser().absolute()
            if p.is_dir() and p not in seen:
                seen.append(p)
        return seen


@dataclass
class RunRecord:
    """A run the TUI launched: enough to find its process, feed and log after a restart."""

    id: str
    kind: str  # sft | pt
    config: str
    output_dir: str
    metrics_path: str
    log_path: str
    pid: int
    pid_start: int | None  # the process's start time in clock ticks (guards against a reused pid)
    started: float
    stopped: bool = False  # the user stopped it (not a failure)
    metrics_offset: int = 0  # the feed's size at launch: an output_dir reused by several runs appends to one feed


class RunStore:
    """runs.json: the records of launched runs, newest last."""

    def __init__(self, folder: Path):
        self.path = folder / RUNS_FILE
        self.log_dir = folder / "logs"

    def load(self) -> list[RunRecord]:
        try:
            rows = json.loads(self.path.read_text(encoding="utf-8"))
            return [RunRecord(**row) for row in rows]
        except (OSError, ValueError, TypeError):
            return []  # a missing or damaged file only loses the reattach list

    def add(self, record: RunRecord) -> None:
        self._write([*[r for r in self.load() if r.id != record.id], record])

    def update(self, record: RunRecord) -> None:
        self._write([record if r.id == record.id else r for r in self.load()])

    def forget(self, run_id: str) -> None:
        self._write([r for r in self.load() if r.id != run_id])

    def new_id(self, name: str) -> str:
        return time.strftime("%Y%m%d-%H%M%S", time.localtime()) + "-" + "".join(
            c if c.isalnum() or c in "-_." else "_" for c in name)[:40]

    def _write(self, records: list[RunRecord]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps([asdict(r) for r in records], indent=1), encoding="utf-8")
        tmp.replace(self.path)
