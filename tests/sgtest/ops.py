"""Run native ops from tests: allocate outputs, call, compare, take finite differences."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import ml_dtypes
import numpy as np

from surogate import _native

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)

# (rtol, atol) for comparing an op's output in a storage dtype against an f32/f64 reference.
TOLERANCE = {
    "float32": (1e-5, 1e-5),
    "float16": (5e-3, 5e-3),
    "bfloat16": (2e-2, 2e-2),
}


def as_dtype(x: np.ndarray, dtype: str | np.dtype) -> np.ndarray:
    """x converted to a numpy dtype given by name ('float32', 'bfloat16', 'float16', ...)."""
    dt = np.dtype(getattr(ml_dtypes, dtype)) if dtype in ("bfloat16", "float8_e4m3fn", "float8_e5m2") else np.dtype(dtype)
    return np.ascontiguousarray(x).astype(dt)


def run_op(name: str, inputs: Sequence, outputs: Sequence, **attrs) -> list[np.ndarray]:
    """Call op `name`. Each output is an array (written in place) or a (shape, dtype) pair to
    allocate, zero-filled. Returns the output arrays."""
    outs = []
    for o in outputs:
        if isinstance(o, np.ndarray):
            outs.append(o)
        else:
            shape, dtype = o
            outs.append(np.zeros(shape, dtype=as_dtype(np.zeros(0), dtype).dtype))
    _native.call_op(name, list(inputs), outs, attrs)
    return outs


def run_on(device: str, name: str, inputs: Sequence, outputs: Sequence, **attrs) -> list:
    """Call op ``name`` on ``device`` ("cpu" or "cuda") with host arrays (None where an input or
    output is absent; the outputs are copied first, since accumulating and in-place ops read
    them); the outputs come back as host arrays (the CUDA-vs-CPU tests' runner)."""
    if device == "cpu":
        outs = [None if o is None else o.copy() for o in outputs]
        _native.call_op(name, list(inputs), outs, attrs)
        return outs
    ins = [None if x is None else _native.tensor(x).to(device) for x in inputs]
    outs = [None if o is None else _native.tensor(o.copy()).to(device) for o in outputs]
    _native.call_op(name, ins, outs, attrs)
    return [None if o is None else o.to("cpu").numpy() for o in outs]


def rel_err(a, b) -> float:
    """max |a - b| over max |b| (in f64): how far a device's result is from the reference's."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))


def f32(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def assert_close(actual, expected, dtype: str = "float32", rtol: float | None = None, atol: float | None = None):
    r, a = TOLERANCE[dtype]
    np.testing.assert_allclose(
        np.asarray(actual, dtype=np.float64),
        np.asarray(expected, dtype=np.float64),
        rtol=r if rtol is None else rtol,
        atol=a if atol is None else atol,
    )


def finite_difference(f: Callable[[np.ndarray], float], x: np.ndarray, eps: float = 1e-3,
                      indices: Sequence[tuple] | None = None) -> np.ndarray:
    """Central differences of scalar f at x (float32 array), at `indices` (all when None).
    Returns an array shaped like x with NaN where not evaluated."""
    g = np.full(x.shape, np.nan, dtype=np.float64)
    idx = list(np.ndindex(x.shape)) if indices is None else indices
    for i in idx:
        orig = x[i]
        x[i] = orig + eps
        fp = f(x)
        x[i] = orig - eps
        fm = f(x)
        x[i] = orig
        g[i] = (fp - fm) / (2 * eps)
    return g


def sample_indices(shape: tuple, n: int, seed: int = 0) -> list[tuple]:
    """n distinct random positions of an array of `shape` (all when it has fewer)."""
    total = int(np.prod(shape))
    rng = np.random.default_rng(seed)
    flat = rng.choice(total, size=min(n, total), replace=False)
    return [tuple(int(v) for v in np.unravel_index(i, shape)) for i in flat]


def argmax_rows(x: np.ndarray) -> np.ndarray:
    """The reference: numpy's argmax (first index of the max), -1 for rows with NaN or +inf."""
    f = x.astype(np.float32)
    want = f.argmax(axis=1).astype(np.int32)
    want[np.isnan(f).any(axis=1) | np.isposinf(f).any(axis=1)] = -1
    return want


def argmax_cases(dtype: str) -> np.ndarray:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((9, 3001)).astype(np.float32)
    x[1, [5, 17, 2999]] = 40.0  # a tie: the lowest index wins
    x[2, 1234] = np.nan
    x[3, 7] = np.inf
    x[4] = -np.inf  # every token masked: index 0 (the sampler then reports the masking)
    x[5, 3000] = 9.0  # the last column
    x[6, :] = 0.5  # all equal
    x[7, 0] = 1e30 if dtype == "float32" else 60000.0 if dtype == "float16" else 1e30
    return as_dtype(x, dtype)
