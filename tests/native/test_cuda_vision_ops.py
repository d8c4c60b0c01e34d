"""The CUDA twins of the vision towers' ops against the CPU backend: layer_norm
(cuda/norm_rope_act_layernorm.cu), act_mul without b (plain gelu_tanh, cuda/norm_rope_act_gated.cu),
mean_pool_2d (cuda/pool.cu) and the training attention's kv_limit (cuda/attention.cu and the
flash path in cuda/attention_flash.cu), with packed documents, bidirectional spans and windows.

Skipped on machines without a CUDA build and a GPU; run on the lent H200."""

import numpy as np
import pytest

from sgtest.ops import as_dtype, assert_close, run_on
from surogate import _native

pytestmark = pytest.mark.cuda

HAS_CUDA = bool(_native.build_info()["cuda"]) and len(_native.cuda_devices()) > 0
if not HAS_CUDA:
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)

COVERS = ("layer_norm_fwd", "layer_norm_bwd", "act_mul_fwd", "act_mul_bwd", "mean_pool_2d_fwd", "mean_pool_2d_bwd",
          "attention_fwd", "attention_bwd")
DTYPES = ["float32", "bfloat16", "float16"]


def rand(shape, dtype, seed, scale=1.0, shift=0.0):
    return as_dtype(np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * scale + shift, dtype)


def compare(name, inputs, outputs, dtypes, **attrs):
    """dtypes per output: a storage dtype's tolerance, or 'sum' for f32 sums over rows."""
    want = run_on("cpu", name, inputs, outputs, **attrs)
    got = run_on("cuda", name, inputs, outputs, **attrs)
    for g, w, dt in zip(got, want, dtypes):
        if w is None:
            assert g is None
            continue
        if dt == "sum":
            assert_close(g, w, rtol=1e-4, atol=1e-3)
        else:
            assert_close(g.astype(np.float32), w.astype(np.float32), dt)


# ---- layer_norm -------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 64), (37, 1152), (9, 13), (300, 80)])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm(dtype, shape, bias):
    n, c = shape
    x, w = rand(shape, dtype, 0, 2.0, 0.5), rand(c, dtype, 1, 0.3, 1.0)
    b = rand(c, dtype, 2, 0.2) if bias else None
    dy = rand(shape, dtype, 3)
    y, mean, rstd = run_on("cpu", "layer_norm_fwd", [x, w, b], [np.zeros(shape, x.dtype), np.zeros(n, np.float32),
                                                             np.zeros(n, np.float32)], eps=1e-6)
    compare("layer_norm_fwd", [x, w, b], [np.zeros(shape, x.dtype), np.zeros(n, np.float32), np.zeros(n, np.float32)],
            [dtype, "float32", "float32"], eps=1e-6)
    db = np.full(c, 0.5, np.float32) if bias else None
    compare("layer_norm_bwd", [dy, x, w, mean, rstd], [np.zeros(shape, x.dtype), np.full(c, 0.25, np.float32), db],
            [dtype, "sum", "sum"], accumulate=True)
    compare("layer_norm_bwd", [dy, x, w, mean, rstd], [np.zeros(shape, x.dtype), None, None], [dtype, None, None])


# ---- gelu_tanh: act_mul without b -------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_tanh(dtype):
    x, dy = rand((37, 77), dtype, 4, 3.0), rand((37, 77), dtype, 5)
    compare("act_mul_fwd", [x, None], [np.zeros(x.shape, x.dtype)], [dtype], act="gelu_tanh")
    compare("act_mul_bwd", [dy, x, None], [np.zeros(x.shape, x.dtype), None], [dtype, None], act="gelu_tanh")


# ---- mean_pool_2d -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,H,W,k,C", [(2, 64, 64, 4, 72), (3, 12, 12, 3, 5), (1, 6, 9, 3, 16)])
def test_mean_pool_2d(dtype, B, H, W, k, C):
    attrs = dict(height=H, width=W, kernel=k)
    x, dy = rand((B * H * W, C), dtype, 6), rand((B * (H // k) * (W // k), C), dtype, 7)
    compare("mean_pool_2d_fwd", [x], [np.zeros(dy.shape, x.dtype)], [dtype], **attrs)
    compare("mean_pool_2d_bwd", [dy], [np.zeros(x.shape, x.dtype)], [dtype], **attrs)


# ---- attention with kv_limit ------------------------------------------------------------------

def spans_limit(L, spans):
    """kv_limit of one document: i, or the last index of the image span [a, b) holding i."""
    lim = np.arange(L, dtype=np.int32)
    for a, b in spans:
        lim[a:b] = b - 1
    return lim


# Documents (length, spans): spans across the 64- and 128-key tiles of both kernel families, at a
# document's start and end, a whole-image document, a one-token one, one without images.
DOCS = [(300, [(10, 200), (201, 260)]), (1, []), (70, [(0, 70)]), (129, [(64, 128)]), (40, [])]
# Bound on |gpu - cpu| relative to the tensor's scale (test_cuda_attention.py's check): f32 order of
# sums only; bf16 / f16 also P and dS in the storage dtype on the tensor cores.
ATTN_TOL = {"float32": 5e-5, "bfloat16": 2e-2, "float16": 5e-3}


def check_scaled(got, want, tol, what):
    a, e = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert np.all(np.isfinite(a)), what
    bound = tol * (np.abs(e) + max(np.abs(e).max(initial=0.0), 1.0))
    assert np.all(np.abs(a - e) <= bound), f"{what}: max error {np.abs(a - e).max():.3g}, tolerance {tol}"


@pytest.mark.parametrize("dtype", DTYPES)
# bf16 / f16: flash at D % 8 == 0 up to 128 (72: Gemma 3's SigLIP, padded to the 80-wide tiles; 40 to
# the 64-wide ones); f32 and 256: the general kernels.
@pytest.mark.parametrize("D", [64, 128, 256, 80, 72, 96, 112, 40])
@pytest.mark.parametrize("window", [0, 5, 100])
def test_attention_kv_limit(dtype, D, window):
    cu = np.concatenate([[0], np.cumsum([L for L, _ in DOCS])]).astype(np.int32)
    lim = np.concatenate([spans_limit(L, sp) for L, sp in DOCS])
    N, Hq, Hkv = int(cu[-1]), 4, 2
    q, dout = rand((N, Hq, D), dtype, 8), rand((N, Hq, D), dtype, 9)
    k, v = rand((N, Hkv, D), dtype, 10), rand((N, Hkv, D), dtype, 11)
    tol = ATTN_TOL[dtype]
    fwd_outs = [np.zeros((N, Hq, D), q.dtype), np.zeros((N, Hq), np.float32)]
    out, lse = run_on("cpu", "attention_fwd", [q, k, v, cu, None, lim], fwd_outs, window=window)
    g_out, g_lse = run_on("cuda", "attention_fwd", [q, k, v, cu, None, lim], fwd_outs, window=window)
    check_scaled(g_out.astype(np.float32), out.astype(np.float32), tol, "out")
    check_scaled(g_lse, lse, 1e-4, "lse")
    bwd_outs = [np.zeros(q.shape, q.dtype), np.zeros(k.shape, k.dtype), np.zeros(v.shape, v.dtype)]
    ins = [dout, q, k, v, out, lse, cu, lim]
    want = run_on("cpu", "attention_bwd", ins, bwd_outs, window=window)
    got = run_on("cuda", "attention_bwd", ins, bwd_outs, window=window)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        check_scaled(g.astype(np.float32), w.astype(np.float32), tol, name)
