"""The ops Gemma 4 added, on the CPU, against torch: act_mul (gelu_tanh(a) * b, and a * one
value), its backward, softcap_fwd, and the proportional rope against transformers' own
_compute_proportional_rope_parameters."""

import numpy as np
import pytest
import torch

from sgtest.ops import as_dtype, assert_close, run_op
from surogate import _native
from surogate.errors import SurogateError


def rand(shape, seed=0, scale=2.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_act_mul_gelu_forward_and_backward_equal_torch(dtype):
    a, b, dy = (as_dtype(rand((7, 33), s), dtype) for s in (1, 2, 3))
    (y,) = run_op("act_mul_fwd", [a, b], [((7, 33), dtype)], act="gelu_tanh")
    da, db = run_op("act_mul_bwd", [dy, a, b], [((7, 33), dtype), ((7, 33), dtype)], act="gelu_tanh")
    ta, tb = (torch.tensor(x.astype(np.float64), requires_grad=True) for x in (a, b))
    ty = torch.nn.functional.gelu(ta, approximate="tanh") * tb
    ty.backward(torch.tensor(dy.astype(np.float64)))
    assert_close(y.astype(np.float32), ty.detach().numpy(), dtype)
    assert_close(da.astype(np.float32), ta.grad.numpy(), dtype)
    assert_close(db.astype(np.float32), tb.grad.numpy(), dtype)


def test_act_mul_by_one_value_scales_and_its_gradient_is_refused():
    a, dy = rand((5, 9), 1), rand((5, 9), 2)
    s = np.array([0.37], np.float32)
    (y,) = run_op("act_mul_fwd", [a, s], [((5, 9), "float32")])
    np.testing.assert_array_equal(y, a * s[0])
    da = np.zeros((5, 9), np.float32)
    _native.call_op("act_mul_bwd", [dy, a, s], [da, None], {})
    np.testing.assert_array_equal(da, dy * s[0])
    with pytest.raises(SurogateError, match="broadcast"):
        run_op("act_mul_bwd", [dy, a, s], [((5, 9), "float32"), ((1,), "float32")])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_softcap_equals_hf_three_roundings(dtype):
    x = as_dtype(rand((4, 50), 4, scale=40.0), dtype)
    (y,) = run_op("softcap_fwd", [x], [((4, 50), dtype)], cap=30.0)
    t = torch.tensor(x.astype(np.float32)).to(torch.bfloat16 if dtype == "bfloat16" else torch.float32)
    ref = (torch.tanh(t / 30.0) * 30.0).float().numpy()
    assert_close(y.astype(np.float32), ref, dtype)
    with pytest.raises(SurogateError, match="cap must be > 0"):
        run_op("softcap_fwd", [x], [((4, 50), dtype)], cap=0.0)


def test_proportional_rope_rotates_the_first_pairs_at_hf_frequencies():
    from transformers.modeling_rope_utils import _compute_proportional_rope_parameters

    class Cfg:  # what the HF function reads of a config
        head_dim, hidden_size, num_attention_heads = 32, 64, 2
        rope_parameters = {"rope_type": "proportional", "rope_theta": 1e6, "partial_rotary_factor": 0.25}

        def standardize_rope_params(self):
            pass

    inv, _ = _compute_proportional_rope_parameters(Cfg())
    D, N = 32, 6
    x = rand((N, 2, D), 5)
    pos = np.arange(3, 3 + N, dtype=np.int32)
    (y,) = run_op("rope_fwd", [x, pos], [((N, 2, D), "float32")], theta=1e6, rope_type="proportional",
                  rope_angles=int(0.25 * D // 2), rotary_dim=D)
    freqs = torch.tensor(pos, dtype=torch.float32)[:, None] * inv[None]
    emb = torch.cat((freqs, freqs), -1)
    tx = torch.tensor(x)
    rot = torch.cat((-tx[..., D // 2:], tx[..., :D // 2]), -1)
    ref = tx * emb.cos()[:, None] + rot * emb.sin()[:, None]
    np.testing.assert_allclose(y, ref.numpy(), atol=1e-6, rtol=0)
    np.testing.assert_array_equal(y[..., 4:16], x[..., 4:16])  # pairs past rope_angles pass through
