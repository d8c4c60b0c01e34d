"""The CUDA norm, rope and gated-activation ops (kernels_native/cuda/norm_rope_act*.cu) against the
CPU backend: rmsnorm / add_rmsnorm, rope / qk_norm_rope, swiglu / geglu, forward and backward.

Skipped on machines without a CUDA build and a GPU; run on the lent H200 before resolving
anything that touches these kernels. Sizes are awkward on purpose: N = 37 rows, channel counts
that are and are not multiples of the 16-byte packs, partial rotary, positions that do not
start at 0, three heads.
"""

import numpy as np
import pytest

from sgtest.ops import as_dtype, assert_close
from surogate import _native

pytestmark = pytest.mark.cuda

HAS_CUDA = bool(_native.build_info()["cuda"]) and len(_native.cuda_devices()) > 0
if not HAS_CUDA:
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)

COVERS = (
    "rmsnorm_fwd", "rmsnorm_bwd", "add_rmsnorm_fwd", "add_rmsnorm_bwd",
    "rope_fwd", "rope_bwd", "qk_norm_rope_fwd", "qk_norm_rope_bwd",
    "swiglu_fwd", "swiglu_bwd", "geglu_fwd", "geglu_bwd",
)

DTYPES = ["float32", "bfloat16", "float16"]
N = 37
H = 3


def run_cpu(name, inputs, outputs, **attrs):
    """outputs: an array (copied, its values kept: accumulate), a (shape, dtype) pair (zeros) or None (absent)."""
    outs = []
    for o in outputs:
        if o is None or isinstance(o, np.ndarray):
            outs.append(None if o is None else o.copy())
        else:
            outs.append(as_dtype(np.zeros(o[0], np.float32), o[1]))
    _native.call_op(name, list(inputs), outs, attrs)
    return outs


def run_cuda(name, inputs, outputs, **attrs):
    ins = [None if x is None else _native.tensor(x).to("cuda") for x in inputs]
    outs = []
    for o in outputs:
        if o is None:
            outs.append(None)
        elif isinstance(o, np.ndarray):
            outs.append(_native.tensor(o.copy()).to("cuda"))
        else:
            outs.append(_native.zeros(list(o[0]), o[1], "cuda"))
    _native.call_op(name, ins, outs, attrs)
    return [None if o is None else o.to("cpu").numpy() for o in outs]


def rand(shape, dtype, seed=0, scale=1.0):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * scale
    return as_dtype(x, dtype)


def check(name, inputs, outputs, dtypes, **attrs):
    """Run on both backends; compare each output at the tolerance of the dtype named in `dtypes`.
    Sums over rows (dw, rstd) get a looser float32 tolerance: their summation order differs."""
    expected = run_cpu(name, inputs, outputs, **attrs)
    got = run_cuda(name, inputs, outputs, **attrs)
    for i, (g, e, dt) in enumerate(zip(got, expected, dtypes)):
        if e is None:
            assert g is None
            continue
        kw = {"rtol": 1e-4, "atol": 1e-4} if dt == "float32-sum" else {}
        assert_close(g.astype(np.float32), e.astype(np.float32), "float32" if dt == "float32-sum" else dt, **kw)
    return got


# ---- rmsnorm / add_rmsnorm -------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("C", [64, 200, 203, 4096])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_rmsnorm_fwd(dtype, C, offset):
    x, w = rand((N, C), dtype, 1, 2.0), rand((C,), dtype, 2)
    check("rmsnorm_fwd", [x, w], [((N, C), dtype), ((N,), "float32")], [dtype, "float32-sum"],
          eps=1e-5, weight_offset=offset)


def test_rmsnorm_fwd_f32_weight_for_bf16_rows():
    x, w = rand((N, 200), "bfloat16", 1), rand((200,), "float32", 2)
    check("rmsnorm_fwd", [x, w], [((N, 200), "bfloat16"), ((N,), "float32")], ["bfloat16", "float32-sum"])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("C", [64, 203, 4096])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_add_rmsnorm_fwd(dtype, C, offset):
    x, r, w = rand((N, C), dtype, 1), rand((N, C), dtype, 3), rand((C,), dtype, 2)
    check("add_rmsnorm_fwd", [x, r, w], [((N, C), dtype), ((N, C), dtype), ((N,), "float32")],
          [dtype, dtype, "float32-sum"], eps=1e-6, weight_offset=offset)


