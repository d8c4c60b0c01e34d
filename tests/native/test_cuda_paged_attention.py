"""kv_cache_write and paged_attention on the GPU, compared with the CPU backend.

Caches hold garbage (not zeros) outside the written slots and sequences own shuffled blocks, so
a wrong slot or block shows. The CPU op is the reference (test_paged_attention.py checks it
against dense attention); tolerances are the storage dtype's (sgtest.ops.TOLERANCE), lse in f32.
"""

import numpy as np
import pytest
from sgtest.ops import as_dtype, assert_close, run_op

from surogate import _native
from surogate.errors import UnsupportedError

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


def paged(device, q, k_cache, v_cache, tables, nqs, ctx, with_lse=True, kv_limit=None, **attrs):
    """paged_attention on `device` ('cpu' or 'cuda'); returns (out, lse or None) as numpy.
    ``kv_limit``: each row's last visible key (input 7)."""
    t, hq, d = q.shape
    cu = np.concatenate([[0], np.cumsum(nqs)]).astype(np.int32)
    ins = [q, k_cache, v_cache, tables, cu, np.asarray(ctx, np.int32)]
    if kv_limit is not None:
        ins += [None, np.asarray(kv_limit, np.int32)]
    if device == "cpu":
        outs = [np.zeros((t, hq, d), q.dtype), np.zeros((t, hq), np.float32) if with_lse else None]
        _native.call_op("paged_attention", ins, outs, attrs)
        return outs[0], outs[1]
    outs = [_native.zeros([t, hq, d], str(q.dtype), "cuda"),
            _native.zeros([t, hq], "float32", "cuda") if with_lse else None]
    _native.call_op("paged_attention", [None if x is None else cuda(x) for x in ins], outs, attrs)
    return outs[0].to("cpu").numpy(), (outs[1].to("cpu").numpy() if with_lse else None)


def compare(q, k_cache, v_cache, tables, nqs, ctx, with_lse=True, kv_limit=None, **attrs):
    dtype = str(q.dtype)
    want, want_lse = paged("cpu", q, k_cache, v_cache, tables, nqs, ctx, with_lse, kv_limit, **attrs)
    got, got_lse = paged("cuda", q, k_cache, v_cache, tables, nqs, ctx, with_lse, kv_limit, **attrs)
    assert_close(got.astype(np.float32), want.astype(np.float32), dtype)
    if with_lse:
        assert_close(got_lse, want_lse, rtol=LSE_TOL[dtype], atol=LSE_TOL[dtype])


def check(dtype, ctx, nqs, hq, hkv, d, block_size, with_lse=True, seed=0, kv_limit=None, **attrs):
    rng = np.random.default_rng(seed)
    k_cache, v_cache, tables = make_cache(rng, ctx, hkv, d, block_size, dtype)
    q = rand(rng, (sum(nqs), hq, d), dtype)
    compare(q, k_cache, v_cache, tables, nqs, ctx, with_lse, kv_limit, **attrs)


def span_limits(ctx, nqs, spans):
    """Each row's kv_limit, flattened: its position, or the end of the (start, len) span holding it."""
    out = []
    for c, n, sp in zip(ctx, nqs, spans):
        pos = np.arange(c - n, c)
        lim = pos.copy()
        for a, m in sp:
            lim[(pos >= a) & (pos < a + m)] = a + m - 1
        out.append(lim)
    return np.concatenate(out).astype(np.int32)


# ---- kv_cache_write ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("hkv,d", [(2, 64), (1, 3), (3, 2), (2, 128), (2, 512)])  # 16-byte rows, 2-, 4- and 8-byte units
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


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("window", [0, 20])
@pytest.mark.parametrize("d,hq,hkv", [(64, 8, 2), (128, 4, 4), (256, 8, 1), (72, 6, 2)])
def test_kv_limit_bidirectional_spans(dtype, window, d, hq, hkv):
    # Gemma 3's image spans: rows of a span see its later keys (input 7), in a mixed batch (a
    # decode row, a whole prompt with two spans, a chunk of a long context starting at its span).
    ctx, nqs = [40, 70, 600, 5], [1, 70, 64, 0]
    limits = span_limits(ctx, nqs, [[], [(10, 12), (60, 10)], [(536, 16)], []])
    check(dtype, ctx, nqs, hq, hkv, d, 16, seed=d + window, kv_limit=limits, window=window)
    # Few CTAs over a long context: key splits, each ending at its rows' largest limit.
    check(dtype, [3000], [24], 8, 1, 64, 16, seed=3, kv_limit=span_limits([3000], [24], [[(2980, 8)]]))


