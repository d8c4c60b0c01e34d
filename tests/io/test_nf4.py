"""NF4 in bitsandbytes' layout (surogate/io/nf4.py, the native nf4_dequantize) against
bitsandbytes' own CPU functions: the packed 4-bit codes and the absmax bit for bit, the
double-quantized absmax state, and our decoder on bnb's own quantization state bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = pytest.importorskip("bitsandbytes.functional")

from surogate import _native  # noqa: E402
from surogate.io.nf4 import (NF4_CODE, NF4Weight, dequantize_nf4, dynamic_code, quantize_blockwise,  # noqa: E402
                             quantize_nf4)

SHAPES = [((48, 128), 64), ((300, 256), 64), ((64, 384), 128), ((40, 96), 32)]


def weight(shape, seed=0):
    w = (np.random.default_rng(seed).standard_normal(shape) * 0.05).astype(np.float32)
    w[0, :64] = 0.0  # an all-zero block
    w[1, 3] = 0.5  # an outlier
    return w


def bnb(w, blocksize, double_quant):
    return F.quantize_4bit(torch.from_numpy(w), blocksize=blocksize, quant_type="nf4",
                           compress_statistics=double_quant)


def native_dequant(t: NF4Weight, dtype=np.float32) -> np.ndarray:
    y = np.zeros(t.shape, dtype)
    ins = [t.q, t.absmax] + ([t.absmax_scale, t.offset] if t.absmax_scale is not None else [])
    _native.call_op("nf4_dequantize", ins, [y], {"blocksize": t.blocksize})
    return y


def test_code_tables_are_bitsandbytes():
    assert np.array_equal(NF4_CODE, F.get_4bit_type("nf4", device="cpu").numpy())
    assert np.array_equal(dynamic_code(), F.create_dynamic_map(signed=True).numpy())


@pytest.mark.parametrize("shape,blocksize", SHAPES)
def test_quantize_without_double_quant_is_bitsandbytes_bit_for_bit(shape, blocksize):
    w = weight(shape)
    ours = quantize_nf4(w, blocksize, double_quant=False)
    q, s = bnb(w, blocksize, False)
    assert np.array_equal(ours.q.reshape(-1), q.numpy().reshape(-1))  # nibble order: the first value high
    assert np.array_equal(ours.absmax, s.absmax.numpy())
    assert np.array_equal(dequantize_nf4(ours), F.dequantize_4bit(q, s).numpy())
    assert np.array_equal(native_dequant(ours), F.dequantize_4bit(q, s).numpy())


@pytest.mark.parametrize("shape,blocksize", SHAPES)
def test_double_quant_state_matches_bitsandbytes(shape, blocksize):
    w = weight(shape, seed=1)
    ours = quantize_nf4(w, blocksize, double_quant=True)
    q, s = bnb(w, blocksize, True)
    assert np.array_equal(ours.q.reshape(-1), q.numpy().reshape(-1))
    # The offset is the absmax mean: torch's and numpy's f32 sums may round a last bit apart.
    assert ours.offset[0] == pytest.approx(s.offset.item(), rel=1e-6)
    # The 8-bit absmax codes against bnb's, given bnb's own offset: bnb's scales bit for bit;
    # the codes are the nearest level (bnb's torch backend's rule, torch.bucketize on the
    # midpoints); bnb's CPU library searches approximately and may take the other neighbour
    # for a value within ~1e-4 of a midpoint.
    absmax = F.quantize_4bit(torch.from_numpy(w), blocksize=blocksize, quant_type="nf4")[1].absmax.numpy()
    shifted = (absmax - np.float32(s.offset.item())).astype(np.float32)
    codes, scale = quantize_blockwise(shifted)
    assert np.array_equal(scale, s.state2.absmax.numpy())
    bnb_codes = s.absmax.numpy()
    code = dynamic_code()
    scaled = shifted / np.repeat(scale, 256)[:shifted.size]
    for i in np.nonzero(codes != bnb_codes)[0]:
        lo, hi = sorted((int(codes[i]), int(bnb_codes[i])))
        assert hi == lo + 1 and abs(scaled[i] - (code[lo] + code[hi]) / 2) < 1e-4, (i, scaled[i], lo, hi)
    assert (codes != bnb_codes).mean() < 0.03


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape,blocksize", SHAPES)
def test_native_decoder_on_bitsandbytes_state_is_bit_exact(shape, blocksize, dtype):
    import ml_dtypes

    w = weight(shape, seed=2)
    q, s = bnb(w, blocksize, True)
    t = NF4Weight(q.numpy().reshape(shape[0], shape[1] // 2), s.absmax.numpy(), blocksize,
                  s.state2.absmax.numpy(), np.array([s.offset.item()], np.float32))
    ref = F.dequantize_4bit(q, s)
    assert np.array_equal(dequantize_nf4(t), ref.numpy())
    if dtype == "float32":
        assert np.array_equal(native_dequant(t), ref.numpy())
    else:  # bnb decodes in f32 and rounds once, as torch's .to(bfloat16)
        got = native_dequant(t, np.dtype(ml_dtypes.bfloat16))
        want = ref.to(torch.bfloat16).view(torch.int16).numpy()
        assert np.array_equal(got.view(np.int16), want)


def test_native_decoder_refuses_a_mismatched_state():
    t = quantize_nf4(weight((8, 128)), 64, double_quant=True)
    y = np.zeros(t.shape, np.float32)
    with pytest.raises(Exception, match="absmax_scale"):
        _native.call_op("nf4_dequantize", [t.q, t.absmax], [y], {"blocksize": 64})
    with pytest.raises(Exception, match="blocks"):
        _native.call_op("nf4_dequantize", [t.q, t.absmax[:-1], t.absmax_scale, t.offset], [y], {"blocksize": 64})
