import pytest

from surogate.dsl import Graph
from surogate.dsl.nn import CausalLM, KVCache, LoRAConfig, ModelSpec


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


@pytest.mark.parametrize("qk_norm", [False, True])
def test_serving_graph_fuses_rope_and_the_cache_write(qk_norm):
    spec = tiny_spec(qk_norm=qk_norm)
    serve = CausalLM(spec).build(mode="serve", kv=KVCache(num_blocks=4, block_size=4))
    fused = [n for n in serve.nodes if n.op == "qkv_rope_cache"]
    assert len(fused) == spec.num_layers
    assert len(fused[0].inputs) == (7 if qk_norm else 5)  # q, k, v, pos, slots (, q_norm, k_norm)
    assert not {"rope_fwd", "qk_norm_rope_fwd", "kv_cache_write"} & {n.op for n in serve.nodes}
    train = {n.op for n in CausalLM(spec).build(mode="train").nodes}
    assert "qkv_rope_cache" not in train and ("qk_norm_rope_fwd" if qk_norm else "rope_fwd") in train


def ops_of(g) -> list[str]:
    return [n.op for n in g.nodes]


@pytest.mark.parametrize("fuse_qkv", [False, True])
def test_the_builder_emits_plain_serving_graphs_whatever_the_serving_options(fuse_qkv):
    """Serving fusions are a compile pass (tests/compile/test_fuse.py), not the builder's choice:
    a serving graph has the training graph's norms, three q / k / v projections, activations and
    linears."""
    spec = tiny_spec()
    L = spec.num_layers
    g = CausalLM(spec).build(mode="serve", kv=KVCache(num_blocks=4, block_size=4, fuse_qkv=fuse_qkv))
    ops_ = ops_of(g)
    assert not {"add_rmsnorm_matmul", "gated_matmul", "columns"} & set(ops_)
    assert ops_.count("rmsnorm_fwd") == 1 and ops_.count("add_rmsnorm_fwd") == 2 * L  # ln1 of layer 0 / the rest
    assert ops_.count("swiglu_fwd") == L and ops_.count("linear") == 6 * L + 1  # q k v o gate_up down, the head
    assert g.kv.fuse_qkv is fuse_qkv  # read by the pass
    assert CausalLM(spec).build(mode="train").kv is None
