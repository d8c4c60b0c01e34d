"""Tokenized datasets saved to disk, so a re-run (or a resumed run) skips tokenization.

One ``<key>.npz`` per dataset entry of the config (so adding a dataset re-tokenizes only that
one), in ``<output_dir>/.cache/tokenized/``. The key hashes everything the tokens depend on:
the dataset's config entry (type, fields, samples, ...), each file's path, size and mtime,
the tokenizer (tokenizer.json as loaded, special tokens, eos ids, chat templates and the
chosen one), train_on, sequence_len (documents are stored truncated) and skip_bad_rows. Packing
is not in it: rows are packed when the dataset is loaded, which takes a moment.

Files hold ``input_ids`` int32, ``loss_mask`` bool, ``offsets`` int64 (see ``Documents``),
``stats``, a JSON string, and for documents with images ``images``, a JSON string of each
document's image sources. They are written to a temporary name and renamed, so an interrupted
run leaves no half-written cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from surogate.io import Tokenizer
from surogate.train.data.packing import Documents

CACHE_VERSION = 1


def cache_key(parts: dict) -> str:
    text = json.dumps({"version": CACHE_VERSION, **parts}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def tokenizer_fingerprint(tokenizer: Tokenizer, chat_template: str | None) -> str:
    h = hashlib.sha256()
    h.update(tokenizer.backend.to_str().encode())  # the vocabulary, merges, pipeline and added tokens
    h.update(json.dumps([tokenizer.special_tokens_map, list(tokenizer.eos_token_ids), tokenizer.chat_templates,
                         chat_template], sort_keys=True).encode())
    return h.hexdigest()


def load(path: Path) -> tuple[Documents, dict] | None:
    """The cached documents and stats, or None when there is no usable cache file."""
    try:
        with np.load(path, allow_pickle=False) as f:
            images = [tuple(i) for i in json.loads(str(f["images"]))] if "images" in f.files else None
            docs = Documents(f["input_ids"], f["loss_mask"], f["offsets"], images)
            stats = json.loads(str(f["stats"]))
    except (OSError, KeyError, ValueError, AssertionError):  # missing, partial or from another version
        return None
    return docs, stats


def save(path: Path, docs: Documents, stats: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            extra = {} if docs.images is None else {"images": np.array(json.dumps(docs.images))}
            np.savez(f, input_ids=docs.input_ids, loss_mask=docs.loss_mask, offsets=docs.offsets,
                     stats=np.array(json.dumps(stats)), **extra)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
