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


@pytest.mark.parametrize("activation,act", [("silu", "silu"), ("gelu_pytorch_tanh", "gelu_tanh")])
def test_serving_graph_folds_norms_and_the_activation_into_the_matmuls(activation, act):
    spec = tiny_spec(activation=activation)
    L = spec.num_layers
    g = CausalLM(spec).build(mode="serve", kv=KVCache(num_blocks=4, block_size=4, fuse_qkv=True))
    ops_ = ops_of(g)
    # each layer: its input norm into the fused qkv, post-attention norm into gate_up, act into down_proj
    assert ops_.count("add_rmsnorm_matmul") == 2 * L and ops_.count("gated_matmul") == L
    assert not {"rmsnorm_fwd", "swiglu_fwd", "geglu_fwd"} & set(ops_)
    assert ops_.count("add_rmsnorm_fwd") == 1  # the final norm, before the head
    first = next(n for n in g.nodes if n.op == "add_rmsnorm_matmul")
    assert first.inputs[1] is None and first.outputs[1] is None  # layer 0: no residual yet, h is the embedding
    assert {n.attrs["act"] for n in g.nodes if n.op == "gated_matmul"} == {act}
    # the unfused q / k / v projections keep their norm; gate_up and down_proj still fold
    g = CausalLM(spec).build(mode="serve", kv=KVCache(num_blocks=4, block_size=4, fuse_qkv=False))
    ops_ = ops_of(g)
    assert ops_.count("add_rmsnorm_matmul") == L and ops_.count("gated_matmul") == L
    assert ops_.count("rmsnorm_fwd") == 1 and ops_.count("add_rmsnorm_fwd") == L  # ln1 of each layer, final norm
    # training and logits graphs are unchanged
    for mode in ("train", "logits"):
        assert not {"add_rmsnorm_matmul", "gated_matmul"} & set(ops_of(CausalLM(spec).build(mode=mode)))


def test_serving_fusions_skip_projections_with_lora_slices_or_ggml_blocks():
    spec = tiny_spec(intermediate_size=64)  # whole Q8_0 blocks of 32
    kv = KVCache(num_blocks=4, block_size=4, fuse_qkv=True)
    g = CausalLM(spec).build(mode="serve", kv=kv, lora=LoRAConfig(rank=4, targets=("k_proj", "down_proj")))
    ops_ = ops_of(g)
    # qkv carries k's slice and down_proj its own: only gate_up folds its norm
    assert ops_.count("add_rmsnorm_matmul") == spec.num_layers and "gated_matmul" not in ops_
    assert ops_.count("swiglu_fwd") == spec.num_layers
    g = CausalLM(spec).build(mode="serve", kv=KVCache(num_blocks=4, block_size=4, fuse_qkv=True),
                             quant={"layers.0.mlp.gate_up_proj.weight": 8, "layers.1.mlp.down_proj.weight": 8})
    linears = {n.outputs[0].name for n in g.nodes if n.op == "linear"}
    assert {"layers.0.mlp.gate_up_proj", "layers.1.mlp.down_proj"} <= linears
    assert ops_of(g).count("gated_matmul") == 1 and ops_of(g).count("add_rmsnorm_matmul") == 3
