"""GPT-OSS's ops on CUDA against the CPU backend (tests/native/test_gpt_oss_ops.py holds the CPU
against torch): attention with sinks forward / backward / dsinks on the general and the flash
paths, paged attention with sinks on the decode and prefill kernels, the clamped SwiGLU and the
per-expert bias. Skipped without a CUDA build and a GPU.

Never run on a GPU when written (no device in that session): the next GPU session runs it."""

import numpy as np
import pytest

from sgtest.ops import TOLERANCE, as_dtype
from surogate import _native

COVERS = ("attention_sinks_bwd", "swiglu_oai_fwd", "swiglu_oai_bwd", "moe_bias_add", "moe_bias_grad")

pytestmark = pytest.mark.cuda

HAS_CUDA = bool(_native.build_info()["cuda"]) and len(_native.cuda_devices()) > 0
if not HAS_CUDA:
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)


def run_on(device, name, inputs, outputs, **attrs):
    ins = [None if x is None else _native.tensor(x).to(device) for x in inputs]
    outs = [None if o is None else _native.tensor(o.copy()).to(device) if isinstance(o, np.ndarray)
            else _native.zeros(list(o[0]), o[1], device) for o in outputs]
    _native.call_op(name, ins, outs, attrs)
    return [None if o is None else o.to("cpu").numpy() for o in outs]


def both(name, inputs, outputs, **attrs):
    return run_on("cpu", name, inputs, outputs, **attrs), run_on("cuda", name, inputs, outputs, **attrs)


def rand(shape, dtype, seed=0, scale=1.0):
    return as_dtype(scale * np.random.default_rng(seed).standard_normal(shape).astype(np.float32), dtype)


def close(got, want, dtype, mul=1.0):
    rtol, atol = TOLERANCE[dtype]
    want = np.asarray(want, np.float64)
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=rtol * mul, atol=atol * scale * mul)


# bf16 / f16 at D % 8 == 0 up to 128 take the flash path (72 on its 80-wide tiles, zero-padded);
# f32 and bf16 at D 160 the general kernels.
@pytest.mark.parametrize("dtype,D", [("float32", 16), ("bfloat16", 64), ("float16", 128), ("bfloat16", 80),
                                     ("bfloat16", 72), ("bfloat16", 160)])
@pytest.mark.parametrize("window", [0, 7])
def test_attention_with_sinks_matches_cpu(dtype, D, window):
    cu = np.array([0, 13, 14, 77], np.int32)
    N, Hq, Hkv = int(cu[-1]), 4, 2
    q, k, v = rand((N, Hq, D), dtype, 1), rand((N, Hkv, D), dtype, 2), rand((N, Hkv, D), dtype, 3)
    sinks = rand((Hq,), dtype, 4, scale=2.0)
    (o0, l0), (o1, l1) = both("attention_fwd", [q, k, v, cu, sinks], [((N, Hq, D), dtype), ((N, Hq), "float32")],
                              window=window)
    close(o1.astype(np.float32), o0.astype(np.float32), dtype, 2)
    close(l1, l0, "float32", 10)
    dout = rand((N, Hq, D), dtype, 5)
    outs = [((N, Hq, D), dtype), ((N, Hkv, D), dtype), ((N, Hkv, D), dtype)]
    r0, r1 = both("attention_bwd", [dout, q, k, v, o0, l0, cu], outs, window=window)
    for a, b in zip(r1, r0):
        close(a.astype(np.float32), b.astype(np.float32), dtype, 2)
    (z0,), (z1,) = both("attention_sinks_bwd", [dout, o0, l0, sinks], [np.full(Hq, 0.25, np.float32)], accumulate=1)
    close(z1, z0, "float32", 100)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("rows", [1, 9])  # decode (the streaming kernel) and a prefill chunk
def test_paged_attention_with_sinks_matches_cpu(dtype, rows):
    S, Hq, Hkv, D, BS, ctx = 3, 8, 2, 64, 16, 40
    nb = S * 3
    kc, vc = rand((nb, BS, Hkv, D), dtype, 1), rand((nb, BS, Hkv, D), dtype, 2)
    bt = np.arange(nb, dtype=np.int32).reshape(S, 3)
    q = rand((S * rows, Hq, D), dtype, 3)
    cu_q = np.arange(0, S * rows + 1, rows, dtype=np.int32)
    cl = np.full(S, ctx, np.int32)
    sinks = rand((Hq,), "float32", 4, scale=2.0)
    for window in (0, 11):
        (o0, l0), (o1, l1) = both("paged_attention", [q, kc, vc, bt, cu_q, cl, sinks],
                                  [((S * rows, Hq, D), dtype), ((S * rows, Hq), "float32")], window=window)
        close(o1.astype(np.float32), o0.astype(np.float32), dtype, 2)
        close(l1, l0, "float32", 10)
        (p0, _), (p1, _) = both("paged_attention", [q, kc, vc, bt, cu_q, cl, sinks],
                                [((S * rows, Hq, D), dtype), None], window=window)  # no lse output: scratch inside
        close(p1.astype(np.float32), p0.astype(np.float32), dtype, 2)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_swiglu_oai_matches_cpu(dtype):
    gu = rand((300, 2 * 96), dtype, 1, scale=6.0)
    (y0,), (y1,) = both("swiglu_oai_fwd", [gu], [((300, 96), dtype)], alpha=1.702, limit=7.0)
    close(y1.astype(np.float32), y0.astype(np.float32), dtype)
    dy = rand((300, 96), dtype, 2)
    (d0,), (d1,) = both("swiglu_oai_bwd", [dy, gu], [((300, 192), dtype)], alpha=1.702, limit=7.0)
    close(d1.astype(np.float32), d0.astype(np.float32), dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_moe_bias_matches_cpu(dtype):
    off = np.array([0, 30, 30, 200, 257], np.int32)
    x, b = rand((257, 48), dtype, 1), rand((4, 48), dtype, 2)
    (y0,), (y1,) = both("moe_bias_add", [x, b, off], [((257, 48), dtype)])
    close(y1.astype(np.float32), y0.astype(np.float32), dtype)
    for out in (np.ones((4, 48), np.float32), as_dtype(np.ones((4, 48), np.float32), dtype)):
        (g0,), (g1,) = both("moe_bias_grad", [x, off], [out], accumulate=1)
        close(g1.astype(np.float32), g0.astype(np.float32), dtype, 4)
