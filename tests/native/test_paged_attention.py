"""kv_cache_write + paged_attention (CPU) against a dense float64 reference.

K/V of each sequence go into the cache through kv_cache_write, in shuffled non-contiguous
blocks; paged_attention is compared with causal GQA attention computed densely per sequence
(same window / softcap masking). Tolerances: float32 1e-5 (rtol and atol); bfloat16 and
float16 outputs 1e-2 (one rounding of an O(1) output to 8 bits of mantissa is < 4e-3; the
reference sees the same rounded q/k/v, so only the output rounding and f32 sums differ).
"""

import itertools
import math
import os
import platform
import subprocess
import sys

import numpy as np
import pytest
from sgtest.ops import as_dtype, run_op

from surogate import _native
from surogate.errors import InvalidArgumentError, SurogateError

TOL = {"float32": 1e-5, "bfloat16": 1e-2, "float16": 1e-2}
LSE_TOL = {"float32": 1e-5, "bfloat16": 1e-4, "float16": 1e-4}


@pytest.fixture
def threads():
    """Set the pool size for one test (more threads than items forces key splits)."""
    n0 = _native.num_threads()
    yield _native.set_num_threads
    _native.set_num_threads(n0)


class Cache:
    """A paged cache with random block tables; holds each sequence's dense K/V for the reference."""

    def __init__(self, rng, max_ctx, hkv, d, block_size, dtype, spare_blocks=5):
        self.rng, self.hkv, self.d, self.bs, self.dtype = rng, hkv, d, block_size, dtype
        nblocks_per = [(c + block_size - 1) // block_size for c in max_ctx]
        self.num_blocks = sum(nblocks_per) + spare_blocks
        perm = rng.permutation(self.num_blocks)  # shuffled: a sequence's blocks are scattered
        self.max_blocks = max(max(nblocks_per), 1) + 2
        self.tables = np.full((len(max_ctx), self.max_blocks), -1, np.int32)
        o = 0
        for s, n in enumerate(nblocks_per):
            self.tables[s, :n] = perm[o:o + n]
            o += n
        shape = (self.num_blocks, block_size, hkv, d)
        # Garbage (not zeros) where nothing was written: reading an unwritten slot shows.
        self.k_cache = as_dtype(np.full(shape, 1e4, np.float32), dtype)
        self.v_cache = as_dtype(np.full(shape, -1e4, np.float32), dtype)
        self.k = [np.zeros((0, hkv, d), np.float32) for _ in max_ctx]
        self.v = [np.zeros((0, hkv, d), np.float32) for _ in max_ctx]

    def slots(self, s, start, n):
        t = np.arange(start, start + n)
        return (self.tables[s, t // self.bs].astype(np.int64) * self.bs + t % self.bs).astype(np.int32)

    def append(self, new):
        """new: {seq: n_tokens}; writes them in one kv_cache_write call (tokens of all sequences)."""
        ks, vs, sl = [], [], []
        for s, n in new.items():
            k = self.rng.standard_normal((n, self.hkv, self.d)).astype(np.float32)
            v = self.rng.standard_normal((n, self.hkv, self.d)).astype(np.float32)
            k = as_dtype(k, self.dtype).astype(np.float32)
            v = as_dtype(v, self.dtype).astype(np.float32)
            sl.append(self.slots(s, len(self.k[s]), n))
            self.k[s] = np.concatenate([self.k[s], k])
            self.v[s] = np.concatenate([self.v[s], v])
            ks.append(k)
            vs.append(v)
        run_op("kv_cache_write", [as_dtype(np.concatenate(ks), self.dtype), as_dtype(np.concatenate(vs), self.dtype),
                                  np.concatenate(sl)], [self.k_cache, self.v_cache])


def reference(q, k, v, scale, window=0, softcap=0.0, kv_limit=None):
    """Dense causal GQA attention of the last nq positions of a context of len(k), float64;
    ``kv_limit`` [nq]: each row's last visible key instead of its own position."""
    nq, hq, _ = q.shape
    ctx, hkv, _ = k.shape
    g = hq // hkv
    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    kh = np.repeat(k64, g, axis=1)  # [ctx, hq, d]
    vh = np.repeat(v64, g, axis=1)
    sc = np.einsum("ihd,jhd->hij", q64, kh) * scale
    if softcap:
        sc = softcap * np.tanh(sc / softcap)
    pos = ctx - nq + np.arange(nq)[:, None]
    j = np.arange(ctx)[None, :]
    ok = j <= (pos if kv_limit is None else np.asarray(kv_limit)[:, None])
    if window:
        ok &= j > pos - window
    sc = np.where(ok[None], sc, -np.inf)
    m = sc.max(-1, keepdims=True)
    p = np.exp(sc - m)
    l = p.sum(-1, keepdims=True)
    out = np.einsum("hij,jhd->ihd", p / l, vh)
    lse = (m + np.log(l))[..., 0].T  # [nq, hq]
    return out, lse


def attend(cache, qs, ctx, hq, dtype, with_lse=True, kv_limit=None, **attrs):
    """paged_attention for sequences with queries qs[s] ([nq, hq, d] f32) and contexts ctx[s]."""
    cu = np.concatenate([[0], np.cumsum([len(x) for x in qs])]).astype(np.int32)
    q = as_dtype(np.concatenate(qs), dtype)
    t = len(q)
    outs = [np.zeros((t, hq, cache.d), as_dtype(np.zeros(0), dtype).dtype),
            np.zeros((t, hq), np.float32) if with_lse else None]
    # (run_op does not take an absent output; call the op directly.)
    ins = [q, cache.k_cache, cache.v_cache, cache.tables, cu, np.asarray(ctx, np.int32)]
    if kv_limit is not None:
        ins += [None, np.concatenate(kv_limit).astype(np.int32)]
    _native.call_op("paged_attention", ins, outs, attrs)
    return outs[0].astype(np.float32), outs[1], cu


def make_queries(rng, nqs, hq, d, dtype):
    return [as_dtype(rng.standard_normal((n, hq, d)).astype(np.float32), dtype).astype(np.float32) for n in nqs]


def check(cache, qs, ctx, hq, dtype, window=0, softcap=0.0, kv_limit=None, **kw):
    d = cache.d
    attrs = {}
    if window:
        attrs["window"] = window
    if softcap:
        attrs["softcap"] = softcap
    out, lse, cu = attend(cache, qs, ctx, hq, dtype, kv_limit=kv_limit, **attrs, **kw)
    scale = 1.0 / math.sqrt(d)
    for s, qq in enumerate(qs):
        if len(qq) == 0:
            continue
        ro, rl = reference(qq, cache.k[s][:ctx[s]], cache.v[s][:ctx[s]], scale, window, softcap,
                           None if kv_limit is None else kv_limit[s])
        np.testing.assert_allclose(out[cu[s]:cu[s + 1]], ro, rtol=TOL[dtype], atol=TOL[dtype],
                                   err_msg=f"out of sequence {s} (ctx {ctx[s]}, nq {len(qq)})")
        np.testing.assert_allclose(lse[cu[s]:cu[s + 1]], rl, rtol=LSE_TOL[dtype], atol=LSE_TOL[dtype],
                                   err_msg=f"lse of sequence {s}")
    return out, lse


DECODE_CTX = [1, 7, 16, 129, 1000]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("d", [64, 72, 80, 128])
@pytest.mark.parametrize("gqa", [1, 4, 8])
def test_decode(dtype, block_size, d, gqa):
    rng = np.random.default_rng(block_size * 1000 + d * 10 + gqa)
    hkv = 2
    hq = hkv * gqa
    cache = Cache(rng, DECODE_CTX, hkv, d, block_size, dtype)
    # The prompts, then one decode token each: two writes per sequence.
    cache.append({s: c - 1 for s, c in enumerate(DECODE_CTX) if c > 1})
    cache.append({s: 1 for s in range(len(DECODE_CTX))})
    check(cache, make_queries(rng, [1] * len(DECODE_CTX), hq, d, dtype), DECODE_CTX, hq, dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_split_k(dtype, threads):
    # Fewer work items than threads: the context is split across them and recombined.
    threads(8)
    rng = np.random.default_rng(1)
    ctx = [1000, 3000]
    cache = Cache(rng, ctx, 1, 64, 16, dtype)
    cache.append({0: 1000, 1: 3000})
    check(cache, make_queries(rng, [1, 0], 8, 64, dtype), ctx, 8, dtype)  # one decode item
    # A sequence of the batch with no query row does not count; window inside a split.
    check(cache, make_queries(rng, [0, 1], 8, 64, dtype), [5, 3000], 8, dtype, window=700)
    # A prefill chunk late in a long context, split too.
    check(cache, make_queries(rng, [20, 0], 8, 64, dtype), [1000, 3000], 8, dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("gqa,d", [(1, 64), (4, 64), (4, 72)])
def test_prefill_whole_prompt(dtype, gqa, d):
    rng = np.random.default_rng(2 + gqa + d)
    hkv = 2
    ctx = [300, 45]
    cache = Cache(rng, ctx, hkv, d, 16, dtype)
    cache.append({0: 300, 1: 45})
    check(cache, make_queries(rng, ctx, hkv * gqa, d, dtype), ctx, hkv * gqa, dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_chunked_prefill_equals_full_prompt(dtype, threads):
    threads(4)
    rng = np.random.default_rng(3)
    hkv, hq, d, n = 2, 8, 80, 200
    full = Cache(rng, [n], hkv, d, 32, dtype)
    full.append({0: n})
    (q,) = make_queries(rng, [n], hq, d, dtype)
    out_full, lse_full = check(full, [q], [n], hq, dtype)

    chunked = Cache(np.random.default_rng(4), [n], hkv, d, 32, dtype)
    chunked.k, chunked.v = [full.k[0][:0]], [full.v[0][:0]]
    bounds = [0, 70, 150, 200]
    for c0, c1 in itertools.pairwise(bounds):
        # This chunk's K/V go in, then its queries attend to everything so far.
        sl = chunked.slots(0, c0, c1 - c0)
        run_op("kv_cache_write", [as_dtype(full.k[0][c0:c1], dtype), as_dtype(full.v[0][c0:c1], dtype), sl],
               [chunked.k_cache, chunked.v_cache])
        chunked.k, chunked.v = [full.k[0][:c1]], [full.v[0][:c1]]
        out, lse = check(chunked, [q[c0:c1]], [c1], hq, dtype)
        # Same rows of the whole-prompt attention (the same sums in another grouping).
        np.testing.assert_allclose(out, out_full[c0:c1], rtol=TOL[dtype], atol=TOL[dtype])
        np.testing.assert_allclose(lse, lse_full[c0:c1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("window,softcap", [(0, 0.0), (37, 0.0), (0, 5.0), (100, 2.0)])
def test_mixed_batch(dtype, window, softcap, threads):
    threads(2)
    rng = np.random.default_rng(5)
    hkv, gqa, d = 2, 4, 64
    hq = hkv * gqa
    # decode, whole prefill, chunked prefill, idle slot (no query), long decode, short prefill
    ctx = [50, 40, 130, 9, 1025, 3]
    nq = [1, 40, 30, 0, 1, 3]
    cache = Cache(rng, ctx, hkv, d, 16, dtype)
    cache.append({s: c - n for s, (c, n) in enumerate(zip(ctx, nq)) if c > n})
    cache.append({s: n for s, n in enumerate(nq) if n})  # this step's writes, then attention
    # Scores of O(10): make softcap matter.
    qs = [x * 3.0 for x in make_queries(rng, nq, hq, d, dtype)]
    check(cache, [as_dtype(x, dtype).astype(np.float32) for x in qs], ctx, hq, dtype, window, softcap)


def span_limits(ctx, nq, spans):
    """Each row's kv_limit: its position, or the end of the (start, len) span holding it."""
    out = []
    for c, n, sp in zip(ctx, nq, spans):
        pos = np.arange(c - n, c)
        lim = pos.copy()
        for a, m in sp:
            lim[(pos >= a) & (pos < a + m)] = a + m - 1
        out.append(lim)
    return out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("window", [0, 20])
@pytest.mark.parametrize("n_threads", [1, 8])
def test_kv_limit_lets_span_rows_see_their_later_keys(dtype, window, n_threads, threads):
    # Bidirectional spans (Gemma 3's image tokens) in a mixed batch: a decode row, a whole prompt
    # with two spans (one over a block boundary, one up to the last row), a chunk late in a long
    # context (key splits with 8 threads) whose span starts at its first row, an idle sequence.
    threads(n_threads)
    rng = np.random.default_rng(11 + window)
    hkv, hq, d = 2, 8, 64
    ctx = [40, 70, 900, 5]
    nq = [1, 70, 64, 0]
    spans = [[], [(10, 12), (60, 10)], [(836, 16)], []]
    cache = Cache(rng, ctx, hkv, d, 16, dtype)
    cache.append({s: c - n for s, (c, n) in enumerate(zip(ctx, nq)) if c > n})
    cache.append({s: n for s, n in enumerate(nq) if n})
    limits = span_limits(ctx, nq, spans)
    qs = make_queries(rng, nq, hq, d, dtype)
    out, _ = check(cache, qs, ctx, hq, dtype, window, kv_limit=limits)
    causal, _ = check(cache, qs, ctx, hq, dtype, window)
    changed = np.abs(out - causal).max(axis=(1, 2)) > 1e-3
    in_span = np.concatenate([lim > np.arange(c - n, c) for lim, c, n in zip(limits, ctx, nq)])
    assert (changed == in_span).all()  # exactly the rows that see a later key differ


def test_kv_limit_outside_the_rows_range_is_refused():
    rng = np.random.default_rng(12)
    cache = Cache(rng, [10], 1, 16, 4, "float32")
    cache.append({0: 10})
    qs = make_queries(rng, [4], 2, 16, "float32")
    # Rows at positions 6..9 of a 10-token context: a limit past the context, one before the row.
    for bad, msg in (([6, 7, 8, 10], r"kv_limit\[3\] = 10 .* position 9 of 10"),
                     ([5, 7, 8, 9], r"kv_limit\[0\] = 5 .* position 6 of 10; it must lie in \[6, 9\]")):
        with pytest.raises(InvalidArgumentError, match=msg):
            attend(cache, qs, [10], 2, "float32", kv_limit=[np.array(bad)])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("window,softcap", [(0, 0.0), (37, 2.0)])
def test_head_dim_512(dtype, window, softcap, threads):
    # Gemma 4's global layers: heads of 512, 8 query heads over one kv head; decode, whole and
    # chunked prefill rows in one batch.
    threads(2)
    rng = np.random.default_rng(12)
    hq, d = 8, 512
    ctx, nq = [50, 40, 130, 300], [1, 40, 30, 1]
    cache = Cache(rng, ctx, 1, d, 16, dtype)
    cache.append({s: c - n for s, (c, n) in enumerate(zip(ctx, nq)) if c > n})
    cache.append({s: n for s, n in enumerate(nq)})
    check(cache, make_queries(rng, nq, hq, d, dtype), ctx, hq, dtype, window, softcap)


def test_float16_and_odd_head_dim():
    # f16 conversions on every path; D = 72 is not a multiple of the 16 lanes (padded copies).
    rng = np.random.default_rng(9)
    ctx, nq = [90, 40, 300], [1, 40, 20]
    cache = Cache(rng, ctx, 2, 72, 32, "float16")
    cache.append({s: c - n for s, (c, n) in enumerate(zip(ctx, nq)) if c > n})
    cache.append({s: n for s, n in enumerate(nq)})
    check(cache, make_queries(rng, nq, 8, 72, "float16"), ctx, 8, "float16", window=50)


def test_scale_attr_and_no_lse():
    rng = np.random.default_rng(6)
    cache = Cache(rng, [20], 1, 64, 16, "float32")
    cache.append({0: 20})
    qs = make_queries(rng, [4], 2, 64, "float32")
    out, lse, _ = attend(cache, qs, [20], 2, "float32", with_lse=False, scale=0.3)
    assert lse is None
    ro, _ = reference(qs[0], cache.k[0], cache.v[0], 0.3)
    np.testing.assert_allclose(out, ro, rtol=1e-5, atol=1e-5)


def test_window_may_free_blocks():
    # Blocks wholly before every query's window are not read: their table entries may be -1.
    rng = np.random.default_rng(7)
    cache = Cache(rng, [100], 1, 64, 16, "float32")
    cache.append({0: 100})
    cache.tables[0, :3] = -1  # positions 0..47; the window of position 99 starts at 70
    check(cache, make_queries(rng, [1], 4, 64, "float32"), [100], 4, "float32", window=30)
    with pytest.raises(InvalidArgumentError, match=r"paged_attention.*block_tables\[0\]\[2\]"):
        check(cache, make_queries(rng, [1], 4, 64, "float32"), [100], 4, "float32", window=60)


def test_kv_cache_write_skips_minus_one():
    rng = np.random.default_rng(8)
    nb, bs, hkv, d = 4, 4, 2, 8
    kc = np.full((nb, bs, hkv, d), 7.0, np.float32)
    vc = np.full((nb, bs, hkv, d), 7.0, np.float32)
    k = rng.standard_normal((5, hkv, d)).astype(np.float32)
    v = rng.standard_normal((5, hkv, d)).astype(np.float32)
    slots = np.array([13, -1, 0, -1, 6], np.int32)
    run_op("kv_cache_write", [k, v, slots], [kc, vc])
    fk, fv = kc.reshape(nb * bs, hkv, d), vc.reshape(nb * bs, hkv, d)
    for i, s in enumerate(slots):
        if s >= 0:
            np.testing.assert_array_equal(fk[s], k[i])
            np.testing.assert_array_equal(fv[s], v[i])
    untouched = np.setdiff1d(np.arange(nb * bs), slots[slots >= 0])
    assert np.all(fk[untouched] == 7.0) and np.all(fv[untouched] == 7.0)


def test_kv_cache_write_errors():
    kc = np.zeros((2, 4, 1, 8), np.float32)
    vc = np.zeros((2, 4, 1, 8), np.float32)
    k = np.ones((4, 1, 8), np.float32)
    for bad in (8, -2):
        slots = np.array([0, 1, 2, bad], np.int32)
        with pytest.raises(InvalidArgumentError, match=r"kv_cache_write: slot_mapping\[3\].*token 3"):
            run_op("kv_cache_write", [k, k, slots], [kc, vc])
    assert not kc.any()  # nothing written when a slot is bad
    with pytest.raises(InvalidArgumentError, match="kv_cache_write: tokens 0 and 2 both map to slot 5"):
        run_op("kv_cache_write", [k, k, np.array([5, 1, 5, -1], np.int32)], [kc, vc])
    with pytest.raises(SurogateError, match="kv_cache_write"):
        run_op("kv_cache_write", [k, k, np.array([0, 1, 2], np.int32)], [kc, vc])
    with pytest.raises(SurogateError, match="kv_cache_write"):
        run_op("kv_cache_write", [as_dtype(k, "bfloat16"), as_dtype(k, "bfloat16"), np.arange(4, dtype=np.int32)],
               [kc, vc])


def test_paged_attention_errors():
    kc = np.zeros((4, 16, 2, 64), np.float32)
    tables = np.array([[0, 1], [2, -1]], np.int32)
    q = np.zeros((3, 4, 64), np.float32)

    def call(cu, ctx, q=q, tables=tables, kc=kc, hq=4):
        _native.call_op("paged_attention", [q, kc, kc, tables, np.asarray(cu, np.int32), np.asarray(ctx, np.int32)],
                        [np.zeros((len(q), hq, 64), np.float32), None], {})

    call([0, 1, 3], [20, 5])  # fine
    with pytest.raises(InvalidArgumentError, match="paged_attention: cu_q"):
        call([0, 1, 2], [20, 5])  # does not end at T
    with pytest.raises(InvalidArgumentError, match="paged_attention: cu_q decreases"):
        call([0, 4, 3], [20, 5])
    with pytest.raises(InvalidArgumentError, match=r"paged_attention: sequence 1 has 2 query rows but context_lens"):
        call([0, 1, 3], [20, 1])  # n_q > context
    with pytest.raises(InvalidArgumentError, match=r"paged_attention: context_lens\[0\] = 33 exceeds"):
        call([0, 1, 3], [33, 5])
    with pytest.raises(InvalidArgumentError, match=r"paged_attention: block_tables\[1\]\[1\] = -1"):
        call([0, 1, 3], [20, 17], tables=np.array([[0, 1, 3], [2, -1, -1]], np.int32))
    with pytest.raises(InvalidArgumentError, match=r"paged_attention: block_tables\[0\]\[1\] = 4"):
        call([0, 1, 3], [20, 5], tables=np.array([[0, 4], [2, -1]], np.int32))
    with pytest.raises(SurogateError, match="paged_attention"):
        call([0, 1], [20, 5])  # cu_q has the wrong length
    with pytest.raises(SurogateError, match="paged_attention"):
        call([0, 1, 3], [20, 5], q=np.zeros((3, 3, 64), np.float32), hq=3)  # 3 heads over 2 kv heads
    with pytest.raises(SurogateError, match="paged_attention"):
        call([0, 1, 3], [20, 5], kc=as_dtype(kc, "bfloat16"))


# Run in a subprocess by test_narrower_isa_builds: the main cases, called directly (no pytest
# start-up), on the kernel build the environment caps the level at.
_NARROW_SCRIPT = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("tpa", sys.argv[1])
t = importlib.util.module_from_spec(spec)
spec.loader.exec_module(t)
threads = t._native.set_num_threads
for dtype in ("float32", "bfloat16"):
    for d in (64, 72, 80):
        t.test_decode(dtype, 16, d, 4)
    t.test_decode(dtype, 32, 128, 8)
    t.test_prefill_whole_prompt(dtype, 4, 72)
    t.test_prefill_whole_prompt(dtype, 1, 64)
    t.test_mixed_batch(dtype, 37, 5.0, threads)
    t.test_split_k(dtype, threads)
t.test_float16_and_odd_head_dim()
print("ok")
"""


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 builds only")
@pytest.mark.parametrize("isa", ["x86-64-v3", "default"])
def test_narrower_isa_builds(isa):
    """The kernel is built per x86-64 level (vector widths 16, 8, 4); run the main cases on the
    narrower ones too, in a subprocess that caps the level."""
    env = dict(os.environ, SUROGATE_PAGED_ATTENTION_ISA=isa)
    tests_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([tests_dir] + [p for p in [env.get("PYTHONPATH")] if p])
    r = subprocess.run([sys.executable, "-P", "-c", _NARROW_SCRIPT, os.path.abspath(__file__)], env=env,
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout[-4000:] + r.stderr[-4000:]
