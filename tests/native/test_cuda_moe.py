"""CUDA mixture-of-experts ops (cuda/moe.cu, cuda/moe_gemm.cu) against the CPU backend
(tests/native/test_moe.py holds the CPU against torch): router and its backward, permutation and
un-permutation, the grouped GEMM over experts (tiles inside one expert, tiles straddling several,
experts with no rows; the small-rows path of decode, a few rows an expert) and its weight gradient,
the load-balancing loss.

Skipped on machines without a CUDA build and a GPU. Shape letters: N tokens, C channels,
E experts, K chosen per token, M = N * K permuted rows.
"""


import numpy as np
import pytest

from sgtest.ops import TOLERANCE, as_dtype
from surogate import _native

COVERS = ("moe_router_fwd", "moe_router_bwd", "moe_permute", "moe_unpermute_fwd", "moe_unpermute_bwd",
          "moe_grouped_matmul", "moe_grouped_matmul_wgrad", "moe_aux_loss_fwd", "moe_aux_loss_bwd",
          "moe_z_loss_fwd", "moe_z_loss_bwd")

pytestmark = pytest.mark.cuda

HAS_CUDA = bool(_native.build_info()["cuda"]) and len(_native.cuda_devices()) > 0
if not HAS_CUDA:
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)

FLOATS = ["float32", "bfloat16", "float16"]


def run_on(device, name, inputs, outputs, **attrs):
    """outputs: (shape, dtype) pairs (zeros) or host arrays (copied up); returns host arrays."""
    ins = [None if x is None else _native.tensor(x).to(device) for x in inputs]
    outs = [_native.tensor(o).to(device) if isinstance(o, np.ndarray) else _native.zeros(list(o[0]), o[1], device)
            for o in outputs]
    _native.call_op(name, ins, outs, attrs)
    return [o.to("cpu").numpy() for o in outs]


def both(name, inputs, outputs, **attrs):
    # Each side gets its own copy of host outputs: the CPU op accumulates into the array itself.
    def fresh():
        return [o.copy() if isinstance(o, np.ndarray) else o for o in outputs]

    return run_on("cpu", name, inputs, fresh(), **attrs), run_on("cuda", name, inputs, fresh(), **attrs)


def rand(shape, dtype, seed=0, scale=1.0):
    return as_dtype(scale * np.random.default_rng(seed).standard_normal(shape).astype(np.float32), dtype)


def close(got, want, dtype):
    rtol, atol = TOLERANCE[dtype]
    want = np.asarray(want, np.float64)
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=rtol, atol=atol * scale)


def routed(n, e, k, seed=0):
    """(idx, rows, offsets) of a random routing, made by the CPU ops."""
    logits = rand((n, e), "float32", seed)
    _, idx, _ = run_on("cpu", "moe_router_fwd", [logits], [((n, k), "float32"), ((n, k), "int32"), ((n, e), "float32")])
    x = rand((n, 8), "float32", seed)
    _, rows, off = run_on("cpu", "moe_permute", [x, idx], [((n * k, 8), "float32"), ((n, k), "int32"),
                                                           ((e + 1,), "int32")])
    return idx, rows, off


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("norm", [0, 1])
# One warp a token for e <= 256 and k <= 32, one thread otherwise: (3, 300, 8) and (5, 64, 40).
@pytest.mark.parametrize("n,e,k", [(1, 4, 1), (37, 8, 2), (300, 128, 8), (1, 128, 8), (64, 32, 4), (2, 256, 32),
                                   (3, 300, 8), (5, 64, 40)])
def test_router_matches_cpu(n, e, k, norm, dtype):
    logits = rand((n, e), dtype, seed=e)
    outs = [((n, k), dtype), ((n, k), "int32"), ((n, e), "float32")]
    (w0, i0, p0), (w1, i1, p1) = both("moe_router_fwd", [logits], outs, norm_topk_prob=norm)
    assert np.array_equal(i0, i1)
    close(p1, p0, "float32")
    close(w1.astype(np.float32), w0.astype(np.float32), dtype)
    dw, dp = rand((n, k), dtype, 1), rand((n, e), "float32", 2)
    (d0,), (d1,) = both("moe_router_bwd", [dw, p0, i0, dp], [((n, e), dtype)], norm_topk_prob=norm)
    close(d1.astype(np.float32), d0.astype(np.float32), dtype)


@pytest.mark.parametrize("dtype", FLOATS)
# (20, 300, 3): a prefix over uneven runs per lane; c = 2050: several 256-channel blocks a token.
@pytest.mark.parametrize("n,e,k,c", [(1, 4, 1, 8), (33, 8, 2, 72), (700, 128, 8, 256), (1, 128, 8, 2050),
                                     (20, 300, 3, 40)])
