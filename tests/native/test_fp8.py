"""The fp8_hybrid ops on the CPU (cpu/fp8.cpp) against torch: quantize_fp8 bit for bit against
torch's float8 casts of x * scale (current and delayed scaling, both formats, transposed copies,
saturation, subnormals, zeros, NaN / inf), matmul_fp8 against a float64 product of the same codes.

torch's CPU cast saturates finite overflow to +-448 for float8_e4m3fn but not for float8_e5m2 (it
rounds to inf there), so the reference clamps to the format's max first: the quantizer's
"satfinite" conversion (kernels_native/runtime/op_checks_fp8.h).

Shape letters: R rows, C columns of x; M, N, K of the GEMM c = a @ b^T.
"""

import ml_dtypes
import numpy as np
import pytest
import torch

from surogate import _native
from surogate.errors import DTypeError, ShapeError

FMT = {"float8_e4m3fn": (np.dtype(ml_dtypes.float8_e4m3fn), torch.float8_e4m3fn, 448.0),
       "float8_e5m2": (np.dtype(ml_dtypes.float8_e5m2), torch.float8_e5m2, 57344.0)}
ACT = {"float32": (np.float32, torch.float32), "bfloat16": (ml_dtypes.bfloat16, torch.bfloat16),
       "float16": (np.float16, torch.float16)}

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def quantize(x: np.ndarray, fmt: str, transpose=False, history=None, roll=True):
    R, C = x.shape
    q = np.zeros((C, R) if transpose else (R, C), FMT[fmt][0])
    s = np.zeros(1, np.float32)
    outs = [q, s, history]
    _native.call_op("quantize_fp8", [x], outs, {"transpose": int(transpose), "roll": int(roll)})
    return q, s[0]


def torch_scale(amax: torch.Tensor, fp8_max: float) -> torch.Tensor:
    """op_checks_fp8.h's rule in torch f32: fp8_max / amax, capped at FLT_MAX, 1 for amax 0."""
    s = torch.tensor(fp8_max, dtype=torch.float32) / amax
    s = torch.where(torch.isinf(s), torch.tensor(torch.finfo(torch.float32).max), s)
    return torch.where(amax == 0, torch.ones_like(s), s)


def torch_quantize(x: np.ndarray, fmt: str, amax=None):
    """(codes as uint8, scale_inv) by torch: x * scale clamped to +-max (NaN kept), cast."""
    _, tdt, fp8_max = FMT[fmt]
    xt = torch.from_numpy(np.asarray(x, np.float32))
    if amax is None:
        amax = xt.abs().max()  # NaN propagates, as the op's amax
    s = torch_scale(torch.as_tensor(amax, dtype=torch.float32), fp8_max)
    q = (xt * s).clamp(-fp8_max, fp8_max).to(tdt)
    return q.view(torch.uint8).numpy(), (1.0 / s).item()


def same_codes(q: np.ndarray, ref: np.ndarray, fmt: str) -> None:
    got = q.view(np.uint8)
    nan_got = np.isnan(q.astype(np.float32))
    nan_ref = np.isnan(ref.view(FMT[fmt][0]).astype(np.float32))
    np.testing.assert_array_equal(nan_got, nan_ref)
    np.testing.assert_array_equal(got[~nan_got], ref[~nan_ref])


