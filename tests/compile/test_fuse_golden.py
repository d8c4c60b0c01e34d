"""The serving fusions pass against the serving graphs the builder made by hand before it.

Up to main's commit eb6b723, surogate/dsl/nn.py fused serving graphs itself (PreNorm.fold,
Linear.gated, the fused-QKV branch of Attention). fuse_golden.json holds those graphs, node by
node, for the cases below: generated ONCE from that builder (with `listing` as written here) and
committed before the builder changed. That builder is gone: do not regenerate the file from
today's code. Each test builds today's plain serving graph, runs `fuse_serving` and asks for the
same listing: the same nodes in the same order, names, attrs, shapes and parameters. The file
also holds a digest of each case's training and logits graphs from that builder: those graphs
never go through the pass and stay as they were.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from surogate.compile import fuse_serving
from surogate.dsl.graph import Dim, Graph
from surogate.dsl.nn import CausalLM, KVCache, LoRAConfig, ModelSpec

GOLDEN = Path(__file__).with_name("fuse_golden.json")
Q8_0 = 8  # GGML type id: blocks of 32 values


def spec(**kw) -> ModelSpec:
    base = dict(family="llama", vocab_size=101, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                head_dim=8, intermediate_size=64)
    base.update(kw)
    return ModelSpec(**base)


QWEN3 = dict(family="qwen3", qk_norm=True, tie_word_embeddings=True)
BIAS = dict(attention_bias=True, mlp_bias=True)
SOME = ("k_proj", "down_proj")
OTHERS = ("q_proj", "v_proj", "gate_proj", "o_proj")
ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
BLOCKS_MIXED = {"layers.0.mlp.gate_up_proj.weight": Q8_0, "layers.1.mlp.down_proj.weight": Q8_0}
# layer 0: q alone in blocks (k and v plain); layer 1: every projection in blocks
BLOCKS_PARTIAL = {"layers.0.self_attn.q_proj.weight": Q8_0, **{
    f"layers.1.{p}.weight": Q8_0 for p in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                            "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")}}

# name -> (ModelSpec fields over spec()'s, LoRA targets or None, GGML-block weights or None)
CASES = {
    "llama": ({}, None, None),
    "qwen3-qknorm-tied": (QWEN3, None, None),
    "llama-bias-geglu-window": ({**BIAS, "activation": "gelu_pytorch_tanh", "sliding_windows": [4, 0],
                                 "attn_softcap": 30.0}, None, None),
    "lora-some": ({}, SOME, None),
    "lora-others": ({}, OTHERS, None),
    "lora-all": ({}, ALL, None),
    "qwen3-bias-lora-some": ({**QWEN3, **BIAS}, SOME, None),
    "blocks-mixed": ({}, None, BLOCKS_MIXED),
    "blocks-partial": ({}, None, BLOCKS_PARTIAL),
    "qwen3-blocks-lora": (QWEN3, ("v_proj", "up_proj"), BLOCKS_MIXED),
}


def spec(**kw) -> ModelSpec:
    base = dict(family="llama", vocab_size=101, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                head_dim=8, intermediate_size=64)  # widths in whole Q8_0 blocks
    base.update(kw)
    return ModelSpec(**base)


def build(case: str, mode: str, fuse_qkv: bool = False) -> Graph:
    kw, targets, quant = CASES[case]
    # LoRA dropout in the training graphs (their linears carry it), ignored by the others
    lora = None if targets is None else LoRAConfig(rank=4, alpha=8.0, targets=targets,
                                                   dropout=0.1 if mode == "train" else 0.0)
    kv = KVCache(num_blocks=4, block_size=4, fuse_qkv=fuse_qkv) if mode == "serve" else None
    return CausalLM(spec(**kw)).build(mode=mode, dtype="bfloat16", lora=lora, kv=kv, quant=quant)


def _value(v) -> str:
    shape = ",".join(d.name if isinstance(d, Dim) else str(d) for d in v.shape)
    return f"{v.name}:{v.dtype}[{shape}]"


def listing(g: Graph) -> dict:
    """The graph as text: one line per node (op, inputs, outputs with dtype and shape, attrs), one
    per parameter or input (kind, dtype, shape, trainable, meta), the outputs."""
    produced = {v.name for n in g.nodes for v in n.outputs if v is not None}
    acts = {v.name for v in g.values.values() if v.kind == "act"}
    assert acts <= produced, f"values no node makes: {sorted(acts - produced)}"
    nodes = []
    for n in g.nodes:
        ins = ",".join(v.name if v is not None else "-" for v in n.inputs)
        outs = ",".join(_value(v) if v is not None else "-" for v in n.outputs)
        nodes.append(f"{n.op}({ins}) -> ({outs}) {json.dumps(n.attrs, sort_keys=True, separators=(',', ':'))}")
    values = [f"{_value(v)} {v.kind} trainable={int(v.trainable)} {json.dumps(v.meta, sort_keys=True)}"
              for v in sorted(g.values.values(), key=lambda v: v.name) if v.kind != "act"]
    return {"nodes": nodes, "values": values, "outputs": {k: v.name for k, v in sorted(g.outputs.items())}}


def digest(g: Graph) -> str:
    return hashlib.sha256(json.dumps(listing(g), sort_keys=True).encode()).hexdigest()


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("fuse_qkv", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_the_pass_makes_the_serving_graphs_the_builder_fused_by_hand(golden, case, fuse_qkv):
    want = golden["serve"][f"{case} fuse_qkv={int(fuse_qkv)}"]
    got = listing(fuse_serving(build(case, "serve", fuse_qkv)))
    assert got["nodes"] == want["nodes"]
    assert got["values"] == want["values"]
    assert got["outputs"] == want["outputs"]


@pytest.mark.parametrize("mode", ["train", "logits"])
@pytest.mark.parametrize("case", CASES)
def test_training_and_logits_graphs_are_as_the_builder_made_them(golden, case, mode):
    assert digest(build(case, mode)) == golden["digests"][f"{case} {mode}"]
