"""Named model shapes for benchmarks (random weights; only the architecture matters)."""

from __future__ import annotations

from surogate.dsl.nn import ModelSpec
from surogate.errors import InvalidArgumentError

SHAPES: dict[str, dict] = {
    "qwen3-0.6b": dict(family="qwen3", vocab_size=151936, hidden_size=1024, num_layers=28, num_heads=16,
                       num_kv_heads=8, head_dim=128, intermediate_size=3072, rms_norm_eps=1e-6, qk_norm=True,
                       tie_word_embeddings=True, rope={"theta": 1000000.0, "rope_type": "default"}),
    "qwen3-1.7b": dict(family="qwen3", vocab_size=151936, hidden_size=2048, num_layers=28, num_heads=16,
                       num_kv_heads=8, head_dim=128, intermediate_size=6144, rms_norm_eps=1e-6, qk_norm=True,
                       tie_word_embeddings=True, rope={"theta": 1000000.0, "rope_type": "default"}),
    "llama-3.2-1b": dict(family="llama", vocab_size=128256, hidden_size=2048, num_layers=16, num_heads=32,
                         num_kv_heads=8, head_dim=64, intermediate_size=8192, rms_norm_eps=1e-5,
                         tie_word_embeddings=True,
                         rope={"theta": 500000.0, "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position": 8192.0}),
    # Small enough for a CPU: SmolLM2-135M's shape.
    "smollm2-135m": dict(family="llama", vocab_size=49152, hidden_size=576, num_layers=30, num_heads=9,
                         num_kv_heads=3, head_dim=64, intermediate_size=1536, rms_norm_eps=1e-5,
                         tie_word_embeddings=True, rope={"theta": 100000.0, "rope_type": "default"}),
    "tiny": dict(family="llama", vocab_size=4096, hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=4,
                 head_dim=32, intermediate_size=768, rms_norm_eps=1e-5, tie_word_embeddings=False,
                 rope={"theta": 10000.0, "rope_type": "default"}),
}


def spec_for(name: str) -> ModelSpec:
    """A named shape, or the shape an HF config.json (or a model folder holding one) describes."""
    from pathlib import Path

    path = Path(name)
    if path.is_dir():
        path = path / "config.json"
    if name not in SHAPES and path.is_file():
        import json

        from surogate.models import family_for

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
    return dict(vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, num_hidden_layers=spec.num_layers,
                num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_kv_heads, head_dim=spec.head_dim,
                intermediate_size=spec.intermediate_size, rms_norm_eps=spec.rms_norm_eps,
                tie_word_embeddings=spec.tie_word_embeddings, rope_parameters=rope, max_position_embeddings=131072)
