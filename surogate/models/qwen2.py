"""Qwen2 / Qwen2.5 (dense): Llama's layout with biases on the q, k and v projections (none on o),
an optional sliding window on the layers from ``max_window_layers`` on, and tied embeddings in
the small ones. In GGUF it is llama.cpp's "qwen2": q/k rows in HF's order (NEOX rope) and the
biases as ``attn_q.bias`` / ``attn_k.bias`` / ``attn_v.bias``. ChatML templates with Hermes tool
calls (``<tool_call>``) and no reasoning block."""

from __future__ import annotations

import dataclasses
import logging

from surogate.dsl import nn
from surogate.dsl.nn import ModelSpec
from surogate.io import gguf_config
from surogate.models import decoder
from surogate.models.family import ChatDefaults, Family, GGUFArchitecture, TinyModel

log = logging.getLogger(__name__)

_ROPE = {"theta": 1000000.0, "rope_type": "default"}


def sliding_windows(cfg: dict) -> list[int]:
    """Per-layer windows as transformers' Qwen2Config defines them: none unless
    ``use_sliding_window`` (default off; it also switches off a ``sliding_window`` the config
    names); then the layers ``layer_types`` calls sliding, or, without ``layer_types``, the layers
    from ``max_window_layers`` (default 28) on."""
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", False) else None
    if not window:
        return []
    layers = int(cfg["num_hidden_layers"])
    first = int(cfg.get("max_window_layers", 28))
    types = cfg.get("layer_types") or ["sliding_attention" if i >= first else "full_attention" for i in range(layers)]
    windows = [int(window) if t == "sliding_attention" else 0 for t in types]
    return windows if any(windows) else []


def spec_from_config(cfg: dict) -> ModelSpec:
    spec = decoder.spec_from_config(cfg, "qwen2")
    return dataclasses.replace(spec, attention_bias=True, sliding_windows=sliding_windows(cfg))


def gguf_metadata(config: dict, rope: dict) -> dict:
    # llama.cpp's qwen2 has no sliding-window key and runs every layer in full attention (as do
    # the released Qwen2.5 configs, whose use_sliding_window is false): say so, not drop it silently.
    if sliding_windows(config):
        log.warning("Qwen2 sliding window (%s tokens) is not written to GGUF: llama.cpp's qwen2 has no key for it, "
                    "and the file runs full attention on every layer", config.get("sliding_window"))
    return gguf_config.hyperparameters("qwen2", config, rope)


FAMILY = Family(
    name="qwen2",
    hf_architectures=("Qwen2ForCausalLM",),
    model_types=("qwen2",),
    spec_from_config=spec_from_config,
    architecture=nn.CausalLM,
    name_table=decoder.hf_name_table,
    gguf=GGUFArchitecture(
        name="qwen2",
        tensors=lambda: decoder.gguf_tensor_table(rope_permuted=False),
        config_from_gguf=lambda gf: gguf_config.hf_config(gf, "Qwen2ForCausalLM", "qwen2"),
        metadata=gguf_metadata,
    ),
    # Qwen2.5 templates offer tools in the system turn and answer in <tool_call> JSON (Hermes);
    # Qwen2 and 2.5 have no <think> block. "qwen2" also covers qwen2_moe's model type.
    chat=ChatDefaults(tool_parser="hermes", model_types=("qwen2",)),
    bench_shapes={
        "qwen2.5-0.5b": dict(vocab_size=151936, hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2,
                             head_dim=64, intermediate_size=4864, rms_norm_eps=1e-6, attention_bias=True,
                             tie_word_embeddings=True, rope=dict(_ROPE)),
        "qwen2.5-1.5b": dict(vocab_size=151936, hidden_size=1536, num_layers=28, num_heads=12, num_kv_heads=2,
                             head_dim=128, intermediate_size=8960, rms_norm_eps=1e-6, attention_bias=True,
                             tie_word_embeddings=True, rope=dict(_ROPE)),
        "qwen2.5-7b": dict(vocab_size=152064, hidden_size=3584, num_layers=28, num_heads=28, num_kv_heads=4,
                           head_dim=128, intermediate_size=18944, rms_norm_eps=1e-6, attention_bias=True,
                           tie_word_embeddings=False, rope=dict(_ROPE)),
    },
    # Two layers, q/k/v biases, tied, ChatML, the vocabulary padded; the second layer slides over
    # 8 tokens (max_window_layers=1), shorter than the parity tests' sequences: the window's edge.
    tiny=TinyModel(
        tokenizer="chatml",
        config={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "max_position_embeddings": 256, "rope_theta": 1000000.0,
                "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "use_sliding_window": True,
                "sliding_window": 8, "max_window_layers": 1},
        bos_token=None,
        eos_token="<|im_end|>",
        vocab_multiple=64,
        variants={
            # Qwen2.5's released configs: a sliding_window named but use_sliding_window off.
            "full-untied-gqa7": {"use_sliding_window": False, "tie_word_embeddings": False,
                                 "num_attention_heads": 7, "num_key_value_heads": 1, "hidden_size": 56,
                                 "num_hidden_layers": 3},
            "all-sliding-w5": {"sliding_window": 5, "max_window_layers": 0},
        },
        # transformers' GGUF reader (the reference) knows no sliding window for qwen2, nor does
        # llama.cpp: the GGUF checks run the full-attention config.
        gguf={"hidden_size": 256, "intermediate_size": 512, "use_sliding_window": False},
    ),
    fp8_linears=decoder.FP8_LINEARS,
)
