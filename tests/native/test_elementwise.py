import numpy as np
import pytest

from sgtest.ops import argmax_cases, argmax_rows, as_dtype, assert_close, run_op
from surogate.errors import DTypeError, ShapeError


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_add_scale(dtype):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((7, 129)).astype(np.float32)
    b = rng.standard_normal((7, 129)).astype(np.float32)
    (y,) = run_op("add", [as_dtype(a, dtype), as_dtype(b, dtype)], [((7, 129), dtype)], alpha=0.5, beta=-2.0)
    ref = 0.5 * as_dtype(a, dtype).astype(np.float32) - 2.0 * as_dtype(b, dtype).astype(np.float32)
    assert_close(y, ref, dtype)
    (z,) = run_op("scale", [as_dtype(a, dtype)], [((7, 129), dtype)], alpha=3.0)
    assert_close(z, 3.0 * as_dtype(a, dtype).astype(np.float32), dtype)


def test_add_in_place_alias():
    a = np.ones((5,), np.float32)
    run_op("add", [a, a], [a])
    assert a.tolist() == [2.0] * 5


def test_fill():
    (y,) = run_op("fill", [], [((3, 4), "bfloat16")], value=1.5)
    assert np.all(y.astype(np.float32) == 1.5)


def test_shape_and_dtype_errors_name_the_op():
    a = np.ones((2, 3), np.float32)
    with pytest.raises(ShapeError, match="add"):
        run_op("add", [a, np.ones((3, 2), np.float32)], [((2, 3), "float32")])
    with pytest.raises(DTypeError, match="add"):
        run_op("add", [a, as_dtype(a, "bfloat16")], [((2, 3), "float32")])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_argmax_picks_the_lowest_index_of_the_max_and_flags_non_finite_rows(dtype):
    x = argmax_cases(dtype)
    (got,) = run_op("argmax", [x], [((x.shape[0],), "int32")])
    np.testing.assert_array_equal(got, argmax_rows(x))
    assert got[1] == 5 and got[2] == -1 and got[3] == -1 and got[4] == 0 and got[6] == 0


def test_argmax_reads_strided_rows():
    base = np.random.default_rng(1).standard_normal((4, 200)).astype(np.float32)
    (got,) = run_op("argmax", [base[:, :150]], [((4,), "int32")])
    np.testing.assert_array_equal(got, base[:, :150].argmax(axis=1))