def test_permute_and_unpermute_match_cpu(n, e, k, c, dtype):
    idx, _, _ = routed(n, e, k, seed=n)
    x = rand((n, c), dtype, 3)
    (xp0, r0, o0), (xp1, r1, o1) = both("moe_permute", [x, idx], [((n * k, c), dtype), ((n, k), "int32"),
                                                                  ((e + 1,), "int32")])
    assert np.array_equal(r0, r1) and np.array_equal(o0, o1) and np.array_equal(xp0, xp1)
    yp, w, dy = rand((n * k, c), dtype, 4), rand((n, k), dtype, 5), rand((n, c), dtype, 6)
    (y0,), (y1,) = both("moe_unpermute_fwd", [yp, r0, w], [((n, c), dtype)])
    close(y1.astype(np.float32), y0.astype(np.float32), dtype)
    (s0,), (s1,) = both("moe_unpermute_fwd", [yp, r0, None], [((n, c), dtype)])
    close(s1.astype(np.float32), s0.astype(np.float32), dtype)
    (g0, dw0), (g1, dw1) = both("moe_unpermute_bwd", [dy, r0, yp, w], [((n * k, c), dtype), ((n, k), dtype)])
    close(g1.astype(np.float32), g0.astype(np.float32), dtype)
    close(dw1.astype(np.float32), dw0.astype(np.float32), dtype)


# The CUDA grouped GEMM has a tensor-core fast path (128x128 tiles, register accumulators, 16-byte
# loads) for bf16 / f16 with the weights in the same dtype and Kin, Nout multiples of 8, and the
# generic kernel otherwise (f32, mixed dtypes, (36, 72) and (64, 100) here). Counts: one expert;
# empty experts; a 128-row tile straddling many experts; M = 423 / 397, not a multiple of 128.
# Shapes: partial 32-wide K steps (40, 200), partial 128-wide N tiles (24, 96, 136), both K layouts
# (trans_b = 0 swaps Kin and Nout).
GEMM_COUNTS = [[5], [3, 0, 70, 1], [0, 0, 2, 0], [200, 1, 17, 0, 9, 64, 2, 130], [1] * 20 + [0] * 5 + [300] + [7] * 11]
GEMM_SHAPES = [(64, 96), (40, 24), (200, 136), (2048, 768), (36, 72), (64, 100)]


def grouped_offsets(counts):
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("counts", GEMM_COUNTS)
@pytest.mark.parametrize("kin,nout", GEMM_SHAPES)
def test_grouped_matmul_and_wgrad_match_cpu(counts, kin, nout, dtype):
    m, e = sum(counts), len(counts)
    off = grouped_offsets(counts)
    x = rand((m, kin), dtype, 0)
    w = rand((e, nout, kin), dtype, 1, scale=1 / np.sqrt(kin))
    (y0,), (y1,) = both("moe_grouped_matmul", [x, w, off], [((m, nout), dtype)])
    close(y1.astype(np.float32), y0.astype(np.float32), dtype)
    dy = rand((m, nout), dtype, 2)
    (dx0,), (dx1,) = both("moe_grouped_matmul", [dy, w, off], [((m, kin), dtype)], trans_b=0)
    close(dx1.astype(np.float32), dx0.astype(np.float32), dtype)
    base = rand((e, nout, kin), "float32", 3)
    (dw0,), (dw1,) = both("moe_grouped_matmul_wgrad", [dy, x, off], [base.copy()], accumulate=1)
    close(dw1, dw0, dtype)
    (dw0,), (dw1,) = both("moe_grouped_matmul_wgrad", [dy, x, off], [base.copy()])
    close(dw1, dw0, dtype)
    # dW in the activations' dtype (the fast path's 16-byte stores, and their accumulate)
    base = rand((e, nout, kin), dtype, 4)
    (dw0,), (dw1,) = both("moe_grouped_matmul_wgrad", [dy, x, off], [base.copy()], accumulate=1)
    close(dw1.astype(np.float32), dw0.astype(np.float32), dtype)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("trans_b", [1, 0])
def test_grouped_matmul_routed_many_experts(trans_b, dtype):
    """A real routing (128 experts, top-8, uneven counts, some experts empty) at a small width."""
    n, e, k, kin, nout = 75, 128, 8, 256, 384
    _, _, off = routed(n, e, k, seed=7)
    m = n * k
    x = rand((m, kin), dtype, 0)
    w = rand((e, nout, kin) if trans_b else (e, kin, nout), dtype, 1, scale=1 / np.sqrt(kin))
    (y0,), (y1,) = both("moe_grouped_matmul", [x, w, off], [((m, nout), dtype)], trans_b=trans_b)
    close(y1.astype(np.float32), y0.astype(np.float32), dtype)
    dy = rand((m, nout), dtype, 2)
    (dw0,), (dw1,) = both("moe_grouped_matmul_wgrad", [dy, x, off], [((e, nout, kin), "float32")])
    close(dw1, dw0, dtype)


