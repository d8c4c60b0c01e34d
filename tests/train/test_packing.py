"""Packing and micro-batches: rows never exceed sequence_len, every token lands exactly once,
position ids restart per document, cu_seqlens agree, and targets never cross a document."""

from __future__ import annotations

import numpy as np
import pytest

from surogate.train.data import IGNORE, Documents, PackedDataset, collate, pack


def random_docs(n: int, max_len: int, seed: int = 0) -> Documents:
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(n):
        length = int(rng.integers(1, max_len + 1))
        ids = rng.integers(0, 1000, length).astype(np.int32)
        mask = rng.random(length) < 0.6
        docs.append((ids, mask))
    return Documents.from_arrays(docs)


def check_batch(batch, docs: Documents, rows: list[list[int]]) -> None:
    """``rows``: the documents of each row of the batch, in order."""
    N, T = batch.num_tokens, batch.sequence_len
    assert N == batch.rows * T == len(rows) * T
    for name in ("input_ids", "position_ids", "cu_seqlens", "targets"):
        assert getattr(batch, name).dtype == np.int32, name
    cu = batch.cu_seqlens.astype(np.int64)
    assert cu[0] == 0 and cu[-1] == N and np.all(np.diff(cu) > 0)
    assert set(range(0, N + 1, T)) <= set(cu.tolist())  # no segment crosses a row
    assert batch.max_seqlen == np.diff(cu).max() <= T
    for s, e in zip(cu[:-1], cu[1:]):  # position ids count from 0 in every segment
        assert np.array_equal(batch.position_ids[s:e], np.arange(e - s))
    # The reference: each row is its documents whole, then padding (pad id -1) up to T.
    segments, labels = [], []
    for row in rows:
        for d in row:
            ids, mask = docs[d]
            segments.append(ids)
            labels.append(np.where(mask, ids, IGNORE))
        used = sum(len(docs[d][0]) for d in row)
        assert used <= T
        if used < T:
            segments.append(np.full(T - used, -1))
            labels.append(np.full(T - used, IGNORE))
    assert np.array_equal(batch.input_ids, np.concatenate(segments))
    assert np.array_equal(np.diff(cu), [len(s) for s in segments])
    # Targets: the next token's label inside a segment; IGNORE at its last token and on padding.
    targets = np.concatenate([np.append(lab[1:], IGNORE) for lab in labels])
    assert np.array_equal(batch.targets, targets)
    assert batch.num_target_tokens == int((targets != IGNORE).sum())


@pytest.mark.parametrize("packing", [True, False])
def test_every_document_lands_in_exactly_one_row(packing: bool) -> None:
    T = 128
    docs = random_docs(300, T)
    plan = pack(docs.lengths, T, packing)
    assert sorted(plan.docs.tolist()) == list(range(len(docs)))
    row_lengths = [docs.lengths[plan.row(r)].sum() for r in range(plan.num_rows)]
    assert max(row_lengths) <= T
    if packing:
        assert plan.num_rows <= 1.1 * np.ceil(docs.num_tokens / T) + 1  # best-fit fills rows nearly full
    else:
        assert plan.num_rows == len(docs)


def test_pack_rejects_untruncated_documents() -> None:
    with pytest.raises(ValueError):
        pack(np.array([10, 200]), 128)


def test_best_fit_decreasing_is_deterministic() -> None:
    plan = pack(np.array([3, 7, 5, 5, 2, 8]), 10)
    rows = [plan.row(r).tolist() for r in range(plan.num_rows)]
    assert rows == [[5, 4], [1, 0], [2, 3]]  # 8+2, 7+3, 5+5


@pytest.mark.parametrize("packing", [True, False])
def test_micro_batches_keep_documents_apart(packing: bool) -> None:
    T, B = 64, 3
    docs = random_docs(40, T, seed=1)
    data = PackedDataset(docs, T, sample_packing=packing, pad_id=-1, seed=5)
    seen_targets = 0
    for index, batch in enumerate(data.batches(B, epoch=2)):
        rows = data.order(2)[index * B:(index + 1) * B].tolist()
        rows += [-1] * (B - len(rows))  # the last micro-batch is topped up with padding rows
        check_batch(batch, docs, [data.plan.row(r).tolist() if r >= 0 else [] for r in rows])
        seen_targets += batch.num_target_tokens
    assert seen_targets == docs.num_targets  # no token lost: every target seen once per epoch


def test_padding_rows_and_a_hand_checked_batch() -> None:
    docs = Documents.from_arrays([(np.array([10, 11, 12], np.int32), np.array([0, 1, 1], bool)),
                                  (np.array([20, 21], np.int32), np.array([1, 1], bool))])
    plan = pack(docs.lengths, 6)
    batch = collate(docs, plan, [0, -1], 6, pad_id=0)
    assert batch.input_ids.tolist() == [10, 11, 12, 20, 21, 0] + [0] * 6
    assert batch.position_ids.tolist() == [0, 1, 2, 0, 1, 0] + list(range(6))
    assert batch.cu_seqlens.tolist() == [0, 3, 5, 6, 12]
    assert batch.targets.tolist() == [11, 12, IGNORE, 21, IGNORE, IGNORE] + [IGNORE] * 6
    assert batch.num_target_tokens == 3 and batch.max_seqlen == 6


def test_documents_concat_and_select() -> None:
    a, b = random_docs(5, 9, seed=2), random_docs(4, 9, seed=3)
    both = Documents.concat([a, b])
    assert len(both) == 9 and both.num_tokens == a.num_tokens + b.num_tokens
    assert np.array_equal(both[6][0], b[1][0])
    picked = both.select([8, 0])
    assert np.array_equal(picked[0][0], b[3][0]) and np.array_equal(picked[1][1], a[0][1])
    assert both.num_targets == a.num_targets + b.num_targets


def test_split_rows_gives_each_part_the_micro_batch_of_its_rows():
    from surogate.train.data import split_rows

    docs = random_docs(60, 40, seed=3)
    ds = PackedDataset(docs, 48, pad_id=0, seed=1)
    rows = [5, -1, 2, 9, 0, 7]  # a padding row among them
    parts = split_rows(ds.batch(rows), 3)
    for p, part in enumerate(parts):
        ref = ds.batch(rows[2 * p:2 * p + 2])
        for name in ("input_ids", "position_ids", "cu_seqlens", "targets"):
            np.testing.assert_array_equal(getattr(part, name), getattr(ref, name), err_msg=name)
        assert (part.num_target_tokens, part.max_seqlen, part.rows) == (ref.num_target_tokens, ref.max_seqlen, 2)
    with pytest.raises(ValueError, match="equal parts"):
        split_rows(ds.batch(rows), 4)
