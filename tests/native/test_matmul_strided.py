"""matmul on row-strided operands: column slices of wider matrices, the way LoRA writes its
update into one projection's columns of a fused weight's output."""

import numpy as np
import pytest

from sgtest.ops import as_dtype, assert_close
from surogate import _native


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("ta,tb", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_column_slices_as_operands_and_output(dtype, ta, tb):
    rng = np.random.default_rng(ta * 2 + tb)
    M, N, K = 7, 5, 9
    a_full = as_dtype(rng.standard_normal((K, M + 4) if ta else (M, K + 4)).astype(np.float32), dtype)
    b_full = as_dtype(rng.standard_normal((N, K + 3) if tb else (K, N + 3)).astype(np.float32), dtype)
    a = a_full[:, 1:1 + M] if ta else a_full[:, 2:2 + K]
    b = b_full[:, 3:3 + K] if tb else b_full[:, 1:1 + N]
    c_full = as_dtype(rng.standard_normal((M, N + 6)).astype(np.float32), dtype)
    before = c_full.astype(np.float64).copy()
    c = c_full[:, 4:4 + N]
    _native.call_op("matmul", [a, b], [c], {"trans_a": ta, "trans_b": tb, "alpha": 0.5, "beta": 1.0})
    opa = a.astype(np.float64).T if ta else a.astype(np.float64)
    opb = b.astype(np.float64).T if tb else b.astype(np.float64)
    expect = before.copy()
    expect[:, 4:4 + N] += 0.5 * opa @ opb
    assert_close(c_full.astype(np.float64), expect, dtype)
    # Columns outside the slice are untouched, bit for bit.
    np.testing.assert_array_equal(c_full[:, :4].astype(np.float64), before[:, :4])
    np.testing.assert_array_equal(c_full[:, 4 + N:].astype(np.float64), before[:, 4 + N:])
