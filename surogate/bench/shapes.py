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


def _hf_rope(r: dict) -> dict:
    """Our rope attributes as transformers' rope_parameters."""
    rope = {"rope_theta": r["theta"], "rope_type": r.get("rope_type", "default")}
    if rope["rope_type"] == "llama3":
        rope.update(factor=r["factor"], low_freq_factor=r["low_freq_factor"], high_freq_factor=r["high_freq_factor"],
                    original_max_position_embeddings=int(r["original_max_position"]))
    elif rope["rope_type"] == "linear":
        rope.update(factor=r["factor"])
    elif rope["rope_type"] == "yarn":
        rope.update(factor=r["factor"], beta_fast=r["beta_fast"], beta_slow=r["beta_slow"],
                    truncate=bool(r["truncate"]), original_max_position_embeddings=int(r["original_max_position"]))
    return rope


def hf_config(spec: ModelSpec) -> dict:
    """The transformers config dict of a spec (for the peer): the same architecture, so that the
    peer computes what we compute (its sliding windows, query scale and per-kind rope too)."""
    cfg = dict(vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, num_hidden_layers=spec.num_layers,
               num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_kv_heads, head_dim=spec.head_dim,
               intermediate_size=spec.intermediate_size, rms_norm_eps=spec.rms_norm_eps,
               tie_word_embeddings=spec.tie_word_embeddings, rope_parameters=_hf_rope(spec.rope),
               max_position_embeddings=131072, hidden_act=spec.activation, hidden_activation=spec.activation)
    if spec.attention_bias:
        cfg["attention_bias"] = True
    windows = [w for w in spec.sliding_windows if w]
    if windows:
        cfg["sliding_window"] = max(windows)
        cfg["layer_types"] = ["sliding_attention" if w else "full_attention" for w in spec.sliding_windows]
    if spec.rope_sliding is not None:
        # Gemma 3: each kind of layer has its own rope (transformers v5's per-kind rope_parameters).
        cfg["rope_parameters"] = {"full_attention": _hf_rope(spec.rope),
                                  "sliding_attention": _hf_rope(spec.rope_sliding)}
    if spec.attn_scale:
        scalar = round(spec.attn_scale ** -2, 6)
        cfg["query_pre_attn_scalar"] = int(scalar) if scalar == int(scalar) else scalar  # transformers wants an int
    if spec.final_softcap:
        cfg["final_logit_softcapping"] = spec.final_softcap
    extra = family_named(spec.family).bench_hf_config  # what only the family's config class says
    return {**cfg, **extra(spec)} if extra else cfg



def hf_model_class(spec: ModelSpec):
    """The transformers class of a spec's family (its config class is ``.config_class``)."""
    import transformers

    return getattr(transformers, family_named(spec.family).hf_architecture)
