import pytest

from surogate.dsl import Graph
from surogate.dsl.nn import CausalLM, LoRAConfig, ModelSpec


def tiny_spec(**kw) -> ModelSpec:
    base = dict(family="llama", vocab_size=101, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                head_dim=8, intermediate_size=48)
    base.update(kw)
    return ModelSpec(**base)


def test_building_a_graph_computes_nothing_and_names_params_like_hf():
    g = CausalLM(tiny_spec()).build(mode="train")
    names = {p.name for p in g.params()}
    assert "layers.1.self_attn.q_proj.weight" in names
    assert "layers.0.mlp.gate_up_proj.weight" in names  # gate and up fused
    assert "lm_head.weight" in names
    assert g.values["layers.0.mlp.gate_up_proj.weight"].shape == (96, 32)
    assert all(n.op != "matmul" for n in g.nodes)  # DSL ops only; lowering comes later
    assert "loss" in g.outputs


def test_tied_embeddings_have_no_head_param():
    g = CausalLM(tiny_spec(tie_word_embeddings=True)).build(mode="logits")
    assert "lm_head.weight" not in {p.name for p in g.params()}


def test_lora_declares_adapters_and_freezes_the_base():
    g = CausalLM(tiny_spec()).build(mode="train", lora=LoRAConfig(rank=4, alpha=8, targets=("q_proj", "up_proj")))
    trainable = sorted(p.name for p in g.params() if p.trainable)
    assert trainable == sorted(
        [f"layers.{i}.self_attn.q_proj.lora_{m}" for i in range(2) for m in "AB"]
        + [f"layers.{i}.mlp.up_proj.lora_{m}" for i in range(2) for m in "AB"]
    )
    assert g.values["layers.0.mlp.up_proj.lora_B"].shape == (48, 4)


def test_shape_errors_name_the_op():
    g = Graph()
    x = g.input("x", (5, 8), "float32")
    w = g.param("w", (3, 7), "float32")
    from surogate.dsl import ops

    with pytest.raises(ValueError, match="linear"):
        ops.linear(x, w)
