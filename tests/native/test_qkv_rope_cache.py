"""qkv_rope_cache (kernels_native/cpu/qkv_rope_cache.cpp) against the ops it fuses: qk_norm_rope_fwd (or
rope_fwd) on q and on k, then kv_cache_write. Equal bit for bit: the fused op rounds in the same order.

N tokens, Hq / Hkv query / kv heads, D head dim, R rotary dim. test_rope.py checks the rope ops against
transformers; here the caches start as garbage so that a wrong or extra slot shows.
"""

import numpy as np
import pytest
from sgtest.ops import as_dtype, run_op
from sgtest.qkv import ROPE, make_case

from surogate.errors import DTypeError, InvalidArgumentError, ShapeError

DTYPES = ["float32", "bfloat16", "float16"]

def composed(c, norm, **attrs):
    """The serving graph before the fusion: rope (after the norm) on q and k, then kv_cache_write."""
    q, k = c["q"], c["k"]
    if norm:
        eps = attrs.pop("eps", 1e-6)
        qo, _ = run_op("qk_norm_rope_fwd", [q, c["q_norm"], c["pos"]], [(q.shape, str(q.dtype)), (q.shape[:2], "float32")],
                       eps=eps, **attrs)
        ko, _ = run_op("qk_norm_rope_fwd", [k, c["k_norm"], c["pos"]], [(k.shape, str(k.dtype)), (k.shape[:2], "float32")],
                       eps=eps, **attrs)
    else:
        (qo,) = run_op("rope_fwd", [q, c["pos"]], [(q.shape, str(q.dtype))], **attrs)
        (ko,) = run_op("rope_fwd", [k, c["pos"]], [(k.shape, str(k.dtype))], **attrs)
    kc, vc = run_op("kv_cache_write", [ko, c["v"], c["slots"]], [c["k_cache"].copy(), c["v_cache"].copy()])
    return qo, kc, vc


def fused(c, norm, q=None, k=None, v=None, **attrs):
    q, k, v = (c[n] if x is None else x for n, x in (("q", q), ("k", k), ("v", v)))
    norms = [c["q_norm"], c["k_norm"]] if norm else []
    return run_op("qkv_rope_cache", [q, k, v, c["pos"], c["slots"], *norms],
                  [(c["q"].shape, str(c["q"].dtype)), c["k_cache"].copy(), c["v_cache"].copy()], **attrs)


def assert_same(got, want):
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g.view(np.uint8), w.view(np.uint8))  # the bits, -0.0 included


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("rope", sorted(ROPE))
def test_equals_the_ops_it_fuses(dtype, norm, rope):
    c = make_case(1, 13, 8, 2, 64, dtype)  # GQA, two padding tokens
    assert_same(fused(c, norm, eps=1e-5, **ROPE[rope]), composed(c, norm, eps=1e-5, **ROPE[rope]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_weight_offset_equals_the_ops_it_fuses(dtype):
    """Gemma's (1 + w) norms: weight_offset reaches both norms, with qk_norm_rope_fwd's rounding."""
    c = make_case(2, 11, 4, 2, 64, dtype)
    assert_same(fused(c, True, weight_offset=1.0, theta=10_000.0), composed(c, True, weight_offset=1.0, theta=10_000.0))
    assert not all(np.array_equal(a, b) for a, b in zip(fused(c, True, weight_offset=1.0), fused(c, True)))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("d,r", [(80, 32), (128, 64), (64, 2), (128, 128)])
def test_partial_rotary(dtype, norm, d, r):
    c = make_case(d + r, 9, 4, 4, d, dtype)
    assert_same(fused(c, norm, rotary_dim=r), composed(c, norm, rotary_dim=r))


def test_one_token_and_many_heads():
    c = make_case(3, 1, 64, 8, 128, "bfloat16", pad=())  # a decode step of a large model
    assert_same(fused(c, True), composed(c, True))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("norm", [True, False])
def test_rows_of_a_fused_projection(dtype, norm):
    # q, k, v as column slices of one [N, (Hq + 2 Hkv) D] projection: strided token rows.
    n, hq, hkv, d = 11, 4, 2, 32
    c = make_case(4, n, hq, hkv, d, dtype)
    qkv = np.concatenate([c["q"].reshape(n, -1), c["k"].reshape(n, -1), c["v"].reshape(n, -1)], axis=1)
    q = qkv[:, :hq * d].reshape(n, hq, d)
    k = qkv[:, hq * d:(hq + hkv) * d].reshape(n, hkv, d)
    v = qkv[:, (hq + hkv) * d:].reshape(n, hkv, d)
    assert not q.flags.c_contiguous and q.strides[0] == qkv.strides[0]
    assert_same(fused(c, norm, q=q, k=k, v=v), composed(c, norm))


def test_padding_tokens_write_no_slot():
    c = make_case(5, 6, 2, 2, 16, "float32")
    c["slots"][:] = -1
    qo, kc, vc = fused(c, True)
    np.testing.assert_array_equal(kc, c["k_cache"])
    np.testing.assert_array_equal(vc, c["v_cache"])
    assert_same([qo], composed(c, True)[:1])  # q is still computed


def test_errors():
    c = make_case(6, 4, 2, 1, 8, "float32", num_blocks=2, block_size=4, pad=())
    with pytest.raises(InvalidArgumentError, match="qkv_rope_cache: pass both norm weights"):
        run_op("qkv_rope_cache", [c["q"], c["k"], c["v"], c["pos"], c["slots"], c["q_norm"], None],
               [(c["q"].shape, "float32"), c["k_cache"], c["v_cache"]])
    kc_before = c["k_cache"].copy()
    for bad in (8, -2):
        c["slots"][3] = bad
        with pytest.raises(InvalidArgumentError, match=r"qkv_rope_cache: slot_mapping\[3\].*token 3"):
            fused(c, True)
    c["slots"][:] = [5, 1, 5, -1]
    with pytest.raises(InvalidArgumentError, match="qkv_rope_cache: tokens 0 and 2 both map to slot 5"):
        run_op("qkv_rope_cache", [c["q"], c["k"], c["v"], c["pos"], c["slots"]],
               [(c["q"].shape, "float32"), c["k_cache"], c["v_cache"]])
    np.testing.assert_array_equal(c["k_cache"], kc_before)  # nothing written when a slot is bad
    c["slots"][:] = [0, 1, 2, 3]
    wide = np.zeros((4, 2, 16), np.float32)[:, :, ::2]  # heads not contiguous
    with pytest.raises(InvalidArgumentError, match=r"qkv_rope_cache: q .*strides"):
        fused(c, False, q=wide)
    with pytest.raises(DTypeError, match="qkv_rope_cache: v is bfloat16 but q is float32"):
        fused(c, False, v=as_dtype(c["v"], "bfloat16"))
    with pytest.raises(ShapeError, match="qkv_rope_cache: k_cache"):
        run_op("qkv_rope_cache", [c["q"], c["k"], c["v"], c["pos"], c["slots"]],
               [(c["q"].shape, "float32"), np.zeros((2, 4, 2, 8), np.float32), np.zeros((2, 4, 2, 8), np.float32)])
    with pytest.raises(InvalidArgumentError, match="qkv_rope_cache: rotary_dim 3"):
        fused(c, False, rotary_dim=3)
