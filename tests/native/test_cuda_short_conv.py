"""The CUDA short convolution (kernels_native/cuda/short_conv.cu) against the CPU backend:
short_conv_fwd, short_conv_bwd (dbcx, dw, dbias, accumulate) and short_conv_cache (serving spans
continued from a conv state, a span at position 0, slot -1, padding rows).

Skipped on machines without a CUDA build and a GPU; run on the lent H200."""

import numpy as np
import pytest

from sgtest.ops import as_dtype, assert_close, run_on
from surogate import _native

pytestmark = pytest.mark.cuda

HAS_CUDA = bool(_native.build_info()["cuda"]) and len(_native.cuda_devices()) > 0
if not HAS_CUDA:
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)

COVERS = ("short_conv_fwd", "short_conv_bwd", "short_conv_cache")
DTYPES = ["float32", "bfloat16", "float16"]


def rand(shape, dtype, seed, scale=1.0):
    return as_dtype(np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * scale, dtype)


def compare(name, inputs, outputs, dtypes, **attrs):
    want = run_on("cpu", name, inputs, outputs, **attrs)
    got = run_on("cuda", name, inputs, outputs, **attrs)
    for g, w, dt in zip(got, want, dtypes):
        if w is None:
            assert g is None
            continue
        kw = {"rtol": 1e-4, "atol": 1e-4} if dt == "float32-sum" else {}
        assert_close(g.astype(np.float32), w.astype(np.float32), "float32" if dt == "float32-sum" else dt, **kw)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("C,L,bias", [(48, 3, False), (37, 4, True), (2048, 3, False), (5, 1, True)])
def test_forward_and_backward_match_the_cpu(dtype, C, L, bias):
    docs = [13, 1, 40, 7]
    N = sum(docs)
    cu = np.concatenate([[0], np.cumsum(docs)]).astype(np.int32)
    bcx, w = rand((N, 3 * C), dtype, 0), rand((C, 1, L), dtype, 1, 0.5)
    b = rand((C,), dtype, 2) if bias else None
    dy = rand((N, C), dtype, 3)
    compare("short_conv_fwd", [bcx, w, cu, b], [np.zeros((N, C), bcx.dtype)], [dtype])
    start_w = np.full((C, 1, L), 0.5, np.float32)
    start_b = np.full((C,), -0.25, np.float32) if bias else None
    compare("short_conv_bwd", [dy, bcx, w, cu, b], [np.zeros_like(bcx), start_w, start_b],
            [dtype, "float32-sum", "float32-sum"], accumulate=1)
    compare("short_conv_bwd", [dy, bcx, w, cu, b], [np.zeros_like(bcx), np.zeros((C, 1, L), w.dtype), None],
            [dtype, dtype, None])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("L", [1, 3, 4])
def test_cache_step_matches_the_cpu(dtype, L):
    """Four sequences: a resumed prefill chunk, a decode, a span at position 0 (its slot holds stale
    values), a sequence without a slot; two padding rows."""
    C, P = 40, 5
    spans, ctx, slots = [5, 1, 3, 2], [9, 20, 3, 2], [3, 0, 1, -1]
    T = sum(spans) + 2
    cu = np.concatenate([[0], np.cumsum(spans)]).astype(np.int32)
    bcx, w, b = rand((T, 3 * C), dtype, 4), rand((C, L), dtype, 5, 0.5), rand((C,), dtype, 6)
    state = rand((P, L - 1, C), dtype, 7)
    compare("short_conv_cache", [bcx, w, np.array(slots, np.int32), cu, np.array(ctx, np.int32), b],
            [np.full((T, C), 3.0, np.float32).astype(bcx.dtype), state], [dtype, dtype])
