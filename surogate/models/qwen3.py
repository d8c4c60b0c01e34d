"""Qwen3 (dense): Llama's layout plus per-head RMSNorm on q and k before rope (qk-norm); in GGUF
its q/k rows stay in HF's order (llama.cpp runs it with NEOX rope) and the norms are
attn_q_norm / attn_k_norm; ChatML templates with <think> and Hermes-style tool calls."""

from __future__ import annotations

from surogate.dsl import nn
from surogate.io import gguf_config
from surogate.models import decoder
from surogate.models.family import ChatDefaults, Family, GGUFArchitecture, TinyModel

_ROPE = {"theta": 1000000.0, "rope_type": "default"}

FAMILY = Family(
    name="qwen3",
    hf_architectures=("Qwen3ForCausalLM",),
    model_types=("qwen3",),
    spec_from_config=lambda cfg: decoder.spec_from_config(cfg, "qwen3", qk_norm=True),
    architecture=nn.CausalLM,
    name_table=lambda: decoder.hf_name_table(qk_norm=True),
    gguf=GGUFArchitecture(
        name="qwen3",
        tensors=lambda: decoder.gguf_tensor_table(rope_permuted=False, qk_norm=True),
        config_from_gguf=lambda gf: gguf_config.hf_config(gf, "Qwen3ForCausalLM", "qwen3"),
        metadata=lambda config, rope: gguf_config.hyperparameters("qwen3", config, rope),
    ),
    # Qwen templates offer tools in the system turn and answer in <tool_call> JSON (Hermes); some
    # speak of tools without showing the tag. Qwen3-MoE shares that (qwen2.py has Qwen2's).
    chat=ChatDefaults(reasoning_parser="qwen3", tool_parser="hermes", model_types=("qwen3",)),
    bench_shapes={
        "qwen3-0.6b": dict(vocab_size=151936, hidden_size=1024, num_layers=28, num_heads=16,
                           num_kv_heads=8, head_dim=128, intermediate_size=3072, rms_norm_eps=1e-6, qk_norm=True,
                           tie_word_embeddings=True, rope=dict(_ROPE)),
        "qwen3-1.7b": dict(vocab_size=151936, hidden_size=2048, num_layers=28, num_heads=16,
                           num_kv_heads=8, head_dim=128, intermediate_size=6144, rms_norm_eps=1e-6, qk_norm=True,
                           tie_word_embeddings=True, rope=dict(_ROPE)),
    },
    # Two layers, q/k norms, tied embeddings, the vocabulary padded past the tokenizer's, ChatML.
    tiny=TinyModel(
        tokenizer="chatml",
        config={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 256, "rope_theta": 1000000.0,
                "rms_norm_eps": 1e-6, "tie_word_embeddings": True},
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        vocab_multiple=64,
        variants={
            "untied": {"tie_word_embeddings": False},
            "tied-hd64-gqa4": {"tie_word_embeddings": True, "head_dim": 64, "num_attention_heads": 4,
                               "num_key_value_heads": 1},
        },
        # transformers' GGUF reader ignores key_length and assumes Qwen3's head_dim of 128.
        gguf={"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 2, "num_key_value_heads": 1,
              "head_dim": 128},
    ),
    fp8_linears=decoder.FP8_LINEARS,
)