def rmsnorm_saved(x, w, offset):
    """rstd of the CPU forward, the backward's input."""
    _, rstd = run_cpu("rmsnorm_fwd", [x, w], [(x.shape, x.dtype.name), ((x.shape[0],), "float32")],
                      weight_offset=offset)
    return rstd


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("C", [64, 200, 203, 4096])
@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize("dw_mode", ["none", "f32", "f32-accumulate", "w-dtype"])
def test_rmsnorm_bwd(dtype, C, offset, dw_mode):
    x, w, dy = rand((N, C), dtype, 1), rand((C,), dtype, 2), rand((N, C), dtype, 4)
    rstd = rmsnorm_saved(x, w, offset)
    attrs = {"weight_offset": offset, "accumulate": dw_mode == "f32-accumulate"}
    if dw_mode == "none":
        dw, dw_dt = None, None
    elif dw_mode == "w-dtype":
        dw, dw_dt = ((C,), dtype), dtype
    else:
        dw, dw_dt = rand((C,), "float32", 5), "float32-sum"
    check("rmsnorm_bwd", [dy, x, w, rstd], [((N, C), dtype), dw], [dtype, dw_dt], **attrs)


@pytest.mark.parametrize("rows", [1, 2100])
def test_rmsnorm_bwd_dw_over_many_blocks(rows):
    # 2100 rows: several rows per dw partial and more than one partial per reduction lane.
    x, w, dy = rand((rows, 72), "float32", 1), rand((72,), "float32", 2), rand((rows, 72), "float32", 4)
    rstd = rmsnorm_saved(x, w, 0.0)
    check("rmsnorm_bwd", [dy, x, w, rstd], [((rows, 72), "float32"), ((72,), "float32")],
          ["float32", "float32-sum"])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("C", [64, 203, 4096])
@pytest.mark.parametrize("with_dh", [False, True])
@pytest.mark.parametrize("accumulate", [False, True])
def test_add_rmsnorm_bwd(dtype, C, with_dh, accumulate):
    h, w, dy = rand((N, C), dtype, 1), rand((C,), dtype, 2), rand((N, C), dtype, 4)
    dh = rand((N, C), dtype, 6) if with_dh else None
    rstd = rmsnorm_saved(h, w, 1.0)
    dw = rand((C,), "float32", 5)
    check("add_rmsnorm_bwd", [dy, dh, h, w, rstd], [((N, C), dtype), dw], [dtype, "float32-sum"],
          weight_offset=1.0, accumulate=accumulate)


def test_add_rmsnorm_bwd_without_dw():
    h, w, dy, dh = rand((N, 64), "bfloat16", 1), rand((64,), "bfloat16", 2), rand((N, 64), "bfloat16", 4), \
        rand((N, 64), "bfloat16", 6)
    rstd = rmsnorm_saved(h, w, 0.0)
    check("add_rmsnorm_bwd", [dy, dh, h, w, rstd], [((N, 64), "bfloat16"), None], ["bfloat16", None])


# ---- rope / qk_norm_rope ---------------------------------------------------------------------

ROPE = {
    "default": {},
    "partial-1e6": {"theta": 1e6, "rotary_dim": 32},
    "linear": {"rope_type": "linear", "factor": 4.0, "theta": 5e5},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position": 8192, "theta": 5e5, "attention_factor": 0.9},
    "llama3-partial": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position": 4096, "theta": 1e4, "rotary_dim": 48},
}


