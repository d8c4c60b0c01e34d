"""attention_fwd / attention_bwd on the GPU against the CPU backend (cpu/attention.cpp is the spec).

Shapes: N packed tokens, Hq query heads, Hkv kv heads, D head dim; cu_seqlens delimits the
documents. The backward of both backends is fed the same (CPU) out and lse, so a forward
difference does not leak into the gradient comparison.
"""

import numpy as np
import pytest

from sgtest.ops import as_dtype, run_op
from surogate import _native
from surogate.errors import ShapeError, UnsupportedError

pytestmark = pytest.mark.cuda

HAS_CUDA = bool(_native.build_info()["cuda"]) and len(_native.cuda_devices()) > 0
if not HAS_CUDA:
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)

COVERS = ("attention_fwd", "attention_bwd")


def run_cuda(name, inputs, out_specs, **attrs):
    ins = [None if x is None else _native.tensor(x).to("cuda") for x in inputs]
    outs = [_native.zeros(list(shape), dtype, "cuda") for shape, dtype in out_specs]
    _native.call_op(name, ins, outs, attrs)
    return [o.to("cpu").numpy() for o in outs]


def make_inputs(cu, Hq, Hkv, D, dtype, seed=0):
    rng = np.random.default_rng(seed)
    N = cu[-1]
    q, dout = (rng.standard_normal((N, Hq, D)).astype(np.float32) for _ in range(2))
    k, v = (rng.standard_normal((N, Hkv, D)).astype(np.float32) for _ in range(2))
    return [as_dtype(x, dtype) for x in (q, k, v, dout)]


# Bound on |gpu - cpu| as a fraction of (|cpu| + max(max|cpu|, 1)), see check(). f32: exp / tanh
# and accumulation order only. bf16 / f16: both round their outputs, and the GPU also feeds P and
# dS to the tensor cores in the storage dtype where the CPU keeps them in f32. lse is f32 always.
TOL = {"float32": 5e-5, "bfloat16": 2e-2, "float16": 5e-3}
LSE_TOL = 1e-4


def check(got, want, tol, what):
    """|got - want| <= tol * (|want| + max(max|want|, 1)): relative to the tensor's scale, so that
    near-zero gradient entries are not held to a relative bound."""
    a = np.asarray(got, np.float64)
    e = np.asarray(want, np.float64)
    assert np.all(np.isfinite(a)), f"{what}: non-finite values"
    bound = tol * (np.abs(e) + max(np.abs(e).max(initial=0.0), 1.0))
    excess = np.abs(a - e) - bound
    worst = np.unravel_index(np.argmax(excess), excess.shape)
    assert excess[worst] <= 0, (f"{what}: at {worst} got {a[worst]:.6g}, want {e[worst]:.6g} "
                                f"(max error {np.abs(a - e).max():.3g}, tolerance {tol})")


def compare(dtype, cu, Hq, Hkv, D, seed=0, **attrs):
    q, k, v, dout = make_inputs(cu, Hq, Hkv, D, dtype, seed)
    cu = np.asarray(cu, np.int32)
    N = int(cu[-1])
    fwd_outs = [((N, Hq, D), dtype), ((N, Hq), "float32")]
    out, lse = run_op("attention_fwd", [q, k, v, cu], fwd_outs, **attrs)
    g_out, g_lse = run_cuda("attention_fwd", [q, k, v, cu], fwd_outs, **attrs)
    tol = TOL[dtype]
    check(g_out.astype(np.float32), out.astype(np.float32), tol, "out")
    check(g_lse, lse, LSE_TOL, "lse")

    bwd_ins = [dout, q, k, v, out, lse, cu]
    bwd_outs = [((N, Hq, D), dtype), ((N, Hkv, D), dtype), ((N, Hkv, D), dtype)]
    want = run_op("attention_bwd", bwd_ins, bwd_outs, **attrs)
    got = run_cuda("attention_bwd", bwd_ins, bwd_outs, **attrs)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        check(g.astype(np.float32), w.astype(np.float32), tol, name)


# Documents of lengths 1, 17, 0, 64 and 130: a one-token document, tile-straddling ones, an empty one.
CU = [0, 1, 18, 18, 82, 212]

