"""Mistral (7B v0.1 - v0.3, Nemo, Small: the dense ``MistralForCausalLM``): Llama's layout under
its own config keys, with a sliding window over every layer when ``sliding_window`` is set (None:
full attention, as from v0.2 on). llama.cpp writes it as its "llama" architecture, q/k rows in
that rope order, so a Mistral GGUF loads as the Llama family, which runs it the same way.
Templates answer tool calls after ``[TOOL_CALLS]`` (the "mistral" parser)."""

from __future__ import annotations

import dataclasses
import logging

from surogate.dsl import nn
from surogate.dsl.nn import ModelSpec
from surogate.io import gguf_config
from surogate.models import decoder
from surogate.models.family import ChatDefaults, Family, GGUFArchitecture, TinyModel

log = logging.getLogger(__name__)


def sliding_windows(cfg: dict) -> list[int]:
    """transformers' MistralAttention slides every layer over ``sliding_window`` tokens when it
    is set; it reads no ``layer_types`` (Ministral's class does)."""
    window = cfg.get("sliding_window")
    return [int(window)] * int(cfg["num_hidden_layers"]) if window else []


def spec_from_config(cfg: dict) -> ModelSpec:
    return dataclasses.replace(decoder.spec_from_config(cfg, "mistral"), sliding_windows=sliding_windows(cfg))


def gguf_metadata(config: dict, rope: dict) -> dict:
    # convert_hf_to_gguf.py writes Mistral as "llama", which has no sliding window: llama.cpp runs
    # v0.1's 4096-token window as full attention, and so does a file read back here.
    window = config.get("sliding_window")
    if window and int(window) < int(config.get("max_position_embeddings", 0)):
        log.warning("Mistral sliding window (%s tokens) is not written to GGUF: llama.cpp's llama architecture "
                    "has no key for it, and the file runs full attention", window)
    return gguf_config.hyperparameters("llama", config, rope)


FAMILY = Family(
    name="mistral",
    hf_architectures=("MistralForCausalLM",),
    model_types=("mistral",),
    spec_from_config=spec_from_config,
    architecture=nn.CausalLM,
    name_table=decoder.hf_name_table,
    gguf=GGUFArchitecture(
        name="llama",
        tensors=lambda: decoder.gguf_tensor_table(rope_permuted=True),
        config_from_gguf=lambda gf: gguf_config.hf_config(gf, "LlamaForCausalLM", "llama"),
        metadata=gguf_metadata,
    ),
    # v3+ templates write [TOOL_CALLS] themselves (the parser registry reads it there); this covers
    # templates that take tools without showing the token.
    chat=ChatDefaults(tool_parser="mistral", model_types=("mistral",)),
    bench_shapes={
        # Mistral-7B-v0.3: the v3 vocabulary, rope base 1e6, no sliding window.
        "mistral-7b": dict(vocab_size=32768, hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8,
                           head_dim=128, intermediate_size=14336, rms_norm_eps=1e-5, tie_word_embeddings=False,
                           rope={"theta": 1000000.0, "rope_type": "default"}),
    },
    # Mistral-7B-v0.1 shrunk: two layers, GQA 4/2, untied, rope base 1e4, its sliding window cut to
    # 8 tokens (shorter than the parity tests' sequences); a Mistral-style tokenizer ([INST], [TOOL_CALLS]).
    tiny=TinyModel(
        tokenizer="mistral",
        # 768 rows, a multiple of 128 as Mistral's vocabularies are (32000, 32768, 131072), past the
        # tokenizer's 412: with 512 the Q8_0-blocks greedy test met a near-tie (top-2 gap 0.003,
        # flipped by the CPU engine's batching); with 768 the smallest gap is 0.016 (Llama's 0.02).
        config={"vocab_size": 768, "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "max_position_embeddings": 256, "rope_theta": 10000.0,
                "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "sliding_window": 8},
        bos_token="<s>",
        eos_token="</s>",
        variants={
            # v0.3: no window, rope base 1e6; Nemo's head_dim apart from hidden / heads.
            "full-hd32-gqa4": {"sliding_window": None, "rope_theta": 1000000.0, "head_dim": 32,
                               "num_attention_heads": 4, "num_key_value_heads": 1, "num_hidden_layers": 3},
            "w3-mha": {"sliding_window": 3, "num_key_value_heads": 4},
        },
        # The GGUF file has no window (llama.cpp's llama has none): the GGUF checks run without one.
        gguf={"hidden_size": 256, "intermediate_size": 512, "sliding_window": None},
    ),
    fp8_linears=decoder.FP8_LINEARS,
)
