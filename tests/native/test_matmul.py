"""matmul (CPU): C = alpha op(A) op(B) + beta C (+ bias) against numpy float64.

bf16 / f16 results are compared with the float64 product of the already-rounded inputs: the op
widens them exactly, multiplies in f32 and rounds once, so the error is one rounding of the
output (half an ulp: 2^-9 relative for bf16, 2^-11 for f16) plus f32 accumulation.
"""

import numpy as np
import pytest

from sgtest.ops import as_dtype, run_op
from surogate.errors import DTypeError, ShapeError

# (rtol, atol) of a result stored in `dtype` against the float64 product of the rounded inputs.
ROUNDED = {"float32": (1e-5, 1e-5), "bfloat16": (2**-8, 1e-5), "float16": (2**-10, 1e-5)}


def operands(M, K, N, ta, tb, dtype="float32", seed=0):
    rng = np.random.default_rng(seed)
    a = as_dtype(rng.standard_normal((K, M) if ta else (M, K), np.float32), dtype)
    b = as_dtype(rng.standard_normal((N, K) if tb else (K, N), np.float32), dtype)
    return a, b


def ref(a, b, ta, tb):
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return (a64.T if ta else a64) @ (b64.T if tb else b64)


def check(actual, expected, dtype, K):
    rtol, atol = ROUNDED[dtype]
    # f32 accumulation error grows like sqrt(K) for these random operands
    np.testing.assert_allclose(actual.astype(np.float64), expected, rtol=rtol, atol=atol * max(1.0, np.sqrt(K)))


@pytest.mark.parametrize("ta", [0, 1])
@pytest.mark.parametrize("tb", [0, 1])
@pytest.mark.parametrize("M,K,N", [(1, 1, 1), (7, 129, 1), (257, 7, 129), (1, 257, 7), (33, 0, 5)])
def test_f32_all_transposes(ta, tb, M, K, N):
    a, b = operands(M, K, N, ta, tb)
    (c,) = run_op("matmul", [a, b], [((M, N), "float32")], trans_a=ta, trans_b=tb)
    check(c, ref(a, b, ta, tb), "float32", K)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_alpha_beta_bias(dtype):
    M, K, N = 7, 129, 33
    a, b = operands(M, K, N, 0, 1, dtype)
    rng = np.random.default_rng(1)
    c_old = as_dtype(rng.standard_normal((M, N)), dtype)
    bias = as_dtype(rng.standard_normal(N), dtype)
    (c,) = run_op("matmul", [a, b, bias], [c_old.copy()], trans_b=1, alpha=-2.0, beta=0.5)
    expected = -2.0 * ref(a, b, 0, 1) + 0.5 * c_old.astype(np.float64) + bias.astype(np.float64)
    check(c, expected, dtype, K)


def test_beta_zero_ignores_old_contents():
    a, b = operands(5, 9, 4, 0, 0)
    c = np.full((5, 4), np.nan, np.float32)
    run_op("matmul", [a, b], [c])
    check(c, ref(a, b, 0, 0), "float32", 9)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("ta,tb", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_half_inputs(dtype, ta, tb):
    M, K, N = 129, 257, 7
    a, b = operands(M, K, N, ta, tb, dtype)
    (c,) = run_op("matmul", [a, b], [((M, N), dtype)], trans_a=ta, trans_b=tb)
    check(c, ref(a, b, ta, tb), dtype, K)


def test_bf16_inputs_accumulate_into_f32():
    # gradient accumulation: dW (f32) += x^T @ dy over two micro-batches of bf16 activations
    M, K, N = 65, 129, 31
    a1, b1 = operands(M, K, N, 1, 0, "bfloat16", seed=1)
    a2, b2 = operands(M, K, N, 1, 0, "bfloat16", seed=2)
    c = np.zeros((M, N), np.float32)
    run_op("matmul", [a1, b1], [c], trans_a=1)
    run_op("matmul", [a2, b2], [c], trans_a=1, beta=1.0)
    check(c, ref(a1, b1, 1, 0) + ref(a2, b2, 1, 0), "float32", 2 * K)


def test_mixed_dtypes_and_batched_a():
    rng = np.random.default_rng(3)
    x = as_dtype(rng.standard_normal((2, 5, 64)), "bfloat16")  # [B, T, K]
    w = rng.standard_normal((48, 64)).astype(np.float32)     # nn.Linear [out, in]
    bias = as_dtype(rng.standard_normal(48), "float16")
    (y,) = run_op("matmul", [x, w, bias], [((2, 5, 48), "float32")], trans_b=1)
    expected = x.astype(np.float64) @ w.astype(np.float64).T + bias.astype(np.float64)
    check(y, expected, "float32", 64)


@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 1)])
@pytest.mark.parametrize("M,K,N", [(17, 2050, 2050), (70, 65536, 3)])
def test_panels(ta, tb, M, K, N):
    # bf16 operands above the 4 Mi-element scratch panel: (17, 2050, 2050) splits op(B) into
    # column panels, (70, 65536, 3) splits op(A) into row panels.
    a, b = operands(M, K, N, ta, tb, "bfloat16")
    (c,) = run_op("matmul", [a, b], [((M, N), "bfloat16")], trans_a=ta, trans_b=tb)
    check(c, ref(a, b, ta, tb), "bfloat16", K)


def test_errors_name_the_op():
    a = np.ones((4, 3), np.float32)
    with pytest.raises(ShapeError, match="matmul: inner dims differ"):
        run_op("matmul", [a, np.ones((4, 5), np.float32)], [((4, 5), "float32")])
    with pytest.raises(ShapeError, match="matmul: C is"):
        run_op("matmul", [a, np.ones((3, 5), np.float32)], [((5, 4), "float32")])
    with pytest.raises(ShapeError, match="matmul: bias"):
        run_op("matmul", [a, np.ones((3, 5), np.float32), np.ones(4, np.float32)], [((4, 5), "float32")])
    with pytest.raises(ShapeError, match="matmul: A must be 2-D"):
        run_op("matmul", [np.ones((2, 4, 3), np.float32), np.ones((4, 5), np.float32)], [((3, 5), "float32")],
               trans_a=1)
    with pytest.raises(ShapeError, match="matmul"):
        run_op("matmul", [a, np.ones((1, 3, 5), np.float32)], [((4, 5), "float32")])
    with pytest.raises(DTypeError, match="matmul"):
        run_op("matmul", [a.astype(np.int32), np.ones((3, 5), np.float32)], [((4, 5), "float32")])
