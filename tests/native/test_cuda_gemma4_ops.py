"""The CUDA twins of Gemma 4's ops (act_mul in cuda/norm_rope_act_gated.cu, softcap_fwd in
cuda/elementwise.cu) against the CPU backend, and the proportional rope on CUDA's rope ops.
Skipped without a CUDA build and a GPU; run on the lent H200."""

import numpy as np
import pytest

from sgtest.ops import as_dtype, assert_close
from surogate import _native

pytestmark = pytest.mark.cuda

HAS_CUDA = bool(_native.build_info()["cuda"]) and len(_native.cuda_devices()) > 0
if not HAS_CUDA:
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)

COVERS = ("act_mul_fwd", "act_mul_bwd", "softcap_fwd")
DTYPES = ["float32", "bfloat16", "float16"]


def run(name, inputs, outputs, device, **attrs):
    if device == "cpu":
        outs = [None if o is None else as_dtype(np.zeros(o[0], np.float32), o[1]) for o in outputs]
        _native.call_op(name, list(inputs), outs, attrs)
        return outs
    ins = [_native.tensor(x).to("cuda") for x in inputs]
    outs = [None if o is None else _native.zeros(list(o[0]), o[1], "cuda") for o in outputs]
    _native.call_op(name, ins, outs, attrs)
    return [None if o is None else o.to("cpu").numpy() for o in outs]


def both(name, inputs, outputs, dtype, **attrs):
    for g, e in zip(run(name, inputs, outputs, "cuda", **attrs), run(name, inputs, outputs, "cpu", **attrs)):
        if e is not None:
            assert_close(g.astype(np.float32), e.astype(np.float32), dtype)


def rand(shape, dtype, seed, scale=2.0):
    return as_dtype(np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * scale, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_act_mul(dtype):
    a, b, dy = (rand((37, 77), dtype, s) for s in (1, 2, 3))
    s = rand((1,), dtype, 4)
    for act in ("gelu_tanh", "none"):
        both("act_mul_fwd", [a, b], [((37, 77), dtype)], dtype, act=act)
        both("act_mul_bwd", [dy, a, b], [((37, 77), dtype), ((37, 77), dtype)], dtype, act=act)
        both("act_mul_fwd", [a, s], [((37, 77), dtype)], dtype, act=act)
        both("act_mul_bwd", [dy, a, s], [((37, 77), dtype), None], dtype, act=act)


@pytest.mark.parametrize("dtype", DTYPES)
def test_softcap(dtype):
    both("softcap_fwd", [rand((5, 1001), dtype, 5, scale=40.0)], [((5, 1001), dtype)], dtype, cap=30.0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_proportional_rope(dtype):
    x = rand((37, 3, 64), dtype, 6)
    pos = np.arange(5, 42, dtype=np.int32)
    both("rope_fwd", [x, pos], [((37, 3, 64), dtype)], dtype, theta=1e6, rope_type="proportional", rope_angles=8,
         rotary_dim=64)
