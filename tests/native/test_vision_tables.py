"""The ops Qwen3-VL's vision tower added, on the CPU, against torch: rope_table (RoPE by per-token
cos / sin tables: transformers' apply_rotary_pos_emb_vision), embedding_bag (a weighted gather of
table rows: F.embedding_bag(mode="sum", per_sample_weights)) and act_mul's act "gelu" (the exact
erf GELU: F.gelu), forward and backward; rope_table's derivative rule through a compiled Program."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sgtest.ops import as_dtype, assert_close, f32, run_op
from surogate import _native
from surogate.autodiff import backward
from surogate.compile import Executable
from surogate.dsl import Graph, ops

DTYPES = ["float32", "bfloat16"]


def rand(shape, dtype="float32", seed=0, scale=1.0):
    return as_dtype(np.random.default_rng(seed).standard_normal(shape) * scale, dtype)


def close(actual, expected, dtype):
    if dtype == "float32":
        assert_close(actual, expected, rtol=1e-5, atol=2e-5)
    else:
        assert_close(f32(actual), expected, dtype, atol=2e-2)


def torch_rope_vision(x, cos, sin):
    """transformers' apply_rotary_pos_emb_vision on one tensor: cos / sin [N, D] (the half repeated)."""
    def rotate_half(t):
        t1, t2 = t[..., : t.shape[-1] // 2], t[..., t.shape[-1] // 2:]
        return torch.cat((-t2, t1), dim=-1)
    c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)
    return x * c + rotate_half(x) * s


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rotary", ["full", "partial"])
def test_rope_table_matches_hf_rotation(dtype, rotary):
    N, H, D = 7, 3, 16
    half = D // 2 if rotary == "full" else D // 4
    x = rand((N, H, D), dtype, seed=1)
    ang = np.random.default_rng(2).uniform(-40, 40, (N, half)).astype(np.float32)
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    (y,) = run_op("rope_table_fwd", [x, cos, sin], [((N, H, D), dtype)])
    xt = torch.tensor(f32(x), dtype=torch.float64)
    R = 2 * half
    c = torch.tensor(np.concatenate([cos, cos], 1), dtype=torch.float64)
    s = torch.tensor(np.concatenate([sin, sin], 1), dtype=torch.float64)
    want = torch.cat([torch_rope_vision(xt[..., :R], c, s), xt[..., R:]], dim=-1)
    close(y, want.numpy(), dtype)
    # Backward: the transpose, <rope(x), dy> = <x, rope_bwd(dy)>.
    dy = rand((N, H, D), dtype, seed=3)
    (dx,) = run_op("rope_table_bwd", [dy, cos, sin], [((N, H, D), dtype)])
    xg = xt.clone().requires_grad_(True)
    torch.cat([torch_rope_vision(xg[..., :R], c, s), xg[..., R:]], dim=-1).backward(
        torch.tensor(f32(dy), dtype=torch.float64))
    close(dx, xg.grad.numpy(), dtype)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_rope_table_round_products_is_hf_text_rope_bit_for_bit(dtype):
    """round_products: transformers' apply_rotary_pos_emb in bf16 / f16 (cos / sin cast to the
    dtype, each product and the sum rounded), forward and autograd's backward, bit for bit."""
    N, H, D = 9, 3, 16
    tdt = getattr(torch, dtype)
    x = rand((N, H, D), dtype, seed=11, scale=3.0)
    ang = np.random.default_rng(12).uniform(-50, 50, (N, D // 2)).astype(np.float32)
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    (y,) = run_op("rope_table_fwd", [x, cos, sin], [((N, H, D), dtype)], round_products=1)
    c = torch.tensor(np.concatenate([cos, cos], 1)).to(tdt)
    s = torch.tensor(np.concatenate([sin, sin], 1)).to(tdt)
    xt = torch.tensor(f32(x)).to(tdt).requires_grad_(True)
    want = torch_rope_vision(xt, c, s)
    np.testing.assert_array_equal(f32(y), want.detach().float().numpy())
    dy = rand((N, H, D), dtype, seed=13)
    want.backward(torch.tensor(f32(dy)).to(tdt))
    (dx,) = run_op("rope_table_bwd", [dy, cos, sin], [((N, H, D), dtype)], round_products=1)
    np.testing.assert_array_equal(f32(dx), xt.grad.float().numpy())
    (plain,) = run_op("rope_table_fwd", [x, cos, sin], [((N, H, D), dtype)])
    assert not np.array_equal(f32(plain), f32(y))  # the option changes the rounding


def test_rope_table_in_place_and_errors():
    N, H, D = 4, 2, 8
    x = rand((N, H, D), seed=4)
    ang = np.random.default_rng(5).uniform(-3, 3, (N, D // 2)).astype(np.float32)
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    (want,) = run_op("rope_table_fwd", [x, cos, sin], [((N, H, D), "float32")])
    run_op("rope_table_fwd", [x, cos, sin], [x])  # y aliasing x
    np.testing.assert_array_equal(x, want)
    with pytest.raises(Exception, match="rotary dims"):
        run_op("rope_table_fwd", [x, np.zeros((N, D), np.float32), np.zeros((N, D), np.float32)],
               [((N, H, D), "float32")])
    with pytest.raises(Exception, match="rows"):
        run_op("rope_table_fwd", [x, cos[:2], sin[:2]], [((N, H, D), "float32")])


def test_rope_table_rule_through_a_program():
    N, H, D = 5, 2, 8
    x, P = rand((N, H * D), seed=6), rand((H * D, H * D), seed=7, scale=0.3)
    ang = np.random.default_rng(8).uniform(-5, 5, (N, D // 2)).astype(np.float32)
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    g = Graph("t")
    p = g.param("P", P.shape, "float32")
    xi, ci, si = (g.input(k, v.shape, "float32") for k, v in (("x", x), ("cos", cos), ("sin", sin)))
    h = ops.view(ops.linear(xi, p, name="h"), (N, H, D))
    y = ops.rope_table(h, ci, si)
    grads = backward(g, y, seed_name="dy")
    dy = rand((N, H, D), seed=9)
    exe = Executable(g, {}, keep=[y])
    for k, v in {"P": P, "x": x, "cos": cos, "sin": sin, "dy": dy}.items():
        exe.bind(k, np.ascontiguousarray(v))
    dP = np.zeros(P.shape, np.float32)
    exe.bind(grads["P"].name, dP)
    exe.run()
    Pt = torch.tensor(P, dtype=torch.float64, requires_grad=True)
    ht = (torch.tensor(x, dtype=torch.float64) @ Pt.T).view(N, H, D)
    c = torch.tensor(np.concatenate([cos, cos], 1), dtype=torch.float64)
    s = torch.tensor(np.concatenate([sin, sin], 1), dtype=torch.float64)
    yt = torch_rope_vision(ht, c, s)
    yt.backward(torch.tensor(dy, dtype=torch.float64))
    assert_close(exe.read(y.name), yt.detach().numpy(), rtol=1e-5, atol=1e-5)
    assert_close(dP, Pt.grad.numpy(), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_bag_matches_torch(dtype):
    V, C, N, K = 16, 12, 9, 4
    table = rand((V, C), dtype, seed=10)
    rng = np.random.default_rng(11)
    ids = rng.integers(0, V, (N, K)).astype(np.int32)
    w = rng.uniform(0, 1, (N, K)).astype(np.float32)
    (y,) = run_op("embedding_bag_fwd", [ids, w, table], [((N, C), dtype)])
    want = F.embedding_bag(torch.tensor(ids, dtype=torch.long), torch.tensor(f32(table), dtype=torch.float64),
                           mode="sum", per_sample_weights=torch.tensor(w, dtype=torch.float64))
    close(y, want.numpy(), dtype)


def test_embedding_bag_names_an_id_out_of_range():
    ids = np.array([[0, 1], [2, 16]], np.int32)
    with pytest.raises(Exception, match=r"ids\[1, 1\] = 16 is out of range for a table of 16 rows"):
        run_op("embedding_bag_fwd", [ids, np.ones((2, 2), np.float32), np.zeros((16, 4), np.float32)],
               [((2, 4), "float32")])


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_exact_forward_and_backward(dtype):
    x = rand((6, 40), dtype, seed=12, scale=3.0)
    (y,) = run_op("act_mul_fwd", [x, None], [(x.shape, dtype)], act="gelu")
    xt = torch.tensor(f32(x), dtype=torch.float64, requires_grad=True)
    yt = F.gelu(xt)
    close(y, yt.detach().numpy(), dtype)
    dy = rand(x.shape, dtype, seed=13)
    dx = as_dtype(np.zeros(x.shape), dtype)
    _native.call_op("act_mul_bwd", [dy, x, None], [dx, None], {"act": "gelu"})
    yt.backward(torch.tensor(f32(dy), dtype=torch.float64))
    close(dx, xt.grad.numpy(), dtype)
