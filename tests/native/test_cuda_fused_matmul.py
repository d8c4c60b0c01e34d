"""CUDA gated_matmul and add_rmsnorm_matmul (cuda/fused_matmul.cu: gemv with a prologue for a
decode step's rows, the composition otherwise) against the CPU backend, which runs the
composition (tests/native/test_fused_matmul.py).

Skipped on machines without a CUDA build and a GPU. M = 1, 5 and 16 take the fused gemv (rows
0..7 only, and 8..15 too); M = 40, f32, K > 4096 and SUROGATE_NO_GEMV the composition.

Shape letters: M rows, N output features, K inner dim (F for gated_matmul).
"""

import os
import subprocess
import sys

import numpy as np
import pytest

from sgtest.ops import TOLERANCE, as_dtype
from surogate import _native

COVERS = ("gated_matmul", "add_rmsnorm_matmul")

pytestmark = pytest.mark.cuda

HAS_CUDA = bool(_native.build_info()["cuda"]) and len(_native.cuda_devices()) > 0
if not HAS_CUDA:
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)

ACTS = ["silu", "gelu_tanh"]
SHAPES = [(1024, 1000), (1024, 6144), (3072, 1000), (3072, 6144)]  # (K, N)


def run_on(device, name, inputs, outputs, **attrs):
    """outputs: (shape, dtype) pairs (zeros) or None (absent); returns host arrays (None where absent)."""
    ins = [None if x is None else _native.tensor(x).to(device) for x in inputs]
    outs = [None if o is None else _native.zeros(list(o[0]), o[1], device) for o in outputs]
    _native.call_op(name, ins, outs, attrs)
    return [None if o is None else o.to("cpu").numpy() for o in outs]


def rand(shape, dtype, seed=0, scale=1.0):
    return as_dtype(scale * np.random.default_rng(seed).standard_normal(shape).astype(np.float32), dtype)


def close(got, want, dtype):
    """Sums of terms of both signs: each element judged against the tensor's scale."""
    rtol, atol = TOLERANCE[dtype]
    want = np.asarray(want, np.float64)
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=rtol, atol=atol * scale)


def gated(M, N, F, dtype, act, bias, seed=0):
    gu = rand((M, 2 * F), dtype, seed, scale=2.0)
    W = rand((N, F), dtype, seed + 1, scale=1 / np.sqrt(F))
    ins = [gu, W] + ([rand((N,), dtype, seed + 2)] if bias else [])
    want = run_on("cpu", "gated_matmul", ins, [((M, N), dtype)], act=act)[0]
    got = run_on("cuda", "gated_matmul", ins, [((M, N), dtype)], act=act)[0]
    close(got.astype(np.float32), want.astype(np.float32), dtype)


def normed(M, N, K, dtype, bias, residual=True, want_h=True, offset=0.0, seed=0):
    x, res = rand((M, K), dtype, seed), rand((M, K), dtype, seed + 1)
    w = as_dtype(1.0 + 0.3 * np.random.default_rng(seed + 2).standard_normal(K), dtype)
    W = rand((N, K), dtype, seed + 3, scale=1 / np.sqrt(K))
    ins = [x, res if residual else None, w, W] + ([rand((N,), dtype, seed + 4)] if bias else [])
    outs = [((M, N), dtype), ((M, K), dtype) if want_h else None]
    attrs = {"eps": 1e-6, "weight_offset": offset}
    y_cpu, h_cpu = run_on("cpu", "add_rmsnorm_matmul", ins, outs, **attrs)
    y, h = run_on("cuda", "add_rmsnorm_matmul", ins, outs, **attrs)
    close(y.astype(np.float32), y_cpu.astype(np.float32), dtype)
    if want_h:
        np.testing.assert_array_equal(h.view(np.uint8), h_cpu.view(np.uint8))  # one rounding of x + residual


@pytest.mark.parametrize("M", [1, 5, 16, 40])
@pytest.mark.parametrize("K,N", SHAPES)
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("bias", [False, True])
def test_gated_matmul(M, K, N, act, bias):
    gated(M, N, K, "bfloat16", act, bias, seed=M + N)


