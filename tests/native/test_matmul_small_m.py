"""matmul (CPU) with few rows against a large weight (decode and speculative-verification steps,
cpu/gemm.cpp's weight-streaming kernel): right against numpy float64 for every row count up to 32
and past it, both weight layouts, alpha / beta; and each row's bits independent of how many
rows ride with it, so a speculative span's rows equal plain decoding's."""

import numpy as np
import pytest

from sgtest.ops import run_op

K, N = 576, 300  # N * K over the kernel's threshold; K not a multiple of 8 below


@pytest.mark.parametrize("tb", [0, 1])
@pytest.mark.parametrize("k", [K, K + 5])
def test_small_m_against_numpy_and_row_bits_independent_of_m(tb, k):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((33, k)).astype(np.float32)
    b = rng.standard_normal((N, k) if tb else (k, N)).astype(np.float32)
    b64 = b.astype(np.float64).T if tb else b.astype(np.float64)
    rows = {}
    for m in (1, 2, 3, 4, 5, 8, 16, 32, 33):
        (c,) = run_op("matmul", [a[:m], b], [((m, N), "float32")], trans_b=tb)
        np.testing.assert_allclose(c, a[:m].astype(np.float64) @ b64, rtol=1e-5, atol=1e-4 * np.sqrt(k))
        rows[m] = c
    for m in (2, 3, 4, 5, 8, 16, 32):  # the rows of the streaming kernel: identical bits at every M
        assert np.array_equal(rows[m], rows[32][:m]), m
        assert np.array_equal(rows[m][:1], rows[1])


def test_small_m_alpha_beta():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((5, K)).astype(np.float32)
    b = rng.standard_normal((N, K)).astype(np.float32)
    c_old = rng.standard_normal((5, N)).astype(np.float32)
    (c,) = run_op("matmul", [a, b], [c_old.copy()], trans_b=1, alpha=-2.0, beta=0.5)
    np.testing.assert_allclose(c, -2.0 * (a.astype(np.float64) @ b.T) + 0.5 * c_old, rtol=1e-5, atol=1e-3)