def positions(kind):
    if kind == "random":  # arbitrary, large, not sorted: one cos/sin row per token on the CPU
        return np.random.default_rng(7).integers(3, 40000, N).astype(np.int32)
    # packed documents restarting at 0 (and one starting at 11): the CPU's by-position table
    return np.concatenate([np.arange(11, 25), np.arange(0, 13), np.arange(0, 10)]).astype(np.int32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rope", sorted(ROPE))
@pytest.mark.parametrize("pos_kind", ["random", "packed"])
@pytest.mark.parametrize("op", ["rope_fwd", "rope_bwd"])
def test_rope(dtype, rope, pos_kind, op):
    D = 64
    x = rand((N, H, D), dtype, 1)
    check(op, [x, positions(pos_kind)], [((N, H, D), dtype)], [dtype], **ROPE[rope])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rope", sorted(ROPE))
@pytest.mark.parametrize("pos_kind", ["random", "packed"])
def test_qk_norm_rope_fwd(dtype, rope, pos_kind):
    D = 64
    x, w = rand((N, H, D), dtype, 1, 3.0), rand((D,), dtype, 2)
    check("qk_norm_rope_fwd", [x, w, positions(pos_kind)], [((N, H, D), dtype), ((N, H), "float32")],
          [dtype, "float32-sum"], eps=1e-6, **ROPE[rope])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rope", ["default", "partial-1e6", "llama3-partial"])
@pytest.mark.parametrize("dw_mode", ["none", "overwrite", "accumulate", "f32"])
def test_qk_norm_rope_bwd(dtype, rope, dw_mode):
    D = 64
    pos = positions("random")
    x, w, dy = rand((N, H, D), dtype, 1), rand((D,), dtype, 2), rand((N, H, D), dtype, 4)
    _, rstd = run_cpu("qk_norm_rope_fwd", [x, w, pos], [((N, H, D), dtype), ((N, H), "float32")], **ROPE[rope])
    dw = None if dw_mode == "none" else rand((D,), "float32" if dw_mode == "f32" else dtype, 5)
    # dw is in w's dtype here: one rounding of a sum over N * H terms.
    check("qk_norm_rope_bwd", [dy, x, w, rstd, pos], [((N, H, D), dtype), dw], [dtype, dtype],
          accumulate=dw_mode == "accumulate", **ROPE[rope])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rope", ["default", "partial-1e6"])
def test_qk_norm_rope_weight_offset(dtype, rope):
    """Gemma's (1 + w): the forward's single rounding and the backward through w + 1, as the CPU."""
    D = 64
    pos = positions("random")
    x, w, dy = rand((N, H, D), dtype, 1, 3.0), rand((D,), dtype, 2), rand((N, H, D), dtype, 4)
    check("qk_norm_rope_fwd", [x, w, pos], [((N, H, D), dtype), ((N, H), "float32")], [dtype, "float32-sum"],
          eps=1e-6, weight_offset=1.0, **ROPE[rope])
    _, rstd = run_cpu("qk_norm_rope_fwd", [x, w, pos], [((N, H, D), dtype), ((N, H), "float32")], weight_offset=1.0,
                      **ROPE[rope])
    check("qk_norm_rope_bwd", [dy, x, w, rstd, pos], [((N, H, D), dtype), rand((D,), dtype, 5)], [dtype, dtype],
          weight_offset=1.0, **ROPE[rope])


def test_qk_norm_rope_head_dim_128_many_tokens():
    # Qwen3's head dim, 16 heads (two per warp), enough tokens for several per dw partial.
    n, h, d = 4500, 16, 128
    pos = np.arange(n, dtype=np.int32) + 100
    x, w, dy = rand((n, h, d), "bfloat16", 1), rand((d,), "bfloat16", 2), rand((n, h, d), "bfloat16", 4)
    _, rstd = check("qk_norm_rope_fwd", [x, w, pos], [((n, h, d), "bfloat16"), ((n, h), "float32")],
                    ["bfloat16", "float32-sum"], theta=1e6)
    dw = rand((d,), "bfloat16", 5)
    check("qk_norm_rope_bwd", [dy, x, w, rstd, pos], [((n, h, d), "bfloat16"), dw], ["bfloat16", "bfloat16"],
          theta=1e6, accumulate=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_qk_norm_rope_head_dim_512(dtype):
    """Gemma 4's full-attention heads: D = 512 (16 dims a lane), the proportional rope (64 of the
    256 pairs rotate), Gemma's (1 + w), the backward's dw."""
    D = 512
    rope = {"theta": 1e6, "rope_type": "proportional", "rope_angles": 64, "weight_offset": 1.0}
    pos = positions("random")
    x, w, dy = rand((N, H, D), dtype, 1, 3.0), rand((D,), dtype, 2), rand((N, H, D), dtype, 4)
    check("qk_norm_rope_fwd", [x, w, pos], [((N, H, D), dtype), ((N, H), "float32")], [dtype, "float32-sum"],
          eps=1e-6, **rope)
    _, rstd = run_cpu("qk_norm_rope_fwd", [x, w, pos], [((N, H, D), dtype), ((N, H), "float32")], eps=1e-6, **rope)
    check("qk_norm_rope_bwd", [dy, x, w, rstd, pos], [((N, H, D), dtype), rand((D,), dtype, 5)], [dtype, dtype],
          **rope)


# ---- swiglu / geglu --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("F", [64, 200, 203])
@pytest.mark.parametrize("act", ["swiglu", "geglu"])
def test_gated_fwd(dtype, F, act):
    gu = rand((N, 2 * F), dtype, 1, 4.0)  # wide enough to reach both tails of the activation
    check(f"{act}_fwd", [gu], [((N, F), dtype)], [dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("F", [64, 200, 203])
@pytest.mark.parametrize("act", ["swiglu", "geglu"])
def test_gated_bwd(dtype, F, act):
    gu, dy = rand((N, 2 * F), dtype, 1, 4.0), rand((N, F), dtype, 2)
    check(f"{act}_bwd", [dy, gu], [((N, 2 * F), dtype)], [dtype])