@pytest.mark.parametrize("M", [1, 5, 16, 40])
@pytest.mark.parametrize("K,N", SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_add_rmsnorm_matmul(M, K, N, bias):
    normed(M, N, K, "bfloat16", bias, seed=M + K)


@pytest.mark.parametrize("M", [3, 12])
@pytest.mark.parametrize("act", ACTS)
def test_gated_matmul_f16_and_ragged_k(M, act):
    # F = 1000 ends inside the last warp's chunk (lanes past K stage zeros); N = 257 inside a tile
    gated(M, 257, 1000, "float16", act, True, seed=M)


@pytest.mark.parametrize("M", [2, 16])
def test_add_rmsnorm_matmul_f16_ragged_k_and_offset(M):
    normed(M, 257, 1000, "float16", True, offset=1.0, seed=M)


@pytest.mark.parametrize("M", [1, 7, 13])
def test_rmsnorm_matmul_without_residual(M):
    # a model's first layer: the embedding rows normed, no h
    normed(M, 1000, 1024, "bfloat16", False, residual=False, want_h=False, seed=M)


def test_add_rmsnorm_matmul_without_h():
    normed(4, 6144, 1024, "bfloat16", True, want_h=False, seed=3)


@pytest.mark.parametrize("M", [1, 16])
def test_widest_resident_k_stages_past_48_kib(M):
    # K = 4096: 16 warps; at M = 16 their stages take 128 KiB of shared memory
    gated(M, 300, 4096, "bfloat16", "silu", False, seed=M)
    normed(M, 300, 4096, "bfloat16", False, seed=M)


@pytest.mark.parametrize("M", [4, 11])
def test_longer_rows_and_f32_take_the_composition(M):
    gated(M, 200, 4352, "bfloat16", "silu", True, seed=M)  # K > 4096: streamed x, no prologue
    normed(M, 200, 4352, "bfloat16", True, seed=M)
    gated(M, 200, 256, "float32", "gelu_tanh", False, seed=M)  # no f32 gemv
    normed(M, 200, 256, "float32", True, seed=M)


def test_fused_ops_in_a_cuda_graph():
    # captured on the second run, replayed on the third: new x values reach the graph each time
    M, N, K, F, dt = 4, 512, 1024, 768, "bfloat16"
    p = _native.Program("cuda")
    xb, rb, wb = p.external("x", [M, K], dt), p.external("r", [M, K], dt), p.external("w", [K], dt)
    Wq, Wd = p.external("Wq", [2 * F, K], dt), p.external("Wd", [N, F], dt)
    gu, hb, yb = p.external("gu", [M, 2 * F], dt), p.external("h", [M, K], dt), p.external("y", [M, N], dt)
    p.op("add_rmsnorm_matmul", [xb, rb, wb, Wq, -1], [gu, hb], {"eps": 1e-6})
    p.op("gated_matmul", [gu, Wd], [yb], {"act": "silu"})
    w, W1, W2 = rand((K,), dt, 1), rand((2 * F, K), dt, 2, 1 / 32), rand((N, F), dt, 3, 1 / 28)
    x_dev, r_dev = _native.tensor(rand((M, K), dt, 4)).to("cuda"), _native.tensor(rand((M, K), dt, 5)).to("cuda")
    for b, arr in ((xb, x_dev), (rb, r_dev), (wb, w), (Wq, W1), (Wd, W2)):
        p.bind(b, arr if not isinstance(arr, np.ndarray) else _native.tensor(arr).to("cuda"))
    for b, shape in ((gu, [M, 2 * F]), (hb, [M, K]), (yb, [M, N])):
        p.bind(b, _native.zeros(shape, dt, "cuda"))
    p.set_graphs(True)
    for seed in (10, 11, 12):
        x, r = rand((M, K), dt, seed), rand((M, K), dt, seed + 100)
        x_dev.copy_from(x)
        r_dev.copy_from(r)
        p.run()
        g_cpu, h_cpu = run_on("cpu", "add_rmsnorm_matmul", [x, r, w, W1], [((M, 2 * F), dt), ((M, K), dt)], eps=1e-6)
        (y_cpu,) = run_on("cpu", "gated_matmul", [g_cpu, W2], [((M, N), dt)], act="silu")
        np.testing.assert_array_equal(p.get(hb).to("cpu").numpy().view(np.uint8), h_cpu.view(np.uint8))
        close(p.get(yb).to("cpu").numpy().astype(np.float32), y_cpu.astype(np.float32), dt)
    assert p.graphs_active and p.num_graphs == 1


def test_gemv_switch_off_takes_the_composition():
    # SUROGATE_NO_GEMV=1 (read once per process) turns the fused path off too; the answer holds
    code = (
        "import numpy as np, ml_dtypes\n"
        "from surogate import _native\n"
        "rng = np.random.default_rng(0)\n"
        "gu = rng.standard_normal((3, 512)).astype(ml_dtypes.bfloat16)\n"
        "W = (rng.standard_normal((50, 256)) / 16).astype(ml_dtypes.bfloat16)\n"
        "ys = []\n"
        "for dev in ('cpu', 'cuda'):\n"
        "    y = _native.zeros([3, 50], 'float32', dev)\n"
        "    _native.call_op('gated_matmul', [_native.tensor(gu).to(dev), _native.tensor(W).to(dev)], [y], {})\n"
        "    ys.append(y.to('cpu').numpy())\n"
        "print(float(np.abs(ys[0] - ys[1]).max()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, SUROGATE_NO_GEMV="1"), check=True,
                         capture_output=True, text=True).stdout
    assert float(out.strip()) < 1e-3
