"""gated_matmul and add_rmsnorm_matmul (serving fusions, runtime/fused_matmul.h) on the CPU: each
equals its composition (swiglu_fwd / geglu_fwd, or add_rmsnorm_fwd / rmsnorm_fwd, then matmul)
bit for bit, roundings to the storage dtype included.

Shape letters: M rows, N output features, K inner dim (F for gated_matmul).
"""

import numpy as np
import pytest

from sgtest.ops import as_dtype
from surogate import _native
from surogate.errors import InvalidArgumentError, ShapeError

ACTS = {"silu": "swiglu_fwd", "gelu_tanh": "geglu_fwd"}


def run(name, inputs, outputs, **attrs):
    """outputs: (shape, dtype) pairs (zeros) or None (absent); returns the arrays (None where absent)."""
    outs = [None if o is None else as_dtype(np.zeros(o[0], np.float32), o[1]) for o in outputs]
    _native.call_op(name, list(inputs), outs, attrs)
    return outs


def rand(shape, dtype, seed=0, scale=1.0):
    return as_dtype(scale * np.random.default_rng(seed).standard_normal(shape).astype(np.float32), dtype)


def gated_case(M, N, F, dtype, bias, seed=0):
    gu = rand((M, 2 * F), dtype, seed, scale=2.0)
    W = rand((N, F), dtype, seed + 1, scale=1 / np.sqrt(F))
    b = rand((N,), dtype, seed + 2) if bias else None
    return gu, W, b


def norm_case(M, N, K, dtype, bias, seed=0):
    x, res = rand((M, K), dtype, seed), rand((M, K), dtype, seed + 1)
    w = rand((K,), dtype, seed + 2, scale=0.3) + as_dtype(np.ones(K), dtype)
    W = rand((N, K), dtype, seed + 3, scale=1 / np.sqrt(K))
    b = rand((N,), dtype, seed + 4) if bias else None
    return x, res, w, W, b


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("M,N,F", [(1, 33, 64), (13, 70, 96)])
def test_gated_matmul_is_its_composition(dtype, act, bias, M, N, F):
    gu, W, b = gated_case(M, N, F, dtype, bias, seed=M + N)
    (a,) = run(ACTS[act], [gu], [((M, F), dtype)])
    (want,) = run("matmul", [a, W, b], [((M, N), dtype)], trans_b=1)
    (got,) = run("gated_matmul", [gu, W, b], [((M, N), dtype)], act=act)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_add_rmsnorm_matmul_is_its_composition(dtype, bias, offset):
    M, N, K = 7, 45, 80
    x, res, w, W, b = norm_case(M, N, K, dtype, bias, seed=3)
    attrs = {"eps": 1e-5, "weight_offset": offset}
    y_n, h_want, _ = run("add_rmsnorm_fwd", [x, res, w], [((M, K), dtype), ((M, K), dtype), ((M,), "float32")],
                         **attrs)
    (want,) = run("matmul", [y_n, W, b], [((M, N), dtype)], trans_b=1)
    got, h = run("add_rmsnorm_matmul", [x, res, w, W, b], [((M, N), dtype), ((M, K), dtype)], **attrs)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    np.testing.assert_array_equal(h.view(np.uint8), h_want.view(np.uint8))
    # h absent: y alone, the same bits
    got, _ = run("add_rmsnorm_matmul", [x, res, w, W, b], [((M, N), dtype), None], **attrs)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rmsnorm_matmul_without_residual_is_rmsnorm_then_matmul(dtype):
    M, N, K = 5, 30, 64
    x, _, w, W, b = norm_case(M, N, K, dtype, True, seed=8)
    y_n, _ = run("rmsnorm_fwd", [x, w], [((M, K), dtype), ((M,), "float32")], eps=1e-6)
    (want,) = run("matmul", [y_n, W, b], [((M, N), dtype)], trans_b=1)
    got, _ = run("add_rmsnorm_matmul", [x, None, w, W, b], [((M, N), dtype), None], eps=1e-6)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def test_errors_name_the_op_and_argument():
    gu, W, _ = gated_case(3, 8, 16, "float32", False)
    with pytest.raises(InvalidArgumentError, match="gated_matmul: act"):
        run("gated_matmul", [gu, W], [((3, 8), "float32")], act="relu")
    with pytest.raises(ShapeError, match="gated_matmul: W"):
        run("gated_matmul", [gu, W[:, :8].copy()], [((3, 8), "float32")])
    with pytest.raises(ShapeError, match="gated_matmul: y"):
        run("gated_matmul", [gu, W], [((3, 9), "float32")])
    x, res, w, W, _ = norm_case(3, 8, 16, "float32", False)
    with pytest.raises(InvalidArgumentError, match="add_rmsnorm_matmul: h is x \\+ residual"):
        run("add_rmsnorm_matmul", [x, None, w, W], [((3, 8), "float32"), ((3, 16), "float32")])
    with pytest.raises(ShapeError, match="add_rmsnorm_matmul: residual"):
        run("add_rmsnorm_matmul", [x, res[:2].copy(), w, W], [((3, 8), "float32"), None])
    with pytest.raises(ShapeError, match="add_rmsnorm_matmul: w"):
        run("add_rmsnorm_matmul", [x, res, w[:8].copy(), W], [((3, 8), "float32"), None])
    with pytest.raises(InvalidArgumentError, match="x, w and W are required"):
        run("add_rmsnorm_matmul", [x, res, None, W], [((3, 8), "float32"), None])
