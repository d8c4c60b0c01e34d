"""The family registry: every family is found by what its checkpoints say they are (config.json's
architectures or model_type, a GGUF's general.architecture, our name), no two families claim the
same name, and each family's parts agree with one another (its tiny config builds its spec, its
name tables cover every parameter of its graph)."""

from __future__ import annotations

import pytest

from surogate.errors import UnsupportedError
from surogate.models import FAMILIES, REGISTRY, Family, family_for, family_for_gguf, family_named

IDS = [f.name for f in REGISTRY]


def test_no_two_families_claim_the_same_name():
    # (GGUF architectures may repeat: llama.cpp writes Mistral as "llama"; the first family wins.)
    for key in (lambda f: [f.name], lambda f: list(f.hf_architectures), lambda f: list(f.model_types),
                lambda f: list(f.bench_shapes)):
        names = [n for f in REGISTRY for n in key(f)]
        assert len(names) == len(set(names)), names


@pytest.mark.parametrize("family", REGISTRY, ids=IDS)
def test_a_family_is_found_by_every_name_it_has(family: Family):
    assert family_named(family.name) is family
    for arch in family.hf_architectures:
        assert family_for({"architectures": [arch]}) is family and FAMILIES[arch] is family
    for mtype in family.model_types:
        assert family_for({"model_type": mtype}) is family

    class _GGUF:  # what family_for_gguf reads of a GGUFFile
        architecture, path = family.gguf.name, "x.gguf"

    assert family_for_gguf(_GGUF()) is next(f for f in REGISTRY if f.gguf.name == family.gguf.name)


def test_unknown_names_list_the_known_ones():
    with pytest.raises(UnsupportedError, match="(?s)MambaForCausalLM.*" + ".*".join(sorted(FAMILIES))):
        family_for({"architectures": ["MambaForCausalLM"]})
    with pytest.raises(UnsupportedError, match="no model family named 'mamba'"):
        family_named("mamba")


@pytest.mark.parametrize("family", REGISTRY, ids=IDS)
def test_the_tiny_config_builds_a_spec_whose_parameters_the_name_tables_cover(family: Family):
    config = {"vocab_size": 512, **family.tiny.config}
    spec = family.spec_from_config(config)
    assert spec.family == family.name and family_named(spec.family) is family
    params = [p.name for p in family.architecture(spec).build(mode="logits").params()]
    hf_table, gguf_table = family.name_table(), family.gguf.tensors()
    for name in params:
        recipe = hf_table.recipe(name)
        assert recipe is not None, name
        for hf in recipe.hf if isinstance(recipe.hf, tuple) else (recipe.hf,):
            g = gguf_table.to_gguf(hf)
            assert g is not None and gguf_table.to_hf(g.gguf) == hf, hf
