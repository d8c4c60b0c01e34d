"""Tokenized documents -> rows of sequence_len tokens -> the micro-batches the trainer runs.

Shape letters: D documents, R rows, B rows per micro-batch, T = sequence_len,
N = B * T tokens in a micro-batch, S segments (documents and padding runs) in a micro-batch.

Packing is best-fit decreasing: documents longest first (ties by index), each into the row whose
free space fits it most tightly, else into a new row. Rows are thus filled nearly full, and a
document never straddles two rows (truncation to T happens before, and is counted). Without
packing every document gets a row of its own. The unused tail of a row is padding: its own
segment, position ids from 0, no targets.

What the trainer gets for one micro-batch (``Batch``), all int32 and flat over the B rows:
- ``input_ids[N]``, ``position_ids[N]`` (restart at 0 at every segment);
- ``cu_seqlens[S+1]``: segment boundaries, 0 first and N last, for varlen attention; no segment
  crosses a row boundary, so the same arrays also read as [B, T];
- ``targets[N]``: the next token to predict, ``targets[t] = labels[t + 1]`` inside a segment and
  IGNORE (-100) at each segment's last token, on padding and wherever the loss mask is off;
- ``num_target_tokens``: how many targets are not IGNORE (the loss is their mean);
- ``images``: the sources of the images whose tokens the batch holds, in token order (row by
  row, each row's documents in order, each document's images in order).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

IGNORE = -100


class Documents:
    """Tokenized documents stored flat: ``input_ids`` int32 [M], ``loss_mask`` bool [M] and
    ``offsets`` int64 [D+1] (document d is ``offsets[d]:offsets[d+1]``); ``images``: None when no
    document has images, else per document the tuple of its images' sources, in order."""

    def __init__(self, input_ids: np.ndarray, loss_mask: np.ndarray, offsets: np.ndarray,
                 images: list[tuple] | None = None):
        assert len(input_ids) == len(loss_mask) == offsets[-1] and offsets[0] == 0
        assert images is None or len(images) == len(offsets) - 1
        self.input_ids = input_ids
        self.loss_mask = loss_mask
        self.offsets = offsets
        self.images = images if images is not None and any(images) else None

    @classmethod
    def from_arrays(cls, docs: Sequence[tuple[np.ndarray, np.ndarray]],
                    images: Sequence[tuple] | None = None) -> Documents:
        offsets = np.zeros(len(docs) + 1, np.int64)
        offsets[1:] = np.cumsum([len(ids) for ids, _ in docs])
        if not docs:
            return cls(np.zeros(0, np.int32), np.zeros(0, bool), offsets)
        return cls(np.concatenate([ids for ids, _ in docs]).astype(np.int32, copy=False),
                   np.concatenate([mask for _, mask in docs]).astype(bool, copy=False), offsets,
                   None if images is None else [tuple(i) for i in images])

    @classmethod
    def concat(cls, parts: Sequence[Documents]) -> Documents:
        if not parts:
            return cls.from_arrays([])
        shifts = np.cumsum([0] + [p.offsets[-1] for p in parts[:-1]])
        offsets = np.concatenate([[0]] + [p.offsets[1:] + s for p, s in zip(parts, shifts)]).astype(np.int64)
        images = None
        if any(p.images is not None for p in parts):
            images = [im for p in parts for im in (p.images if p.images is not None else [()] * len(p))]
        return cls(np.concatenate([p.input_ids for p in parts]), np.concatenate([p.loss_mask for p in parts]), offsets,
                   images)

    def select(self, indices: Sequence[int] | np.ndarray) -> Documents:
        return Documents.from_arrays([self[int(i)] for i in indices],
                                     None if self.images is None else [self.images[int(i)] for i in indices])

    def doc_images(self, d: int) -> tuple:
        return self.images[d] if self.images is not None else ()

    def __getitem__(self, d: int) -> tuple[np.ndarray, np.ndarray]:
        s, e = self.offsets[d], self.offsets[d + 1]
        return self.input_ids[s:e], self.loss_mask[s:e]

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    @property
    def num_targets(self) -> int:
        """Tokens the loss sees: masked tokens that are not the first of their document."""
        return int(self.loss_mask.sum() - self.loss_mask[self.offsets[:-1][self.lengths > 0]].sum())


@dataclass(frozen=True)
class PackPlan:
    """Which documents fill which row: row r holds ``docs[row_offsets[r]:row_offsets[r+1]]``, in order."""

    row_offsets: np.ndarray  # int64 [R+1]
    docs: np.ndarray  # int64 [D]

    @property
    def num_rows(self) -> int:
        return len(self.row_offsets) - 1

    def row(self, r: int) -> np.ndarray:
        return self.docs[self.row_offsets[r]:self.row_offsets[r + 1]]


