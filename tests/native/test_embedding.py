"""embedding_fwd/bwd against torch's nn.functional.embedding and its autograd."""

import numpy as np
import pytest
import torch

from sgtest.ops import as_dtype, assert_close, f32, finite_difference, run_op, sample_indices
from surogate import _native
from surogate.errors import DTypeError, InvalidArgumentError, ShapeError


def case(n, v, c, dtype, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, v, n).astype(np.int32)
    table = as_dtype(rng.standard_normal((v, c)), dtype)
    dy = as_dtype(rng.standard_normal((n, c)), dtype)
    return ids, table, dy


def ref_dtable(ids, dy, v):
    table = torch.zeros((v, dy.shape[1]), dtype=torch.float64, requires_grad=True)
    y = torch.nn.functional.embedding(torch.from_numpy(ids.astype(np.int64)), table)
    (y * torch.tensor(f32(dy), dtype=torch.float64)).sum().backward()
    return table.grad.numpy()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("n,v,c", [(1, 5, 64), (7, 3, 80), (129, 50, 128), (33, 10, 4097)])
def test_embedding_forward_is_a_row_gather(dtype, n, v, c):
    ids, table, _ = case(n, v, c, dtype)
    (y,) = run_op("embedding_fwd", [ids, table], [((n, c), dtype)])
    assert np.array_equal(f32(y), f32(table)[ids])


@pytest.mark.parametrize("n,v,c", [(1, 5, 64), (7, 3, 80), (129, 50, 128), (33, 10, 4097)])
def test_embedding_bwd_f32_matches_autograd(n, v, c):
    ids, _, dy = case(n, v, c, "float32", seed=1)
    (dt,) = run_op("embedding_bwd", [ids, dy], [((v, c), "float32")])
    assert_close(dt, ref_dtable(ids, dy, v))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_embedding_bwd_half_dtypes(dtype):
    n, v, c = 129, 7, 80  # many repeats per id: the sum runs in f32 and is rounded once
    ids, _, dy = case(n, v, c, dtype, seed=2)
    ref = ref_dtable(ids, dy, v)
    (dt32,) = run_op("embedding_bwd", [ids, dy], [((v, c), "float32")])
    assert_close(dt32, ref, rtol=1e-5, atol=1e-5)
    (dt,) = run_op("embedding_bwd", [ids, dy], [((v, c), dtype)])
    assert np.array_equal(f32(dt), f32(as_dtype(dt32, dtype)))


def test_embedding_bwd_one_hot_id_dominates():
    # Most tokens share one id (padding): the column-block split must still sum every one.
    n, v, c = 600, 4, 1100
    ids = np.zeros(n, np.int32)
    ids[::50] = 3
    dy = np.random.default_rng(3).standard_normal((n, c)).astype(np.float32)
    (dt,) = run_op("embedding_bwd", [ids, dy], [((v, c), "float32")])
    assert_close(dt, ref_dtable(ids, dy, v), rtol=1e-5, atol=1e-4)
    assert not dt[1:3].any()


def test_embedding_bwd_accumulate_keeps_unused_rows():
    n, v, c = 7, 12, 80
    ids, _, dy = case(n, v, c, "float32", seed=4)
    dt = np.full((v, c), 0.25, np.float32)
    run_op("embedding_bwd", [ids, dy], [dt], accumulate=True)
    assert_close(dt, ref_dtable(ids, dy, v) + 0.25)
    dt_bf = as_dtype(np.full((v, c), 0.25), "bfloat16")
    run_op("embedding_bwd", [ids, as_dtype(dy, "bfloat16")], [dt_bf], accumulate=True)
    assert_close(dt_bf, ref_dtable(ids, as_dtype(dy, "bfloat16"), v) + 0.25, "bfloat16")


def test_embedding_bwd_finite_differences():
    n, v, c = 6, 4, 8
    ids, table, dy = case(n, v, c, "float32", seed=5)
    ids[:3] = 2  # a repeated id

    def loss(t):
        (y,) = run_op("embedding_fwd", [ids, t], [((n, c), "float32")])
        return float(np.sum(y.astype(np.float64) * dy))

    (dt,) = run_op("embedding_bwd", [ids, dy], [((v, c), "float32")])
    idx = sample_indices(table.shape, 20)
    fd = finite_difference(loss, table.copy(), indices=idx)
    for i in idx:
        assert abs(dt[i] - fd[i]) < 1e-3, (i, dt[i], fd[i])


