"""The config's datasets -> packed training (and evaluation) data, and the micro-batches of each epoch.

``build_datasets(config, tokenizer)`` reads and tokenizes every dataset entry (or loads it from
the cache), holds out the evaluation documents, and packs each side into rows of sequence_len.
A ``PackedDataset`` then serves micro-batches of B rows in an order fixed by (seed, epoch), from
any position: a checkpoint stores ``BatchIterator.position`` and resuming from it yields the
very batches an uninterrupted run would have.

Evaluation documents come from validation_datasets when given, else from a split of the
training documents (validation_split_ratio of them, at least one, chosen by seed), else none.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import msgspec
import numpy as np

from surogate.config.sft import DatasetConfig, SFTConfig
from surogate.errors import ConfigError
from surogate.io import Tokenizer
from surogate.train.data import cache
from surogate.train.data.formats import Conversation, RowError, normalize
from surogate.train.data.images import resolve_images
from surogate.train.data.packing import Batch, Documents, collate, pack
from surogate.train.data.sources import RowErrors, fingerprint, read_rows, resolve_files
from surogate.train.data.tokenize import ChatEncoder

log = logging.getLogger(__name__)
_CHUNK = 512  # samples rendered and tokenized together


@dataclass
class DataStats:
    """Counts for the run log: what was read, skipped, cut and kept."""

    rows: int = 0  # rows turned into documents
    bad_rows: int = 0  # malformed rows skipped (skip_bad_rows)
    truncated: int = 0  # documents cut to sequence_len
    no_targets: int = 0  # documents dropped because nothing in them is trained on
    documents: int = 0
    tokens: int = 0
    target_tokens: int = 0
    cached: int = 0  # dataset entries loaded from the cache
    tokenized: int = 0  # dataset entries tokenized in this run

    def add(self, other: dict) -> None:
        for k, v in other.items():
            setattr(self, k, getattr(self, k) + v)


class BatchPosition(NamedTuple):
    """Where the next micro-batch comes from: epoch and micro-batch index within it."""

    epoch: int = 0
    index: int = 0


class PackedDataset:
    """Documents packed into rows of ``sequence_len`` tokens (see ``packing``)."""

    def __init__(self, docs: Documents, sequence_len: int, *, sample_packing: bool = True, pad_id: int = 0,
                 seed: int = 0, stats: DataStats | None = None):
        self.docs = docs
        self.sequence_len = sequence_len
        self.pad_id = pad_id
        self.seed = seed
        self.plan = pack(docs.lengths, sequence_len, sample_packing)
        self.stats = stats or DataStats(documents=len(docs), tokens=docs.num_tokens, target_tokens=docs.num_targets)

    @property
    def num_rows(self) -> int:
        return self.plan.num_rows

    def __len__(self) -> int:
        return self.num_rows

    @property
    def fill(self) -> float:
        """Share of row tokens that are document tokens (the rest is padding)."""
        return self.docs.num_tokens / max(1, self.num_rows * self.sequence_len)

    def num_batches(self, batch_size: int) -> int:
        """Micro-batches per epoch; the last one is topped up with padding rows."""
        return math.ceil(self.num_rows / batch_size)

    def order(self, epoch: int, shuffle: bool = True) -> np.ndarray:
        """The row order of an epoch: a permutation drawn from (seed, epoch), or 0..R-1."""
        if not shuffle:
            return np.arange(self.num_rows)
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_rows)

    def batch(self, rows) -> Batch:
        """The micro-batch of these row indices (-1: a padding row)."""
        return collate(self.docs, self.plan, rows, self.sequence_len, self.pad_id)

    def batches(self, batch_size: int, *, epoch: int = 0, start: int = 0, shuffle: bool = True) -> Iterator[Batch]:
        """One epoch's micro-batches from index ``start`` (evaluation: ``shuffle=False``)."""
        order = self.order(epoch, shuffle)
        for i in range(start, self.num_batches(batch_size)):
            yield self.batch(_take(order, i, batch_size))

    def iterator(self, batch_size: int, position: BatchPosition | tuple[int, int] = (0, 0)) -> BatchIterator:
        """Micro-batches without end, epoch after epoch, from ``position`` (a checkpoint's)."""
        return BatchIterator(self, batch_size, BatchPosition(*position))


