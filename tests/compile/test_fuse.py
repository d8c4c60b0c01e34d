"""The serving fusions pass, one rewrite at a time, on small hand-made graphs and on the model's
serving graphs; what it leaves alone (ops it does not know, LoRA slices, GGML blocks, the head);
and that a fused serving Program computes the plain one's numbers (the CPU runs each fused op
as its composition, so bit for bit). test_fuse_golden.py checks whole graphs against those the
builder used to fuse by hand."""

from __future__ import annotations

import numpy as np
import pytest

from surogate.compile import Executable, fuse_serving
from surogate.dsl import Graph, ops
from surogate.dsl.graph import Dim
from surogate.dsl.nn import CausalLM, KVCache, LoRAConfig, ModelSpec, SandwichBlock
from surogate.errors import InvalidArgumentError

N = Dim("N")
Q8_0 = 8  # GGML type id: blocks of 32 values


def tiny_spec(**kw) -> ModelSpec:
    base = dict(family="llama", vocab_size=101, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                head_dim=8, intermediate_size=48)
    base.update(kw)
    return ModelSpec(**base)


def serving_graph(fuse_qkv: bool = False) -> Graph:
    g = Graph("t")
    g.kv = KVCache(num_blocks=4, block_size=4, fuse_qkv=fuse_qkv)
    return g


def ops_of(g: Graph) -> list[str]:
    return [n.op for n in g.nodes]


# ---- norm -> matmul ---------------------------------------------------------------------------
def norm_into(g: Graph, linear, residual: bool = True) -> None:
    """x (+ r) -> norm -> linear(...) -> add(., h): the shape of a block's input norm."""
    x = g.input("x", (N, 32), "float32")
    w = g.param("ln.weight", (32,), "float32")
    if residual:
        r = g.input("r", (N, 32), "float32")
        y, h = ops.add_rmsnorm(x, r, w, 1e-5, name="ln")
    else:
        y, h = ops.rmsnorm(x, w, 1e-5, name="ln"), x
    g.mark_output("out", ops.add(linear(y), h, name="out"))


@pytest.mark.parametrize("residual", [True, False])
def test_a_norm_feeding_one_plain_linear_becomes_add_rmsnorm_matmul(residual):
    g = serving_graph()
    W = g.param("proj.weight", (32, 32), "float32")
    b = g.param("proj.bias", (32,), "float32")
    norm_into(g, lambda y: ops.linear(y, W, b, name="proj"), residual)
    fuse_serving(g)
    assert ops_of(g) == ["add_rmsnorm_matmul", "add"]
    fused = g.nodes[0]
    assert fused.inputs == [g.values["x"], g.values.get("r"), g.values["ln.weight"], W, b]
    # the fused node makes the values it replaces, under their names, and their readers read it
    assert [v.name if v is not None else None for v in fused.outputs] == ["proj", "ln.residual" if residual else None]
    assert g.nodes[1].inputs == [g.values["proj"], g.values["ln.residual" if residual else "x"]]
    assert g.values["proj"].producer is fused
    assert fused.attrs == {"eps": 1e-5, "weight_offset": 0.0}
    assert "ln" not in g.values and "ln.rstd" not in g.values


def test_a_norm_is_not_fused_into_several_readers_a_lora_slice_ggml_blocks_or_the_head():
    def three(g):
        W = [g.param(f"{p}.weight", (32, 32), "float32") for p in "qk"]
        return lambda y: ops.add(ops.linear(y, W[0], name="q"), ops.linear(y, W[1], name="k"), name="qk")

    def lora(g):
        W = g.param("proj.weight", (32, 32), "float32")
        A, B = g.param("proj.lora_A", (4, 32), "float32"), g.param("proj.lora_B", (32, 4), "float32")
        return lambda y: ops.linear(y, W, None, [ops.LoRASlice("proj", A, B, 2.0, 0, 32)], name="proj")

    def blocks(g):
        from surogate.io.gguf import row_bytes

        W = g.param("proj.weight", (32, row_bytes(Q8_0, 32)), "uint8", trainable=False, ggml_type=Q8_0)
        return lambda y: ops.linear(y, W, name="proj")

    for make in (three, lora, blocks):
        g = serving_graph()
        norm_into(g, make(g))
        before = ops_of(g)
        fuse_serving(g)
        assert ops_of(g) == before and "add_rmsnorm_fwd" in before, make.__name__
    # the head: its logits are a graph output
    g = serving_graph()
    x, r = g.input("x", (N, 32), "float32"), g.input("r", (N, 32), "float32")
    y, _ = ops.add_rmsnorm(x, r, g.param("norm.weight", (32,), "float32"), 1e-5, name="final_norm")
    g.mark_output("logits", ops.linear(y, g.param("lm_head.weight", (101, 32), "float32"), name="logits"))
    fuse_serving(g)
    assert ops_of(g) == ["add_rmsnorm_fwd", "linear"]


