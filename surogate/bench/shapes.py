"""Named model shapes for benchmarks (random weights; only the architecture matters), and the
HF transformers peer of a shape."""

from __future__ import annotations

from surogate.dsl.nn import ModelSpec
from surogate.errors import InvalidArgumentError
from surogate.models import REGISTRY, family_for, family_named

# Each family's named shapes (its file's bench_shapes: ModelSpec fields), in registry order.
SHAPES: dict[str, dict] = {name: {"family": f.name, **shape}
                           for f in REGISTRY for name, shape in f.bench_shapes.items()}


def spec_for(name: str) -> ModelSpec:
    """A named shape, or the shape an HF config.json (or a model folder holding one) describes."""
    from pathlib import Path

    path = Path(name)
    if path.is_dir():
        path = path / "config.json"
    if name not in SHAPES and path.is_file():
        import json

        config = json.loads(path.read_text())
        return family_for(config, source=str(path)).spec_from_config(config)
    if name not in SHAPES:
        raise InvalidArgumentError(f"unknown model shape {name!r}",
                                   hint=f"known: {', '.join(SHAPES)}; or give an HF config.json or model folder")
    return ModelSpec(**SHAPES[name])


def hf_config(spec: ModelSpec) -> dict:
    """The transformers config dict of a spec (for the peer)."""
    rope = {"rope_theta": spec.rope["theta"], "rope_type": spec.rope.get("rope_type", "default")}
    if rope["rope_type"] == "llama3":
        rope.update(factor=spec.rope["factor"], low_freq_factor=spec.rope["low_freq_factor"],
                    high_freq_factor=spec.rope["high_freq_factor"],
                    original_max_position_embeddings=int(spec.rope["original_max_position"]))
    cfg = dict(vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, num_hidden_layers=spec.num_layers,
               num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_kv_heads, head_dim=spec.head_dim,
               intermediate_size=spec.intermediate_size, rms_norm_eps=spec.rms_norm_eps,
               tie_word_embeddings=spec.tie_word_embeddings, rope_parameters=rope, max_position_embeddings=131072)
    if spec.moe is not None:  # Qwen3-MoE's keys: the layers not listed are dense (mlp_only_layers)
        m = spec.moe
        cfg.update(num_experts=m.num_experts, num_experts_per_tok=m.top_k, moe_intermediate_size=m.intermediate_size,
                   norm_topk_prob=m.norm_topk_prob, decoder_sparse_step=1,
                   mlp_only_layers=[i for i in range(spec.num_layers) if i not in m.layers])
    return cfg


def hf_model_class(spec: ModelSpec):
    """The transformers class of a spec's family (its config class is ``.config_class``)."""
    import transformers

    return getattr(transformers, family_named(spec.family).hf_architecture)
