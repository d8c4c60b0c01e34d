"""CUDA matmul (cuBLASLt) and the fused LM-head cross-entropy, compared with the CPU backend.

Skipped on machines without a CUDA build and a GPU.

Shape letters: M, N, K for the GEMM; N tokens, C channels, V vocabulary for the cross-entropy.
"""

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