# ---- activation -> matmul ---------------------------------------------------------------------
@pytest.mark.parametrize("op,act", [(ops.swiglu, "silu"), (ops.geglu, "gelu_tanh")])
def test_a_gated_activation_feeding_a_plain_linear_becomes_gated_matmul(op, act):
    g = serving_graph()
    gu = g.input("gu", (N, 64), "float32")
    W = g.param("down.weight", (16, 32), "float32")
    y = ops.linear(op(gu, name="act"), W, name="down")
    g.mark_output("out", ops.add(y, y, name="out"))
    fuse_serving(g)
    assert ops_of(g) == ["gated_matmul", "add"]
    fused = g.nodes[0]
    assert fused.inputs == [gu, W, None] and fused.attrs == {"act": act}
    assert fused.outputs == [g.values["down"]] and g.nodes[1].inputs == [g.values["down"]] * 2
    assert "act" not in g.values


def test_an_activation_is_not_fused_into_a_lora_slice_or_a_second_reader():
    g = serving_graph()
    gu = g.input("gu", (N, 64), "float32")
    W = g.param("down.weight", (16, 32), "float32")
    A, B = g.param("down.lora_A", (4, 32), "float32"), g.param("down.lora_B", (16, 4), "float32")
    a = ops.swiglu(gu, name="act")
    g.mark_output("out", ops.linear(a, W, None, [ops.LoRASlice("down", A, B, 2.0, 0, 16)], name="down"))
    g2 = serving_graph()
    gu2 = g2.input("gu", (N, 64), "float32")
    a2 = ops.swiglu(gu2, name="act")
    y2 = ops.linear(a2, g2.param("down.weight", (32, 32), "float32"), name="down")
    g2.mark_output("out", ops.add(y2, a2, name="out"))  # the activation is read twice
    for graph in (g, g2):
        fuse_serving(graph)
        assert ops_of(graph)[:2] == ["swiglu_fwd", "linear"]


# ---- ops the pass does not know ------------------------------------------------------------------
def test_an_op_the_pass_does_not_know_is_left_alone_and_breaks_the_pattern_it_stands_in():
    g = serving_graph()
    x = g.input("x", (N, 32), "float32")
    w = g.param("ln.weight", (32,), "float32")
    (y,) = g.node("layernorm_fwd", [x, w], [("ln", (N, 32), "float32")], eps=1e-5)  # not a norm it knows
    z = ops.linear(y, g.param("up.weight", (64, 32), "float32"), name="up")
    (s,) = g.node("scale", [ops.swiglu(z, name="act")], [("scaled", (N, 32), "float32")], alpha=0.5)
    g.mark_output("out", ops.linear(s, g.param("down.weight", (16, 32), "float32"), name="down"))
    before = [(n.op, list(n.inputs), list(n.outputs), dict(n.attrs)) for n in g.nodes]
    fuse_serving(g)
    assert [(n.op, n.inputs, n.outputs, n.attrs) for n in g.nodes] == before


def test_training_and_logits_graphs_are_refused():
    for mode in ("train", "logits"):
        with pytest.raises(InvalidArgumentError, match="serving graphs only"):
            fuse_serving(CausalLM(tiny_spec()).build(mode=mode))


# ---- fused QKV ----------------------------------------------------------------------------------
def serve(spec: ModelSpec, fuse_qkv: bool, **kw) -> Graph:
    return fuse_serving(CausalLM(spec).build(mode="serve", kv=KVCache(num_blocks=4, block_size=4, fuse_qkv=fuse_qkv),
                                             **kw))


