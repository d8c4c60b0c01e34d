"""Every family's named bench shapes: the graph we build for a shape has the parameters (count
and shapes) transformers gives the HF config of that shape (on the meta device: no memory)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from surogate.bench.shapes import SHAPES, hf_config, hf_model_class, spec_for  # noqa: E402
from surogate.models import REGISTRY, family_named  # noqa: E402

NAMES = [name for f in REGISTRY for name in f.bench_shapes]


def test_shapes_are_the_families_own():
    assert list(SHAPES) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_shape_has_the_parameters_transformers_gives_its_config(name):
    spec = spec_for(name)
    family = family_named(spec.family)
    ours = {p.name: p.shape for p in family.architecture(spec).build(mode="logits").params()}
    model_cls = hf_model_class(spec)
    with torch.device("meta"):
        ref = model_cls(model_cls.config_class(**hf_config(spec)))
    theirs = {name: tuple(p.shape) for name, p in ref.named_parameters()}
    assert sum(map(math.prod, ours.values())) == sum(map(math.prod, theirs.values()))
    table = family.name_table()
    for param, shape in ours.items():
        recipe = table.recipe(param)
        parts = recipe.hf if isinstance(recipe.hf, tuple) else (recipe.hf,)
        assert shape[0] == sum(theirs[p][0] for p in parts) and shape[1:] == theirs[parts[0]][1:], param


@pytest.mark.parametrize("name", NAMES)
def test_the_peers_config_is_the_same_model(name):
    # The peer (HF transformers in `bench train / serve --vs hf`) is built from hf_config(spec):
    # read back by the family, it must give the spec itself (windows, per-kind rope, query
    # scale), or the two sides of a benchmark compute different models.
    spec = spec_for(name)
    assert family_named(spec.family).spec_from_config(hf_config(spec)) == spec
