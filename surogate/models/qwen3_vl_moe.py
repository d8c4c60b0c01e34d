"""Qwen3-VL-MoE (transformers' Qwen3VLMoeForConditionalGeneration, Qwen3-VL-30B-A3B and -235B-A22B):
Qwen3-VL's vision tower, DeepStack and interleaved MRoPE (models/qwen3_vl.py, its tower, prompts
and graph dsl/nn_qwen3_vl.py Qwen3VLLM) over Qwen3-MoE's decoder (models/qwen3_moe.py: dsl/nn.py's
MoE block on the sparse layers, the load-balancing loss, expert LoRA in peft's layout). This file
is what differs, and only that:

- the text config (Qwen3VLMoeTextConfig, model_type qwen3_vl_moe_text: Qwen3MoeConfig's keys with
  its own defaults): the sparse layers as Qwen3VLMoeTextDecoderLayer picks them (mlp_only_layers,
  decoder_sparse_step), the top-k weights always renormalised (Qwen3VLMoeTextTopKRouter: the
  config has no norm_topk_prob), no shared expert, no sliding window, the load-balancing loss
  with text_config.output_router_logits;
- the experts: transformers 5 holds them stacked, gate_up_proj [E, 2F, C] and down_proj [E, C, F]
  (our layout), but the hub's checkpoints store them [E, C, 2F] and [E, F, C] (transformers'
  conversion_mapping transposes them by shape at load, and its save_pretrained writes its own
  layout back): the name table reads either, by the two tensors' shapes (name_table.Experts.layer),
  and `Model.to_hf` writes the hub's;
- the Family: Qwen3-VL's image prompts, vision hooks and checkpoint names, Qwen3-MoE's LoRA targets.

A config of model_type qwen3_vl_moe_text is the language model alone (Qwen3-MoE's graph with
Qwen3-VL's names). As GGUF: llama.cpp's qwen3vlmoe text model beside Qwen3-VL's mmproj, read and
written by qwen3_vl_gguf.py with Qwen3-MoE's expert tensors and keys (`GGUF`); only a model whose
every text layer is sparse can be written (llama.cpp's graph has experts in each).
"""

from __future__ import annotations

import dataclasses

from surogate.dsl import nn
from surogate.errors import UnsupportedError
from surogate.models import qwen3_moe, qwen3_vl, qwen3_vl_gguf
from surogate.models.family import ChatDefaults, Family, TinyModel
from surogate.models.name_table import Direct, Experts, NameTable

TEXT_TYPE = "qwen3_vl_moe_text"
# Qwen3VLMoeTextConfig's defaults (over Qwen3MoeConfig's); head_dim: hidden_size / heads; the
# expert count under the name transformers 5 writes (the hub's num_experts comes first:
# qwen3_moe.num_experts).
TEXT_DEFAULTS = {"vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 24,
                 "num_attention_heads": 16, "num_key_value_heads": 16, "hidden_act": "silu",
                 "max_position_embeddings": 128000, "rms_norm_eps": 1e-6, "attention_bias": False,
                 "moe_intermediate_size": 1408, "num_experts_per_tok": 4, "num_local_experts": 60,
                 "decoder_sparse_step": 1, "mlp_only_layers": [], "router_aux_loss_coef": 0.001,
                 "output_router_logits": False}


def spec_from_config(cfg: dict) -> nn.ModelSpec:
    """Qwen3-VL's spec (`qwen3_vl.language_spec`: the tower, MRoPE, the outer tie_word_embeddings)
    with the text config's experts on its sparse layers."""
    spec = qwen3_vl.language_spec(cfg, "qwen3_vl_moe", TEXT_TYPE, TEXT_DEFAULTS)
    text = qwen3_vl.text_config_of(cfg, TEXT_TYPE, TEXT_DEFAULTS)
    if text.get("use_sliding_window"):
        raise UnsupportedError("config.json: text_config.use_sliding_window is set",
                               hint="Qwen3-VL-MoE's language model has no sliding window (transformers ignores it)")
    layers = qwen3_moe.sparse_layers(text)
    if not layers:
        return spec
    coef = float(text.get("router_aux_loss_coef", 0.001)) if text.get("output_router_logits", False) else 0.0
    moe = nn.MoESpec(num_experts=qwen3_moe.num_experts(text), top_k=int(text["num_experts_per_tok"]),
                     intermediate_size=int(text["moe_intermediate_size"]), layers=layers, norm_topk_prob=True,
                     router_aux_loss_coef=coef)
    return dataclasses.replace(spec, moe=moe)


