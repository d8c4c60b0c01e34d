"""The fp8_hybrid recipe's compile pass (surogate/compile/fp8.py): which projections it picks, and
one projection's forward and gradients through the lowered Program against torch doing the same
quantization (e4m3 x and W, e5m2 dy, per-tensor current scaling) in float64.

Shape letters: N tokens, I input and O output features of the projection.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from surogate.autodiff import backward  # noqa: E402
from surogate.compile import Executable  # noqa: E402
from surogate.compile.fp8 import Fp8Recipe, mark_fp8  # noqa: E402
from surogate.dsl import Graph, ops  # noqa: E402
from surogate.dsl.nn import CausalLM, LoRAConfig, ModelSpec  # noqa: E402

N, I, O = 32, 48, 64


def quant(t: torch.Tensor, dtype, fp8_max):
    """(codes as float64, scale_inv) the way quantize_fp8 makes them, in torch."""
    t = t.float()
    s = torch.tensor(fp8_max, dtype=torch.float32) / t.abs().max()
    return (t * s).clamp(-fp8_max, fp8_max).to(dtype).double(), (1.0 / s).double()


def e4m3(t):
    return quant(t, torch.float8_e4m3fn, 448.0)


def e5m2(t):
    return quant(t, torch.float8_e5m2, 57344.0)


def projection_graph(bias: bool):
    """p -> x = p * 1 (an activation, so dx is asked for) -> y = x @ W^T (+ b), W a block projection."""
    g = Graph()
    p = g.param("p", (N, I), "float32")
    w = g.param("layers.0.mlp.down_proj.weight", (O, I), "float32")
    b = g.param("layers.0.mlp.down_proj.bias", (O,), "float32") if bias else None
    x = ops.scale(p, 1.0, name="x")
    y = ops.linear(x, w, b, name="layers.0.mlp.down_proj")
    return g, y


@pytest.mark.parametrize("bias", [False, True])
def test_projection_forward_and_gradients_match_torch(bias):
    g, y = projection_graph(bias)
    assert mark_fp8(g, Fp8Recipe()) == ["layers.0.mlp.down_proj.weight"]
    backward(g, y, seed_name="dy")
    exe = Executable(g, {}, keep=[y, g.values["x.grad"]])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, I)).astype(np.float32)
    w = (rng.standard_normal((O, I)) * 0.05).astype(np.float32)
    b = rng.standard_normal(O).astype(np.float32)
    dy = (rng.standard_normal((N, O)) * 1e-3).astype(np.float32)
    exe.bind("p", x)
    exe.bind("layers.0.mlp.down_proj.weight", w)
    exe.bind("dy", dy)
    grads = {n: np.zeros(exe.buf(n).shape, np.float32) for n in exe.external_names("grad")}
    if bias:
        exe.bind("layers.0.mlp.down_proj.bias", b)
    for n, a in grads.items():
        exe.bind(n, a)
    exe.run()
    assert [i.op for i in exe.lowered.instrs].count("matmul_fp8") == 3

    xq, sx = e4m3(torch.from_numpy(x))
    wq, sw = e4m3(torch.from_numpy(w))
    dyq, sdy = e5m2(torch.from_numpy(dy))
    y_ref = (xq @ wq.T) * sx * sw + (torch.from_numpy(b).double() if bias else 0)
    dx_ref = (dyq @ wq) * sdy * sw  # dx = e5m2(dy) @ e4m3(W)
    dw_ref = (dyq.T @ xq) * sdy * sx  # dW = e5m2(dy)^T @ e4m3(x)
    close = lambda a, r: np.testing.assert_allclose(a, r.numpy(), rtol=1e-5, atol=1e-6 * float(r.abs().max()))
    close(exe.read(y.name), y_ref)
    close(exe.read("x.grad"), dx_ref)
    close(grads["grad.layers.0.mlp.down_proj.weight"], dw_ref)
    if bias:  # the bias gradient stays an ordinary sum of dy
        np.testing.assert_allclose(grads["grad.layers.0.mlp.down_proj.bias"], dy.sum(0), rtol=1e-5, atol=1e-7)
    # FP8's error against the plain f32 projection: a few percent, not more.
    plain = x @ w.T + (b if bias else 0)
    assert np.abs(exe.read(y.name) - plain).max() < 0.1 * np.abs(plain).max()


def spec(layers=4, intermediate_size=48):
    return ModelSpec(family="llama", vocab_size=64, hidden_size=32, num_layers=layers, num_heads=2, num_kv_heads=1,
                     head_dim=16, intermediate_size=intermediate_size)


def fp8_weights(g):
    return sorted(n.inputs[1].name for n in g.nodes if n.op == "linear" and n.attrs.get("fp8"))


def test_the_block_projections_are_picked_and_nothing_else():
    g = CausalLM(spec()).build(mode="train", lora=LoRAConfig(rank=2, alpha=4))
    marked = mark_fp8(g, Fp8Recipe())
    assert fp8_weights(g) == sorted(marked)
    per_layer = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_up_proj",
                 "mlp.down_proj"}
    assert set(marked) == {f"layers.{i}.{m}.weight" for i in range(4) for m in per_layer}
    backward(g, g.outputs["loss"])
    exe = Executable(g, {"N": 32, "S1": 2})
    ops_ = [i.op for i in exe.lowered.instrs]
    # LoRA's skinny matmuls and the head stay in the model's dtype; frozen W: dx only (one FP8 GEMM),
    # except the first block's q / k / v, whose input gradient would only reach the frozen embedding.
    assert ops_.count("matmul_fp8") == 4 * 6 + 4 * 6 - 3
    assert "lm_head_ce_fwd" in ops_ and ops_.count("matmul") >= 4 * 7 * 2


def test_skip_quant_keeps_the_edge_blocks_and_odd_widths_out():
    g = CausalLM(spec()).build(mode="train")
    marked = mark_fp8(g, Fp8Recipe(skip_first_layers=1, skip_last_layers=2))
    assert {m.split(".")[1] for m in marked} == {"1"}
    g = CausalLM(spec(layers=2, intermediate_size=36)).build(mode="train")  # 36 (72 fused): not multiples of 16
    assert not any("gate_up" in m or "down_proj" in m for m in mark_fp8(g, Fp8Recipe()))


def test_projections_reading_one_tensor_share_its_quantized_copy():
    g = CausalLM(spec(layers=1)).build(mode="train")
    mark_fp8(g, Fp8Recipe())
    backward(g, g.outputs["loss"])
    instrs = Executable(g, {"N": 32, "S1": 2}).lowered.instrs
    sources = [(i.inputs[0].name, i.outputs[0].dtype, i.attrs.get("transpose", 0)) for i in instrs
               if i.op == "quantize_fp8"]
    assert len(sources) == len(set(sources))  # no tensor quantized twice the same way
    # Forward: the 4 distinct inputs (q / k / v share theirs) and the 6 weights; backward (full
    # fine-tune): per projection dy, dy^T and W^T, and x^T of the 4 distinct inputs.
    assert len(sources) == (4 + 6) + (6 * 3 + 4), sources
