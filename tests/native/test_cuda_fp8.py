"""CUDA quantize_fp8 / matmul_fp8 (cuda/fp8.cu, cuBLASLt's FP8 GEMM) against the CPU backend's exact
emulation (cpu/fp8.cpp, itself checked bit for bit against torch in test_fp8.py): the codes and
scales bit for bit (both formats, transposed copies, delayed scaling's history, NaN / inf), the
GEMM within the error of Hopper's FP8 accumulation.

Skipped on machines without a CUDA build and a GPU (FP8 GEMMs need SM 8.9+; the lent H200 is 9.0).

Shape letters: R, C of x; M, N, K of c = a @ b^T.
"""

import ml_dtypes
import numpy as np
import pytest

from surogate import _native
from surogate.errors import UnsupportedError

COVERS = ("quantize_fp8", "matmul_fp8")

pytestmark = [pytest.mark.cuda, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

HAS_CUDA = bool(_native.build_info()["cuda"]) and len(_native.cuda_devices()) > 0
if not HAS_CUDA:
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)

E4M3, E5M2 = "float8_e4m3fn", "float8_e5m2"
NP = {E4M3: np.dtype(ml_dtypes.float8_e4m3fn), E5M2: np.dtype(ml_dtypes.float8_e5m2),
      "float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}


def run_on(device, name, inputs, outputs, **attrs):
    """outputs: arrays (starting values) or None; returns host arrays."""
    ins = [None if x is None else _native.tensor(np.ascontiguousarray(x)).to(device) for x in inputs]
    outs = [None if o is None else _native.tensor(o.copy()).to(device) for o in outputs]
    _native.call_op(name, ins, outs, attrs)
    return [None if o is None else o.to("cpu").numpy() for o in outs]


def spread(shape, seed=0, dtype="float32"):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32) * np.exp2(rng.integers(-20, 4, shape)).astype(np.float32)
    x.flat[::13] = 0.0
    return x.astype(NP[dtype])


def quantize(device, x, fmt, transpose=False, history=None, roll=True):
    R, C = x.shape
    q = np.zeros((C, R) if transpose else (R, C), NP[fmt])
    q, s, h = run_on(device, "quantize_fp8", [x], [q, np.zeros(1, np.float32), history], transpose=int(transpose),
                     roll=int(roll))
    return q, s, h


def same(a, b):
    na, nb = np.isnan(a.astype(np.float32)), np.isnan(b.astype(np.float32))
    np.testing.assert_array_equal(na, nb)
    np.testing.assert_array_equal(a.view(np.uint8)[~na], b.view(np.uint8)[~nb])


@pytest.mark.parametrize("fmt", [E4M3, E5M2])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("transpose", [False, True])
# (64, 96), (1, 1000), (1024, 2048): the 16-byte path (1024 x 2048: thousands of blocks, the last
# one computing the scale); (37, 70): element by element; (300, 33): f32's amax vectorized, its codes not.
@pytest.mark.parametrize("shape", [(64, 96), (37, 70), (1, 1000), (300, 33), (1024, 2048)])
def test_quantize_is_the_cpu_bit_for_bit(fmt, dtype, transpose, shape):
    x = spread(shape, dtype=dtype)
    qc, sc, _ = quantize("cpu", x, fmt, transpose)
    qg, sg, _ = quantize("cuda", x, fmt, transpose)
    same(qg, qc)
    assert sg.view(np.uint32)[0] == sc.view(np.uint32)[0]


def test_delayed_scaling_history_and_saturation_match_the_cpu():
    hc = np.zeros(5, np.float32)  # this run's amax, then the last 4 runs'
    hg = hc.copy()
    # (a run's first use rolls the history; the uses after it, a recompute or an MLP chunk, do not)
    for step, (mult, roll) in enumerate(((1.0, 1), (8.0, 1), (0.25, 0), (1.0, 1), (100.0, 0), (3.0, 1))):
        x = spread((48, 64), seed=step) * np.float32(mult)
        qc, sc, hc = quantize("cpu", x, E4M3, history=hc, roll=roll)
        qg, sg, hg = quantize("cuda", x, E4M3, history=hg, roll=roll)
        same(qg, qc)
        assert sg[0] == sc[0]
        np.testing.assert_array_equal(hg, hc)


@pytest.mark.parametrize("bad", [np.nan, np.inf, 0.0])
def test_nan_inf_and_zero_tensors_match_the_cpu(bad):
    x = spread((32, 32)) if bad != 0.0 else np.zeros((32, 32), np.float32)
    x[3, 5] = bad
    for fmt in (E4M3, E5M2):
        qc, sc, _ = quantize("cpu", x, fmt)
        qg, sg, _ = quantize("cuda", x, fmt)
        same(qg, qc)
        assert np.array_equal(sg, sc, equal_nan=True)


@pytest.mark.parametrize("pair", [(E4M3, E4M3), (E5M2, E4M3), (E4M3, E5M2)])
@pytest.mark.parametrize("out", ["float32", "bfloat16"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("mnk", [(32, 48, 64), (256, 384, 512)])
def test_matmul_fp8_matches_the_cpu(pair, out, bias, mnk):
    M, N, K = mnk
    a, sa, _ = quantize("cpu", spread((M, K), 1), pair[0])
    b, sb, _ = quantize("cpu", spread((N, K), 2), pair[1])
    bv = np.random.default_rng(3).standard_normal(N).astype(NP[out]) if bias else None
    c0 = np.random.default_rng(4).standard_normal((M, N)).astype(NP[out])
    for beta in (0.0, 1.0):
        ins = [a, sa, b, sb, bv]
        (cc,) = run_on("cpu", "matmul_fp8", ins, [c0], alpha=0.5, beta=beta)
        (cg,) = run_on("cuda", "matmul_fp8", ins, [c0], alpha=0.5, beta=beta)
        cc, cg = cc.astype(np.float64), cg.astype(np.float64)
        # f32: Hopper's FP8 tensor cores keep fewer bits than f32 in their partial sums (some 14:
        # 2.7e-4 of the largest output was seen at K = 512), cuBLASLt promoting them to f32 as it goes;
        # bf16: an ulp. A wrong scale, layout or operand is off by O(1).
        tol = 2e-3 if out == "float32" else 8e-3
        assert np.abs(cg - cc).max() <= tol * np.abs(cc).max(), (beta, np.abs(cg - cc).max())


def test_matmul_fp8_refuses_dims_off_16():
    a, sa, _ = quantize("cpu", spread((24, 32)), E4M3)
    b, sb, _ = quantize("cpu", spread((16, 32)), E4M3)
    with pytest.raises(UnsupportedError, match="multiples of 16"):
        run_on("cuda", "matmul_fp8", [a, sa, b, sb], [np.zeros((24, 16), np.float32)])