def test_out_of_range_id_names_position_and_id():
    ids, table, dy = case(7, 5, 8, "float32")
    ids[4] = 5
    with pytest.raises(InvalidArgumentError, match=r"embedding_fwd: ids\[4\] = 5 .*5 rows"):
        run_op("embedding_fwd", [ids, table], [((7, 8), "float32")])
    ids[4] = -1
    with pytest.raises(InvalidArgumentError, match=r"embedding_bwd: ids\[4\] = -1"):
        run_op("embedding_bwd", [ids, dy], [((5, 8), "float32")])


def test_shape_and_dtype_errors_name_the_op():
    ids, table, dy = case(7, 5, 8, "float32")
    with pytest.raises(ShapeError, match="embedding_fwd.*y"):
        run_op("embedding_fwd", [ids, table], [((6, 8), "float32")])
    with pytest.raises(DTypeError, match="embedding_fwd.*ids"):
        run_op("embedding_fwd", [ids.astype(np.int64), table], [((7, 8), "float32")])
    with pytest.raises(DTypeError, match="embedding_fwd.*y"):
        run_op("embedding_fwd", [ids, table], [((7, 8), "bfloat16")])
    with pytest.raises(ShapeError, match="embedding_bwd.*dy"):
        run_op("embedding_bwd", [ids, dy[:, :4].copy()], [((5, 8), "float32")])
    with pytest.raises(DTypeError, match="embedding_bwd.*dtable"):
        run_op("embedding_bwd", [ids, as_dtype(dy, "bfloat16")], [((5, 8), "float16")])


def test_embedding_bwd_is_bitwise_independent_of_thread_count():
    n, v, c = 1000, 20, 600
    ids, _, dy = case(n, v, c, "float32", seed=6)
    before = _native.num_threads()
    try:
        results = []
        for threads in (1, 3):
            _native.set_num_threads(threads)
            results.append(run_op("embedding_bwd", [ids, dy], [((v, c), "float32")])[0])
    finally:
        _native.set_num_threads(before)
    assert np.array_equal(results[0], results[1])


# ---- embed_rows (serving: given rows in place of some tokens' embeddings) ----------------------

@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_embed_rows_replaces_the_indexed_rows_rounded_to_x_dtype(dtype):
    rng = np.random.default_rng(3)
    x = as_dtype(rng.standard_normal((9, 24)), dtype)
    rows = rng.standard_normal((4, 24)).astype(np.float32)
    index = np.array([2, -1, 7, 0], np.int32)
    (y,) = run_op("embed_rows", [x, index, rows], [((9, 24), dtype)])
    want = x.copy()
    for e, i in enumerate(index):
        if i >= 0:
            want[i] = as_dtype(rows[e], dtype)  # torch's .to(dtype): round to nearest even
    np.testing.assert_array_equal(f32(y), f32(want))


def test_embed_rows_refuses_bad_indices_before_writing():
    x = np.ones((4, 8), np.float32)
    rows = np.zeros((2, 8), np.float32)
    y = np.full((4, 8), 7.0, np.float32)
    with pytest.raises(InvalidArgumentError, match=r"embed_rows: index\[1\] = 4 is not a row of x \(4 rows"):
        run_op("embed_rows", [x, np.array([0, 4], np.int32), rows], [y])
    with pytest.raises(InvalidArgumentError, match=r"embed_rows: index\[1\] = 1 repeats an earlier index"):
        run_op("embed_rows", [x, np.array([1, 1], np.int32), rows], [y])
    assert (y == 7.0).all()
    with pytest.raises(ShapeError, match="embed_rows: rows"):
        run_op("embed_rows", [x, np.array([0, 1], np.int32), np.zeros((2, 5), np.float32)], [y])
    with pytest.raises(DTypeError, match="embed_rows: rows"):
        run_op("embed_rows", [x, np.array([0, 1], np.int32), rows.astype(np.float16)], [y])
