"""qkv_rope_cache on the GPU (kernels_native/cuda/qkv_rope_cache.cu) against the CPU op, which
test_qkv_rope_cache.py checks bit for bit against the ops it fuses.

Caches start as garbage, so a wrong or extra slot shows; v rows and every slot left alone must be
equal to the bit, q and the roped k within the storage dtype's tolerance. Shapes cover the 16-byte
pack path and the single-element path (head dims, rotary dims and row strides off the packs),
the kernel's CTA shapes (several tokens a CTA, a token's heads over several CTAs), rows of a fused
projection (strided views in a Program) and a Program replayed as a CUDA graph with new positions
and slots each step.
"""

import numpy as np
import pytest
from sgtest.ops import as_dtype, assert_close
from sgtest.qkv import ROPE, make_case

from surogate import _native

pytestmark = pytest.mark.cuda

HAS_CUDA = bool(_native.build_info()["cuda"]) and len(_native.cuda_devices()) > 0
if not HAS_CUDA:
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)

COVERS = ("qkv_rope_cache",)

DTYPES = ["float32", "bfloat16", "float16"]

def run(device, c, norm, **attrs):
    """qkv_rope_cache on `device`; returns (q_out, k_cache, v_cache) as numpy."""
    names = ["q", "k", "v", "pos", "slots"] + (["q_norm", "k_norm"] if norm else [])
    q = c["q"]
    if device == "cpu":
        outs = [np.zeros(q.shape, q.dtype), c["k_cache"].copy(), c["v_cache"].copy()]
        _native.call_op("qkv_rope_cache", [c[n] for n in names], outs, attrs)
        return outs
    ins = [_native.tensor(np.ascontiguousarray(c[n])).to("cuda") for n in names]
    outs = [_native.zeros(list(q.shape), str(q.dtype), "cuda"), _native.tensor(c["k_cache"].copy()).to("cuda"),
            _native.tensor(c["v_cache"].copy()).to("cuda")]
    _native.call_op("qkv_rope_cache", ins, outs, attrs)
    return [o.to("cpu").numpy() for o in outs]


def assert_matches(got, want, c):
    """q and k within tolerance; v rows and the slots nobody wrote equal to the bit."""
    dtype = str(c["q"].dtype)
    q_got, k_got, v_got = got
    q_want, k_want, v_want = want
    assert_close(q_got.astype(np.float32), q_want.astype(np.float32), dtype)
    assert_close(k_got.astype(np.float32), k_want.astype(np.float32), dtype)
    np.testing.assert_array_equal(v_got.view(np.uint8), v_want.view(np.uint8))
    hkv, d = k_want.shape[2:]
    written = c["slots"][c["slots"] >= 0]
    kept = np.setdiff1d(np.arange(k_want.shape[0] * k_want.shape[1]), written)
    np.testing.assert_array_equal(k_got.reshape(-1, hkv, d)[kept].view(np.uint8),
                                  c["k_cache"].reshape(-1, hkv, d)[kept].view(np.uint8))


def check(c, norm, **attrs):
    assert_matches(run("cuda", c, norm, **attrs), run("cpu", c, norm, **attrs), c)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("rope", sorted(ROPE))
def test_matches_cpu(dtype, norm, rope):
    check(make_case(1, 37, 8, 2, 64, dtype, num_blocks=12), norm, eps=1e-5, **ROPE[rope])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d,r", [(256, 256), (64, 32), (72, 72)])
