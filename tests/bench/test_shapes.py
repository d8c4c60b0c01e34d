"""Every family's named bench shapes: the graph we build for a shape has the parameters (count
and shapes) transformers gives the HF config of that shape (on the meta device: no memory)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from surogate.bench.shapes import SHAPES, hf_config, hf_model_class, spec_for  # noqa: E402
from surogate.models import REGISTRY, family_named  # noqa: E402
from surogate.models.name_table import Slice  # noqa: E402

NAMES = [name for f in REGISTRY for name in f.bench_shapes]


def test_shapes_are_the_families_own():
    assert list(SHAPES) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_shape_has_the_parameters_transformers_gives_its_config(name):
    spec = spec_for(name)
    family = family_named(spec.family)
    params = family.architecture(spec).build(mode="logits").params()
    ours = {p.name: p.shape for p in params}
    trained = {p.name for p in params if p.trainable}  # the rest are HF buffers (Gemma 4's layer_scalar)
    model_cls = hf_model_class(spec)
    with torch.device("meta"):
        ref = model_cls(model_cls.config_class(**hf_config(spec)))
    theirs = {name: tuple(p.shape) for name, p in ref.named_parameters()}
    assert sum(math.prod(s) for n, s in ours.items() if n in trained) == sum(map(math.prod, theirs.values()))
    theirs |= {name: tuple(b.shape) for name, b in ref.named_buffers()}
    table = family.name_table()
    for param, shape in ours.items():
        recipe = table.recipe(param)
        if isinstance(recipe, Slice):  # one layer's part of a tensor packed over the layers (Gemma 4)
            full, ax = theirs[recipe.hf], recipe.axis
            assert full[ax] == spec.num_layers * shape[ax] and full[:ax] + full[ax + 1:] == shape[:ax] + shape[ax + 1:]
            continue
        if getattr(recipe, "transposed", False):  # GPT-OSS's experts: HF's [E, in, out], ours [E, out, in]
            assert shape == theirs[recipe.hf][:-2] + theirs[recipe.hf][:-3:-1], param
            continue
        parts = recipe.hf if isinstance(recipe.hf, tuple) else (recipe.hf,)
        assert shape[0] == sum(theirs[p][0] for p in parts) and shape[1:] == theirs[parts[0]][1:], param


@pytest.mark.parametrize("name", NAMES)
def test_the_peers_config_is_the_same_model(name):
    # The peer (HF transformers in `bench train / serve --vs hf`) is built from hf_config(spec):
    # read back by the family, it must give the spec itself (windows, per-kind rope, query
    # scale), or the two sides of a benchmark compute different models.
    spec = spec_for(name)
    assert family_named(spec.family).spec_from_config(hf_config(spec)) == spec


def test_a_moe_roofline_counts_only_the_active_experts():
    """The single-stream ceiling of a MoE shape reads top_k of num_experts experts' weights per
    token: the Qwen3-30B-A3B shape's active weights, counted from transformers' own modules."""
    import dataclasses

    from surogate.bench.serve import active_weight_bytes
    from surogate.bench.train import random_model

    spec = spec_for("qwen3-30b-a3b")
    spec = dataclasses.replace(spec, num_layers=2, hidden_size=64, num_heads=2, num_kv_heads=1, head_dim=32,
                               vocab_size=256, moe=dataclasses.replace(spec.moe, intermediate_size=16, layers=(0, 1)))
    model = random_model(spec, "float32")
    cls = hf_model_class(spec)
    cfg = cls.config_class(**hf_config(spec))
    with torch.device("meta"):
        hf = cls(cfg)
    total = experts = 0
    for name, p in hf.named_parameters():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        total += p.numel()
        experts += p.numel() if ".mlp.experts." in name else 0
    want = 4 * (total - experts + experts * spec.moe.top_k / spec.moe.num_experts)
    assert active_weight_bytes(model) == pytest.approx(want)
    assert active_weight_bytes(model) < 0.2 * sum(a.nbytes for a in model.params.values())
