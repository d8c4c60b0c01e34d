"""Rows out of dataset files: JSON Lines, JSON, CSV, parquet; a folder of them; a hub dataset repo.

A row is a plain dict and the place it came from (``data/train.jsonl line 7``), so that every
later failure can name it. ``RowErrors`` decides what a malformed row does: stop the run with an
error naming the file and line (the default), or, with ``skip_bad_rows``, be skipped and counted.

Folders (and downloaded hub repos) are read in sorted path order. ``split`` and ``subset`` pick
files by name the way hub repos lay them out: a file belongs to split "train" when a part of
its relative path (split at ``/ _ - .``) is "train"; a subset is a folder of that name. A
folder whose file names mention no split at all is read whole for split "train".
"""

from __future__ import annotations

import csv
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from surogate.config.sft import DatasetConfig
from surogate.errors import ConfigError, FileFormatError, NotFoundError, UnsupportedError

log = logging.getLogger(__name__)

EXTENSIONS = (".jsonl", ".json", ".csv", ".parquet")
_SPLIT_WORDS = {"train", "training", "test", "validation", "valid", "val", "dev", "eval"}
_REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


class Row(NamedTuple):
    record: dict
    where: str  # "<file> line 7", "<file> record 3", "<file> row 12" (all 1-based)
    path: Path | None = None  # the file (relative image paths in the row are relative to its folder)


class RowErrors:
    """Malformed rows: raised as errors naming them, or (``skip``) counted with a few examples kept."""

    def __init__(self, skip: bool):
        self.skip = skip
        self.count = 0
        self.examples: list[str] = []

    def bad(self, where: str, problem: str, hint: str | None = None) -> None:
        if not self.skip:
            hint = f"{hint + '; or ' if hint else ''}set skip_bad_rows: true to skip malformed rows"
            raise FileFormatError(f"{where}: {problem}", hint=hint)
        self.count += 1
        if len(self.examples) < 5:
            self.examples.append(f"{where}: {problem}")


def resolve_files(dataset: DatasetConfig) -> list[Path]:
    """The local files holding a dataset's rows; a hub id is downloaded (or found in the HF cache) first."""
    path = Path(dataset.path).expanduser()
    if not path.exists():
        if (not _REPO_ID.match(dataset.path) or dataset.path.startswith((".", "/", "~"))
                or path.suffix.lower() in EXTENSIONS):
            raise NotFoundError(f"dataset not found: {dataset.path}",
                                hint="give a local file or folder, or a Hugging Face dataset id (org/name)")
        path = _download(dataset.path)
    if path.is_file():
        if path.suffix.lower() not in EXTENSIONS:
            raise FileFormatError(f"{path}: unsupported dataset file type {path.suffix!r}",
                                  hint=f"surogate reads {', '.join(EXTENSIONS)}")
        return [path]
    return _pick_files(path, dataset.split, dataset.subset)


def read_rows(files: list[Path], errors: RowErrors) -> Iterator[Row]:
    for path in files:
        reader = {".jsonl": _read_jsonl, ".json": _read_json, ".csv": _read_csv,
                  ".parquet": _read_parquet}[path.suffix.lower()]
        for row in reader(path, errors):
            yield row._replace(path=path)


def fingerprint(files: list[Path]) -> list[tuple[str, int, int]]:
    """What the rows depend on, for the tokenization cache: each file's path, size and mtime."""
    out = []
    for f in files:
        st = f.stat()
        out.append((str(f.resolve()), st.st_size, st.st_mtime_ns))
    return out


# -- finding files --

