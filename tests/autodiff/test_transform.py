import pytest

from surogate.autodiff import backward, needs_grad
from surogate.dsl import Graph, ops
from surogate.dsl.nn import CausalLM, LoRAConfig, ModelSpec
from surogate.errors import NotFoundError, UnsupportedError


def spec():
    return ModelSpec(family="llama", vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1,
                     head_dim=8, intermediate_size=24)


def test_full_finetune_gives_every_param_a_gradient():
    g = CausalLM(spec()).build(mode="train")
    grads = backward(g, g.outputs["loss"])
    assert set(grads) == {p.name for p in g.params()}
    ops = [n.op for n in g.nodes]
    assert "embedding_bwd" in ops and "lm_head_ce_bwd" in ops and "attention_bwd" in ops


def test_lora_leaves_base_weights_without_gradients_but_flows_through_them():
    g = CausalLM(spec()).build(mode="train", lora=LoRAConfig(rank=2, alpha=4))
    grads = backward(g, g.outputs["loss"])
    assert all(".lora_" in name for name in grads)
    ops = [n.op for n in g.nodes]
    assert "embedding_bwd" not in ops  # the frozen embedding gets nothing
    # the first block's q/k/v LoRA gradients need the input gradient of attention
    assert "attention_bwd" in ops
    need = needs_grad(g)
    assert g.values["embed"] not in need


def test_missing_rule_names_the_op():
    g = Graph()
    w = g.param("w", (4,), "float32")
    (y,) = g.node("mystery_op", [w], [("y", (4,), "float32")])
    with pytest.raises(NotFoundError, match="mystery_op"):
        backward(g, y)


def test_serving_ops_refuse_a_backward_pass():
    g = Graph()
    q = g.param("q", (3, 2, 8), "float32")
    k, v = g.param("k", (3, 1, 8), "float32"), g.param("v", (3, 1, 8), "float32")
    pos, slots = g.input("pos", (3,), "int32"), g.input("slots", (3,), "int32")
    k_cache, v_cache = g.input("k_cache", (2, 4, 1, 8), "float32"), g.input("v_cache", (2, 4, 1, 8), "float32")
    q_out = ops.qkv_rope_cache(q, k, v, pos, slots, k_cache, v_cache, {"theta": 10000.0})
    with pytest.raises(UnsupportedError, match="qkv_rope_cache is a serving op"):
        backward(g, q_out)


@pytest.mark.parametrize("op", ["gated_matmul", "add_rmsnorm_matmul"])
def test_serving_fusions_refuse_a_backward_pass(op):
    g = Graph()
    x, W = g.param("x", (3, 16), "float32"), g.param("W", (5, 8 if op == "gated_matmul" else 16), "float32")
    if op == "gated_matmul":
        y = ops.gated_matmul(x, W, None, "silu", name="down")
    else:
        y, _ = ops.add_rmsnorm_matmul(x, g.param("r", (3, 16), "float32"), g.param("w", (16,), "float32"), W, None,
                                      1e-6, name="qkv", norm_name="ln1")
    with pytest.raises(UnsupportedError, match=f"{op} is a serving fusion"):
        backward(g, y)
