"""`surogate distill capture CONFIG`: the teacher's top-K log-probs at every trained position of
the run's data, computed once by our engine (the teacher's logits Program over each packed row,
documents isolated as in training) and stored, so that `surogate distill` trains from the file
without loading the teacher (``distillation.teacher_logprobs``: the folder; the same config).

The folder:

- ``capture.json``: ``format`` ("surogate-distill-capture"), ``version``, the teacher, ``top_k``,
  ``sequence_len``, ``rows`` (packed rows of the data), ``shard_rows``, and ``vocab_sha256`` (the
  digest of the tokenizer's vocabulary: training refuses a student of another tokenizer).
- ``shard-NNNNN.npz`` per ``shard_rows`` packed rows, in row order: ``keys`` [R] (sha256 of each
  row's input ids, positions and targets: the trainer finds a batch's rows by content, so a
  capture of other data is an error, not silently wrong targets), ``offsets`` [R + 1] into
  ``positions`` [M] (int32, the row's positions that have a target), ``ids`` [M, K] (int32,
  most likely first) and ``logprobs`` [M, K] (float32: the teacher's full log_softmax).

Every file is written to a temporary name and renamed, so a shard is whole or absent: a capture
stopped part way resumes at its first missing shard, after checking the ones there (a shard
that does not load, or was made from other rows, is an error naming the file).

Shape letters: T tokens per row (sequence_len), M positions with a target, K top tokens.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from surogate.errors import ConfigError, FileFormatError

FORMAT, VERSION = "surogate-distill-capture", 1
SHARD_ROWS = 256
IGNORE = -100


def vocab_digest(tokenizer) -> str:
    vocab = tokenizer.backend.get_vocab(with_added_tokens=True)
    return hashlib.sha256(json.dumps(sorted(vocab.items())).encode()).hexdigest()


def row_key(input_ids: np.ndarray, position_ids: np.ndarray, targets: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in (input_ids, position_ids, targets):
        h.update(np.ascontiguousarray(a, np.int32).tobytes())
    return h.hexdigest()


def top_k_logprobs(logits: np.ndarray, k: int, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """([M, k] ids most likely first among the first ``vocab`` tokens, [M, k] their log_softmax
    over the whole row), from [M, V'] logits."""
    z = np.asarray(logits, np.float64)
    top = np.argpartition(-z[:, :vocab], k - 1, axis=1)[:, :k]
    zk = np.take_along_axis(z, top, axis=1)
    order = np.argsort(-zk, axis=1, kind="stable")
    top, zk = np.take_along_axis(top, order, axis=1), np.take_along_axis(zk, order, axis=1)
    m = z.max(axis=1, keepdims=True)
    lse = m + np.log(np.exp(z - m).sum(axis=1, keepdims=True))
    return top.astype(np.int32), (zk - lse).astype(np.float32)


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def shard_path(folder: Path, i: int) -> Path:
    return folder / f"shard-{i:05d}.npz"


def _load_shard(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path) as z:
            shard = {k: z[k] for k in ("keys", "offsets", "positions", "ids", "logprobs")}
    except Exception as e:  # truncated, not an npz, a key missing
        raise FileFormatError(f"{path}: not a readable capture shard ({e})",
                              hint="delete it and run `surogate distill capture` again: it redoes missing shards") \
            from None
    n = len(shard["keys"])
    if len(shard["offsets"]) != n + 1 or shard["offsets"][-1] != len(shard["positions"]) \
            or shard["ids"].shape != shard["logprobs"].shape or len(shard["ids"]) != len(shard["positions"]):
        raise FileFormatError(f"{path}: its arrays do not fit together (keys, offsets, positions, ids, logprobs)",
                              hint="delete it and run `surogate distill capture` again")
    return shard


def capture(cfg, *, teacher=None, student_tokenizer=None, log=print) -> Path:
    """Write (or finish) the capture of ``cfg`` (a DistillConfig) at ``distillation.teacher_logprobs``;
    ``teacher`` / ``student_tokenizer``: already loaded ones (tests). Returns the folder."""
    from surogate.model import load_model, resolve_device
    from surogate.train.data import build_datasets
    from surogate.train.distill import check_same_tokenizer

    d = cfg.distillation
    if not d.teacher_logprobs:
        raise ConfigError("surogate distill capture writes to distillation.teacher_logprobs, which is not set",
                          where="distillation.teacher_logprobs", hint="set it to a folder for the capture")
    folder = Path(d.teacher_logprobs)
    teacher = teacher or load_model(d.teacher_model, device=resolve_device(cfg.device), dtype=cfg.dtype)
    if student_tokenizer is None:  # (the student's weights load mmapped and go unused)
        student_tokenizer = load_model(cfg.model, device="cpu", dtype=cfg.dtype).tokenizer
    check_same_tokenizer(_Named(student_tokenizer, cfg.model), teacher)
    data, _ = build_datasets(cfg, student_tokenizer)
    T, rows, vocab = data.sequence_len, data.num_rows, student_tokenizer.vocab_size
    meta = {"format": FORMAT, "version": VERSION, "teacher": str(d.teacher_model), "top_k": d.top_k,
            "sequence_len": T, "rows": rows, "shard_rows": SHARD_ROWS, "vocab_sha256": vocab_digest(student_tokenizer)}
    folder.mkdir(parents=True, exist_ok=True)
    meta_path = folder / "capture.json"
    if meta_path.exists():
        old = read_meta(folder)
        if {k: old.get(k) for k in meta} != meta:
            diff = sorted(k for k in meta if old.get(k) != meta[k])
            raise ConfigError(f"{meta_path} is a capture of another setup (differs in {', '.join(diff)})",
                              where="distillation.teacher_logprobs",
                              hint="point teacher_logprobs at a new folder, or delete this one")
    else:
        _atomic_write(meta_path, lambda f: f.write(json.dumps(meta, indent=1).encode()))
    exe = teacher.executable("logits", T, T)
    for s in range(-(-rows // SHARD_ROWS)):
        path = shard_path(folder, s)
        span = range(s * SHARD_ROWS, min((s + 1) * SHARD_ROWS, rows))
        batches = [data.batch([r]) for r in span]
        keys = [row_key(b.input_ids, b.position_ids, b.targets) for b in batches]
        if path.exists():
            if list(_load_shard(path)["keys"]) != keys:
                raise FileFormatError(f"{path}: holds other rows than the data's {span.start}..{span.stop - 1}",
                                      hint="delete the capture folder and capture again")
            continue
        positions, ids, lps, offsets = [], [], [], [0]
        for b in batches:
            where = np.nonzero(b.targets != IGNORE)[0]
            if len(where):
                cu = np.full(T + 1, T, np.int32)  # empty documents fill the fixed-size list, as the trainer's
                cu[:len(b.cu_seqlens)] = b.cu_seqlens
                teacher._feed(exe, b.input_ids, b.position_ids, cu)
                exe.run()
                top, lp = top_k_logprobs(np.asarray(exe.read("logits"), np.float32)[where], d.top_k, vocab)
                positions.append(where.astype(np.int32))
                ids.append(top)
                lps.append(lp)
            offsets.append(offsets[-1] + len(where))
        arrays = {"keys": np.array(keys), "offsets": np.asarray(offsets, np.int64),
                  "positions": np.concatenate(positions) if positions else np.zeros(0, np.int32),
                  "ids": np.concatenate(ids) if ids else np.zeros((0, d.top_k), np.int32),
                  "logprobs": np.concatenate(lps) if lps else np.zeros((0, d.top_k), np.float32)}
        _atomic_write(path, lambda f: np.savez(f, **arrays))
        log(f"distill capture: rows {span.start}..{span.stop - 1} of {rows} -> {path}")
    return folder


class _Named:
    """A tokenizer standing in for the student Model in check_same_tokenizer's messages."""

    def __init__(self, tokenizer, path):
        self.tokenizer, self.path = tokenizer, path


def read_meta(folder: Path) -> dict:
    path = Path(folder) / "capture.json"
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path} does not exist: {folder} is not a distill capture",
                          where="distillation.teacher_logprobs",
                          hint="run `surogate distill capture CONFIG` first, or unset teacher_logprobs to "
                               "compute the teacher on the fly") from None
    except (OSError, ValueError) as e:
        raise FileFormatError(f"{path}: not readable JSON ({e})", hint="delete the folder and capture again") from None
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise FileFormatError(f"{path}: not a {FORMAT} version {VERSION} file",
                              hint="capture again with this version of surogate")
    return meta


class CapturedTeacher:
    """The stored top-K of a capture, looked up by row content (what DistillTrainer reads)."""

    def __init__(self, folder: str | Path, tokenizer, top_k: int, sequence_len: int):
        self.folder = Path(folder)
        meta = read_meta(self.folder)
        where = "distillation.teacher_logprobs"
        if meta["vocab_sha256"] != vocab_digest(tokenizer):
            raise ConfigError(f"{self.folder} was captured with another tokenizer than the student's",
                              where=where, hint="capture with a teacher of the student's tokenizer")
        if meta["top_k"] < top_k:
            raise ConfigError(f"{self.folder} holds the top {meta['top_k']} tokens per position, "
                              f"distillation.top_k is {top_k}", where=where,
                              hint=f"lower top_k to {meta['top_k']} or capture again")
        if meta["sequence_len"] != sequence_len:
            raise ConfigError(f"{self.folder} was captured over rows of {meta['sequence_len']} tokens, "
                              f"sequence_len is {sequence_len}", where=where, hint="capture again with this config")
        self.k = top_k
        self.rows: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        for s in range(-(-meta["rows"] // meta["shard_rows"])):
            path = shard_path(self.folder, s)
            if not path.exists():
                raise FileFormatError(f"{path} is missing: the capture did not finish",
                                      hint="run `surogate distill capture CONFIG` again: it resumes there")
            z = _load_shard(path)
            for i, key in enumerate(z["keys"]):
                a, b = z["offsets"][i], z["offsets"][i + 1]
                self.rows[str(key)] = (z["positions"][a:b], z["ids"][a:b, :top_k], z["logprobs"][a:b, :top_k])

    def top_k(self, b) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """As DistillTrainer.teacher_top_k: (positions [M] in the batch, ids [M, k], the teacher's
        probabilities renormalized over its k)."""
        T = b.sequence_len
        at, ids, lps = [], [], []
        for j in range(b.rows):
            sl = slice(j * T, (j + 1) * T)
            want = np.nonzero(b.targets[sl] != IGNORE)[0]
            if not len(want):
                continue
            hit = self.rows.get(row_key(b.input_ids[sl], b.position_ids[sl], b.targets[sl]))
            if hit is None or not np.array_equal(hit[0], want):
                raise ConfigError(f"{self.folder} holds no capture of a row of this run's data",
                                  where="distillation.teacher_logprobs",
                                  hint="the data or its packing changed since the capture: capture again")
            at.append(want + j * T)
            ids.append(hit[1])
            lps.append(hit[2])
        if not at:
            return np.zeros(0, np.int64), np.zeros((0, self.k), np.int32), np.zeros((0, self.k))
        lp = np.concatenate(lps).astype(np.float64)
        w = np.exp(lp - lp.max(axis=1, keepdims=True))
        return np.concatenate(at), np.concatenate(ids), w / w.sum(axis=1, keepdims=True)
