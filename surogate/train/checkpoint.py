"""Checkpoints: written atomically, resumable bit for bit.

Layout under ``<output_dir>/checkpoints/``::

    step_00000050/            one complete checkpoint (a folder appears only once complete)
      trainable.safetensors   the trained parameters, by our names (f32 masters where kept)
      optimizer.safetensors   AdamW moments, master weights, step
      trainer_state.json      step, data position, loss history, config fingerprint
    latest                    the name of the newest complete checkpoint

A checkpoint is written into a hidden temp folder, each file flushed to disk, then the folder
is renamed into place and `latest` is replaced atomically; killing the process at any moment
leaves the previous checkpoint intact and `latest` pointing at a complete one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from surogate.errors import FileFormatError, NotFoundError
from surogate.io import open_safetensors, save_safetensors


@dataclass
class TrainerState:
    step: int = 0  # optimizer steps done
    epoch: int = 0
    batch_index: int = 0  # micro-batches of `epoch` consumed
    tokens_seen: int = 0
    losses: list[float] = field(default_factory=list)  # per optimizer step
    fingerprint: str = ""  # what must match to resume (model, data, batch geometry)

    def to_json(self) -> dict:
        return dict(self.__dict__)

    @staticmethod
    def from_json(d: dict) -> TrainerState:
        return TrainerState(**{k: d[k] for k in TrainerState.__dataclass_fields__ if k in d})


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_text_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def checkpoint_name(step: int) -> str:
    return f"step_{step:08d}"


def save_checkpoint(root: Path, state: TrainerState, trainable: dict[str, np.ndarray],
                    optimizer: dict[str, np.ndarray], keep: int = 0) -> Path:
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / checkpoint_name(state.step)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=root))
    try:
        save_safetensors(tmp / "trainable.safetensors", {k: np.ascontiguousarray(v) for k, v in trainable.items()})
        save_safetensors(tmp / "optimizer.safetensors", {k: np.ascontiguousarray(v) for k, v in optimizer.items()})
        _write_text_atomic(tmp / "trainer_state.json", json.dumps(state.to_json(), indent=1))
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(tmp)
        if final.exists():  # a re-run reaching the same step: the newer one wins
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _write_text_atomic(root / "latest", final.name + "\n")
    if keep > 0:
        prune(root, keep)
    return final


def list_checkpoints(root: Path) -> list[Path]:
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step_") and
                  (p / "trainer_state.json").is_file())


def prune(root: Path, keep: int) -> None:
    for p in list_checkpoints(root)[:-keep]:
        shutil.rmtree(p, ignore_errors=True)
    for p in Path(root).glob(".step_*.tmp-*"):  # left by a killed save
        shutil.rmtree(p, ignore_errors=True)


def latest_checkpoint(root: Path) -> Path | None:
    root = Path(root)
    pointer = root / "latest"
    if pointer.is_file():
        p = root / pointer.read_text().strip()
        if (p / "trainer_state.json").is_file():
            return p
    found = list_checkpoints(root)
    return found[-1] if found else None


def load_checkpoint(path: Path) -> tuple[TrainerState, dict[str, np.ndarray], dict[str, np.ndarray]]:
    path = Path(path)
    state_file = path / "trainer_state.json"
    if not state_file.is_file():
        raise NotFoundError(f"{path} is not a checkpoint (no trainer_state.json)",
                            hint="pass a step_XXXXXXXX folder, or resume_from_checkpoint: true for the latest")
    try:
        state = TrainerState.from_json(json.loads(state_file.read_text()))
    except (json.JSONDecodeError, TypeError) as e:
        raise FileFormatError(f"{state_file}: {e}") from None
    trainable = {k: np.array(v) for k, v in _items(path / "trainable.safetensors")}
    optimizer = {k: np.array(v) for k, v in _items(path / "optimizer.safetensors")}
    return state, trainable, optimizer


def _items(path: Path):
    f = open_safetensors(path)
    return [(k, f.get(k)) for k in f.keys()]
