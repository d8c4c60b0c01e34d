"""GGML block types on the CPU against gguf-py (the reference decoder / legacy quantizer).

gguf_dequantize must equal gguf.quants.dequantize bit for bit on arbitrary blocks; gguf_quantize
must equal gguf.quants.quantize bit for bit for Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 and be as
accurate as llama.cpp's reference quantizers for the K types; gguf_matmul must match a float64
matmul of the gguf-py-decoded weight.
"""

import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from sgtest.ops import run_op
from surogate.errors import InvalidArgumentError, ShapeError, SurogateError, UnsupportedError

DECODED = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
           "Q8_K", "IQ4_NL", "IQ4_XS", "MXFP4"]
LEGACY = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]

# Byte offsets of the f16 scale fields in a block (random bytes elsewhere are valid codes).
F16_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "IQ4_NL": [0],
              "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "IQ4_XS": [0]}


def geometry(name: str) -> tuple[int, int]:
    return GGML_QUANT_SIZES[T[name]]


def bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Bitwise equality of two f32 arrays, any NaN equal to any NaN."""
    a = np.ascontiguousarray(a, np.float32)
    b = np.ascontiguousarray(b, np.float32)
    return bool(np.all((a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))))


def reference_dequantize(q: np.ndarray, name: str) -> np.ndarray:
    if name == "Q8_K":  # gguf-py has no Q8_K decoder: d (f32), qs[256] int8, bsums[16] int16
        blocks = q.reshape(-1, 292)
        d = blocks[:, :4].copy().view(np.float32)
        qs = blocks[:, 4:260].view(np.int8).astype(np.float32)
        return (d * qs).reshape(q.shape[0], -1)
    with np.errstate(invalid="ignore", over="ignore"):
        return gguf_dequantize(q, T[name])


def random_blocks(name: str, rows: int, cols: int, rng, finite: bool = False, scale: float = 0.01) -> np.ndarray:
    """Random raw blocks; with finite, every scale field is a small finite value."""
    bs, ts = geometry(name)
    if name in ("F32", "F16", "BF16"):
        x = rng.standard_normal((rows, cols), dtype=np.float32)
        dt = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16}[name]
        return x.astype(dt).view(np.uint8)
    q = rng.integers(0, 256, (rows, cols // bs * ts), dtype=np.uint8)
    if finite:
        blocks = q.reshape(-1, ts)
        if name == "Q8_K":
            blocks[:, :4] = (rng.uniform(0.5, 1.5, (len(blocks), 1)) * scale).astype(np.float32).view(np.uint8)
        for off in F16_FIELDS.get(name, []):
            blocks[:, off:off + 2] = (rng.uniform(0.5, 1.5, (len(blocks), 1)) * scale).astype(np.float16).view(np.uint8)
    return q


def dequantize(q: np.ndarray, name: str, cols: int, dtype: str = "float32") -> np.ndarray:
    (y,) = run_op("gguf_dequantize", [q], [((q.shape[0], cols), dtype)], type=int(T[name]), cols=cols)
    return y


def quantize(x: np.ndarray, name: str) -> np.ndarray:
    bs, ts = geometry(name)
    (q,) = run_op("gguf_quantize", [x], [((x.shape[0], x.shape[1] // bs * ts), "uint8")], type=int(T[name]))
    return q


# ---- decoding ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", DECODED)
def test_dequantize_matches_gguf_py_bit_for_bit(name):
    rng = np.random.default_rng(list(T.__members__).index(name))
    bs, _ = geometry(name)
    rows, cols = 16, 8 * max(bs, 32)
    q = random_blocks(name, rows, cols, rng)  # raw random bytes: NaN / inf / subnormal scales included
    y = dequantize(q, name, cols)
    ref = reference_dequantize(q, name)
    assert bits_equal(y, ref)
    assert np.isfinite(ref).mean() > 0.5  # the comparison is mostly about numbers
    # And blocks whose scales are all finite: plain equality, no NaN at all.
    q = random_blocks(name, rows, cols, rng, finite=True)
    y = dequantize(q, name, cols)
    assert np.isfinite(y).all()
    assert np.array_equal(y.view(np.uint32), reference_dequantize(q, name).view(np.uint32))


def test_f16_decoder_is_exact_for_every_bit_pattern():
    q = np.arange(65536, dtype=np.uint16).view(np.uint8).reshape(1, -1)
    assert bits_equal(dequantize(q, "F16", 65536), q.view(np.float16).astype(np.float32))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_dequantize_to_narrow_dtypes_rounds_once(dtype):
    rng = np.random.default_rng(1)
    q = random_blocks("Q4_K", 4, 512, rng, finite=True)
    y = dequantize(q, "Q4_K", 512, dtype)
    ref = reference_dequantize(q, "Q4_K").astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16)
    assert np.array_equal(y.view(np.uint16), ref.view(np.uint16))


# ---- quantizing ----------------------------------------------------------------------------------


def normal_rows(rng, rows: int = 24, cols: int = 1024) -> np.ndarray:
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    x[1] *= 1e-3  # small values
    x[2, :64] = 0.0  # all-zero blocks
    x[3, :64] = 0.75  # constant blocks
    x[4] = np.round(x[4] * 4) / 4  # many ties
    x[5, ::7] *= 30  # outliers
    return x


@pytest.mark.parametrize("name", LEGACY + ["F16", "BF16", "MXFP4"])
def test_legacy_quantizers_match_gguf_py_bit_for_bit(name):
    x = normal_rows(np.random.default_rng(2))
    ref = np.asarray(gguf_quantize(x, T[name])).view(np.uint8).reshape(x.shape[0], -1)
    assert np.array_equal(quantize(x, name), ref)


# RMSE / RMS(x) of dequantize(quantize(x)) for standard normal x. Measured: Q2_K 0.296, Q3_K 0.151,
# Q4_K 0.0715, Q5_K 0.0362, Q6_K 0.0178, Q8_K 0.0070; bounds sit ~10% above. For scale, plain
# rounding over a block's range would give Q4_K ~ 4 sigma / 15 / sqrt(12) = 0.077 and Q5_K ~ 0.037;
# llama.cpp's scale searches (reproduced here) do a little better.
K_ERROR_BOUNDS = {"Q2_K": 0.33, "Q3_K": 0.165, "Q4_K": 0.079, "Q5_K": 0.040, "Q6_K": 0.020, "Q8_K": 0.0078}


@pytest.mark.parametrize("name", list(K_ERROR_BOUNDS))
def test_k_quantizers_error_and_gguf_py_round_trip(name):
    x = np.random.default_rng(3).standard_normal((32, 1024), dtype=np.float32)
    q = quantize(x, name)
    y = dequantize(q, name, x.shape[1])
    rel_rmse = np.sqrt(np.mean((y - x) ** 2)) / np.sqrt(np.mean(x ** 2))
    assert rel_rmse < K_ERROR_BOUNDS[name], rel_rmse
    assert rel_rmse > 0.6 * K_ERROR_BOUNDS[name], rel_rmse  # a much better number means a broken test
    assert bits_equal(y, reference_dequantize(q, name))
    # Scales stay in range: no block decodes to something far from its values.
    assert np.abs(y - x).max() < 8 * K_ERROR_BOUNDS[name] * np.abs(x).max()


@pytest.mark.parametrize("name", ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K"])
def test_k_quantizers_on_awkward_rows(name):
    x = normal_rows(np.random.default_rng(4), cols=512)
    y = dequantize(quantize(x, name), name, 512)
    assert np.isfinite(y).all()
    assert np.all(y[2, :64] == 0.0)  # zeros stay zeros
    rel = np.sqrt(np.mean((y - x) ** 2, axis=1)) / np.sqrt(np.mean(x ** 2, axis=1))
    assert np.all(rel[:2] < 2 * K_ERROR_BOUNDS[name])  # tiny values keep their relative accuracy


def test_q8_k_block_sums():
    x = np.random.default_rng(5).standard_normal((2, 512), dtype=np.float32)
    blocks = quantize(x, "Q8_K").reshape(-1, 292)
    qs = blocks[:, 4:260].view(np.int8).astype(np.int32).reshape(-1, 16, 16)
    assert np.array_equal(blocks[:, 260:].copy().view(np.int16), qs.sum(-1))


def test_quantize_from_bf16_equals_quantize_of_its_f32_values():
    x = np.random.default_rng(6).standard_normal((3, 256), dtype=np.float32).astype(ml_dtypes.bfloat16)
    assert np.array_equal(quantize(x, "Q4_K"), quantize(x.astype(np.float32), "Q4_K"))


# ---- matmul --------------------------------------------------------------------------------------


def q8_activations(x: np.ndarray) -> np.ndarray:
    """x as the integer dot path sees it: per 32 values, scale amax/127, rounded to nearest even."""
    g = x.reshape(x.shape[0], -1, 32)
    d = (np.abs(g).max(-1, keepdims=True) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d > 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    q = np.rint(g * inv)
    return (q.astype(np.float64) * d.astype(np.float64)).reshape(x.shape)


def check_matmul(y, x, w):
    """y must match x @ w^T in float64 (the sgemm path), or the same with x rounded as the
    integer dot path rounds it; both to ~f32 accuracy relative to sum |x||w|."""
    y = np.asarray(y, np.float64)
    w = w.astype(np.float64)
    errs = []
    for xe in (x.astype(np.float64), q8_activations(x)):
        scale = np.abs(xe) @ np.abs(w).T + 1e-30
        errs.append(np.max(np.abs(y - xe @ w.T) / scale))
    assert min(errs) < 2e-6, errs
    # And against the exact product, whichever path: x rounded to 8 bits costs < 1% of the scale.
    scale = np.abs(x.astype(np.float64)) @ np.abs(w).T
    assert np.max(np.abs(y - x.astype(np.float64) @ w.T) / scale) < 1e-2


MATMUL_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ4_NL",
                "IQ4_XS", "F16", "BF16", "F32"]


@pytest.mark.parametrize("name", MATMUL_TYPES)
def test_matmul_matches_float64_of_gguf_py_weights(name):
    rng = np.random.default_rng(7)
    bs, _ = geometry(name)
    shapes = [(256, 7), (512, 130)] + ([(96, 5), (288, 9)] if bs <= 32 else [])  # (K, M); partial chunks
    for K, M in shapes:
        q = random_blocks(name, M, K, rng, finite=True, scale=0.02)
        w = reference_dequantize(q, name) if name not in ("F32", "F16", "BF16") else dequantize(q, name, K)
        for N in (1, 3, 6, 17, 64):  # <= 32: integer dot path; above: f32 panels + sgemm
            x = rng.standard_normal((N, K), dtype=np.float32)
            (y,) = run_op("gguf_matmul", [x, q], [((N, M), "float32")], type=int(T[name]))
            check_matmul(y, x, w)


@pytest.mark.parametrize("N", [2, 33])
def test_matmul_bf16_in_and_out(N):
    rng = np.random.default_rng(8)
    q = quantize(rng.standard_normal((40, 512), dtype=np.float32), "Q4_K")
    w = reference_dequantize(q, "Q4_K").astype(np.float64)
    x = rng.standard_normal((N, 512), dtype=np.float32).astype(ml_dtypes.bfloat16)
    (y,) = run_op("gguf_matmul", [x, q], [((N, 40), "bfloat16")], type=int(T.Q4_K))
    ref = x.astype(np.float64) @ w.T
    assert np.max(np.abs(y.astype(np.float64) - ref)) < 2e-2 * np.abs(ref).max()


def test_matmul_quantized_real_weights_decode_and_prefill_agree():
    rng = np.random.default_rng(9)
    q = quantize(rng.standard_normal((64, 1024), dtype=np.float32) * 0.02, "Q6_K")
    x = rng.standard_normal((40, 1024), dtype=np.float32)
    (big,) = run_op("gguf_matmul", [x, q], [((40, 64), "float32")], type=int(T.Q6_K))
    (small,) = run_op("gguf_matmul", [x[:1], q], [((1, 64), "float32")], type=int(T.Q6_K))
    assert np.max(np.abs(small[0] - big[0])) < 1e-2 * np.abs(big[0]).max()


def test_portable_path_without_avx2():
    """The same decoding and matmul checks on the portable (non-AVX2) kernels."""
    env = dict(os.environ, SUROGATE_GGUF_NO_AVX2="1")
    # -P: the installed surogate, not the source folder of the current directory.
    args = [sys.executable, "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
            "bit_for_bit and not legacy or matmul_matches and (Q4_K or Q6_K or Q4_0 or Q5_1 or Q3_K or IQ4_XS)"]
    r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


# ---- errors --------------------------------------------------------------------------------------


def test_errors_name_the_op_and_the_type():
    x = np.ones((2, 512), np.float32)
    bad = np.zeros((2, 289), np.uint8)  # Q4_K rows of 512 take 288 bytes
    with pytest.raises(ShapeError, match="gguf_matmul.*Q4_K.*288"):
        run_op("gguf_matmul", [x, bad], [((2, 2), "float32")], type=int(T.Q4_K))
    with pytest.raises(ShapeError, match="gguf_dequantize.*Q4_K.*288"):
        run_op("gguf_dequantize", [bad], [((2, 512), "float32")], type=int(T.Q4_K), cols=512)
    with pytest.raises(ShapeError, match="gguf_quantize.*Q6_K.*256"):
        run_op("gguf_quantize", [np.ones((2, 320), np.float32)], [((2, 210), "uint8")], type=int(T.Q6_K))
    with pytest.raises(UnsupportedError, match="unsupported GGUF type IQ2_XXS"):
        run_op("gguf_dequantize", [np.zeros((1, 66), np.uint8)], [((1, 256), "float32")], type=int(T.IQ2_XXS))
    with pytest.raises(UnsupportedError, match="unsupported GGUF type IQ3_S"):
        run_op("gguf_matmul", [x[:, :256], np.zeros((1, 110), np.uint8)], [((2, 1), "float32")], type=int(T.IQ3_S))
    with pytest.raises(UnsupportedError, match="gguf_quantize: unsupported GGUF type IQ4_NL"):
        run_op("gguf_quantize", [x], [((2, 288), "uint8")], type=int(T.IQ4_NL))
    with pytest.raises(InvalidArgumentError, match="unknown GGUF type id 99"):
        run_op("gguf_dequantize", [bad], [((2, 512), "float32")], type=99)
    with pytest.raises(SurogateError, match="attr `type`"):
        run_op("gguf_matmul", [x, bad], [((2, 2), "float32")])
