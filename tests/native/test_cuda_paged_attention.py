"""kv_cache_write and paged_attention on the GPU, compared with the CPU backend.

Caches hold garbage (not zeros) outside the written slots and sequences own shuffled blocks, so
a wrong slot or block shows. The CPU op is the reference (test_paged_attention.py checks it
against dense attention); tolerances are the storage dtype's (sgtest.ops.TOLERANCE), lse in f32.
"""

import numpy as np
import pytest
from sgtest.ops import as_dtype, assert_close, run_op

from surogate import _native

pytestmark = pytest.mark.cuda

HAS_CUDA = bool(_native.build_info()["cuda"]) and len(_native.cuda_devices()) > 0
if not HAS_CUDA:
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)

COVERS = ("kv_cache_write", "paged_attention")

LSE_TOL = {"float32": 1e-5, "bfloat16": 1e-4, "float16": 1e-4}


def cuda(x):
    return _native.tensor(np.ascontiguousarray(x)).to("cuda")


def rand(rng, shape, dtype, scale=1.0):
    return as_dtype((rng.standard_normal(shape) * scale).astype(np.float32), dtype)


def make_cache(rng, ctx, hkv, d, block_size, dtype, spare_blocks=3):
    """Caches holding each sequence's ctx[s] tokens in shuffled blocks (written by the CPU op),
    and the block tables (padded with -1)."""
    per = [(c + block_size - 1) // block_size for c in ctx]
    num_blocks = sum(per) + spare_blocks
    perm = rng.permutation(num_blocks)
    tables = np.full((len(ctx), max(per + [1]) + 1), -1, np.int32)
    o = 0
    for s, n in enumerate(per):
        tables[s, :n] = perm[o:o + n]
        o += n
    shape = (num_blocks, block_size, hkv, d)
    k_cache = as_dtype(np.full(shape, 1e4, np.float32), dtype)
    v_cache = as_dtype(np.full(shape, -1e4, np.float32), dtype)
    slots = np.concatenate([tables[s, np.arange(c) // block_size].astype(np.int64) * block_size +
                            np.arange(c) % block_size for s, c in enumerate(ctx)]).astype(np.int32)
    n = len(slots)
    run_op("kv_cache_write", [rand(rng, (n, hkv, d), dtype), rand(rng, (n, hkv, d), dtype), slots],
           [k_cache, v_cache])
    return k_cache, v_cache, tables


def paged(device, q, k_cache, v_cache, tables, nqs, ctx, with_lse=True, **attrs):
    """paged_attention on `device` ('cpu' or 'cuda'); returns (out, lse or None) as numpy."""
    t, hq, d = q.shape
    cu = np.concatenate([[0], np.cumsum(nqs)]).astype(np.int32)
    ins = [q, k_cache, v_cache, tables, cu, np.asarray(ctx, np.int32)]
    if device == "cpu":
        outs = [np.zeros((t, hq, d), q.dtype), np.zeros((t, hq), np.float32) if with_lse else None]
        _native.call_op("paged_attention", ins, outs, attrs)
        return outs[0], outs[1]
    outs = [_native.zeros([t, hq, d], str(q.dtype), "cuda"),
            _native.zeros([t, hq], "float32", "cuda") if with_lse else None]
    _native.call_op("paged_attention", [cuda(x) for x in ins], outs, attrs)
    return outs[0].to("cpu").numpy(), (outs[1].to("cpu").numpy() if with_lse else None)


def check(dtype, ctx, nqs, hq, hkv, d, block_size, with_lse=True, seed=0, **attrs):
    rng = np.random.default_rng(seed)
    k_cache, v_cache, tables = make_cache(rng, ctx, hkv, d, block_size, dtype)
    q = rand(rng, (sum(nqs), hq, d), dtype)
    want, want_lse = paged("cpu", q, k_cache, v_cache, tables, nqs, ctx, with_lse, **attrs)
    got, got_lse = paged("cuda", q, k_cache, v_cache, tables, nqs, ctx, with_lse, **attrs)
    assert_close(got.astype(np.float32), want.astype(np.float32), dtype)
    if with_lse:
        assert_close(got_lse, want_lse, rtol=LSE_TOL[dtype], atol=LSE_TOL[dtype])


# ---- kv_cache_write ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("hkv,d", [(2, 64), (1, 3), (3, 2), (2, 128)])  # 16-byte rows, 2-, 4- and 8-byte units
def test_kv_cache_write(dtype, hkv, d):
    rng = np.random.default_rng(hkv * 100 + d)
    num_blocks, block_size, t = 6, 16, 37
    k_cache = rand(rng, (num_blocks, block_size, hkv, d), dtype)
    v_cache = rand(rng, (num_blocks, block_size, hkv, d), dtype)
    slots = rng.permutation(num_blocks * block_size)[:t].astype(np.int32)
    slots[[0, 5, 6, 36]] = -1  # padding tokens: nothing written
    k = rand(rng, (t, hkv, d), dtype)
    v = rand(rng, (t, hkv, d), dtype)
    want_k, want_v = run_op("kv_cache_write", [k, v, slots], [k_cache.copy(), v_cache.copy()])
    outs = [cuda(k_cache), cuda(v_cache)]
    _native.call_op("kv_cache_write", [cuda(k), cuda(v), cuda(slots)], outs, {})
    np.testing.assert_array_equal(outs[0].to("cpu").numpy(), want_k)
    np.testing.assert_array_equal(outs[1].to("cpu").numpy(), want_v)


# ---- paged_attention -----------------------------------------------------------------------------

DECODE_CTX = [1, 7, 16, 33, 64, 129, 200, 300]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("hq,hkv", [(8, 2), (4, 4)])
def test_decode(dtype, block_size, d, hq, hkv):
    check(dtype, DECODE_CTX, [1] * len(DECODE_CTX), hq, hkv, d, block_size, seed=block_size + d + hq)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("window,softcap", [(0, 0.0), (48, 0.0), (0, 30.0), (48, 30.0)])
@pytest.mark.parametrize("with_lse", [True, False])
def test_decode_window_softcap(dtype, window, softcap, with_lse):
    check(dtype, DECODE_CTX, [1] * len(DECODE_CTX), 8, 2, 64, 16, with_lse, seed=window, window=window,
          softcap=softcap)


# Chunked prefill: q lengths 1, 5, 40 and 0 against longer contexts, one whole prompt (5 = 5).
PREFILL_NQ = [1, 5, 0, 40]
PREFILL_CTX = [50, 5, 9, 97]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("hq,hkv", [(8, 2), (4, 4)])
@pytest.mark.parametrize("window,softcap", [(0, 0.0), (48, 0.0), (0, 30.0), (48, 30.0)])
def test_chunked_prefill(dtype, hq, hkv, window, softcap):
    check(dtype, PREFILL_CTX, PREFILL_NQ, hq, hkv, 64, 16, seed=hq + window, window=window, softcap=softcap)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("with_lse", [True, False])
def test_chunked_prefill_d128(dtype, block_size, with_lse):
    check(dtype, PREFILL_CTX, PREFILL_NQ, 8, 2, 128, block_size, with_lse, seed=block_size, scale=0.05)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("d,hq,hkv", [(36, 4, 2), (33, 2, 1), (80, 6, 2), (200, 4, 1), (256, 16, 1), (72, 96, 1)])
def test_odd_head_dims_and_groups(dtype, d, hq, hkv):
    # Head dims off the 16-byte vector path and the 32-lane split, D up to 256, a group of 96
    # heads (two CTAs of 48 heads each), a group of 3.
    check(dtype, [70, 3], [1, 3], hq, hkv, d, 16, seed=d)
    check(dtype, PREFILL_CTX, PREFILL_NQ, hq, hkv, d, 16, seed=d + 1)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_split_k_long_context(dtype):
    # Few CTAs and long contexts: the keys are split (flash-decoding) and combined.
    check(dtype, [3000, 1000], [1, 1], 8, 1, 64, 16, seed=1)
    check(dtype, [3000, 5], [1, 0], 8, 1, 128, 16, seed=2, window=700)
    check(dtype, [3000, 1000], [20, 0], 8, 1, 64, 32, seed=3, softcap=30.0)  # a prefill chunk late in the context
    check(dtype, [2100], [1], 4, 4, 64, 16, with_lse=False, seed=4)
