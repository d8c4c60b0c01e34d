"""gguf_dequantize and gguf_matmul on the GPU against the CPU backend.

Dequantizing must give the CPU's bits exactly, for every type the CPU decodes and every output
dtype. gguf_matmul must match a float64 product of the CPU-decoded weight: tightly on the decode
kernel (N <= 8, f32 all the way), to tensor-core accuracy on the prefill path (dequantized panels
through the CUDA matmul), and agree with the CPU op (which rounds x to 8 bits for few rows).
Skipped on machines without a CUDA build and a GPU.
"""

import ml_dtypes
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from sgtest.ops import as_dtype, run_op

from surogate import _native
from surogate.errors import ShapeError, SurogateError, UnsupportedError

pytestmark = pytest.mark.cuda

HAS_CUDA = bool(_native.build_info()["cuda"]) and len(_native.cuda_devices()) > 0
if not HAS_CUDA:
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)

COVERS = ("gguf_dequantize", "gguf_matmul")

DECODED = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
           "Q8_K", "IQ4_NL", "IQ4_XS"]
QUANTIZABLE = {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
               "Q8_K"}
# Byte offsets of the scale fields of a block (f16, but f32 for Q8_K): random bytes elsewhere are valid codes.
SCALE_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "IQ4_NL": [0],
                "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "IQ4_XS": [0]}


def run_cuda(name, inputs, out_specs, **attrs):
    ins = [None if x is None else _native.tensor(x).to("cuda") for x in inputs]
    outs = [_native.zeros(list(shape), dtype, "cuda") for shape, dtype in out_specs]
    _native.call_op(name, ins, outs, attrs)
    return [o.to("cpu").numpy() for o in outs]


def both(name, inputs, out_specs, **attrs):
    """(CPU result, CUDA result) of one op."""
    (cpu,) = run_op(name, inputs, out_specs, **attrs)
    (gpu,) = run_cuda(name, inputs, out_specs, **attrs)
    return cpu, gpu