def hf_name_table() -> NameTable:
    """Qwen3-VL's table (the language model under model.language_model.*, the tower's) with each
    sparse layer's router and stacked experts; the experts in either layout (the module doc)."""
    L = qwen3_vl.language_model_name("model.layers.{i}.mlp.")
    layer = (L + "experts.gate_up_proj", L + "experts.down_proj")
    return NameTable({
        **qwen3_vl.hf_name_table().entries,
        "layers.{i}.mlp.gate.weight": Direct(L + "gate.weight"),
        "layers.{i}.mlp.experts.gate_up_proj": Experts(layer[0], (), transposed=True, layer=layer),
        "layers.{i}.mlp.experts.down_proj": Experts(layer[1], (), transposed=True, layer=layer),
    })


# llama.cpp's form: Qwen3-MoE's text GGUF (qwen3vlmoe: its experts and their keys, every layer
# sparse, the top-k always renormalised) beside Qwen3-VL's mmproj (qwen3_vl_gguf.py).
GGUF = qwen3_vl_gguf.Qwen3VLGGUF(
    arch="qwen3vlmoe", hf_architecture="Qwen3VLMoeForConditionalGeneration", model_type="qwen3_vl_moe",
    text_type=TEXT_TYPE, text_defaults=TEXT_DEFAULTS, spec_from_config=spec_from_config,
    text_tensors=qwen3_moe.gguf_tensor_table,
    expert_metadata=lambda arch, text: qwen3_moe.expert_metadata(arch, text, norm_topk_prob=True),
    expert_config=qwen3_moe.expert_config)


# A tiny checkpoint for tests (tests/sgtest/tiny_models.py make_qwen3_vl(moe=True), make_model):
# Qwen3-VL's TINY with three text layers, the middle one dense (mlp_only_layers), 6 experts of
# width 24, top 2, the load-balancing loss on (its coefficient large enough that its gradients show).
TINY_TEXT = {"num_hidden_layers": 3, "num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 24,
             "decoder_sparse_step": 1, "mlp_only_layers": [1], "output_router_logits": True,
             "router_aux_loss_coef": 0.05}
TINY = {**qwen3_vl.TINY, "text_config": {**qwen3_vl.TINY["text_config"], **TINY_TEXT}}


def _family() -> Family:
    dense = qwen3_vl.FAMILY
    return Family(
        name="qwen3_vl_moe",
        hf_architectures=("Qwen3VLMoeForConditionalGeneration",),
        model_types=("qwen3_vl_moe",),
        spec_from_config=spec_from_config,
        architecture=qwen3_vl.architecture,
        name_table=hf_name_table,
        checkpoint_aliases=dense.checkpoint_aliases,
        image_prompt=dense.image_prompt,
        vision=dense.vision,
        # Qwen3-MoE's: on the sparse layers gate / up / down_proj mean the stacked experts (peft's
        # target_parameters); the dense layers' MLPs get none, as peft 0.21 on transformers 5.
        lora_targets=qwen3_moe.FAMILY.lora_targets,
        gguf=GGUF.architecture(),
        chat=ChatDefaults(reasoning_parser="qwen3", tool_parser="hermes", model_types=("qwen3_vl_moe",)),
        bench_shapes={},
        tiny=TinyModel(tokenizer="chatml", config=TINY, bos_token=None, eos_token="<|im_end|>"),
    )


FAMILY = _family()