def _download(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(repo_id, repo_type="dataset", allow_patterns=[f"*{e}" for e in EXTENSIONS])
    except Exception as e:  # not found, gated, offline: the hub raises many kinds
        raise NotFoundError(f"dataset {repo_id!r} is neither a local path nor a downloadable hub dataset: {e}",
                            hint="check the id and the network; gated datasets need `hf auth login`") from e
    return Path(folder)


def _pick_files(folder: Path, split: str, subset: str | None) -> list[Path]:
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in EXTENSIONS
                   and not any(part.startswith(".") for part in p.relative_to(folder).parts))
    if not files:
        raise NotFoundError(f"no dataset files in {folder}", hint=f"surogate reads {', '.join(EXTENSIONS)}")
    rel = {p: p.relative_to(folder) for p in files}
    if subset is not None:
        chosen = [p for p in files if subset in rel[p].parts[:-1]]
        if not chosen:
            folders = sorted({str(r.parent) for r in rel.values() if str(r.parent) != "."})
            raise ConfigError(f"subset {subset!r}: no folder of that name in {folder}",
                              hint=f"folders found: {', '.join(folders) or 'none'}")
        files = chosen
    words = {p: set(re.split(r"[/_.\-]", str(rel[p]).lower())) for p in files}
    chosen = [p for p in files if split.lower() in words[p]]
    if chosen:
        return chosen
    if split == "train" and not any(w & _SPLIT_WORDS for w in words.values()):
        return files  # a plain folder of files: all of it is training data
    found = sorted({w for ws in words.values() for w in ws & _SPLIT_WORDS})
    raise ConfigError(f"split {split!r}: no file in {folder} is named for it",
                      hint=f"splits found: {', '.join(found) or 'none'}; set split: to one of them")


# -- readers --

def _read_jsonl(path: Path, errors: RowErrors) -> Iterator[Row]:
    with open(path, encoding="utf-8", errors="strict") as f:
        lineno = 0
        while True:
            try:
                line = f.readline()
            except UnicodeDecodeError as e:
                raise FileFormatError(f"{path} line {lineno + 1}: not UTF-8 text ({e.reason})",
                                      hint="re-encode the file as UTF-8") from None
            if not line:
                return
            lineno += 1
            if not line.strip():
                continue
            where = f"{path} line {lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                errors.bad(where, f"invalid JSON: {e.msg} at column {e.colno}")
                continue
            if not isinstance(record, dict):
                errors.bad(where, f"expected a JSON object, got {type(record).__name__}")
                continue
            yield Row(record, where)


def _read_json(path: Path, errors: RowErrors) -> Iterator[Row]:
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except json.JSONDecodeError as e:
        if e.msg == "Extra data":  # JSON Lines saved as .json, as many datasets are
            yield from _read_jsonl(path, errors)
            return
        raise FileFormatError(f"{path} line {e.lineno}: invalid JSON: {e.msg} at column {e.colno}",
                              hint='fix the file; a .json dataset holds a list of objects or {"data": [...]}') from None
    except UnicodeDecodeError as e:
        raise FileFormatError(f"{path}: not UTF-8 text ({e.reason})", hint="re-encode the file as UTF-8") from None
    if isinstance(value, dict) and isinstance(value.get("data"), list):
        value = value["data"]
    if not isinstance(value, list):
        raise FileFormatError(f'{path}: expected a list of objects or {{"data": [...]}}, found {type(value).__name__}',
                              hint="or write one JSON object per line in a .jsonl file")
    for i, record in enumerate(value, 1):
        where = f"{path} record {i}"
        if not isinstance(record, dict):
            errors.bad(where, f"expected a JSON object, got {type(record).__name__}")
            continue
        yield Row(record, where)


def _read_csv(path: Path, errors: RowErrors) -> Iterator[Row]:
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        try:
            for record in reader:
                where = f"{path} line {reader.line_num}"
                if None in record or any(v is None for v in record.values()):
                    more = "more" if None in record else "fewer"
                    errors.bad(where, f"has {more} fields than the header's {len(header)}",
                               hint="quote fields that contain commas or line breaks")
                    continue
                yield Row(record, where)
        except csv.Error as e:
            raise FileFormatError(f"{path} line {reader.line_num}: invalid CSV: {e}") from None


def _read_parquet(path: Path, errors: RowErrors) -> Iterator[Row]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UnsupportedError(f"{path}: install pyarrow to read parquet", hint="pip install pyarrow") from None
    try:
        file = pq.ParquetFile(path)
        i = 0
        for batch in file.iter_batches(batch_size=4096):
            for record in batch.to_pylist():
                i += 1
                yield Row(record, f"{path} row {i}")
    except OSError as e:  # pyarrow.ArrowInvalid subclasses ValueError, ArrowIOError OSError
        raise FileFormatError(f"{path}: cannot read parquet: {e}") from None
    except ValueError as e:
        raise FileFormatError(f"{path}: cannot read parquet: {e}") from None