def test_fused_qkv_reads_the_stacked_weight_through_columns_views_and_moves_the_lora_slices():
    spec = tiny_spec(attention_bias=True)
    g = serve(spec, True, lora=LoRAConfig(rank=4, alpha=8.0, targets=("k_proj", "v_proj")))
    names = {p.name for p in g.params()}
    assert {"layers.0.self_attn.qkv_proj.weight", "layers.0.self_attn.qkv_proj.bias"} <= names
    assert not {f"layers.0.self_attn.{p}_proj.{k}" for p in "qkv" for k in ("weight", "bias")} & names
    assert g.values["layers.0.self_attn.qkv_proj.weight"].shape == (64, 32)  # q 32 rows, k 16, v 16
    (qkv,) = [n for n in g.nodes if n.outputs[0].name == "layers.0.self_attn.qkv_proj"]
    assert [(s["name"], s["offset"], s["size"]) for s in qkv.attrs["lora"]] == [("k_proj", 32, 16), ("v_proj", 48, 16)]
    assert [v.name for v in qkv.inputs[3:]] == [f"layers.0.self_attn.{p}_proj.lora_{m}" for p in "kv" for m in "AB"]
    cols = [n for n in g.nodes if n.op == "columns" and n.outputs[0].name.startswith("layers.0.")]
    assert [(n.outputs[0].name, n.attrs["offset"], n.outputs[0].shape) for n in cols] == [
        ("layers.0.self_attn.q", 0, (N, 4, 8)), ("layers.0.self_attn.k", 32, (N, 2, 8)),
        ("layers.0.self_attn.v", 48, (N, 2, 8))]
    rope = next(n for n in g.nodes if n.op == "qkv_rope_cache")
    assert [v.name for v in rope.inputs[:3]] == [n.outputs[0].name for n in cols]


def test_q_k_v_stay_three_projections_unless_asked_or_when_one_is_ggml_blocks():
    spec = tiny_spec()
    assert "columns" not in ops_of(serve(spec, False))
    g = serve(spec, True, quant={"layers.1.self_attn.v_proj.weight": Q8_0})
    assert ops_of(g).count("columns") == 3  # layer 0 only
    assert "layers.1.self_attn.q_proj.weight" in g.values and "layers.1.self_attn.qkv_proj.weight" not in g.values


# ---- the model's serving graphs (moved from tests/dsl/test_graph.py with the fusions) -----------
@pytest.mark.parametrize("activation,act", [("silu", "silu"), ("gelu_pytorch_tanh", "gelu_tanh")])
def test_serving_graph_folds_norms_and_the_activation_into_the_matmuls(activation, act):
    spec = tiny_spec(activation=activation)
    L = spec.num_layers
    g = serve(spec, True)
    ops_ = ops_of(g)
    # each layer: its input norm into the fused qkv, post-attention norm into gate_up, act into down_proj
    assert ops_.count("add_rmsnorm_matmul") == 2 * L and ops_.count("gated_matmul") == L
    assert not {"rmsnorm_fwd", "swiglu_fwd", "geglu_fwd"} & set(ops_)
    assert ops_.count("add_rmsnorm_fwd") == 1  # the final norm, before the head
    first = next(n for n in g.nodes if n.op == "add_rmsnorm_matmul")
    assert first.inputs[1] is None and first.outputs[1] is None  # layer 0: no residual yet, h is the embedding
    assert {n.attrs["act"] for n in g.nodes if n.op == "gated_matmul"} == {act}
    # the unfused q / k / v projections keep their norm; gate_up and down_proj still fold
    ops_ = ops_of(serve(spec, False))
    assert ops_.count("add_rmsnorm_matmul") == L and ops_.count("gated_matmul") == L
    assert ops_.count("rmsnorm_fwd") == 1 and ops_.count("add_rmsnorm_fwd") == L  # ln1 of each layer, final norm
    # training and logits graphs are unchanged
    for mode in ("train", "logits"):
        assert not {"add_rmsnorm_matmul", "gated_matmul"} & set(ops_of(CausalLM(spec).build(mode=mode)))


def test_serving_fusions_skip_projections_with_lora_slices_or_ggml_blocks():
    spec = tiny_spec(intermediate_size=64)  # whole Q8_0 blocks of 32
    g = serve(spec, True, lora=LoRAConfig(rank=4, targets=("k_proj", "down_proj")))
    ops_ = ops_of(g)
    # qkv carries k's slice and down_proj its own: only gate_up folds its norm
    assert ops_.count("add_rmsnorm_matmul") == spec.num_layers and "gated_matmul" not in ops_
    assert ops_.count("swiglu_fwd") == spec.num_layers
    g = serve(spec, True, quant={"layers.0.mlp.gate_up_proj.weight": Q8_0, "layers.1.mlp.down_proj.weight": Q8_0})
    linears = {n.outputs[0].name for n in g.nodes if n.op == "linear"}
    assert {"layers.0.mlp.gate_up_proj", "layers.1.mlp.down_proj"} <= linears
    assert ops_of(g).count("gated_matmul") == 1 and ops_of(g).count("add_rmsnorm_matmul") == 3