# The small-rows path (decode): bf16 / f16, Kin and Nout multiples of 8, and M <= 8 E (at most 8 rows
# an expert on average), grid (Nout chunks, E). Its passes hold 1, 2, 4 or 8 rows (4 at most with
# trans_b = 0) and repeat for more, so the counts below hit every pass size, partial passes (3, 5..7
# rows) and an expert of 300 rows beside ones of 1 and 0. Shapes: Nout not a multiple of the 32
# (trans_b) / 64 column chunk, Kin below one warp's 256 values and past two steps of it; (36, 72)
# and (64, 100) are misaligned and take the generic kernel at the same counts.
ROWS_COUNTS = [[1] * 8, [1, 0, 2, 0, 3, 4, 0, 5, 6, 7, 8, 9, 0, 16, 17],
               [1] * 20 + [0] * 10 + [300] + [1] * 33, [0] * 6 + [2]]
ROWS_SHAPES = [(64, 96), (40, 24), (256, 40), (1032, 72), (2048, 136), (36, 72), (64, 100)]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("trans_b", [1, 0])
@pytest.mark.parametrize("counts", ROWS_COUNTS)
@pytest.mark.parametrize("kin,nout", ROWS_SHAPES)
def test_grouped_matmul_few_rows_per_expert(counts, kin, nout, trans_b, dtype):
    m, e = sum(counts), len(counts)
    assert m <= 8 * e  # the small-rows path's bound
    off = grouped_offsets(counts)
    x = rand((m, kin), dtype, 0)
    w = rand((e, nout, kin) if trans_b else (e, kin, nout), dtype, 1, scale=1 / np.sqrt(kin))
    (y0,), (y1,) = both("moe_grouped_matmul", [x, w, off], [((m, nout), dtype)], trans_b=trans_b)
    close(y1.astype(np.float32), y0.astype(np.float32), dtype)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("trans_b", [1, 0])
@pytest.mark.parametrize("n,e,k", [(1, 128, 8), (64, 128, 8), (1, 32, 4), (40, 32, 4)])
def test_grouped_matmul_decode_routing(n, e, k, trans_b, dtype):
    """Decode steps' routings (n tokens, top-k of e experts; most experts empty at n = 1) at a small
    width, against numpy in f64 on the rounded operands."""
    _, _, off = routed(n, e, k, seed=n + e)
    m, kin, nout = n * k, 512, 200
    x = rand((m, kin), dtype, 0)
    w = rand((e, nout, kin) if trans_b else (e, kin, nout), dtype, 1, scale=1 / np.sqrt(kin))
    (y,) = run_on("cuda", "moe_grouped_matmul", [x, w, off], [((m, nout), dtype)], trans_b=trans_b)
    xf, wf = x.astype(np.float64), w.astype(np.float64)
    want = np.zeros((m, nout))
    for j in range(e):
        lo, hi = off[j], off[j + 1]
        want[lo:hi] = xf[lo:hi] @ (wf[j].T if trans_b else wf[j])
    close(y.astype(np.float32), want, dtype)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("n", [1, 16])
@pytest.mark.parametrize("kin,nout", [(2048, 1536), (768, 2048)])
def test_grouped_matmul_qwen3_moe_decode_shapes(kin, nout, n, dtype):
    """Qwen3-30B-A3B's expert projections at decode (gate_up 2048 -> 1536, down 768 -> 2048, top-8),
    over 16 experts rather than 128 to keep the host weights small: n = 1 gives 8 experts of one
    row, n = 16 about 8 rows each."""
    e, k = 16, 8
    _, _, off = routed(n, e, k, seed=n)
    m = n * k
    x = rand((m, kin), dtype, 0)
    w = rand((e, nout, kin), dtype, 1, scale=1 / np.sqrt(kin))
    (y0,), (y1,) = both("moe_grouped_matmul", [x, w, off], [((m, nout), dtype)])
    close(y1.astype(np.float32), y0.astype(np.float32), dtype)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("trans_b", [1, 0])
