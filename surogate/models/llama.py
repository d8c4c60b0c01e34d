"""Llama 3.x (3.1, 3.2; SmolLM2 has its layout): the dense decoder of dsl/nn.py as it is, and in
GGUF its q/k rows in llama.cpp's rope order and its Llama 3 rope scaling as rope_freqs.weight.

The worked example of surogate/models/README-dev.md: every part of a family, each in a few lines.
"""

from __future__ import annotations

from surogate.dsl import nn
from surogate.io import gguf_config
from surogate.models import decoder
from surogate.models.family import ChatDefaults, Family, GGUFArchitecture, TinyModel

FAMILY = Family(
    name="llama",
    hf_architectures=("LlamaForCausalLM",),
    model_types=("llama",),
    spec_from_config=lambda cfg: decoder.spec_from_config(cfg, "llama"),
    architecture=nn.CausalLM,
    name_table=decoder.hf_name_table,
    gguf=GGUFArchitecture(
        name="llama",
        # llama.cpp runs Llama with its LLAMA rope (adjacent pairs): q/k rows stored permuted.
        tensors=lambda: decoder.gguf_tensor_table(rope_permuted=True),
        config_from_gguf=lambda gf: gguf_config.hf_config(gf, "LlamaForCausalLM", "llama"),
        metadata=lambda config, rope: gguf_config.hyperparameters("llama", config, rope),
        rope_freqs=True,
    ),
    # Llama 3 templates show their call format (<|python_tag|>, "parameters" under the headers),
    # which the parser registry reads from the template itself: nothing to assume.
    chat=ChatDefaults(),
    bench_shapes={
        "llama-3.2-1b": dict(vocab_size=128256, hidden_size=2048, num_layers=16, num_heads=32,
                             num_kv_heads=8, head_dim=64, intermediate_size=8192, rms_norm_eps=1e-5,
                             tie_word_embeddings=True,
                             rope={"theta": 500000.0, "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position": 8192.0}),
        # The long-context and offload figures' shape (meta-llama/Llama-3.1-8B's config.json).
        "llama-3.1-8b": dict(vocab_size=128256, hidden_size=4096, num_layers=32, num_heads=32,
                             num_kv_heads=8, head_dim=128, intermediate_size=14336, rms_norm_eps=1e-5,
                             tie_word_embeddings=False,
                             rope={"theta": 500000.0, "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position": 8192.0}),
        # Small enough for a CPU: SmolLM2-135M's shape.
        "smollm2-135m": dict(vocab_size=49152, hidden_size=576, num_layers=30, num_heads=9,
                             num_kv_heads=3, head_dim=64, intermediate_size=1536, rms_norm_eps=1e-5,
                             tie_word_embeddings=True, rope={"theta": 100000.0, "rope_type": "default"}),
        "tiny": dict(vocab_size=4096, hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=4,
                     head_dim=32, intermediate_size=768, rms_norm_eps=1e-5, tie_word_embeddings=False,
                     rope={"theta": 10000.0, "rope_type": "default"}),
    },
    # Two layers, grouped-query attention (4 query heads on 2), untied, a Llama-3-style tokenizer.
    tiny=TinyModel(
        tokenizer="llama3",
        config={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "max_position_embeddings": 256, "rope_theta": 500000.0,
                "rms_norm_eps": 1e-5, "tie_word_embeddings": False},
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        variants={
            "tied-gqa4-hd32-l1": {"tie_word_embeddings": True, "num_attention_heads": 4, "num_key_value_heads": 1,
                                  "head_dim": 32, "num_hidden_layers": 1},
            "mha-rope-llama3-l3-odd-vocab": {
                "num_key_value_heads": 4, "num_hidden_layers": 3, "vocab_size": 509,
                "rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
                                    "rope_theta": 500000.0}},
            "hd128-l4": {"head_dim": 128, "num_attention_heads": 2, "num_key_value_heads": 2, "num_hidden_layers": 4},
        },
    ),
    fp8_linears=decoder.FP8_LINEARS,
)