class BatchIterator:
    """Endless micro-batches; ``position`` is where the next one comes from (save it in checkpoints)."""

    def __init__(self, dataset: PackedDataset, batch_size: int, position: BatchPosition):
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if dataset.num_rows == 0:
            raise ValueError("the dataset has no rows")
        self.dataset = dataset
        self.batch_size = batch_size
        self.position = position
        self._order: tuple[int, np.ndarray] | None = None

    def __iter__(self) -> BatchIterator:
        return self

    def __next__(self) -> Batch:
        epoch, index = self.position
        if index >= self.dataset.num_batches(self.batch_size):
            epoch, index = epoch + 1, 0
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, self.dataset.order(epoch))
        batch = self.dataset.batch(_take(self._order[1], index, self.batch_size))
        index += 1
        if index == self.dataset.num_batches(self.batch_size):
            epoch, index = epoch + 1, 0
        self.position = BatchPosition(epoch, index)
        return batch


def _take(order: np.ndarray, index: int, batch_size: int) -> list[int]:
    rows = order[index * batch_size:(index + 1) * batch_size].tolist()
    return rows + [-1] * (batch_size - len(rows))


# -- building --

def build_datasets(config: SFTConfig, tokenizer: Tokenizer, *, cache_dir: str | Path | None = None,
                   image_prompt=None, images_refused: tuple[str, str] | None = None
                   ) -> tuple[PackedDataset, PackedDataset | None]:
    """(train, eval or None) for the config; ``cache_dir`` defaults to <output_dir>/.cache/tokenized.
    ``image_prompt`` (the family's ``ImagePrompt``): the model's image placeholders; None: rows
    with images are errors, saying ``images_refused`` = (why, hint) when given."""
    cache_dir = Path(cache_dir) if cache_dir is not None else Path(config.output_dir) / ".cache" / "tokenized"
    builder = _Builder(config, tokenizer, cache_dir, image_prompt, images_refused)
    train_stats = DataStats()
    train_docs = Documents.concat([builder.load(d, f"datasets[{i}]", train_stats)
                                   for i, d in enumerate(config.datasets)])
    eval_docs, eval_stats = None, None
    if config.validation_datasets and config.eval_steps > 0:
        eval_stats = DataStats()
        eval_docs = Documents.concat([builder.load(d, f"validation_datasets[{i}]", eval_stats)
                                      for i, d in enumerate(config.validation_datasets)])
    elif config.eval_split_ratio > 0 and len(train_docs) >= 2:
        n = len(train_docs)
        n_eval = min(max(1, round(config.eval_split_ratio * n)), n - 1)
        perm = np.random.default_rng(config.seed).permutation(n)
        eval_docs = train_docs.select(np.sort(perm[:n_eval]))
        train_docs = train_docs.select(np.sort(perm[n_eval:]))
    if len(train_docs) == 0:
        raise ConfigError("no training documents: every row was skipped or has nothing to train on",
                          where="datasets", hint="check the datasets' type, fields and train_on")

    pad_id = next((i for i in (tokenizer.pad_token_id, tokenizer.eos_token_id, *tokenizer.eos_token_ids)
                   if i is not None), 0)
    kw = dict(sample_packing=config.sample_packing, pad_id=pad_id, seed=config.seed)
    train = PackedDataset(train_docs, config.sequence_len, stats=_final(train_stats, train_docs), **kw)
    evaluation = None
    if eval_docs is not None and len(eval_docs):
        evaluation = PackedDataset(eval_docs, config.sequence_len, stats=_final(eval_stats or DataStats(), eval_docs),
                                   **kw)
    log.info("training data: %d documents, %d tokens (%d trained on) in %d rows of %d (%.0f%% full)%s",
             len(train_docs), train_docs.num_tokens, train_docs.num_targets, train.num_rows, config.sequence_len,
             100 * train.fill, f"; evaluation: {len(eval_docs)} documents" if evaluation else "")
    return train, evaluation


def _final(stats: DataStats, docs: Documents) -> DataStats:
    stats.documents, stats.tokens, stats.target_tokens = len(docs), docs.num_tokens, docs.num_targets
    return stats