def test_grouped_matmul_few_rows_bad_offsets_stay_in_bounds(trans_b, dtype):
    """The small-rows path (m = 20 <= 8 e) with offsets the device cannot validate."""
    m, e, kin, nout = 20, 4, 64, 40
    x = rand((m, kin), dtype, 0)
    w = rand((e, nout, kin) if trans_b else (e, kin, nout), dtype, 1, scale=1 / np.sqrt(kin))
    for bad in ([-7, 4, 2, 10**6, 3], [0, 30, 10, 16, 20], [5, 5, -1, 19, 2**31 - 1]):
        (y,) = run_on("cuda", "moe_grouped_matmul", [x, w, np.array(bad, np.int32)], [((m, nout), dtype)],
                      trans_b=trans_b)
        assert np.isfinite(y.astype(np.float32)).all()
    off = grouped_offsets([3, 0, 9, 8])
    (y0,), (y1,) = both("moe_grouped_matmul", [x, w, off], [((m, nout), dtype)], trans_b=trans_b)
    close(y1.astype(np.float32), y0.astype(np.float32), dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_grouped_matmul_mixed_weight_dtype_matches_cpu(dtype):
    """x in one float type, W in another: the generic kernel (the fast path needs W in x's dtype)."""
    counts = [3, 0, 140, 9]
    m, e, kin, nout = sum(counts), len(counts), 64, 48
    off = grouped_offsets(counts)
    wdt = "float16" if dtype == "bfloat16" else "bfloat16"
    x = rand((m, kin), dtype, 0)
    w = rand((e, nout, kin), wdt, 1, scale=1 / np.sqrt(kin))
    (y0,), (y1,) = both("moe_grouped_matmul", [x, w, off], [((m, nout), dtype)])
    close(y1.astype(np.float32), y0.astype(np.float32), wdt if dtype == "float32" else dtype)


@pytest.mark.parametrize("layers,n,e,k", [(1, 11, 4, 1), (3, 257, 128, 8)])
def test_aux_loss_matches_cpu(layers, n, e, k):
    ins = []
    for layer in range(layers):
        logits = rand((n, e), "float32", layer)
        _, idx, p = run_on("cpu", "moe_router_fwd", [logits],
                           [((n, k), "float32"), ((n, k), "int32"), ((n, e), "float32")])
        ins += [p, idx]
    (l0, c0), (l1, c1) = both("moe_aux_loss_fwd", ins, [((1,), "float32"), ((e,), "float32")])
    assert np.array_equal(c0, c1)
    np.testing.assert_allclose(l1, l0, rtol=1e-6)
    (d0,), (d1,) = both("moe_aux_loss_bwd", [np.array([0.5], np.float32), c0], [((n, e), "float32")],
                        num_layers=layers)
    np.testing.assert_allclose(d1, d0, rtol=1e-6)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("layers,n,e", [(1, 11, 4), (3, 257, 128)])
def test_z_loss_matches_cpu(layers, n, e, dtype):
    logits = [rand((n, e), dtype, layer, scale=3.0) for layer in range(layers)]
    (l0,), (l1,) = both("moe_z_loss_fwd", logits, [((1,), "float32")])
    np.testing.assert_allclose(l1, l0, rtol=1e-5)
    for lg in logits:
        (d0,), (d1,) = both("moe_z_loss_bwd", [np.array([0.5], np.float32), lg], [((n, e), dtype)],
                            num_layers=layers)
        close(d1, d0, dtype)


@pytest.mark.parametrize("dtype,kin", [("bfloat16", 64), ("float16", 64), ("bfloat16", 36), ("float32", 64)])
def test_grouped_matmul_bad_offsets_stay_in_bounds(dtype, kin):
    """Offsets the device cannot validate (negative, past M, decreasing) give wrong numbers, never an
    out-of-bounds access: the calls succeed and a correct call afterwards still matches the CPU."""
    m, e, nout = 150, 4, 40
    x = rand((m, kin), dtype, 0)
    w = rand((e, nout, kin), dtype, 1, scale=1 / np.sqrt(kin))
    dy = rand((m, nout), dtype, 2)
    for bad in ([-7, 40, 20, 10**6, 3], [0, 200, 100, 160, 150], [5, 5, -1, 149, 2**31 - 1]):
        off = np.array(bad, np.int32)
        (y,) = run_on("cuda", "moe_grouped_matmul", [x, w, off], [((m, nout), dtype)])
        assert np.isfinite(y.astype(np.float32)).all()
        (dw,) = run_on("cuda", "moe_grouped_matmul_wgrad", [dy, x, off], [((e, nout, kin), "float32")])
        assert np.isfinite(dw).all()
    off = grouped_offsets([30, 0, 100, 20])
    (y0,), (y1,) = both("moe_grouped_matmul", [x, w, off], [((m, nout), dtype)])
    close(y1.astype(np.float32), y0.astype(np.float32), dtype)
