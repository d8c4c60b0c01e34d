"""CUDA matmul (cuBLASLt, and cuda/gemv.cu for decode-sized x @ W^T) and the fused LM-head
cross-entropy, compared with the CPU backend.

Skipped on machines without a CUDA build and a GPU.

Shape letters: M, N, K for the GEMM; N tokens, C channels, V vocabulary for the cross-entropy.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

from sgtest.ops import TOLERANCE, as_dtype
from surogate import _native
from surogate.errors import InvalidArgumentError, ShapeError

COVERS = ("matmul", "lm_head_ce_fwd", "lm_head_ce_bwd")

pytestmark = pytest.mark.cuda

HAS_CUDA = bool(_native.build_info()["cuda"]) and len(_native.cuda_devices()) > 0
if not HAS_CUDA:
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)

IGNORE = -100


def run_on(device, name, inputs, outputs, **attrs):
    """Run op `name` on `device`. Each output is an array (its values are the op's starting point,
    for beta / accumulate), a (shape, dtype) pair (zeros) or None (an absent optional output).
    Returns host arrays (None for absent outputs); the caller's arrays are not written."""
    ins = [None if x is None else _native.tensor(x).to(device) for x in inputs]
    outs = []
    for o in outputs:
        if o is None:
            outs.append(None)
        elif isinstance(o, np.ndarray):
            outs.append(_native.tensor(o.copy()).to(device))
        else:
            shape, dtype = o
            outs.append(_native.zeros(list(shape), dtype, device))
    _native.call_op(name, ins, outs, attrs)
    return [None if o is None else o.to("cpu").numpy() for o in outs]


def run_cpu(name, inputs, outputs, **attrs):
    return run_on("cpu", name, inputs, outputs, **attrs)


def run_cuda(name, inputs, outputs, **attrs):
    return run_on("cuda", name, inputs, outputs, **attrs)


def rand(shape, dtype, seed=0, scale=1.0):
    return as_dtype(scale * np.random.default_rng(seed).standard_normal(shape).astype(np.float32), dtype)


def close(got, want, dtype):
    """Outputs are sums of terms of both signs: judge each element against the tensor's scale."""
    rtol, atol = TOLERANCE[dtype]
    want = np.asarray(want, np.float64)
    scale = max(1.0, float(np.abs(want).max())) if want.size else 1.0
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=rtol, atol=atol * scale)


# ---- matmul ---------------------------------------------------------------------------------


def matmul_case(M, N, K, ta, tb, dt_a, dt_b, dt_c, beta, bias_dt, seed=0, batch=None):
    A = rand((K, M) if ta else ((*batch, K) if batch else (M, K)), dt_a, seed)
    B = rand((N, K) if tb else (K, N), dt_b, seed + 1)
    c_shape = (*batch, N) if batch else (M, N)
    C0 = rand(c_shape, dt_c, seed + 2)
    ins = [A, B] + ([rand((N,), bias_dt, seed + 3)] if bias_dt else [])
    attrs = {"trans_a": ta, "trans_b": tb, "alpha": 0.75, "beta": beta}
    want = run_cpu("matmul", ins, [C0], **attrs)[0]
    got = run_cuda("matmul", ins, [C0], **attrs)[0]
    # the output's rounding decides the tolerance; f32 from 16-bit operands is exact-ish
    close(got.astype(np.float32), want.astype(np.float32), dt_c)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("ta,tb", [(0, 0), (0, 1), (1, 0), (1, 1)])
@pytest.mark.parametrize("beta,bias", [(0.0, False), (1.5, True)])
def test_matmul_odd_shapes(dtype, ta, tb, beta, bias):
    matmul_case(37, 129, 65, ta, tb, dtype, dtype, dtype, beta, dtype if bias else None, seed=ta * 2 + tb)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_matmul_batched_a_with_bias(dtype):
    matmul_case(3 * 7, 33, 65, 0, 1, dtype, dtype, dtype, 0.0, dtype, batch=(3, 7))
    matmul_case(3 * 7, 33, 65, 0, 0, dtype, dtype, dtype, 1.0, None, batch=(3, 7))