def spread(shape, seed=0):
    """Values over many binades (down into each format's subnormals relative to the amax), zeros,
    exact ties of the fp8 grid after scaling and both signs."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32) * np.exp2(rng.integers(-24, 4, shape)).astype(np.float32)
    x.flat[::17] = 0.0
    return x


@pytest.mark.parametrize("fmt", list(FMT))
@pytest.mark.parametrize("act", list(ACT))
@pytest.mark.parametrize("transpose", [False, True])
def test_quantize_matches_torch_bit_for_bit(fmt, act, transpose):
    x = spread((37, 70)).astype(ACT[act][0])
    q, s = quantize(x, fmt, transpose)
    ref, ref_s = torch_quantize(x, fmt)
    same_codes(q, ref.T if transpose else ref, fmt)
    assert s == np.float32(ref_s)
    assert (q.view(np.uint8) & 0x7F != 0).any() and (np.abs(q.astype(np.float32)) < 2.0 ** -6).any()  # subnormals


def test_quantize_reaches_the_format_max_and_reads_row_strided_x():
    wide = spread((8, 48), seed=3)
    x = wide[:, 8:40]  # a column slice: row stride 48
    for fmt, (_, _, fp8_max) in FMT.items():
        q, s = quantize(x, fmt)
        same_codes(q, torch_quantize(np.ascontiguousarray(x), fmt)[0], fmt)
        assert np.abs(q.astype(np.float32)).max() == fp8_max  # the amax element lands on the max


def test_all_zeros_scale_one_and_tiny_amax_capped():
    q, s = quantize(np.zeros((4, 16), np.float32), "float8_e4m3fn")
    assert s == 1.0 and not q.view(np.uint8).any()
    tiny = np.full((2, 16), 1e-45, np.float32)  # 448 / amax overflows f32: the scale is FLT_MAX
    q, s = quantize(tiny, "float8_e4m3fn")
    assert s == np.float32(1.0) / np.finfo(np.float32).max
    same_codes(q, torch_quantize(tiny, "float8_e4m3fn")[0], "float8_e4m3fn")


def test_nan_or_inf_poisons_the_tensor_instead_of_saturating():
    x = spread((4, 16))
    x[1, 3] = np.nan
    q, s = quantize(x, "float8_e4m3fn")
    assert np.isnan(s) and np.isnan(q.astype(np.float32)).all()
    x[1, 3] = np.inf  # amax inf: scale 0, the inf itself NaN, scale_inv inf (the GEMM's output is not finite)
    q, s = quantize(x, "float8_e5m2")
    assert np.isinf(s) and np.isnan(q.astype(np.float32)[1, 3])
    same_codes(q, torch_quantize(x, "float8_e5m2")[0], "float8_e5m2")


def test_delayed_scaling_takes_the_history_max_and_saturates():
    H = 4
    hist = np.zeros(H + 1, np.float32)  # [0]: this run's amax, [1..H]: the last H runs', newest first
    x1 = spread((8, 32), seed=1)
    q, s = quantize(x1, "float8_e4m3fn", history=hist)  # empty history: this tensor's amax
    a1 = np.abs(x1).max()
    same_codes(q, torch_quantize(x1, "float8_e4m3fn")[0], "float8_e4m3fn")
    np.testing.assert_array_equal(hist, [a1, 0, 0, 0, 0])
    x2 = x1 * 8  # the next run, larger than the history knows: saturates at +-448
    q, s = quantize(x2, "float8_e4m3fn", history=hist)
    ref, ref_s = torch_quantize(x2, "float8_e4m3fn", amax=a1)
    same_codes(q, ref, "float8_e4m3fn")
    assert s == np.float32(ref_s) and (np.abs(q.astype(np.float32)) == 448).sum() > 1
    np.testing.assert_array_equal(hist, [np.abs(x2).max(), a1, 0, 0, 0])
    hist[:] = [0.25, np.nan, 2.0, 1.0, 0.5]  # NaN entries are skipped; the oldest falls out
    q, s = quantize(x1, "float8_e5m2", history=hist)
    same_codes(q, torch_quantize(x1, "float8_e5m2", amax=2.0)[0], "float8_e5m2")
    np.testing.assert_array_equal(hist, [a1, 0.25, np.nan, 2.0, 1.0])


def test_later_uses_in_a_run_take_the_first_uses_scale():
    """Without roll (a recomputed block, an MLP chunk): the scale of the runs before, whatever this
    tensor's amax; this run's slot keeps the largest amax of its uses."""
    hist = np.array([0.0, 3.0, 1.0, 0.5], np.float32)
    x = spread((16, 16), seed=2)
    x *= np.float32(10.0 / np.abs(x).max())  # amax about 10, above the history's 3
    ax = np.abs(x).max()
    small = x * np.float32(0.01)  # amax about 0.1
    first, s1 = quantize(x, "float8_e4m3fn", history=hist)
    np.testing.assert_array_equal(hist, [ax, 0.0, 3.0, 1.0])
    same_codes(first, torch_quantize(x, "float8_e4m3fn", amax=3.0)[0], "float8_e4m3fn")
    again, s2 = quantize(x, "float8_e4m3fn", history=hist, roll=False)  # the recompute
    assert s2 == s1 and np.array_equal(again.view(np.uint8), first.view(np.uint8))
    np.testing.assert_array_equal(hist, [ax, 0.0, 3.0, 1.0])  # nothing moved
    chunk, s3 = quantize(small, "float8_e4m3fn", history=hist, roll=False)  # another chunk: the same scale
    assert s3 == s1
    same_codes(chunk, torch_quantize(small, "float8_e4m3fn", amax=3.0)[0], "float8_e4m3fn")
    np.testing.assert_array_equal(hist, [ax, 0.0, 3.0, 1.0])
    bad = x.copy()
    bad[0, 0] = np.nan
    quantize(bad, "float8_e4m3fn", history=hist, roll=False)
    assert np.isnan(hist[0]) and hist[2] == 3.0  # a NaN use marks the run; later runs skip it
    _, s4 = quantize(x, "float8_e4m3fn", history=hist)  # the next run: [ax, NaN, 0, 3]
    assert np.isnan(hist[1]) and hist[3] == 3.0 and s4 == s1


def test_a_history_of_one_value_is_refused():
    with pytest.raises(ShapeError, match=r"\[H \+ 1\]"):
        quantize(spread((4, 16)), "float8_e4m3fn", history=np.zeros(1, np.float32))


def gemm_ref(a, sa, b, sb, alpha=1.0, beta=0.0, c=None, bias=None):
    out = alpha * sa * sb * (a.astype(np.float64) @ b.astype(np.float64).T)
    if c is not None and beta:
        out += beta * c.astype(np.float64)
    if bias is not None:
        out += bias.astype(np.float64)
    return out


@pytest.mark.parametrize("pair", [("float8_e4m3fn", "float8_e4m3fn"), ("float8_e5m2", "float8_e4m3fn"),
                                  ("float8_e4m3fn", "float8_e5m2")])
@pytest.mark.parametrize("out", ["float32", "bfloat16"])
def test_matmul_fp8_is_the_scaled_product_of_the_codes(pair, out):
    M, N, K = 24, 40, 48
    a, sa = quantize(spread((M, K), 5), pair[0])
    b, sb = quantize(spread((N, K), 6), pair[1])
    bias = np.random.default_rng(7).standard_normal(N).astype(ACT[out][0])
    c0 = np.random.default_rng(8).standard_normal((M, N)).astype(ACT[out][0])
    c = c0.copy()
    _native.call_op("matmul_fp8", [a, np.array([sa]), b, np.array([sb]), bias], [c], {"alpha": 0.5, "beta": 1.0})
    ref = gemm_ref(a, sa, b, sb, 0.5, 1.0, c0, bias)
    tol = 1e-5 if out == "float32" else 1e-2
    np.testing.assert_allclose(c.astype(np.float64), ref, rtol=tol, atol=tol * np.abs(ref).max())


def test_matmul_fp8_refuses_e5m2_pairs_and_bad_shapes():
    a, sa = quantize(spread((16, 32)), "float8_e5m2")
    one = np.array([sa])
    with pytest.raises(DTypeError, match="both float8_e5m2"):
        _native.call_op("matmul_fp8", [a, one, a, one], [np.zeros((16, 16), np.float32)])
    b, sb = quantize(spread((16, 16)), "float8_e4m3fn")
    with pytest.raises(ShapeError, match="inner dim K"):
        _native.call_op("matmul_fp8", [a, one, b, one], [np.zeros((16, 16), np.float32)])
    with pytest.raises(DTypeError, match="float8_e4m3fn or float8_e5m2"):
        _native.call_op("quantize_fp8", [spread((4, 4))], [np.zeros((4, 4), np.float32), np.zeros(1, np.float32), None])