SHAPES = [
    # cu,       Hq, Hkv, D,   causal, window, softcap
    (CU, 4, 2, 64, True, 0, 0.0),
    (CU, 2, 2, 128, True, 32, 20.0),
    (CU, 4, 2, 128, False, 0, 0.0),
    (CU, 4, 1, 64, False, 32, 20.0),
    (CU, 4, 2, 80, True, 32, 0.0),  # f32: D padded up to the 128-wide kernel; bf16 / f16: flash at 80
    (CU, 2, 2, 8, False, 0, 20.0),  # tiny D, padded to 64
    ([0, 3, 70], 3, 1, 256, True, 0, 0.0),
    # Gemma 4's global layers (head dim 512): 32 x 32 forward tiles whose score product splits
    # over the warps, 16 x 16 backward tiles split 8 ways; 320 runs padded on the 512-wide kernel.
    (CU, 4, 2, 512, True, 0, 0.0),  # causal, GQA 4 / 2
    (CU, 8, 1, 512, True, 32, 20.0),  # causal window, softcap, GQA 8 / 1 (gemma-4-e2b)
    (CU, 2, 2, 512, False, 32, 0.0),  # bidirectional window
    (CU, 4, 4, 512, False, 0, 20.0),  # no mask, softcap
    (CU, 4, 2, 320, True, 0, 0.0),  # D padded up to the 512-wide kernel
    # bf16 / f16 at D % 8 == 0 up to 128 without softcap run the FlashAttention-2 kernels
    # (attention_flash.cu; test_flash_head_dims below for the widths other than 64 / 128):
    (CU, 4, 2, 128, True, 32, 0.0),  # causal window
    (CU, 4, 1, 64, False, 32, 0.0),  # bidirectional window, GQA 4 / 1
    ([0, 0, 100, 100], 2, 1, 128, True, 0, 0.0),  # empty documents around one of 100 tokens
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("cu,Hq,Hkv,D,causal,window,softcap", SHAPES)
def test_matches_cpu(dtype, cu, Hq, Hkv, D, causal, window, softcap):
    compare(dtype, cu, Hq, Hkv, D, causal=causal, window=window, softcap=softcap)


def test_defaults_and_explicit_scale():
    compare("float32", [0, 5, 40], 4, 2, 64, seed=1)  # causal, scale 1/sqrt(D), no window, no softcap
    compare("bfloat16", [0, 5, 40], 4, 2, 64, seed=1, scale=0.3, causal=False)


def test_window_of_one_sees_only_itself():
    compare("float32", CU, 2, 1, 64, seed=2, causal=True, window=1)
    compare("float32", CU, 2, 1, 64, seed=2, causal=False, window=1)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_long_documents_head_dim_512(dtype):
    """Gemma-4-31B's global heads (GQA 32 / 4 cut to 8 / 1, D = 512) over a 700-token and a 300-token
    document: many 32-row query tiles and 16-key backward tiles, the causal skipping, a window
    that leaves whole tiles unseen."""
    compare(dtype, [0, 700, 1000], 8, 1, 512, seed=7, causal=True)
    compare(dtype, [0, 700, 1000], 8, 1, 512, seed=8, causal=True, window=100, softcap=30.0)


def test_long_sequence_many_tiles():
    """One 1024-token document: many key and query tiles, the causal tile skipping, GQA."""
    compare("bfloat16", [0, 1024], 4, 2, 128, seed=3, causal=True)
    compare("bfloat16", [0, 1024], 4, 2, 128, seed=3, causal=True, window=100, softcap=20.0)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_long_documents_fast_path(dtype):
    """Qwen3-0.6B's heads (GQA 16 / 8, D = 128) over a 2048-token document and a 552-token one, then
    D = 64 (128-row query tiles) with a causal window and without a mask: many key and query tiles,
    the causal skipping, diagonal and partial tiles, rows that see no key of a tile."""
    compare(dtype, [0, 2048, 2600], 16, 8, 128, seed=4, causal=True)
    compare(dtype, [0, 700, 2048], 4, 2, 64, seed=5, causal=True, window=300)
    compare(dtype, [0, 1500], 4, 2, 64, seed=6, causal=False)


# The flash kernels' widths (64, 80, 96, 112, 128) at their own D and padded (D < width: 8, 40, 72
# for Gemma 3's SigLIP, 88, 104, 120), causal and bidirectional, with and without a window.
FLASH_DS = [72, 80, 96, 112, 8, 40, 88, 104, 120]
MASKS = [(True, 0), (False, 0), (True, 32), (False, 32)]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("D", FLASH_DS)
@pytest.mark.parametrize("causal,window", MASKS)
def test_flash_head_dims(dtype, D, causal, window):
    compare(dtype, CU, 4, 2, D, seed=D, causal=causal, window=window)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("D", [72, 96, 112])
def test_flash_head_dims_long_documents(dtype, D):
    """Many forward (128 rows at widths 80 / 96, 64 at 112) and backward (64 keys) tiles: the causal
    skipping, a window that leaves whole tiles unseen, GQA 4 / 1, an explicit scale."""
    compare(dtype, [0, 700, 1000], 4, 1, D, seed=10 + D, causal=True)
    compare(dtype, [0, 700, 1000], 4, 1, D, seed=11 + D, causal=True, window=100)
    compare(dtype, [0, 300, 557, 1000], 4, 2, D, seed=12 + D, causal=False, scale=0.3)


def torch_attention(q, k, v, dout, cu, causal, scale):
    """out, lse, dq, dk, dv of varlen attention in f32 torch (autograd), document by document."""
    torch = pytest.importorskip("torch")
    qt, kt, vt = (torch.tensor(np.asarray(x, np.float32), requires_grad=True) for x in (q, k, v))
    G = q.shape[1] // k.shape[1]
    outs, lses = [], []
    for a, b in zip(cu[:-1], cu[1:]):
        qd = qt[a:b].transpose(0, 1)  # [Hq, L, D]
        kd = kt[a:b].repeat_interleave(G, dim=1).transpose(0, 1)
        vd = vt[a:b].repeat_interleave(G, dim=1).transpose(0, 1)
        s = scale * qd @ kd.transpose(1, 2)
        if causal:
            L = b - a
            s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
        outs.append((torch.softmax(s, dim=-1) @ vd).transpose(0, 1))
        lses.append(torch.logsumexp(s, dim=-1).transpose(0, 1))
    out, lse = torch.cat(outs), torch.cat(lses)
    out.backward(torch.tensor(np.asarray(dout, np.float32)))
    return [x.detach().numpy() for x in (out, lse, qt.grad, kt.grad, vt.grad)]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("D,causal,Hq,Hkv", [(72, False, 4, 4), (72, True, 4, 2), (104, False, 2, 1)])
def test_flash_padded_head_dims_match_torch(dtype, D, causal, Hq, Hkv):
    """Gemma 3's SigLIP (D = 72, bidirectional, images as documents) and a causal GQA variant against
    torch in f32, independently of the CPU backend."""
    cu = [0, 256, 256 + 197, 256 + 197 + 64]
    q, k, v, dout = make_inputs(cu, Hq, Hkv, D, dtype, seed=20 + D)
    scale = 1.0 / np.sqrt(D)
    out, lse, dq, dk, dv = torch_attention(q, k, v, dout, cu, causal, scale)
    cu = np.asarray(cu, np.int32)
    N = int(cu[-1])
    fwd_outs = [((N, Hq, D), dtype), ((N, Hq), "float32")]
    g_out, g_lse = run_cuda("attention_fwd", [q, k, v, cu], fwd_outs, causal=causal)
    tol = TOL[dtype]
    check(g_out.astype(np.float32), out, tol, "out")
    check(g_lse, lse, LSE_TOL, "lse")
    bwd_outs = [((N, Hq, D), dtype), ((N, Hkv, D), dtype), ((N, Hkv, D), dtype)]
    # The kernel's own out (rounded to dtype) and lse: the backward's Delta = rowsum(dout * out).
    got = run_cuda("attention_bwd", [dout, q, k, v, g_out, g_lse, cu], bwd_outs, causal=causal)
    for name, g, w in zip(("dq", "dk", "dv"), got, (dq, dk, dv)):
        check(g.astype(np.float32), w, tol, name)


def test_errors_name_the_op_and_argument():
    q = np.zeros((8, 6, 16), np.float32)
    k = np.zeros((8, 4, 16), np.float32)
    cu = np.array([0, 3, 8], np.int32)
    with pytest.raises(ShapeError, match="attention_fwd: Hq = 6 .* not a multiple of Hkv = 4"):
        run_cuda("attention_fwd", [q, k, k, cu], [((8, 6, 16), "float32"), ((8, 6), "float32")])
    q = np.zeros((8, 2, 520), np.float32)
    with pytest.raises(UnsupportedError, match="attention_fwd: head dim D = 520 .*at most 512"):
        run_cuda("attention_fwd", [q, q, q, cu], [((8, 2, 520), "float32"), ((8, 2), "float32")])