@pytest.mark.parametrize(
    "dt_a,dt_b,dt_c,bias_dt",
    [
        ("bfloat16", "bfloat16", "float32", None),  # gradient accumulation into an f32 master grad
        ("float16", "float16", "float32", "float16"),
        ("bfloat16", "bfloat16", "bfloat16", "float32"),  # bias cast to C's dtype for the epilogue
        ("float32", "bfloat16", "float32", None),  # mixed operands: widened in scratch
        ("float32", "float32", "bfloat16", "bfloat16"),  # f32 operands into a bf16 C
        ("bfloat16", "float16", "float16", None),
    ],
)
@pytest.mark.parametrize("ta,tb", [(0, 1), (1, 0)])
def test_matmul_dtype_mixes(dt_a, dt_b, dt_c, bias_dt, ta, tb):
    matmul_case(37, 129, 65, ta, tb, dt_a, dt_b, dt_c, 1.0, bias_dt, seed=5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_matmul_big(dtype):
    matmul_case(512, 1024, 768, 0, 1, dtype, dtype, dtype, 0.0, None, seed=9)
    matmul_case(512, 1024, 768, 1, 0, dtype, dtype, "float32", 1.0, None, seed=10)


def test_matmul_empty_inner_dim():
    # K = 0: C = beta * C + bias
    matmul_case(5, 7, 0, 0, 0, "float32", "float32", "float32", 0.5, "float32")
    matmul_case(5, 7, 0, 0, 1, "bfloat16", "bfloat16", "bfloat16", 0.0, "bfloat16")


def test_matmul_beta_zero_ignores_nan():
    A, B = rand((9, 17), "float32"), rand((17, 11), "float32", 1)
    C0 = np.full((9, 11), np.nan, np.float32)
    got = run_cuda("matmul", [A, B], [C0], beta=0.0)[0]
    close(got, A.astype(np.float64) @ B.astype(np.float64), "float32")


def test_matmul_repeat_uses_cached_plan():
    # the second call with the same shapes hits the plan cache with new pointers and values
    for seed in (0, 1):
        matmul_case(64, 48, 32, 0, 1, "bfloat16", "bfloat16", "bfloat16", 0.0, "bfloat16", seed=seed)


def test_matmul_errors():
    with pytest.raises(ShapeError, match="matmul: inner dims differ"):
        run_cuda("matmul", [rand((4, 5), "float32"), rand((6, 3), "float32")], [((4, 3), "float32")])


# ---- matmul: the decode path ----------------------------------------------------------------
# x[M, K] @ W[N, K]^T (trans_b) with M <= 16, x and W both bf16 or both f16, K a multiple of 8 and
# 16-byte aligned rows goes to gemv (cuda/gemv.cu); the cases past those bounds check that the
# fallback to cuBLASLt still answers. Neither path is visible from here: the CPU decides.


def gemv_case(M, N, K, dtype, bias_dt=None, out_dt=None, alpha=1.0, beta=0.0, seed=0, x_shape=None):
    out_dt = out_dt or dtype
    x = rand(x_shape or (M, K), dtype, seed)
    W = rand((N, K), dtype, seed + 1, scale=1 / np.sqrt(K))
    C0 = rand((*x.shape[:-1], N), out_dt, seed + 2)
    ins = [x, W] + ([rand((N,), bias_dt, seed + 3)] if bias_dt else [])
    attrs = {"trans_b": 1, "alpha": alpha, "beta": beta}
    want = run_cpu("matmul", ins, [C0], **attrs)[0]
    got = run_cuda("matmul", ins, [C0], **attrs)[0]
    close(got.astype(np.float32), want.astype(np.float32), out_dt)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("M", [1, 3, 8, 16])
@pytest.mark.parametrize("N,K", [(1000, 1024), (1000, 3072), (257, 1000), (13, 8), (40, 16)])
@pytest.mark.parametrize("bias", [False, True])
def test_gemv_shapes(dtype, M, N, K, bias):
    # K = 1000 and 8 / 16 end inside a 32-wide slab; N = 257 and 13 inside an 8-row tile
    gemv_case(M, N, K, dtype, dtype if bias else None, seed=M + N)


@pytest.mark.parametrize("M", [1, 16])
def test_gemv_vocab_sized(M):
    # an LM head's shape, N a prime, cut down to keep the CPU reference quick
    gemv_case(M, 15193, 1024, "bfloat16", seed=M)


def test_gemv_long_rows_take_several_steps():
    # K = 16384 is past resident x (K <= 4096): 16 warps of 4 chunks at M = 2, of 8 at M = 11
    for M in (2, 11):
        gemv_case(M, 24, 16384, "bfloat16", "bfloat16", seed=M)


@pytest.mark.parametrize("M", [1, 7, 16])
def test_gemv_persistent_grid(M):
    # N = 30001 is 3751 tiles, far more than the resident CTAs: each CTA loops over many tiles
    # (both shared-memory buffers reused), the last one ragged; K = 1000 ends inside a chunk
    gemv_case(M, 30001, 1000, "bfloat16", "bfloat16", "float32", alpha=0.5, beta=1.0, seed=M)


@pytest.mark.parametrize("M", [5, 13])
def test_gemv_streamed_x_over_several_tiles(M):
    # K = 4352 is 17 chunks at M <= 8 (9 warps of two, the last warp's second past K) and 34 at
    # M > 8 (12 warps of three, two past K); N = 4000 is 500 tiles, several per CTA
    gemv_case(M, 4000, 4352, "float16", "float32", "float32", alpha=0.75, beta=1.0, seed=M)


@pytest.mark.parametrize(
    "dtype,bias_dt,out_dt,alpha,beta",
    [
        ("bfloat16", "float32", "float32", 0.5, 1.0),  # LoRA's B: alpha scale, added into an f32 C
        ("bfloat16", None, "bfloat16", 0.75, 1.5),
        ("float16", "bfloat16", "float32", 1.0, 0.0),
        ("float16", "float32", "float16", -2.0, 0.5),
    ],
)
@pytest.mark.parametrize("M", [4, 12])
def test_gemv_alpha_beta_and_dtype_mixes(dtype, bias_dt, out_dt, alpha, beta, M):
    gemv_case(M, 300, 512, dtype, bias_dt, out_dt, alpha, beta, seed=M)


def test_gemv_batched_x():
    # a 3-D x [B, T, K] with B * T = 10 rows
    gemv_case(10, 96, 256, "bfloat16", "bfloat16", x_shape=(2, 5, 256))


@pytest.mark.parametrize(
    "M,K,dtype",
    [
        (17, 1024, "bfloat16"),  # past the row bound
        (64, 1024, "float16"),
        (4, 1020, "bfloat16"),  # K not a multiple of 8
        (1, 1001, "float16"),
        (4, 1024, "float32"),  # no f32 gemv: tensor cores would round to tf32
    ],
)
def test_gemv_fallback_to_cublaslt(M, K, dtype):
    gemv_case(M, 1000, K, dtype, dtype, seed=M)


def test_gemv_mixed_operands_fall_back():
    x = rand((3, 256), "float16")
    W = rand((100, 256), "bfloat16", 1)
    want = run_cpu("matmul", [x, W], [((3, 100), "float32")], trans_b=1)[0]
    got = run_cuda("matmul", [x, W], [((3, 100), "float32")], trans_b=1)[0]
    close(got, want, "bfloat16")


def test_gemv_beta_zero_ignores_nan():
    x, W = rand((2, 64), "bfloat16"), rand((33, 64), "bfloat16", 1)
    C0 = np.full((2, 33), np.nan, np.float32)
    got = run_cuda("matmul", [x, W], [C0], trans_b=1, beta=0.0)[0]
    close(got, x.astype(np.float64) @ W.astype(np.float64).T, "float32")


def strided_program(M, N, K, x_off, x_ld, y_off, y_ld, dtype):
    """A cuda Program multiplying a column slice of x_full [M, x_ld] by W into a column slice of
    y_full [M, y_ld] (beta = 1: the slice is added to), as LoRA addresses one projection's columns."""
    p = _native.Program("cuda")
    xf = p.external("x_full", [M, x_ld], dtype)
    w = p.external("W", [N, K], dtype)
    yf = p.external("y_full", [M, y_ld], "float32")
    xv = p.view("x", xf, [M, K], offset=x_off, strides=[x_ld, 1])
    yv = p.view("y", yf, [M, N], offset=y_off, strides=[y_ld, 1])
    p.op("matmul", [xv, w], [yv], {"trans_b": 1, "beta": 1.0})
    return p, xf, w, yf


@pytest.mark.parametrize("x_off", [8, 4])  # 16-byte aligned rows (gemv), 8-byte (cuBLASLt)
def test_gemv_strided_x_and_y(x_off):
    M, N, K, dtype = 5, 77, 256, "bfloat16"
    x_ld, y_off, y_ld = K + 24, 3, N + 10
    x_full = rand((M, x_ld), dtype)
    W = rand((N, K), dtype, 1, scale=1 / np.sqrt(K))
    y_full = rand((M, y_ld), "float32", 2)
    p, xf, w, yf = strided_program(M, N, K, x_off, x_ld, y_off, y_ld, dtype)
    p.bind(xf, _native.tensor(x_full).to("cuda"))
    p.bind(w, _native.tensor(W).to("cuda"))
    p.bind(yf, _native.tensor(y_full.copy()).to("cuda"))
    p.run()
    got = p.get(yf).to("cpu").numpy()
    want = y_full.astype(np.float64)
    x = x_full[:, x_off:x_off + K].astype(np.float64)
    want[:, y_off:y_off + N] += x @ W.astype(np.float64).T
    close(got, want, "float32")
    # columns outside the slice are untouched
    np.testing.assert_array_equal(got[:, :y_off], y_full[:, :y_off])
    np.testing.assert_array_equal(got[:, y_off + N:], y_full[:, y_off + N:])


def test_gemv_in_a_cuda_graph():
    # captured on the second run, replayed on the third: new x values each time reach the graph
    M, N, K, dtype = 4, 200, 512, "bfloat16"
    p = _native.Program("cuda")
    xb, wb, bb = p.external("x", [M, K], dtype), p.external("W", [N, K], dtype), p.external("b", [N], dtype)
    yb = p.external("y", [M, N], dtype)
    p.op("matmul", [xb, wb, bb], [yb], {"trans_b": 1})
    W, bias = rand((N, K), dtype, 1, scale=1 / np.sqrt(K)), rand((N,), dtype, 2)
    x_dev = _native.tensor(rand((M, K), dtype)).to("cuda")
    p.bind(xb, x_dev)
    p.bind(wb, _native.tensor(W).to("cuda"))
    p.bind(bb, _native.tensor(bias).to("cuda"))
    p.bind(yb, _native.zeros([M, N], dtype, "cuda"))
    p.set_graphs(True)
    for seed in (10, 11, 12):
        x = rand((M, K), dtype, seed)
        x_dev.copy_from(x)
        p.run()
        want = run_cpu("matmul", [x, W, bias], [((M, N), dtype)], trans_b=1)[0]
        close(p.get(yb).to("cpu").numpy().astype(np.float32), want.astype(np.float32), dtype)
    assert p.graphs_active and p.num_graphs == 1


def test_gemv_switch_off_by_environment():
    # SUROGATE_NO_GEMV=1 (read once per process) sends everything to cuBLASLt; the answer holds
    code = (
        "import numpy as np, ml_dtypes\n"
        "from surogate import _native\n"
        "rng = np.random.default_rng(0)\n"
        "x = rng.standard_normal((3, 256)).astype(ml_dtypes.bfloat16)\n"
        "W = (rng.standard_normal((50, 256)) / 16).astype(ml_dtypes.bfloat16)\n"
        "y = _native.zeros([3, 50], 'float32', 'cuda')\n"
        "_native.call_op('matmul', [_native.tensor(x).to('cuda'), _native.tensor(W).to('cuda')], [y], {'trans_b': 1})\n"
        "ref = x.astype(np.float64) @ W.astype(np.float64).T\n"
        "print(float(np.abs(y.to('cpu').numpy() - ref).max()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, SUROGATE_NO_GEMV="1"), check=True,
                         capture_output=True, text=True).stdout
    assert float(out.strip()) < 1e-4


# ---- lm_head_ce -----------------------------------------------------------------------------


def make_case(N, C, V, dtype, seed=0, ignore_every=4):
    rng = np.random.default_rng(seed)
    h = as_dtype(rng.standard_normal((N, C)), dtype)
    W = as_dtype(rng.standard_normal((V, C)) / np.sqrt(C), dtype)
    targets = rng.integers(0, V, N).astype(np.int32)
    if ignore_every:
        targets[1::ignore_every] = IGNORE
    dloss = rng.standard_normal(N).astype(np.float32)
    return h, W, targets, dloss


def ce_tol(dtype):
    # losses and grads come out in f32 on both sides; 16-bit inputs add GEMM rounding on the GPU
    # (dlogits go into the GEMMs in the inputs' dtype) that the CPU's f32 GEMMs do not have
    return "float32" if dtype == "float32" else dtype


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("N,C,V,chunk", [(37, 64, 1000, 256), (5, 48, 301, 4096), (130, 96, 777, 100)])
@pytest.mark.parametrize("eps,softcap", [(0.0, 0.0), (0.1, 0.0), (0.0, 30.0), (0.1, 30.0)])
def test_ce_fwd_bwd(dtype, N, C, V, chunk, eps, softcap):
    h, W, targets, dloss = make_case(N, C, V, dtype, seed=N + V)
    attrs = {"chunk": chunk, "label_smoothing": eps, "softcap": softcap}
    fwd_outs = [((N,), "float32"), ((N,), "float32")]
    loss, lse = run_cpu("lm_head_ce_fwd", [h, W, targets], fwd_outs, **attrs)
    g_loss, g_lse = run_cuda("lm_head_ce_fwd", [h, W, targets], fwd_outs, **attrs)
    tol = "float32" if dtype == "float32" else "float16"  # f32 logits from the same inputs on both sides
    close(g_lse, lse, tol)
    close(g_loss, loss, tol)
    ignored = targets == IGNORE
    assert np.all(g_loss[ignored] == 0) and np.all(g_lse[ignored] == 0)

    bwd_ins = [h, W, targets, lse, dloss]
    bwd_outs = [(h.shape, dtype), (W.shape, dtype)]
    dh, dW = run_cpu("lm_head_ce_bwd", bwd_ins, bwd_outs, **attrs)
    g_dh, g_dW = run_cuda("lm_head_ce_bwd", bwd_ins, bwd_outs, **attrs)
    close(g_dh.astype(np.float32), dh.astype(np.float32), ce_tol(dtype))
    close(g_dW.astype(np.float32), dW.astype(np.float32), ce_tol(dtype))
    assert not g_dh[ignored].astype(np.float32).any()


@pytest.mark.parametrize("dtype,dw_dtype", [("float32", "float32"), ("bfloat16", "float32"),
                                            ("bfloat16", "bfloat16")])
@pytest.mark.parametrize("chunk", [64, 4096])
def test_ce_bwd_accumulate_and_absent_dw(dtype, dw_dtype, chunk):
    N, C, V = 45, 40, 203
    h, W, targets, dloss = make_case(N, C, V, dtype, seed=3)
    lse = run_cpu("lm_head_ce_fwd", [h, W, targets], [((N,), "float32"), ((N,), "float32")], chunk=chunk)[1]
    ins = [h, W, targets, lse, dloss]
    # dW absent: only dh, which is overwritten whatever it held
    dh0 = as_dtype(np.full(h.shape, 7.0), dtype)
    want_dh = run_cpu("lm_head_ce_bwd", ins, [dh0, None], chunk=chunk)[0]
    got_dh = run_cuda("lm_head_ce_bwd", ins, [dh0, None], chunk=chunk)[0]
    close(got_dh.astype(np.float32), want_dh.astype(np.float32), ce_tol(dtype))
    # accumulate adds into dW, and still overwrites dh
    for accumulate in (False, True):
        dW0 = rand(W.shape, dw_dtype, seed=11)
        outs = [dh0.copy(), dW0]
        want = run_cpu("lm_head_ce_bwd", ins, outs, chunk=chunk, accumulate=accumulate)
        got = run_cuda("lm_head_ce_bwd", ins, outs, chunk=chunk, accumulate=accumulate)
        for g, w in zip(got, want):
            close(g.astype(np.float32), w.astype(np.float32), ce_tol(dtype) if dw_dtype == "float32" else dw_dtype)


@pytest.mark.parametrize("dw_dtype,accumulate", [("bfloat16", False), ("float32", True)])
def test_ce_several_row_blocks(dw_dtype, accumulate):
    # 2^25 logits per row block: at chunk 4096 that is 8192 rows, so N = 8200 takes two row
    # blocks (dW sums over them: in an f32 buffer for a bf16 dW, in place for an f32 one) and
    # V = 4100 two vocab chunks. C is small to keep the CPU reference quick.
    N, C, V = 8200, 16, 4100
    h, W, targets, dloss = make_case(N, C, V, "bfloat16", seed=21)
    fwd_outs = [((N,), "float32"), ((N,), "float32")]
    loss, lse = run_cpu("lm_head_ce_fwd", [h, W, targets], fwd_outs)
    g_loss, g_lse = run_cuda("lm_head_ce_fwd", [h, W, targets], fwd_outs)
    close(g_lse, lse, "float16")
    close(g_loss, loss, "float16")
    dW0 = rand(W.shape, dw_dtype, seed=5, scale=1e-3)
    ins = [h, W, targets, lse, dloss]
    want = run_cpu("lm_head_ce_bwd", ins, [(h.shape, "bfloat16"), dW0], accumulate=accumulate)
    got = run_cuda("lm_head_ce_bwd", ins, [(h.shape, "bfloat16"), dW0], accumulate=accumulate)
    for g, w in zip(got, want):
        close(g.astype(np.float32), w.astype(np.float32), "bfloat16")


def test_ce_mixed_dtypes_and_dh_dtype():
    # h f32 with a bf16 W (GEMMs widen), dh in bf16 over several chunks (f32 sum, rounded once)
    N, C, V = 33, 24, 150
    h, _, targets, dloss = make_case(N, C, V, "float32", seed=7)
    W = make_case(N, C, V, "bfloat16", seed=7)[1]
    fwd_outs = [((N,), "float32"), ((N,), "float32")]
    loss, lse = run_cpu("lm_head_ce_fwd", [h, W, targets], fwd_outs, chunk=64)
    g_loss, _ = run_cuda("lm_head_ce_fwd", [h, W, targets], fwd_outs, chunk=64)
    close(g_loss, loss, "float32")
    outs = [(h.shape, "bfloat16"), (W.shape, "float32")]
    want = run_cpu("lm_head_ce_bwd", [h, W, targets, lse, dloss], outs, chunk=64)
    got = run_cuda("lm_head_ce_bwd", [h, W, targets, lse, dloss], outs, chunk=64)
    close(got[0].astype(np.float32), want[0].astype(np.float32), "bfloat16")
    close(got[1], want[1], "float32")


def test_ce_all_rows_ignored():
    N, C, V = 6, 8, 20
    h, W, _, dloss = make_case(N, C, V, "float32", seed=4, ignore_every=0)
    targets = np.full(N, -1, np.int32)
    loss, lse = run_cuda("lm_head_ce_fwd", [h, W, targets], [((N,), "float32"), ((N,), "float32")], ignore_index=-1)
    dh, dW = run_cuda("lm_head_ce_bwd", [h, W, targets, lse, dloss], [np.ones_like(h), np.ones_like(W)],
                      ignore_index=-1)
    assert not loss.any() and not lse.any() and not dh.any() and not dW.any()


def test_ce_target_out_of_range_is_nan():
    # the CPU op raises; the GPU cannot read targets back without a sync, so the row turns NaN
    N, C, V = 5, 8, 20
    h, W, targets, _ = make_case(N, C, V, "float32", ignore_every=0)
    targets[3] = V
    loss, lse = run_cuda("lm_head_ce_fwd", [h, W, targets], [((N,), "float32"), ((N,), "float32")])
    assert np.isnan(loss[3]) and np.isnan(lse[3]) and np.isfinite(np.delete(loss, 3)).all()


def test_ce_errors():
    h, W, targets, _ = make_case(5, 8, 20, "float32", ignore_every=0)
    outs = [((5,), "float32"), ((5,), "float32")]
    with pytest.raises(InvalidArgumentError, match="chunk"):
        run_cuda("lm_head_ce_fwd", [h, W, targets], outs, chunk=0)
    with pytest.raises(ShapeError, match="lm_head_ce_fwd"):
        run_cuda("lm_head_ce_fwd", [h, W[:, :4].copy(), targets], outs)