def pack(lengths: np.ndarray, sequence_len: int, packing: bool = True) -> PackPlan:
    """Rows for documents of these lengths (each at most sequence_len): best-fit decreasing, or one per row."""
    lengths = np.asarray(lengths, np.int64)
    if len(lengths) and (lengths.max() > sequence_len or lengths.min() < 1):
        raise ValueError("documents must be truncated to 1..sequence_len tokens before packing")
    if not packing:
        return PackPlan(np.arange(len(lengths) + 1, dtype=np.int64), np.arange(len(lengths), dtype=np.int64))
    order = np.lexsort((np.arange(len(lengths)), -lengths))
    rows: list[list[int]] = []
    # Distinct free capacities in ascending order (at most T of them, so insertion stays cheap)
    # and, for each, the rows that have exactly that much room.
    capacities: list[int] = []
    rows_with: dict[int, list[int]] = {}
    for d in order.tolist():
        size = int(lengths[d])
        i = bisect.bisect_left(capacities, size)
        if i == len(capacities):
            r, room = len(rows), sequence_len
            rows.append([])
        else:
            room = capacities[i]
            waiting = rows_with[room]
            r = waiting.pop()
            if not waiting:
                del rows_with[room]
                capacities.pop(i)
        rows[r].append(d)
        rest = room - size
        if rest > 0:
            if rest not in rows_with:
                bisect.insort(capacities, rest)
                rows_with[rest] = []
            rows_with[rest].append(r)
    row_offsets = np.zeros(len(rows) + 1, np.int64)
    row_offsets[1:] = np.cumsum([len(r) for r in rows])
    docs = np.fromiter((d for r in rows for d in r), np.int64, count=len(lengths))
    return PackPlan(row_offsets, docs)


@dataclass(frozen=True)
class Batch:
    """One micro-batch, flat over its B rows of T tokens (see the module header)."""

    input_ids: np.ndarray  # int32 [N]
    position_ids: np.ndarray  # int32 [N]
    cu_seqlens: np.ndarray  # int32 [S+1]
    targets: np.ndarray  # int32 [N], IGNORE where there is no loss
    num_target_tokens: int
    max_seqlen: int  # the longest segment, for varlen attention kernels
    rows: int  # B
    sequence_len: int  # T
    images: tuple = ()  # the images' sources, in token order (module header)

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)


def collate(docs: Documents, plan: PackPlan, rows: Sequence[int], sequence_len: int, pad_id: int) -> Batch:
    """The micro-batch made of these rows of ``plan``; a row index of -1 is an all-padding row."""
    T = sequence_len
    ids_parts: list[np.ndarray] = []
    label_parts: list[np.ndarray] = []
    seqlens: list[int] = []
    images: list = []
    for r in rows:
        used = 0
        if r >= 0:
            for d in plan.row(int(r)).tolist():
                ids, mask = docs[d]
                images += docs.doc_images(d)
                ids_parts.append(ids)
                label_parts.append(np.where(mask, ids, IGNORE).astype(np.int32))
                seqlens.append(len(ids))
                used += len(ids)
        assert used <= T, "a packed row is longer than sequence_len"
        if used < T:
            ids_parts.append(np.full(T - used, pad_id, np.int32))
            label_parts.append(np.full(T - used, IGNORE, np.int32))
            seqlens.append(T - used)
    input_ids = np.concatenate(ids_parts).astype(np.int32, copy=False)
    labels = np.concatenate(label_parts)
    lens = np.asarray(seqlens, np.int64)
    cu_seqlens = np.zeros(len(lens) + 1, np.int64)
    cu_seqlens[1:] = np.cumsum(lens)
    position_ids = (np.arange(len(input_ids)) - np.repeat(cu_seqlens[:-1], lens)).astype(np.int32)
    targets = np.empty_like(labels)
    targets[:-1] = labels[1:]
    targets[cu_seqlens[1:] - 1] = IGNORE  # a segment's last token predicts nothing: no crossing documents
    return Batch(input_ids=input_ids, position_ids=position_ids, cu_seqlens=cu_seqlens.astype(np.int32),
                 targets=targets, num_target_tokens=int((targets != IGNORE).sum()),
                 max_seqlen=int(lens.max()), rows=len(rows), sequence_len=T, images=tuple(images))


def split_rows(batch: Batch, parts: int) -> list[Batch]:
    """A micro-batch of P * b rows as P micro-batches of b consecutive rows each (data parallel:
    part p is rank p's share), each what ``collate`` gives for those rows: segments never cross
    a row, so the cut points are boundaries already."""
    if batch.rows % parts:
        raise ValueError(f"{batch.rows} rows do not split into {parts} equal parts")
    if batch.images:
        raise ValueError("a micro-batch with images does not split by rows yet")
    n = batch.rows // parts * batch.sequence_len
    cu = batch.cu_seqlens
    out = []
    for p in range(parts):
        lo, hi = p * n, (p + 1) * n
        sub = cu[(cu >= lo) & (cu <= hi)] - lo
        targets = batch.targets[lo:hi]
        out.append(Batch(input_ids=batch.input_ids[lo:hi], position_ids=batch.position_ids[lo:hi],
                         cu_seqlens=sub.astype(np.int32), targets=targets,
                         num_target_tokens=int((targets != IGNORE).sum()), max_seqlen=int(np.diff(sub).max()),
                         rows=batch.rows // parts, sequence_len=batch.sequence_len))
    return out
