"""rope_fwd / rope_bwd / qk_norm_rope_{fwd,bwd} (kernels_native/cpu/rope.cpp) against transformers:
LlamaRotaryEmbedding + apply_rotary_pos_emb, Qwen3RMSNorm, torch autograd and finite differences.

N tokens, H heads, D head dim, R rotary dim.
"""

import numpy as np
import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb, rotate_half
from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

from sgtest.ops import as_dtype, assert_close, finite_difference, run_op, sample_indices
from surogate import _native
from surogate.errors import DTypeError, InvalidArgumentError, ShapeError

TORCH_DTYPE = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# (hf rope_parameters, our attrs) per rope_type.
ROPE = {
    "default": ({"rope_type": "default", "rope_theta": 10000.0}, {}),
    "llama3": (
        {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        {"theta": 500000.0, "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
         "high_freq_factor": 4.0, "original_max_position": 8192},
    ),
    "linear": ({"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}, {"rope_type": "linear", "factor": 4.0}),
}

POSITIONS = {
    "one": lambda rng: rng.integers(0, 100_000, 1),
    "seq7": lambda rng: np.arange(7),
    "packed": lambda rng: np.concatenate([np.arange(7), np.arange(122)]),  # two documents, restart at 0
    "large": lambda rng: rng.integers(0, 100_000, 129),
}


def hf_cos_sin(pos, D, rope_parameters, dtype):
    config = LlamaConfig(hidden_size=4 * D, num_attention_heads=4, head_dim=D, max_position_embeddings=131072,
                         rope_parameters=dict(rope_parameters))
    rotary = LlamaRotaryEmbedding(config)
    return rotary(torch.zeros(1, dtype=dtype), torch.from_numpy(np.asarray(pos, np.int64))[None])  # [1, N, D]


def hf_rope(x, cos, sin):
    """apply_rotary_pos_emb on x [N, H, D] (HF lays q out as [B, H, N, D])."""
    q = x.transpose(0, 1)[None]
    y, _ = apply_rotary_pos_emb(q, q, cos, sin)
    return y[0].transpose(0, 1)


def assert_matches_hf_low_precision(actual, expected, dtype):
    """bf16 / f16: we follow HF's rounding order, so all but rare elements (a cos/sin value one f32 ulp
    off before its rounding to the storage dtype) are equal; none is more than 2 storage ulps off."""
    a, e = np.asarray(actual, np.float32), np.asarray(expected, np.float32)
    assert np.mean(a == e) >= 0.999
    ulp = 2.0**-7 if dtype == "bfloat16" else 2.0**-10
    np.testing.assert_allclose(a, e, rtol=2 * ulp, atol=2 * ulp * np.abs(e).max())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("rope_type", ["default", "llama3", "linear"])
@pytest.mark.parametrize("positions", ["one", "seq7", "packed", "large"])
@pytest.mark.parametrize("D", [64, 80, 128])
def test_rope_fwd_matches_transformers(D, positions, rope_type, dtype):
    rng = np.random.default_rng(D)
    pos = POSITIONS[positions](rng).astype(np.int32)
    N, H = len(pos), 3
    x = as_dtype(rng.standard_normal((N, H, D)), dtype)
    hf_params, attrs = ROPE[rope_type]
    cos, sin = hf_cos_sin(pos, D, hf_params, TORCH_DTYPE[dtype])
    expected = hf_rope(torch.from_numpy(x.astype(np.float32)).to(TORCH_DTYPE[dtype]), cos, sin).float().numpy()
    (y,) = run_op("rope_fwd", [x, pos], [((N, H, D), dtype)], **attrs)
    if dtype == "float32":
        assert_close(y, expected, rtol=1e-5, atol=1e-5)
    else:
        assert_matches_hf_low_precision(y, expected, dtype)


def torch_partial_rope(x, pos, R, theta):
    """HF's partial rotary (GPT-NeoX, Phi, Qwen3-Next): x[..., :R] rotates with R-wide cos/sin."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, R, 2, dtype=torch.int64).float() / R))
    freqs = torch.from_numpy(pos.astype(np.int64)).float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # [N, 1, R]
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    x_rot, x_pass = x[..., :R], x[..., R:]
    return torch.cat([x_rot * cos + rotate_half(x_rot) * sin, x_pass], dim=-1)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("D,R", [(80, 32), (128, 64), (64, 2), (64, 64)])
def test_partial_rotary(D, R, dtype):
    rng = np.random.default_rng(R)
    pos = POSITIONS["packed"](rng).astype(np.int32)
    x = as_dtype(rng.standard_normal((len(pos), 2, D)), dtype)
    expected = torch_partial_rope(torch.from_numpy(x.astype(np.float32)).to(TORCH_DTYPE[dtype]), pos, R, 10000.0)
    (y,) = run_op("rope_fwd", [x, pos], [(x.shape, dtype)], rotary_dim=R)
    if dtype == "float32":
        assert_close(y, expected.numpy())
    else:
        assert_matches_hf_low_precision(y, expected.float().numpy(), dtype)
    assert np.array_equal(y[..., R:], x[..., R:])


def test_attention_factor_scales_cos_and_sin():
    rng = np.random.default_rng(1)
    pos = np.arange(9, dtype=np.int32)
    x = rng.standard_normal((9, 2, 64)).astype(np.float32)
    (y,) = run_op("rope_fwd", [x, pos], [(x.shape, "float32")])
    (y2,) = run_op("rope_fwd", [x, pos], [(x.shape, "float32")], attention_factor=0.5)
    assert_close(y2, 0.5 * y)


def qwen3_qk_norm_rope(x, w, pos, theta, eps, dtype):
    """Qwen3Attention's q_norm then apply_rotary_pos_emb, in torch `dtype`."""
    D = x.shape[-1]
    norm = Qwen3RMSNorm(D, eps=eps).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(w)
    cos, sin = hf_cos_sin(pos, D, {"rope_type": "default", "rope_theta": theta}, dtype)
    return hf_rope(norm(x), cos, sin)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("positions", ["seq7", "packed", "large"])
@pytest.mark.parametrize("D", [64, 128])
def test_qk_norm_rope_fwd_matches_qwen3(D, positions, dtype):
    rng = np.random.default_rng(D + 1)
    pos = POSITIONS[positions](rng).astype(np.int32)
    N, H, theta, eps = len(pos), 4, 1_000_000.0, 1e-6
    x = as_dtype(3.0 * rng.standard_normal((N, H, D)), dtype)
    w = as_dtype(1.0 + 0.1 * rng.standard_normal(D), dtype)
    tdt = TORCH_DTYPE[dtype]
    xt = torch.from_numpy(x.astype(np.float32)).to(tdt)
    with torch.no_grad():
        expected = qwen3_qk_norm_rope(xt, torch.from_numpy(w.astype(np.float32)), pos, theta, eps, tdt)
    y, rstd = run_op("qk_norm_rope_fwd", [x, w, pos], [((N, H, D), dtype), ((N, H), "float32")], theta=theta)
    x32 = torch.from_numpy(x.astype(np.float32))
    assert_close(rstd, torch.rsqrt(x32.pow(2).mean(-1) + eps).numpy(), rtol=1e-6, atol=0)
    if dtype == "float32":
        # theta 1e6, R 128: torch's powf is 1 ulp off the correctly rounded inv_freq at i = 37
        # (see rope.cpp), which moves angles near position 1e5 by ~2e-6.
        assert_close(y, expected.numpy(), rtol=1e-5, atol=2e-5)
    else:
        assert_matches_hf_low_precision(y, expected.float().numpy(), dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_qk_norm_rope_fwd_weight_offset_matches_gemma3(dtype):
    """weight_offset 1: Gemma3RMSNorm's x rstd (1 + w), rounded once, then rope."""
    rng = np.random.default_rng(5)
    pos = POSITIONS["packed"](rng).astype(np.int32)
    N, H, D, theta, eps = len(pos), 4, 64, 10_000.0, 1e-6
    x = as_dtype(3.0 * rng.standard_normal((N, H, D)), dtype)
    w = as_dtype(0.3 * rng.standard_normal(D), dtype)
    tdt = TORCH_DTYPE[dtype]
    norm = Gemma3RMSNorm(D, eps=eps).to(tdt)
    with torch.no_grad():
        norm.weight.copy_(torch.from_numpy(w.astype(np.float32)))
        cos, sin = hf_cos_sin(pos, D, {"rope_type": "default", "rope_theta": theta}, tdt)
        expected = hf_rope(norm(torch.from_numpy(x.astype(np.float32)).to(tdt)), cos, sin)
    y, _ = run_op("qk_norm_rope_fwd", [x, w, pos], [((N, H, D), dtype), ((N, H), "float32")], theta=theta,
                  eps=eps, weight_offset=1.0)
    if dtype == "float32":
        assert_close(y, expected.numpy(), rtol=1e-5, atol=2e-5)
    else:
        assert_matches_hf_low_precision(y, expected.float().numpy(), dtype)


# ---- backward -------------------------------------------------------------------------------


def test_rope_bwd_matches_autograd_f64_and_inverts_fwd():
    rng = np.random.default_rng(3)
    pos = POSITIONS["packed"](rng).astype(np.int32)
    hf_params, attrs = ROPE["llama3"]
    N, H, D = len(pos), 2, 64
    x = rng.standard_normal((N, H, D))
    dy = rng.standard_normal((N, H, D)).astype(np.float32)
    cos, sin = hf_cos_sin(pos, D, hf_params, torch.float32)
    xt = torch.from_numpy(x).requires_grad_()
    hf_rope(xt, cos.double(), sin.double()).backward(torch.from_numpy(dy).double())
    (dx,) = run_op("rope_bwd", [dy, pos], [(dy.shape, "float32")], **attrs)
    assert_close(dx, xt.grad.numpy())
    dy16 = as_dtype(dy, "bfloat16")
    xt.grad = None
    hf_rope(xt, cos.double(), sin.double()).backward(torch.from_numpy(dy16.astype(np.float64)))
    (dx16,) = run_op("rope_bwd", [dy16, pos], [(dy.shape, "bfloat16")], **attrs)
    assert_close(dx16, xt.grad.numpy(), "bfloat16")
    (y,) = run_op("rope_fwd", [x.astype(np.float32), pos], [(dy.shape, "float32")], **attrs)
    (back,) = run_op("rope_bwd", [y, pos], [(dy.shape, "float32")], **attrs)
    assert_close(back, x)


def test_rope_bwd_finite_differences():
    rng = np.random.default_rng(4)
    pos = np.array([0, 1, 2, 0, 1, 700], np.int32)
    x = rng.standard_normal((6, 2, 16)).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    attrs = {"rotary_dim": 8, "theta": 100.0}

    def loss(v):
        (y,) = run_op("rope_fwd", [v, pos], [(v.shape, "float32")], **attrs)
        return float(np.sum(y.astype(np.float64) * dy))

    idx = sample_indices(x.shape, 40)
    fd = finite_difference(loss, x, eps=1e-2, indices=idx)
    (dx,) = run_op("rope_bwd", [dy, pos], [(x.shape, "float32")], **attrs)
    got = np.array([dx[i] for i in idx])
    assert_close(got, np.array([fd[i] for i in idx]), rtol=1e-3, atol=1e-3)


def f64_qk_norm_rope(x, w, pos, D, R, theta, eps, dtype):
    """The op's math in f64 autograd: RMSNorm over D, then rope of the first R dims, with HF's cos/sin
    as rounded to the storage dtype (the values the forward multiplies by)."""
    cos, sin = hf_cos_sin(pos, R, {"rope_type": "default", "rope_theta": theta}, TORCH_DTYPE[dtype])
    n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
    return torch.cat([hf_rope(n[..., :R], cos.double(), sin.double()), n[..., R:]], dim=-1)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("R", [64, 32])
def test_qk_norm_rope_bwd_matches_autograd_f64(R, dtype):
    rng = np.random.default_rng(R)
    pos = POSITIONS["packed"](rng).astype(np.int32)
    N, H, D, theta, eps = len(pos), 3, 64, 10000.0, 1e-6
    x = as_dtype(2.0 * rng.standard_normal((N, H, D)), dtype)
    w = as_dtype(1.0 + 0.1 * rng.standard_normal(D), dtype)
    dy = as_dtype(rng.standard_normal((N, H, D)), dtype)
    xt = torch.from_numpy(x.astype(np.float64)).requires_grad_()
    wt = torch.from_numpy(w.astype(np.float64)).requires_grad_()
    f64_qk_norm_rope(xt, wt, pos, D, R, theta, eps, dtype).backward(torch.from_numpy(dy.astype(np.float64)))

    attrs = {"theta": theta, "rotary_dim": R}
    _, rstd = run_op("qk_norm_rope_fwd", [x, w, pos], [(x.shape, dtype), ((N, H), "float32")], **attrs)
    dx, dw = run_op("qk_norm_rope_bwd", [dy, x, w, rstd, pos], [(x.shape, dtype), ((D,), dtype)], **attrs)
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == "float32" else {}
    assert_close(dx, xt.grad.numpy(), dtype, **tol)
    assert_close(dw, wt.grad.numpy(), dtype, **tol)

    # accumulate adds into dw; an absent dw (frozen weight) still gives the same dx.
    acc = as_dtype(np.ones(D), dtype)
    run_op("qk_norm_rope_bwd", [dy, x, w, rstd, pos], [np.zeros_like(x), acc], accumulate=True, **attrs)
    assert_close(acc, 1.0 + wt.grad.numpy(), dtype, **tol)
    dx_only = np.zeros_like(x)
    _native.call_op("qk_norm_rope_bwd", [dy, x, w, rstd, pos], [dx_only, None], attrs)
    assert np.array_equal(dx_only, dx)
    # An f32 dw (the trainer's gradient accumulator for a bf16 model) gets the unrounded sum.
    acc32 = np.ones(D, np.float32)
    run_op("qk_norm_rope_bwd", [dy, x, w, rstd, pos], [np.zeros_like(x), acc32], accumulate=True, **attrs)
    assert_close(acc32, 1.0 + wt.grad.numpy(), "float32", rtol=1e-4, atol=1e-4)


def test_qk_norm_rope_bwd_weight_offset_is_the_shifted_weight():
    """weight_offset o: dx is the backward through w + o, dw the same sum as without it (f32: exact)."""
    rng = np.random.default_rng(8)
    x, dy = rng.standard_normal((2, 7, 3, 32)).astype(np.float32)
    w = (0.3 * rng.standard_normal(32)).astype(np.float32)
    pos = np.arange(7, dtype=np.int32)
    outs = [(x.shape, "float32"), ((7, 3), "float32")]
    y, rstd = run_op("qk_norm_rope_fwd", [x, w, pos], outs, weight_offset=1.0)
    y1, rstd1 = run_op("qk_norm_rope_fwd", [x, w + 1, pos], outs)
    np.testing.assert_allclose(y, y1, rtol=1e-6, atol=1e-6)
    dx, dw = run_op("qk_norm_rope_bwd", [dy, x, w, rstd, pos], [(x.shape, "float32"), ((32,), "float32")],
                    weight_offset=1.0)
    dx1, dw1 = run_op("qk_norm_rope_bwd", [dy, x, w + 1, rstd1, pos], [(x.shape, "float32"), ((32,), "float32")])
    np.testing.assert_array_equal(dx, dx1)
    np.testing.assert_array_equal(dw, dw1)


def test_qk_norm_rope_bwd_finite_differences():
    rng = np.random.default_rng(5)
    pos = np.array([0, 1, 2, 0, 1], np.int32)
    x = rng.standard_normal((5, 2, 16)).astype(np.float32)
    w = (1.0 + 0.1 * rng.standard_normal(16)).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    attrs = {"rotary_dim": 8, "theta": 100.0, "eps": 1e-5}

    def loss(xv, wv):
        y, _ = run_op("qk_norm_rope_fwd", [xv, wv, pos], [(x.shape, "float32"), ((5, 2), "float32")], **attrs)
        return float(np.sum(y.astype(np.float64) * dy))

    _, rstd = run_op("qk_norm_rope_fwd", [x, w, pos], [(x.shape, "float32"), ((5, 2), "float32")], **attrs)
    dx, dw = run_op("qk_norm_rope_bwd", [dy, x, w, rstd, pos], [(x.shape, "float32"), ((16,), "float32")], **attrs)
    idx = sample_indices(x.shape, 40)
    fd_x = finite_difference(lambda v: loss(v, w), x, eps=1e-2, indices=idx)
    assert_close([dx[i] for i in idx], [fd_x[i] for i in idx], rtol=2e-3, atol=2e-3)
    fd_w = finite_difference(lambda v: loss(x, v), w, eps=1e-2)
    assert_close(dw, fd_w, rtol=2e-3, atol=2e-3)


def test_dw_does_not_depend_on_thread_count():
    rng = np.random.default_rng(6)
    pos = np.arange(300, dtype=np.int32)
    x = rng.standard_normal((300, 2, 64)).astype(np.float32)
    w = np.ones(64, np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    _, rstd = run_op("qk_norm_rope_fwd", [x, w, pos], [(x.shape, "float32"), ((300, 2), "float32")])
    threads = _native.num_threads()
    try:
        _native.set_num_threads(1)
        _, dw1 = run_op("qk_norm_rope_bwd", [dy, x, w, rstd, pos], [(x.shape, "float32"), ((64,), "float32")])
        _native.set_num_threads(3)
        _, dw3 = run_op("qk_norm_rope_bwd", [dy, x, w, rstd, pos], [(x.shape, "float32"), ((64,), "float32")])
    finally:
        _native.set_num_threads(threads)
    assert np.array_equal(dw1, dw3)


# ---- in place and errors --------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_in_place(dtype):
    rng = np.random.default_rng(7)
    pos = POSITIONS["packed"](rng).astype(np.int32)
    x = as_dtype(rng.standard_normal((len(pos), 2, 80)), dtype)
    w = as_dtype(1.0 + 0.1 * rng.standard_normal(80), dtype)
    for op, inputs, extra in [
        ("rope_fwd", [pos], []),
        ("rope_bwd", [pos], []),
        ("qk_norm_rope_fwd", [w, pos], [((len(pos), 2), "float32")]),
    ]:
        attrs = {"rotary_dim": 48}
        (expected, *_) = run_op(op, [x, *inputs], [(x.shape, dtype), *extra], **attrs)
        xi = x.copy()
        run_op(op, [xi, *inputs], [xi, *extra], **attrs)
        assert np.array_equal(xi, expected), op


def test_errors_name_the_op():
    x = np.zeros((4, 2, 16), np.float32)
    pos = np.arange(4, dtype=np.int32)
    w = np.ones(16, np.float32)
    with pytest.raises(ShapeError, match="rope_fwd: pos"):
        run_op("rope_fwd", [x, pos[:3]], [(x.shape, "float32")])
    with pytest.raises(DTypeError, match="rope_bwd: pos"):
        run_op("rope_bwd", [x, pos.astype(np.int64)], [(x.shape, "float32")])
    with pytest.raises(InvalidArgumentError, match="rope_fwd: rotary_dim 7"):
        run_op("rope_fwd", [x, pos], [(x.shape, "float32")], rotary_dim=7)
    with pytest.raises(InvalidArgumentError, match="qk_norm_rope_fwd: rotary_dim 32"):
        run_op("qk_norm_rope_fwd", [x, w, pos], [(x.shape, "float32"), ((4, 2), "float32")], rotary_dim=32)
    with pytest.raises(InvalidArgumentError, match="rope_fwd: unknown rope_type 'longrope'"):
        run_op("rope_fwd", [x, pos], [(x.shape, "float32")], rope_type="longrope")
    with pytest.raises(InvalidArgumentError, match="rope_fwd: rope_type yarn needs attrs factor, yarn_low, yarn_high"):
        run_op("rope_fwd", [x, pos], [(x.shape, "float32")], rope_type="yarn", factor=4.0)
    with pytest.raises(InvalidArgumentError, match="rope_fwd: rope_type llama3 needs"):
        run_op("rope_fwd", [x, pos], [(x.shape, "float32")], rope_type="llama3", factor=8.0)
    with pytest.raises(ShapeError, match="qk_norm_rope_bwd: pos"):
        run_op("qk_norm_rope_bwd", [x, x, w, np.ones((4, 2), np.float32), pos[:2]],
               [(x.shape, "float32"), ((16,), "float32")])
    with pytest.raises(ShapeError, match="qk_norm_rope_fwd: w"):
        run_op("qk_norm_rope_fwd", [x, w[:8], pos], [(x.shape, "float32"), ((4, 2), "float32")])