def random_blocks(name, rows, cols, rng, finite=False):
    """Raw blocks of random bytes; with finite, every scale is a small finite value."""
    bs, ts = GGML_QUANT_SIZES[T[name]]
    if name in ("F32", "F16", "BF16"):
        dt = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16}[name]
        return rng.standard_normal((rows, cols), dtype=np.float32).astype(dt).view(np.uint8)
    q = rng.integers(0, 256, (rows, cols // bs * ts), dtype=np.uint8)
    if finite:
        blocks = q.reshape(-1, ts)
        scale = rng.uniform(0.005, 0.02, (len(blocks), 1))
        if name == "Q8_K":
            blocks[:, :4] = scale.astype(np.float32).view(np.uint8)
        for off in SCALE_FIELDS.get(name, []):
            blocks[:, off:off + 2] = scale.astype(np.float16).view(np.uint8)
    return q


def weights(name, M, K, rng):
    """Wq [M, row bytes] as a model would carry it: the CPU quantizer's output where there is one."""
    if name not in QUANTIZABLE:
        return random_blocks(name, M, K, rng, finite=True)
    bs, ts = GGML_QUANT_SIZES[T[name]]
    w = rng.standard_normal((M, K), dtype=np.float32) * 0.02
    (q,) = run_op("gguf_quantize", [w], [((M, K // bs * ts), "uint8")], type=int(T[name]))
    return q


def bits(y):
    """The raw bits of an f32 / bf16 / f16 array, every NaN made one pattern."""
    y = np.ascontiguousarray(y)
    u = y.view(np.uint32 if y.dtype.itemsize == 4 else np.uint16).copy()
    u[np.isnan(y.astype(np.float32))] = 0
    return u


# ---- gguf_dequantize --------------------------------------------------------------------------


@pytest.mark.parametrize("name", DECODED)
def test_dequantize_is_bit_exact(name):
    rng = np.random.default_rng(DECODED.index(name))
    bs, _ = GGML_QUANT_SIZES[T[name]]
    # Rows that end inside a warp's 32 units, and (for 32-value blocks) rows of an odd number of
    # blocks; plain floats with an odd row length.
    shapes = [(7, 3 * 256), (1, 256)] + ([(5, 96), (33, 32)] if bs == 32 else []) + ([(3, 77)] if bs == 1 else [])
    for rows, cols in shapes:
        q = random_blocks(name, rows, cols, rng)  # NaN / inf / subnormal scales included
        cpu, gpu = both("gguf_dequantize", [q], [((rows, cols), "float32")], type=int(T[name]), cols=cols)
        np.testing.assert_array_equal(bits(gpu), bits(cpu))
        q = random_blocks(name, rows, cols, rng, finite=True)
        for dtype in ("float32", "bfloat16", "float16"):
            cpu, gpu = both("gguf_dequantize", [q], [((rows, cols), dtype)], type=int(T[name]), cols=cols)
            np.testing.assert_array_equal(bits(gpu), bits(cpu))


def test_dequantize_many_rows_uses_the_whole_grid():
    rng = np.random.default_rng(3)
    q = random_blocks("Q6_K", 2051, 512, rng, finite=True)
    cpu, gpu = both("gguf_dequantize", [q], [((2051, 512), "float32")], type=int(T.Q6_K), cols=512)
    np.testing.assert_array_equal(bits(gpu), bits(cpu))


# ---- gguf_matmul ----------------------------------------------------------------------------------


def relative_error(y, x, w):
    """max |y - x @ w^T| in units of |x| @ |w|^T (float64): the size of the sum's terms."""
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    return np.max(np.abs(np.asarray(y, np.float64) - x @ w.T) / (np.abs(x) @ np.abs(w).T + 1e-30))


@pytest.mark.parametrize("name", DECODED)
def test_matmul_matches_cpu(name):
    rng = np.random.default_rng(10 + DECODED.index(name))
    K, M = 512, 77
    q = weights(name, M, K, rng)
    (w,) = run_op("gguf_dequantize", [q], [((M, K), "float32")], type=int(T[name]), cols=K)
    for N in (1, 3, 8, 9, 64):  # <= 8: the decode kernel; above: dequantized panels + matmul
        combos = [("float32", "float32"), ("bfloat16", "bfloat16")]
        if N in (3, 64):
            combos.append(("bfloat16", "float32"))
        for xdt, ydt in combos:
            x = as_dtype(rng.standard_normal((N, K), dtype=np.float32), xdt)
            cpu, gpu = both("gguf_matmul", [x, q], [((N, M), ydt)], type=int(T[name]))
            # f32 end to end on the decode kernel; tf32 / bf16 tensor cores on the prefill path.
            tight = N <= 8 and xdt == ydt == "float32"
            bound = 2e-5 if tight else 2e-3 if xdt == ydt == "float32" else 1e-2
            assert relative_error(gpu, x, w) < bound, (N, xdt, ydt)
            # The CPU rounds x to 8 bits per 32 values for N <= 32: agree to that.
            scale = np.abs(np.asarray(x, np.float64)) @ np.abs(w.astype(np.float64)).T
            assert np.max(np.abs(gpu.astype(np.float64) - cpu.astype(np.float64)) / scale) < 2e-2, (N, xdt, ydt)


@pytest.mark.parametrize("N", [2, 12])
def test_matmul_f16_x_and_narrow_y(N):
    """f16 x is widened (never narrowed to bf16); f16 / bf16 y from f32 x goes through scratch."""
    rng = np.random.default_rng(20)
    K, M = 256, 45
    q = weights("Q4_K", M, K, rng)
    (w,) = run_op("gguf_dequantize", [q], [((M, K), "float32")], type=int(T.Q4_K), cols=K)
    for xdt, ydt in (("float16", "float16"), ("float16", "float32"), ("float32", "bfloat16"), ("float32", "float16")):
        x = as_dtype(rng.standard_normal((N, K), dtype=np.float32), xdt)
        (gpu,) = run_cuda("gguf_matmul", [x, q], [((N, M), ydt)], type=int(T.Q4_K))
        assert relative_error(gpu, x, w) < (2e-3 if ydt == "float32" else 1e-2), (xdt, ydt)


@pytest.mark.parametrize("name", ["F16", "BF16", "F32"])
def test_matmul_float_weights_of_odd_width(name):
    """K not a multiple of 32: plain-float weights skip the decode kernel at any N."""
    rng = np.random.default_rng(21)
    K, M = 100, 33
    q = random_blocks(name, M, K, rng)
    (w,) = run_op("gguf_dequantize", [q], [((M, K), "float32")], type=int(T[name]), cols=K)
    for N in (1, 9):
        for xdt in ("float32", "bfloat16"):
            x = as_dtype(rng.standard_normal((N, K), dtype=np.float32), xdt)
            (gpu,) = run_cuda("gguf_matmul", [x, q], [((N, M), "float32")], type=int(T[name]))
            assert relative_error(gpu, x, w) < 2e-3, (N, xdt)


def test_matmul_prefill_in_several_panels():
    """M * K over one panel (16 Mi values): each panel's product lands in its columns of y."""
    rng = np.random.default_rng(22)
    K, M, N = 4096, 4099, 9
    q = random_blocks("Q4_0", M, K, rng, finite=True)
    (w,) = run_op("gguf_dequantize", [q], [((M, K), "float32")], type=int(T.Q4_0), cols=K)
    for xdt, ydt in (("float32", "float32"), ("bfloat16", "bfloat16")):
        x = as_dtype(rng.standard_normal((N, K), dtype=np.float32), xdt)
        (gpu,) = run_cuda("gguf_matmul", [x, q], [((N, M), ydt)], type=int(T.Q4_0))
        assert relative_error(gpu, x, w) < (2e-3 if ydt == "float32" else 1e-2), (xdt, ydt)


def test_matmul_long_rows_several_tiles():
    """K over one shared-memory tile of x (1024 columns) and not a multiple of it."""
    rng = np.random.default_rng(23)
    K, M = 2816, 70
    for name in ("Q5_K", "Q8_0"):
        q = weights(name, M, K, rng)
        (w,) = run_op("gguf_dequantize", [q], [((M, K), "float32")], type=int(T[name]), cols=K)
        x = rng.standard_normal((5, K), dtype=np.float32)
        (gpu,) = run_cuda("gguf_matmul", [x, q], [((5, M), "float32")], type=int(T[name]))
        assert relative_error(gpu, x, w) < 2e-5, name


# ---- errors ---------------------------------------------------------------------------------------


def test_errors_name_the_op_and_the_type():
    x = np.ones((2, 512), np.float32)
    bad = np.zeros((2, 289), np.uint8)  # Q4_K rows of 512 take 288 bytes
    with pytest.raises(ShapeError, match="gguf_matmul.*Q4_K.*288"):
        run_cuda("gguf_matmul", [x, bad], [((2, 2), "float32")], type=int(T.Q4_K))
    with pytest.raises(ShapeError, match="gguf_dequantize.*Q4_K.*288"):
        run_cuda("gguf_dequantize", [bad], [((2, 512), "float32")], type=int(T.Q4_K), cols=512)
    with pytest.raises(UnsupportedError, match="gguf_dequantize: unsupported GGUF type IQ2_XXS"):
        run_cuda("gguf_dequantize", [np.zeros((1, 66), np.uint8)], [((1, 256), "float32")], type=int(T.IQ2_XXS))
    with pytest.raises(UnsupportedError, match="gguf_matmul: unsupported GGUF type IQ3_S"):
        run_cuda("gguf_matmul", [np.ascontiguousarray(x[:, :256]), np.zeros((1, 110), np.uint8)], [((2, 1), "float32")],
                 type=int(T.IQ3_S))
    with pytest.raises(SurogateError, match="unknown GGUF type id 99"):
        run_cuda("gguf_dequantize", [bad], [((2, 512), "float32")], type=99)
    with pytest.raises(SurogateError, match="attr `type`"):
        run_cuda("gguf_matmul", [x, bad], [((2, 2), "float32")])