def test_weight_offset_matches_cpu(dtype, d, r):
    """Gemma's (1 + w) norms (head 256 as Gemma 3's, a partial rotary, single-element units)."""
    check(make_case(3, 19, 8, 4, d, dtype, num_blocks=12), True, weight_offset=1.0, rotary_dim=r, theta=10_000.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("d,r", [(128, 128), (80, 32), (128, 64), (256, 256), (64, 2), (34, 34), (72, 72), (512, 512),
                                 (96, 48), (512, 128), (512, 64)])
def test_head_and_rotary_dims(dtype, norm, d, r):
    # 16-byte packs where D and half divide them, single elements otherwise (half 1, 17, 36 for bf16);
    # D = 512 takes two packs a lane for f32 (half 256), and for every dtype when D - R is past 32
    # packs (512 - 128, 512 - 64).
    check(make_case(d + r, 19, 4, 2, d, dtype), norm, rotary_dim=r)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", [True, False])
def test_gemma4_global_head(dtype, norm):
    # Gemma 4's full-attention layers: heads of 512, the proportional rope (64 of the 256 pairs
    # rotate), norms with and without Gemma's weight offset.
    c = make_case(512, 7, 8, 1, 512, dtype)
    check(c, norm, rotary_dim=512, rope_type="proportional", rope_angles=64)
    check(c, norm, rotary_dim=512, rope_type="proportional", rope_angles=64, weight_offset=1.0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("n", [1, 3, 300])
def test_heads_over_several_ctas(dtype, n):
    # 64 + 2 x 8 = 80 head tasks a token, more than one CTA holds: 3 CTAs a token in bf16 (27 tasks
    # each, the last 26), 5 in f32 (16 each); one decode token, a few, a prefill chunk.
    c = make_case(n, n, 64, 8, 128, dtype, num_blocks=80, block_size=4, pad=(0, 2) if n > 2 else ())
    check(c, True)
    check(c, False)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("hq,hkv,d", [(2, 1, 16), (3, 1, 32)])
@pytest.mark.parametrize("n", [1, 37, 63, 64, 65, 130])
def test_several_tokens_per_cta(dtype, norm, hq, hkv, d, n):
    # Small heads: a CTA holds the tasks of many tokens (64 or 32 tokens of 4 heads with D = 16,
    # 25 or 12 of 5 heads with D = 32), so token counts off those multiples leave a last CTA part
    # empty, and 25 x 5 x 2 lanes leave a warp part empty.
    c = make_case(100 + n, n, hq, hkv, d, dtype, num_blocks=n // 4 + 2)
    check(c, norm, eps=1e-6, **ROPE["llama3"])


def test_out_of_range_slot_skips_the_token():
    # The CPU op rejects such a slot; on the GPU (no host reads) it is skipped like -1.
    c = make_case(7, 6, 4, 2, 64, "bfloat16", pad=())
    c["slots"][2] = 7 * 4 + 3
    got = run("cuda", c, True)
    c["slots"][2] = -1
    assert_matches(got, run("cpu", c, True), c)


def test_no_tokens():
    c = make_case(8, 0, 4, 2, 64, "float32", pad=())
    q, kc, _ = run("cuda", c, True)
    assert q.shape == (0, 4, 64)
    np.testing.assert_array_equal(kc, c["k_cache"])


# ---- rows of a fused projection, in a Program (eager and as a CUDA graph) --------------------------

def fused_program(device, n, hq, hkv, d, dtype, norm, width, attrs):
    """qkv_rope_cache reading q, k, v as column slices of one external [n, width] projection."""
    p = _native.Program(device)
    ids = {"qkv": p.external("qkv", [n, width], dtype)}
    ins = [p.view("q", ids["qkv"], [n, hq, d], 0, [width, d, 1]),
           p.view("k", ids["qkv"], [n, hkv, d], hq * d, [width, d, 1]),
           p.view("v", ids["qkv"], [n, hkv, d], (hq + hkv) * d, [width, d, 1])]
    specs = [("pos", [n], "int32"), ("slots", [n], "int32"), ("q_out", [n, hq, d], dtype),
             ("k_cache", [7, 4, hkv, d], dtype), ("v_cache", [7, 4, hkv, d], dtype)]
    if norm:
        specs += [("q_norm", [d], dtype), ("k_norm", [d], dtype)]
    for name, shape, dt in specs:
        ids[name] = p.external(name, shape, dt)
    ins += [ids["pos"], ids["slots"]] + ([ids["q_norm"], ids["k_norm"]] if norm else [])
    p.op("qkv_rope_cache", ins, [ids["q_out"], ids["k_cache"], ids["v_cache"]], attrs)
    return p, ids


def qkv_rows(c, width):
    n = c["q"].shape[0]
    rows = np.concatenate([c["q"].reshape(n, -1), c["k"].reshape(n, -1), c["v"].reshape(n, -1)], axis=1)
    out = np.zeros((n, width), rows.dtype)
    out[:, :rows.shape[1]] = rows
    return out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("extra", [0, 8, 1])  # row stride a multiple of the packs, or not (single elements)
def test_rows_of_a_fused_projection(dtype, norm, extra):
    n, hq, hkv, d = 11, 8, 2, 64
    c = make_case(9 + extra, n, hq, hkv, d, dtype)
    width = (hq + 2 * hkv) * d + extra
    p, ids = fused_program("cuda", n, hq, hkv, d, dtype, norm, width, {"eps": 1e-6})
    bound = {"qkv": qkv_rows(c, width), "q_out": np.zeros(c["q"].shape, c["q"].dtype)}
    bound.update({k: c[k] for k in ("pos", "slots", "k_cache", "v_cache", "q_norm", "k_norm") if k in ids})
    tensors = {k: _native.tensor(np.ascontiguousarray(x)).to("cuda") for k, x in bound.items()}
    for k, t in tensors.items():
        p.bind(ids[k], t)
    p.run()
    got = [tensors[k].to("cpu").numpy() for k in ("q_out", "k_cache", "v_cache")]
    assert_matches(got, run("cpu", c, norm, eps=1e-6), c)


@pytest.mark.parametrize("norm", [True, False])
def test_replayed_as_a_cuda_graph(norm):
    # Decode steps of 3 sequences: the graph is captured on the second run and replayed after,
    # reading each step's positions and slots from the device.
    n, hq, hkv, d, dtype = 3, 8, 2, 64, "bfloat16"
    width = (hq + 2 * hkv) * d
    c = make_case(10, n, hq, hkv, d, dtype, pad=())
    p, ids = fused_program("cuda", n, hq, hkv, d, dtype, norm, width, {"eps": 1e-6, **ROPE["llama3"]})
    tensors = {"qkv": _native.tensor(qkv_rows(c, width)).to("cuda"),
               "q_out": _native.zeros([n, hq, d], dtype, "cuda"),
               "k_cache": _native.tensor(c["k_cache"].copy()).to("cuda"),
               "v_cache": _native.tensor(c["v_cache"].copy()).to("cuda")}
    for k in ("pos", "slots", "q_norm", "k_norm"):
        if k in ids:
            tensors[k] = _native.tensor(np.ascontiguousarray(c[k])).to("cuda")
    for k, t in tensors.items():
        p.bind(ids[k], t)
    p.set_graphs(True)
    rng = np.random.default_rng(11)
    for step in range(4):
        c["q"] = as_dtype(rng.standard_normal(c["q"].shape).astype(np.float32), dtype)
        c["k"] = as_dtype(rng.standard_normal(c["k"].shape).astype(np.float32), dtype)
        c["v"] = as_dtype(rng.standard_normal(c["v"].shape).astype(np.float32), dtype)
        c["pos"] = (c["pos"] + 1 + step).astype(np.int32)
        c["slots"] = rng.permutation(28)[:n].astype(np.int32)
        c["slots"][step % n] = -1
        for k in ("pos", "slots"):
            tensors[k].copy_from(c[k])
        tensors["qkv"].copy_from(qkv_rows(c, width))
        want = run("cpu", c, norm, eps=1e-6, **ROPE["llama3"])
        p.run()
        got = [tensors[k].to("cpu").numpy() for k in ("q_out", "k_cache", "v_cache")]
        assert_matches(got, want, c)
        c["k_cache"], c["v_cache"] = want[1], want[2]  # the next step writes over this one's cache
    assert p.graphs_active and p.num_graphs == 1