def test_kv_limit_on_a_decode_shaped_step_takes_the_general_kernel():
    # T <= S (one row per sequence), as a step whose only rows are one-token spans: the causal
    # limit, which the streaming decode kernel (no kv_limit) would also give; and a whole one-row
    # prompt beside idle sequences.
    ctx, nqs = [7, 33, 129, 300], [1, 1, 1, 1]
    check("bfloat16", ctx, nqs, 8, 2, 64, 16, seed=4, kv_limit=span_limits(ctx, nqs, [[]] * 4))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("with_lse", [True, False])
def test_chunked_prefill_d128(dtype, block_size, with_lse):
    check(dtype, PREFILL_CTX, PREFILL_NQ, 8, 2, 128, block_size, with_lse, seed=block_size, scale=0.05)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("d,hq,hkv", [(36, 4, 2), (33, 2, 1), (80, 6, 2), (200, 4, 1), (256, 16, 1), (72, 96, 1),
                                     (512, 8, 1), (500, 4, 2), (320, 12, 1)])
def test_odd_head_dims_and_groups(dtype, d, hq, hkv):
    # Head dims off the 16-byte vector path and the 32-lane split, D up to 512 (16 dims a lane,
    # 16 queries a CTA), a group of 96 heads (two CTAs of 48 heads each), a group of 3.
    check(dtype, [70, 3], [1, 3], hq, hkv, d, 16, seed=d)
    check(dtype, PREFILL_CTX, PREFILL_NQ, hq, hkv, d, 16, seed=d + 1)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_split_k_long_context(dtype):
    # Few CTAs and long contexts: the keys are split (flash-decoding) and combined.
    check(dtype, [3000, 1000], [1, 1], 8, 1, 64, 16, seed=1)
    check(dtype, [3000, 5], [1, 0], 8, 1, 128, 16, seed=2, window=700)
    check(dtype, [3000, 1000], [20, 0], 8, 1, 64, 32, seed=3, softcap=30.0)  # a prefill chunk late in the context
    check(dtype, [2100], [1], 4, 4, 64, 16, with_lse=False, seed=4)


# ---- the decode path (T <= S, rows a multiple of 16 bytes: cuda/paged_attention_decode.cu) ------
# It splits the keys over CTAs when rows x kv heads would not give each SM two CTAs: on an H200
# (132 SMs) below 264. Batches of a few rows take the split; MANY_SEQS rows of 8 kv heads do not.
# A row whose keys span two or more splits has them merged in the same launch by the last split
# to finish (an arrival counter per row and kv head, back at 0 after each launch); a row whose
# keys fit one split is written by that split alone.

EDGE_CTX = [1, 15, 16, 17, 385, 4097]  # around the block size, Qwen3-0.6B's bench context, past 4k
MANY_SEQS = 40


