"""The CUDA twins of Qwen3-VL's vision-tower ops against the CPU backend: rope_table
(cuda/rope_table.cu: full and partial rotary, in place), embedding_bag (cuda/embedding_bag.cu) and
act_mul's exact GELU (act "gelu", cuda/norm_rope_act_gated.cu).

Skipped on machines without a CUDA build and a GPU; run on the lent H200."""

import numpy as np
import pytest

from sgtest.ops import as_dtype, assert_close, run_on
from surogate import _native

pytestmark = pytest.mark.cuda

HAS_CUDA = bool(_native.build_info()["cuda"]) and len(_native.cuda_devices()) > 0
if not HAS_CUDA:
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)

COVERS = ("rope_table_fwd", "rope_table_bwd", "embedding_bag_fwd")
DTYPES = ["float32", "bfloat16", "float16"]


def rand(shape, dtype, seed, scale=1.0):
    return as_dtype(np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * scale, dtype)


def compare(name, inputs, outputs, dtype, **attrs):
    want = run_on("cpu", name, inputs, outputs, **attrs)
    got = run_on("cuda", name, inputs, outputs, **attrs)
    for g, w in zip(got, want):
        if w is not None:
            assert_close(g.astype(np.float32), w.astype(np.float32), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(37, 16, 72, 36), (5, 3, 16, 4), (300, 2, 64, 32)])
def test_rope_table(dtype, shape):
    N, H, D, half = shape
    x = rand((N, H, D), dtype, 0, 2.0)
    ang = np.random.default_rng(1).uniform(-60, 60, (N, half)).astype(np.float32)
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    for op in ("rope_table_fwd", "rope_table_bwd"):
        compare(op, [x, cos, sin], [np.zeros(x.shape, x.dtype)], dtype)
        # HF's text-rope rounding (Qwen3-VL's MRoPE): the same on both backends.
        compare(op, [x, cos, sin], [np.zeros(x.shape, x.dtype)], dtype, round_products=1)
    # In place (y aliasing x) on the device: the pass-through dims stay.
    t = _native.tensor(x.copy()).to("cuda")
    _native.call_op("rope_table_fwd", [t, _native.tensor(cos).to("cuda"), _native.tensor(sin).to("cuda")], [t], {})
    (want,) = run_on("cpu", "rope_table_fwd", [x, cos, sin], [np.zeros(x.shape, x.dtype)])
    assert_close(t.to("cpu").numpy().astype(np.float32), want.astype(np.float32), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(96, 4, 2304, 1152), (7, 3, 16, 5)])
def test_embedding_bag(dtype, shape):
    N, K, V, C = shape
    rng = np.random.default_rng(2)
    ids = rng.integers(0, V, (N, K)).astype(np.int32)
    w = rng.uniform(0, 1, (N, K)).astype(np.float32)
    y = np.zeros((N, C), as_dtype(np.zeros(0), dtype).dtype)
    compare("embedding_bag_fwd", [ids, w, rand((V, C), dtype, 3)], [y], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_exact(dtype):
    x, dy = rand((37, 77), dtype, 4, 3.0), rand((37, 77), dtype, 5)
    compare("act_mul_fwd", [x, None], [np.zeros(x.shape, x.dtype)], dtype, act="gelu")
    compare("act_mul_bwd", [dy, x, None], [np.zeros(x.shape, x.dtype), None], dtype, act="gelu")
