"""The mixture-of-experts ops (cpu/moe.cpp) against torch: the router (softmax, top-k,
renormalisation) and its backward, the permutation and the weighted un-permutation, the grouped
GEMM over experts and its gradients, and transformers' load_balancing_loss_func."""

import numpy as np
import pytest
import torch

from sgtest.ops import as_dtype, assert_close, f32, run_op
from surogate.errors import InvalidArgumentError

F64 = torch.float64


def rand(shape, seed, dtype="float32", scale=1.0):
    return as_dtype(np.random.default_rng(seed).standard_normal(shape) * scale, dtype)


def route(logits, k, norm):
    p = torch.softmax(logits, dim=-1)
    w, idx = torch.topk(p, k, dim=-1)
    if norm:
        w = w / w.sum(-1, keepdim=True)
    return w, idx, p


@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("n,e,k", [(1, 4, 1), (13, 8, 2), (40, 16, 8), (7, 64, 8)])
def test_router_forward_and_backward_match_torch(n, e, k, norm):
    logits = rand((n, e), seed=e + k)
    w, idx, p = run_op("moe_router_fwd", [logits], [((n, k), "float32"), ((n, k), "int32"), ((n, e), "float32")],
                       norm_topk_prob=int(norm))
    lt = torch.tensor(logits, dtype=F64, requires_grad=True)
    rw, ridx, rp = route(lt, k, norm)
    assert np.array_equal(idx, ridx.numpy())
    assert_close(p, rp.detach().numpy(), rtol=1e-6, atol=1e-7)
    assert_close(w, rw.detach().numpy(), rtol=1e-6, atol=1e-7)
    dw, dp = rand((n, k), seed=1), rand((n, e), seed=2)
    ((rw * torch.tensor(dw, dtype=F64)).sum() + (rp * torch.tensor(dp, dtype=F64)).sum()).backward()
    (dl,) = run_op("moe_router_bwd", [dw, p, idx, dp], [((n, e), "float32")], norm_topk_prob=int(norm))
    assert_close(dl, lt.grad.numpy(), rtol=1e-5, atol=1e-6)
    (dl2,) = run_op("moe_router_bwd", [dw, p, idx], [((n, e), "float32")], norm_topk_prob=int(norm))
    lt.grad = None
    rw, _, _ = route(lt, k, norm)
    (rw * torch.tensor(dw, dtype=F64)).sum().backward()
    assert_close(dl2, lt.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_router_bf16_weights_are_the_f32_ones_rounded():
    logits = rand((9, 8), seed=3, dtype="bfloat16")
    w, idx, p = run_op("moe_router_fwd", [logits], [((9, 2), "bfloat16"), ((9, 2), "int32"), ((9, 8), "float32")],
                       norm_topk_prob=1)
    rw, ridx, _ = route(torch.tensor(f32(logits)), 2, True)
    assert np.array_equal(idx, ridx.numpy())
    assert np.array_equal(f32(w), rw.to(torch.bfloat16).float().numpy())


def permute_case(n, e, k, c, seed=0, dtype="float32"):
    rng = np.random.default_rng(seed)
    idx = np.stack([rng.permutation(e)[:k] for _ in range(n)]).astype(np.int32)
    return rand((n, c), seed, dtype), idx


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("n,e,k,c", [(1, 4, 1, 8), (17, 8, 2, 24), (33, 16, 8, 40)])
def test_permute_groups_rows_by_expert_in_token_order(n, e, k, c, dtype):
    x, idx = permute_case(n, e, k, c, dtype=dtype)
    xp, rows, offsets = run_op("moe_permute", [x, idx], [((n * k, c), dtype), ((n, k), "int32"), ((e + 1,), "int32")])
    flat = idx.reshape(-1)
    order = np.argsort(flat, kind="stable")  # (n, k) pairs by expert, token order inside
    assert np.array_equal(offsets, np.concatenate([[0], np.cumsum(np.bincount(flat, minlength=e))]))
    assert np.array_equal(rows.reshape(-1)[order], np.arange(n * k))
    assert np.array_equal(f32(xp), f32(x)[order // k])
    # The backward of the permutation is the un-permutation without weights (a sum over k).
    dxp = rand((n * k, c), 5, dtype)
    (dx,) = run_op("moe_unpermute_fwd", [dxp, rows], [((n, c), dtype)])
    ref = np.zeros((n, c))
    np.add.at(ref, order // k, f32(dxp).astype(np.float64))
    assert_close(dx, ref, dtype)


@pytest.mark.parametrize("n,e,k,c", [(1, 4, 1, 8), (17, 8, 2, 24), (33, 16, 8, 40)])
def test_unpermute_is_the_weighted_scatter_add_and_its_backward(n, e, k, c):
    x, idx = permute_case(n, e, k, c, seed=1)
    _, rows, _ = run_op("moe_permute", [x, idx], [((n * k, c), "float32"), ((n, k), "int32"), ((e + 1,), "int32")])
    yp, w = rand((n * k, c), 2), rand((n, k), 3)
    (y,) = run_op("moe_unpermute_fwd", [yp, rows, w], [((n, c), "float32")])
    ypt = torch.tensor(yp, dtype=F64, requires_grad=True)
    wt = torch.tensor(w, dtype=F64, requires_grad=True)
    ref = (ypt[torch.tensor(rows.astype(np.int64))] * wt[..., None]).sum(1)
    assert_close(y, ref.detach().numpy())
    dy = rand((n, c), 4)
    (ref * torch.tensor(dy, dtype=F64)).sum().backward()
    dyp, dw = run_op("moe_unpermute_bwd", [dy, rows, yp, w], [((n * k, c), "float32"), ((n, k), "float32")])
    assert_close(dyp, ypt.grad.numpy())
    assert_close(dw, wt.grad.numpy(), rtol=1e-5, atol=1e-5)


def grouped_case(counts, kin, nout, seed=0, dtype="float32"):
    m = sum(counts)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    return rand((m, kin), seed, dtype), rand((len(counts), nout, kin), seed + 1, dtype, 0.3), offsets


def grouped_ref(x, w, offsets, trans_b=True):
    return torch.cat([x[offsets[e]:offsets[e + 1]] @ (w[e].T if trans_b else w[e]) for e in range(len(w))])


@pytest.mark.parametrize("counts", [[5], [3, 0, 7, 1], [0, 0, 2, 0], [40, 1, 17, 0, 9, 33, 2, 64]])
def test_grouped_matmul_and_its_gradients_match_a_loop_over_experts(counts):
    kin, nout = 24, 40
    x, w, offsets = grouped_case(counts, kin, nout)
    m = len(x)
    (y,) = run_op("moe_grouped_matmul", [x, w, offsets], [((m, nout), "float32")])
    xt = torch.tensor(x, dtype=F64, requires_grad=True)
    wt = torch.tensor(w, dtype=F64, requires_grad=True)
    ref = grouped_ref(xt, wt, offsets)
    assert_close(y, ref.detach().numpy(), rtol=1e-5, atol=1e-5)
    dy = rand((m, nout), 7)
    (ref * torch.tensor(dy, dtype=F64)).sum().backward()
    # dx: the same op over W[e] untransposed ([E, out, in] read as [E, K = out, N = in]).
    (dx,) = run_op("moe_grouped_matmul", [dy, w, offsets], [((m, kin), "float32")], trans_b=0)
    assert_close(dx, xt.grad.numpy(), rtol=1e-5, atol=1e-5)
    dw0 = rand(w.shape, 8)
    (dw,) = run_op("moe_grouped_matmul_wgrad", [dy, x, offsets], [dw0.copy()], accumulate=1)
    assert_close(dw, wt.grad.numpy() + dw0, rtol=1e-5, atol=1e-5)
    (dw,) = run_op("moe_grouped_matmul_wgrad", [dy, x, offsets], [dw0.copy()])
    assert_close(dw, wt.grad.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_grouped_matmul_low_precision_rounds_the_f32_product_once(dtype):
    x, w, offsets = grouped_case([6, 0, 11], 32, 16, dtype=dtype)
    (y,) = run_op("moe_grouped_matmul", [x, w, offsets], [((17, 16), dtype)])
    ref = grouped_ref(torch.tensor(f32(x)), torch.tensor(f32(w)), offsets)
    assert_close(y, ref.numpy(), dtype)


def test_grouped_matmul_refuses_offsets_that_do_not_cover_the_rows():
    x, w, offsets = grouped_case([3, 4], 8, 8)
    offsets[-1] = 6
    with pytest.raises(InvalidArgumentError, match="offsets run from 0 to 6, expected 0 to M = 7"):
        run_op("moe_grouped_matmul", [x, w, offsets], [((7, 8), "float32")])


def test_permute_refuses_an_expert_index_out_of_range():
    x, idx = permute_case(3, 4, 2, 8)
    idx[1, 1] = 4
    with pytest.raises(InvalidArgumentError, match=r"idx\[3\] = 4 is outside \[0, 4\)"):
        run_op("moe_permute", [x, idx], [((6, 8), "float32"), ((3, 2), "int32"), ((5,), "int32")])


@pytest.mark.parametrize("layers,n,e,k", [(1, 11, 4, 1), (3, 23, 8, 2), (2, 9, 16, 8)])
def test_aux_loss_equals_transformers_load_balancing_loss(layers, n, e, k):
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    logits = [rand((n, e), seed=l) for l in range(layers)]
    ins = []
    for lg in logits:
        _, idx, p = run_op("moe_router_fwd", [lg], [((n, k), "float32"), ((n, k), "int32"), ((n, e), "float32")])
        ins += [p, idx]
    loss, counts = run_op("moe_aux_loss_fwd", ins, [((1,), "float32"), ((e,), "float32")])
    lts = tuple(torch.tensor(lg, dtype=F64, requires_grad=True) for lg in logits)
    ref = load_balancing_loss_func(lts, e, k)
    assert loss[0] == pytest.approx(ref.item(), rel=1e-6)
    assert counts.sum() == layers * n * k
    ref.backward()
    (dp,) = run_op("moe_aux_loss_bwd", [np.array([1.0], np.float32), counts], [((n, e), "float32")],
                   num_layers=layers)
    for l, lt in enumerate(lts):  # through each router's softmax backward
        (dl,) = run_op("moe_router_bwd", [np.zeros((n, k), np.float32), ins[2 * l], ins[2 * l + 1], dp],
                       [((n, e), "float32")])
        assert_close(dl, lt.grad.numpy(), rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("layers,n,e", [(1, 11, 4), (3, 23, 8), (2, 9, 128)])
def test_z_loss_equals_switch_transformers_router_z_loss(layers, n, e):
    """ST-MoE's z-loss as transformers writes it (router_z_loss_func), over the layers'
    logits concatenated along the tokens as SwitchTransformers passes them; the backward is
    torch's gradient of that, one layer at a time."""
    from transformers.models.switch_transformers.modeling_switch_transformers import router_z_loss_func

    logits = [rand((n, e), seed=l, scale=3.0) for l in range(layers)]
    (loss,) = run_op("moe_z_loss_fwd", logits, [((1,), "float32")])
    lts = [torch.tensor(lg, dtype=F64, requires_grad=True) for lg in logits]
    ref = router_z_loss_func(torch.cat(lts)[None])
    assert loss[0] == pytest.approx(ref.item(), rel=1e-6)
    (0.5 * ref).backward()
    for lg, lt in zip(logits, lts):
        (dl,) = run_op("moe_z_loss_bwd", [np.array([0.5], np.float32), lg], [((n, e), "float32")],
                       num_layers=layers)
        assert_close(dl, lt.grad.numpy(), rtol=1e-5, atol=1e-8)


def test_z_loss_bf16_reads_the_rounded_logits():
    lg = as_dtype(rand((7, 16), seed=3, scale=2.0), "bfloat16")
    (loss,) = run_op("moe_z_loss_fwd", [lg], [((1,), "float32")])
    want = torch.logsumexp(torch.tensor(f32(lg), dtype=F64), -1).pow(2).mean().item()
    assert loss[0] == pytest.approx(want, rel=1e-5)
    (dl,) = run_op("moe_z_loss_bwd", [np.array([1.0], np.float32), lg], [((7, 16), "bfloat16")], num_layers=1)
    t = torch.tensor(f32(lg), dtype=F64, requires_grad=True)
    torch.logsumexp(t, -1).pow(2).mean().backward()
    assert_close(f32(dl), t.grad.numpy(), rtol=1e-2, atol=1e-4)


def test_z_loss_refuses_layers_of_different_shapes():
    with pytest.raises(InvalidArgumentError, match="moe_z_loss_fwd"):
        run_op("moe_z_loss_fwd", [rand((4, 8), 0), rand((5, 8), 1)], [((1,), "float32")])