def many_ctx(n=MANY_SEQS):
    return [EDGE_CTX[i % len(EDGE_CTX)] + i // len(EDGE_CTX) for i in range(n)]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("ctx", EDGE_CTX)
def test_decode_batch1_split(dtype, ctx):
    # Qwen3-0.6B heads: one sequence, 8 kv heads, so the keys are split (some splits empty).
    check(dtype, [ctx], [1], 16, 8, 128, 16, seed=ctx)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("d", [64, 128, 256, 512])
@pytest.mark.parametrize("n_seq", [len(EDGE_CTX), MANY_SEQS])
def test_decode_head_dims(dtype, d, n_seq):
    ctx = many_ctx(n_seq)
    check(dtype, ctx, [1] * n_seq, 16, 8, d, 16, seed=d + n_seq)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("d", [8, 36, 72, 80, 200, 33])
def test_decode_odd_head_dims(dtype, d):
    # Rows of 1, 9, 10, 25 ... 16-byte vectors (some lanes of a key idle), and rows that are not
    # whole vectors (bf16 36 and 33, f32 33: the general kernel takes those decode batches).
    check(dtype, EDGE_CTX, [1] * len(EDGE_CTX), 4, 2, d, 16, seed=d)


@pytest.mark.parametrize("group", [1, 2, 3, 4, 5, 6, 7, 8, 12])
@pytest.mark.parametrize("d", [64, 128])
def test_decode_gqa_ratios(group, d):
    # 1..8 query heads per kv head (3, 5, 6, 7 leave some of the CTA's 4 or 8 head slots empty),
    # 12 in chunks of 8; few sequences of 2 kv heads (split) and many of 8 (no split).
    check("bfloat16", EDGE_CTX, [1] * len(EDGE_CTX), 2 * group, 2, d, 16, seed=group)
    check("bfloat16", many_ctx(), [1] * MANY_SEQS, 8 * group, 8, d, 16, seed=group + d)


def test_decode_96_heads_per_kv_head():
    check("bfloat16", EDGE_CTX, [1] * len(EDGE_CTX), 96, 1, 64, 16, seed=96)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("window,softcap", [(0, 0.0), (48, 0.0), (0, 30.0), (1000, 30.0)])
@pytest.mark.parametrize("n_seq", [len(EDGE_CTX), MANY_SEQS])
@pytest.mark.parametrize("with_lse", [True, False])
def test_decode_window_softcap_split_or_not(dtype, window, softcap, n_seq, with_lse):
    ctx = many_ctx(n_seq)
    check(dtype, ctx, [1] * n_seq, 16, 8, 128, 16, with_lse, seed=window + n_seq, window=window, softcap=softcap,
          scale=0.2)


@pytest.mark.parametrize("block_size", [16, 32, 5])
def test_decode_block_sizes(block_size):
    check("bfloat16", EDGE_CTX, [1] * len(EDGE_CTX), 8, 2, 128, block_size, seed=block_size)


def test_decode_freed_blocks_before_window():
    # Blocks wholly before every query's window may be freed (-1): the decode path never reads them.
    rng = np.random.default_rng(7)
    ctx, window, bs = [4097, 385, 17, 100], 48, 16
    k_cache, v_cache, tables = make_cache(rng, ctx, 8, 128, bs, "bfloat16")
    for s, c in enumerate(ctx):
        tables[s, :max(0, c - window) // bs] = -1
    q = rand(rng, (len(ctx), 16, 128), "bfloat16")
    compare(q, k_cache, v_cache, tables, [1] * len(ctx), ctx, window=window)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_decode_rows_not_one_per_sequence(dtype):
    # T <= S but not one row each: sequences with no query and one with three (its rows at their
    # own positions, each a decode row of the kernel).
    check(dtype, [30, 9, 385, 17, 2, 64], [3, 0, 1, 0, 1, 1], 16, 8, 128, 16, seed=11)
    check(dtype, [30, 9, 385, 17, 2, 64], [0, 2, 0, 2, 0, 2], 16, 8, 128, 16, seed=12, window=5)


@pytest.mark.parametrize("n_seq", [4, 48])
def test_decode_padding_rows_untouched(n_seq):
    # Rows of q past cu_q[S] belong to no sequence: out and lse keep what they held.
    rng = np.random.default_rng(n_seq)
    hq, hkv, d, dtype = 16, 8, 128, "bfloat16"
    nqs = ([1, 0, 1, 1] * n_seq)[:n_seq]
    ctx = [EDGE_CTX[i % len(EDGE_CTX)] for i in range(n_seq)]
    k_cache, v_cache, tables = make_cache(rng, ctx, hkv, d, 16, dtype)
    rows, pad = sum(nqs), n_seq - sum(nqs)  # T = S: still the decode path
    q = rand(rng, (rows + pad, hq, d), dtype)
    want, want_lse = paged("cpu", q[:rows], k_cache, v_cache, tables, nqs, ctx)
    cu = np.concatenate([[0], np.cumsum(nqs)]).astype(np.int32)
    out = cuda(as_dtype(np.full((rows + pad, hq, d), 7.0, np.float32), dtype))
    lse = cuda(np.full((rows + pad, hq), 7.0, np.float32))
    _native.call_op("paged_attention", [cuda(x) for x in (q, k_cache, v_cache, tables, cu, np.asarray(ctx, np.int32))],
                    [out, lse], {})
    got, got_lse = out.to("cpu").numpy().astype(np.float32), lse.to("cpu").numpy()
    assert (got[rows:] == 7.0).all() and (got_lse[rows:] == 7.0).all()
    assert_close(got[:rows], want.astype(np.float32), dtype)
    assert_close(got_lse[:rows], want_lse, rtol=LSE_TOL[dtype], atol=LSE_TOL[dtype])


@pytest.mark.parametrize("n_seq", [1, MANY_SEQS])
def test_decode_cuda_graph_replay(n_seq):
    # Captured once, replayed with new context lengths and queries written in place: the op reads
    # them on the device only (and its split scratch is held for the replays).
    rng = np.random.default_rng(n_seq)
    hq, hkv, d, dtype = 16, 8, 128, "bfloat16"
    ctx_b = many_ctx(n_seq) if n_seq > 1 else [385]
    ctx_a = [c - 1 if c > 1 else c for c in ctx_b]  # the step before: one token fewer
    k_cache, v_cache, tables = make_cache(rng, ctx_b, hkv, d, 16, dtype)
    q_a, q_b = rand(rng, (n_seq, hq, d), dtype), rand(rng, (n_seq, hq, d), dtype)
    cu = np.arange(n_seq + 1, dtype=np.int32)
    p = _native.Program("cuda")
    names = ["q", "k_cache", "v_cache", "block_tables", "cu_q", "context_lens", "out", "lse"]
    arrays = [q_a, k_cache, v_cache, tables, cu, np.asarray(ctx_a, np.int32),
              np.zeros((n_seq, hq, d), q_a.dtype), np.zeros((n_seq, hq), np.float32)]
    ids = [p.external(n, list(a.shape), str(a.dtype)) for n, a in zip(names, arrays, strict=True)]
    p.op("paged_attention", ids[:6], ids[6:], {})
    dev = [cuda(a) for a in arrays]
    for i, t in zip(ids, dev, strict=True):
        p.bind(i, t)
    p.set_graphs(True)
    for q, ctx in ((q_a, ctx_a), (q_a, ctx_a), (q_b, ctx_b)):  # eager, captured, replayed
        dev[0].copy_from(q)
        dev[5].copy_from(np.asarray(ctx, np.int32))
        p.run()
        want, want_lse = paged("cpu", q, k_cache, v_cache, tables, [1] * n_seq, ctx)
        assert_close(dev[6].to("cpu").numpy().astype(np.float32), want.astype(np.float32), dtype)
        assert_close(dev[7].to("cpu").numpy(), want_lse, rtol=LSE_TOL[dtype], atol=LSE_TOL[dtype])
    assert p.graphs_active and p.num_graphs == 1


# Rows of 16 bf16 heads of 128 over 8 kv heads (32 keys per CTA iteration), tables of
# ceil(ctx / 16) + 1 blocks. Live splits on an H200: [20] 1 of 2 (split 0 writes out alone), [40]
# 2 of 2, [1000] 32 of 32, [4097] 26 of 26, the batch 1, 2, 4 and 17 of 17. Other GPUs split
# differently; the comparison holds either way.
SPLIT_BATCHES = [[20], [40], [1000], [4097], [20, 300, 1000, 4097]]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("ctx", SPLIT_BATCHES)
@pytest.mark.parametrize("with_lse", [True, False])
def test_decode_split_merge(dtype, ctx, with_lse):
    check(dtype, ctx, [1] * len(ctx), 16, 8, 128, 16, with_lse, seed=sum(ctx))


def test_decode_split_launches_back_to_back():
    # Launches queued one after another on the same shapes (so the same arrival counters), each
    # with other context lengths (32, 4, 1, 32 live splits on an H200), then read: a counter not
    # back at 0 would merge too early or never (out left at 0).
    rng = np.random.default_rng(5)
    hq, hkv, d, dtype = 16, 8, 128, "bfloat16"
    k_cache, v_cache, tables = make_cache(rng, [1000], hkv, d, 16, dtype)
    cu = np.array([0, 1], np.int32)
    steps = [([1000], rand(rng, (1, hq, d), dtype)), ([100], rand(rng, (1, hq, d), dtype)),
             ([20], rand(rng, (1, hq, d), dtype)), ([999], rand(rng, (1, hq, d), dtype))]
    shared = [cuda(x) for x in (k_cache, v_cache, tables, cu)]
    ins = [(cuda(q), cuda(np.asarray(ctx, np.int32))) for ctx, q in steps]  # uploaded before any launch
    outs = [(_native.zeros([1, hq, d], dtype, "cuda"), _native.zeros([1, hq], "float32", "cuda")) for _ in steps]
    for (q, ctx), out in zip(ins, outs, strict=True):
        _native.call_op("paged_attention", [q, *shared, ctx], list(out), {})
    for (ctx, q), (out, lse) in zip(steps, outs, strict=True):
        want, want_lse = paged("cpu", q, k_cache, v_cache, tables, [1], ctx)
        assert_close(out.to("cpu").numpy().astype(np.float32), want.astype(np.float32), dtype)
        assert_close(lse.to("cpu").numpy(), want_lse, rtol=LSE_TOL[dtype], atol=LSE_TOL[dtype])


def test_decode_split_graph_replays():
    # Two ops per step (the second right behind the first, on the same counters), captured once
    # and replayed with context lengths that move each row between 1, 2 and many live splits
    # (H200: 20 -> 1, 40 -> 2, 1000 -> 32 of 32).
    rng = np.random.default_rng(9)
    hq, hkv, d, dtype = 16, 8, 128, "bfloat16"
    k_cache, v_cache, tables = make_cache(rng, [1000, 1000], hkv, d, 16, dtype)
    steps = [[1000, 20], [40, 1000], [20, 40], [1000, 1000], [40, 20]]  # eager, captured, replays
    cu = np.arange(3, dtype=np.int32)
    p = _native.Program("cuda")
    names = ["q1", "q2", "k_cache", "v_cache", "block_tables", "cu_q", "context_lens", "out1", "lse1", "out2", "lse2"]
    arrays = [rand(rng, (2, hq, d), dtype), rand(rng, (2, hq, d), dtype), k_cache, v_cache, tables, cu,
              np.asarray(steps[0], np.int32), np.zeros((2, hq, d), k_cache.dtype), np.zeros((2, hq), np.float32),
              np.zeros((2, hq, d), k_cache.dtype), np.zeros((2, hq), np.float32)]
    ids = [p.external(n, list(a.shape), str(a.dtype)) for n, a in zip(names, arrays, strict=True)]
    p.op("paged_attention", [ids[0], *ids[2:7]], ids[7:9], {})
    p.op("paged_attention", [ids[1], *ids[2:7]], ids[9:11], {})
    dev = [cuda(a) for a in arrays]
    for i, t in zip(ids, dev, strict=True):
        p.bind(i, t)
    p.set_graphs(True)
    for ctx in steps:
        q1, q2 = rand(rng, (2, hq, d), dtype), rand(rng, (2, hq, d), dtype)
        dev[0].copy_from(q1)
        dev[1].copy_from(q2)
        dev[6].copy_from(np.asarray(ctx, np.int32))
        p.run()
        for q, out, lse in ((q1, dev[7], dev[8]), (q2, dev[9], dev[10])):
            want, want_lse = paged("cpu", q, k_cache, v_cache, tables, [1, 1], ctx)
            assert_close(out.to("cpu").numpy().astype(np.float32), want.astype(np.float32), dtype)
            assert_close(lse.to("cpu").numpy(), want_lse, rtol=LSE_TOL[dtype], atol=LSE_TOL[dtype])
    assert p.graphs_active and p.num_graphs == 1


@pytest.mark.parametrize("n_seq", [1, MANY_SEQS])
def test_decode_row_with_no_key(n_seq):
    # context_lens below a sequence's rows (the CPU op rejects it): its row sees no key and gets
    # out = 0, lse = -inf, split (one sequence) or not; the other rows are unaffected.
    rng = np.random.default_rng(n_seq + 3)
    hq, hkv, d, dtype = 16, 8, 128, "bfloat16"
    ctx = many_ctx(n_seq) if n_seq > 1 else [385]
    k_cache, v_cache, tables = make_cache(rng, ctx, hkv, d, 16, dtype)
    q = rand(rng, (n_seq, hq, d), dtype)
    bad = list(ctx)
    bad[0] = 0
    cu = np.arange(n_seq + 1, dtype=np.int32)
    out = cuda(as_dtype(np.full((n_seq, hq, d), 7.0, np.float32), dtype))
    lse = cuda(np.full((n_seq, hq), 7.0, np.float32))
    _native.call_op("paged_attention", [cuda(x) for x in (q, k_cache, v_cache, tables, cu, np.asarray(bad, np.int32))],
                    [out, lse], {})
    got, got_lse = out.to("cpu").numpy().astype(np.float32), lse.to("cpu").numpy()
    assert (got[0] == 0.0).all() and (got_lse[0] == -np.inf).all()
    if n_seq > 1:
        want, want_lse = paged("cpu", q[1:], k_cache, v_cache, tables[1:], [1] * (n_seq - 1), ctx[1:])
        assert_close(got[1:], want.astype(np.float32), dtype)
        assert_close(got_lse[1:], want_lse, rtol=LSE_TOL[dtype], atol=LSE_TOL[dtype])


# ---- head dim 512 ----------------------------------------------------------------------------
# Gemma 4's global layers: heads of 512 (2 x 16-byte vectors a lane in bf16 / f16, 4 in f32; at
# most 4 query heads a decode CTA), 8 query heads over 1 kv head (gemma-4-e2b) or 4 over 2.
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("hq,hkv", [(8, 1), (4, 2)])
@pytest.mark.parametrize("window,softcap", [(0, 0.0), (48, 0.0), (0, 30.0), (48, 30.0)])
def test_head_dim_512(dtype, hq, hkv, window, softcap):
    attrs = dict(window=window, softcap=softcap)
    check(dtype, PREFILL_CTX, PREFILL_NQ, hq, hkv, 512, 16, seed=hq + window, **attrs)  # chunked prefill
    check(dtype, EDGE_CTX, [1] * len(EDGE_CTX), hq, hkv, 512, 16, seed=hq + window + 1, **attrs)  # decode, split
    check(dtype, many_ctx(), [1] * MANY_SEQS, hq, hkv, 512, 16, seed=hq + window + 2, **attrs)  # decode, no split
    check(dtype, [4097], [1], hq, hkv, 512, 16, seed=hq + window + 3, with_lse=False, **attrs)  # batch 1


@pytest.mark.parametrize("group", [1, 2, 3, 4, 5, 8, 12])
def test_decode_gqa_ratios_d512(group):
    # Groups of 1..12 over heads of 512: 1, 2 or 4 heads a CTA, several chunks past 4.
    check("bfloat16", EDGE_CTX, [1] * len(EDGE_CTX), 2 * group, 2, 512, 16, seed=group)
    check("float32", many_ctx(), [1] * MANY_SEQS, 2 * group, 2, 512, 16, seed=group + 1)


def test_head_dim_above_512_names_the_limit():
    rng = np.random.default_rng(0)
    k_cache, v_cache, tables = make_cache(rng, [5], 1, 520, 16, "float32")
    q = rand(rng, (1, 2, 520), "float32")
    with pytest.raises(UnsupportedError, match="paged_attention: head dim 520 has no CUDA kernel .at most 512"):
        paged("cuda", q, k_cache, v_cache, tables, [1], [5])