# ---- numbers --------------------------------------------------------------------------------------
def run_serving_step(g: Graph, weights: dict[str, np.ndarray], spec: ModelSpec) -> np.ndarray:
    """One prefill step of 6 tokens (one sequence, cache blocks 0 and 1) -> its last row's logits."""
    T = 6
    exe = Executable(g, {"N": T, "S": 1, "S1": 2, "B": 2, "R": 1}, "cpu", keep=[g.outputs["logits"]])
    for name in exe.external_names("param"):
        exe.bind(name, weights[name])
    cache = (4, 4, spec.num_kv_heads, spec.head_dim)
    for i in range(spec.num_layers):
        exe.bind(f"layers.{i}.k_cache", np.zeros(cache, np.float32))
        exe.bind(f"layers.{i}.v_cache", np.zeros(cache, np.float32))
    i32 = lambda *v: np.array(v, np.int32)  # noqa: E731
    for name, arr in {"input_ids": i32(3, 14, 15, 92, 65, 35), "position_ids": i32(*range(T)),
                      "slot_mapping": i32(*range(T)), "block_tables": i32(0, 1).reshape(1, 2), "cu_q": i32(0, T),
                      "context_lens": i32(T), "logits_rows": i32(T - 1)}.items():
        exe.bind(name, arr)
    exe.run()
    return exe.read("logits").copy()


@pytest.mark.parametrize("fuse_qkv", [False, True])
def test_a_fused_serving_program_computes_the_plain_ones_numbers(fuse_qkv):
    spec = tiny_spec(qk_norm=True, attention_bias=True)
    build = lambda: CausalLM(spec).build(mode="serve", kv=KVCache(4, 4, fuse_qkv))  # noqa: E731
    plain = build()
    rng = np.random.default_rng(0)
    weights = {p.name: rng.normal(0, 0.3, p.shape).astype(np.float32) for p in plain.params()}
    for i in range(spec.num_layers):  # the stack the serving runner binds as qkv_proj
        for kind in ("weight", "bias"):
            weights[f"layers.{i}.self_attn.qkv_proj.{kind}"] = np.concatenate(
                [weights[f"layers.{i}.self_attn.{p}_proj.{kind}"] for p in "qkv"])
    fused = fuse_serving(build())
    assert {"add_rmsnorm_matmul", "gated_matmul"} <= set(ops_of(fused))
    np.testing.assert_array_equal(run_serving_step(fused, weights, spec), run_serving_step(plain, weights, spec))


# ---- Gemma's sandwich block: (1 + w) norms, post-norms -------------------------------------------
def gemma_spec() -> ModelSpec:
    return tiny_spec(family="gemma3", qk_norm=True, activation="gelu_pytorch_tanh", norm_offset=1.0,
                     embed_scale=True, attn_scale=0.3, sliding_windows=[4, 0],
                     rope_sliding={"theta": 10000.0, "rope_type": "default"})


def test_gemma_pre_norms_fold_with_their_offset_and_the_post_norms_stay():
    spec = gemma_spec()
    L = spec.num_layers
    g = fuse_serving(CausalLM(spec, block=SandwichBlock).build(mode="serve", kv=KVCache(4, 4, True)))
    fused = [n for n in g.nodes if n.op == "add_rmsnorm_matmul"]
    # each layer's input norm into qkv and pre-feedforward norm into gate_up, the (1 + w) kept
    assert len(fused) == 2 * L and {n.attrs["weight_offset"] for n in fused} == {1.0}
    post = [n for n in g.nodes if n.op == "rmsnorm_fwd"]  # the post-norms read attention / the MLP, feed the stream
    assert sorted(n.outputs[0].name for n in post) == sorted(
        f"layers.{i}.{k}_post_norm" for i in range(L) for k in ("attn", "mlp"))
    assert {n.attrs["weight_offset"] for n in post} == {1.0}
    assert ops_of(g).count("gated_matmul") == L
    assert {n.attrs["weight_offset"] for n in g.nodes if n.op == "qkv_rope_cache"} == {1.0}


@pytest.mark.parametrize("fuse_qkv", [False, True])
def test_a_fused_gemma_serving_program_computes_the_plain_ones_numbers(fuse_qkv):
    spec = gemma_spec()
    build = lambda: CausalLM(spec, block=SandwichBlock).build(mode="serve", kv=KVCache(4, 4, fuse_qkv))  # noqa: E731
    plain = build()
    rng = np.random.default_rng(1)
    weights = {p.name: rng.normal(0, 0.3, p.shape).astype(np.float32) for p in plain.params()}
    for i in range(spec.num_layers):
        weights[f"layers.{i}.self_attn.qkv_proj.weight"] = np.concatenate(
            [weights[f"layers.{i}.self_attn.{p}_proj.weight"] for p in "qkv"])
    fused = fuse_serving(build())
    assert {"add_rmsnorm_matmul", "gated_matmul"} <= set(ops_of(fused))
    np.testing.assert_array_equal(run_serving_step(fused, weights, spec), run_serving_step(plain, weights, spec))