class _Builder:
    def __init__(self, config: SFTConfig, tokenizer: Tokenizer, cache_dir: Path, image_prompt=None,
                 images_refused=None):
        self.config = config
        self.image_prompt = image_prompt
        self.encoder = ChatEncoder(tokenizer, config.chat_template, image_prompt, images_refused)
        self.cache_dir = cache_dir
        self._tokenizer_fp: str | None = None

    def load(self, dataset: DatasetConfig, name: str, stats: DataStats) -> Documents:
        config = self.config
        files = resolve_files(dataset)
        train_on = config.dataset_train_on(dataset)
        if self._tokenizer_fp is None:
            self._tokenizer_fp = cache.tokenizer_fingerprint(self.encoder.tokenizer, config.chat_template)
        key = cache.cache_key({"dataset": msgspec.to_builtins(dataset), "files": fingerprint(files),
                               "tokenizer": self._tokenizer_fp, "train_on": train_on,
                               "sequence_len": config.sequence_len, "skip_bad_rows": config.skip_bad_rows,
                               # (only for vision models: the text models' keys stay as they were)
                               **({"image_prompt": _prompt_key(self.image_prompt)} if self.image_prompt else {})})
        path = self.cache_dir / f"{key}.npz"
        hit = cache.load(path)
        if hit is not None:
            docs, counts = hit
            stats.add({**counts, "cached": 1})
            log.info("%s (%s): %d documents from the cache %s", name, dataset.path, len(docs), path)
            return docs
        docs, counts = self._tokenize(files, dataset, name, train_on)
        cache.save(path, docs, counts)
        stats.add({**counts, "tokenized": 1})
        return docs

    def _tokenize(self, files, dataset: DatasetConfig, name: str, train_on: str) -> tuple[Documents, dict]:
        T = self.config.sequence_len
        errors = RowErrors(self.config.skip_bad_rows)
        kept: list[tuple[np.ndarray, np.ndarray]] = []
        kept_images: list[tuple] = []
        counts = {"rows": 0, "bad_rows": 0, "truncated": 0, "no_targets": 0}
        pending: list[tuple[object, str]] = []

        def bad(where: str, e: RowError) -> None:
            hint = e.hint or (f"set {name}.{e.key} to the field that holds it" if e.key else None)
            errors.bad(where, e.problem, hint)

        def flush() -> None:
            for (_, where), enc in zip(pending, self.encoder.encode_batch([s for s, _ in pending], train_on)):
                if isinstance(enc, RowError):
                    bad(where, enc)
                    continue
                counts["rows"] += 1
                ids, mask, images = enc.input_ids, enc.loss_mask, enc.images
                if len(ids) > T:
                    ids, mask = ids[:T], mask[:T]
                    if images:  # an image cut short is dropped with the tokens after it
                        ids, mask, images = _whole_images(ids, mask, images, enc.views, self.image_prompt)
                    counts["truncated"] += 1
                if not mask[1:].any():  # the first token is never a target
                    counts["no_targets"] += 1
                    continue
                kept.append((ids, mask))
                kept_images.append(images)
            pending.clear()

        read = 0
        for row in read_rows(files, errors):
            if dataset.samples is not None and read >= dataset.samples:
                break
            try:
                sample = normalize(row.record, dataset)
                if isinstance(sample, Conversation) and sample.images:
                    sample = resolve_images(sample, row.path, self.image_prompt)
            except RowError as e:
                bad(row.where, e)
                continue
            read += 1
            pending.append((sample, row.where))
            if len(pending) >= _CHUNK:
                flush()
        flush()
        counts["bad_rows"] = errors.count
        if errors.count:
            log.warning("%s (%s): skipped %d malformed rows, e.g. %s", name, dataset.path, errors.count,
                        "; ".join(errors.examples[:3]))
        if counts["truncated"]:
            log.warning("%s (%s): %d of %d documents are longer than sequence_len=%d and were truncated",
                        name, dataset.path, counts["truncated"], counts["rows"], T)
        if counts["no_targets"]:
            log.warning("%s (%s): %d documents have nothing to train on (train_on: %s) and were dropped",
                        name, dataset.path, counts["no_targets"], train_on)
        if not kept and counts["rows"] + errors.count == 0:
            raise ConfigError(f"{name}: no rows in {dataset.path}", where=name, hint="check the path, split and subset")
        return Documents.from_arrays(kept, kept_images if any(kept_images) else None), counts


def _prompt_key(prompt) -> list:
    """What the tokens of image rows depend on, for the cache key."""
    pan = getattr(prompt.processor, "do_pan_and_scan", False)
    return [prompt.placeholder, prompt.image_text(0), prompt.image_text(1), prompt.image_token_id,
            prompt.tokens_per_view, (pan or prompt.image_tokens is not None) and repr(prompt.processor)]


def _whole_images(ids: np.ndarray, mask: np.ndarray, images: tuple, views: tuple,
                  prompt) -> tuple[np.ndarray, np.ndarray, tuple]:
    """A truncated document cut again before the first view of an image whose tokens (any view's)
    it cut, and its whole images."""
    at = np.flatnonzero(ids == prompt.image_token_id)
    per = 1 if prompt.image_tokens is not None else prompt.tokens_per_view  # (views: token counts)
    ends = np.cumsum(views) * per  # image tokens up to the end of each image
    whole = int(np.searchsorted(ends, len(at), side="right"))
    done = int(ends[whole - 1]) if whole else 0
    if len(at) > done:
        end = int(at[done])
        ids, mask = ids[:end], mask[:end]
    return ids, mask, tuple(images[:whole])

