"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention (qk-norm) with a sparse
mixture-of-experts MLP (dsl/nn.py's MoE: a router to E experts, the top K per token, optionally
renormalised; no shared expert) on the layers ``decoder_sparse_step`` and ``mlp_only_layers``
leave sparse, a dense MLP of ``intermediate_size`` on the others, and transformers'
load-balancing loss (``router_aux_loss_coef``) in the training loss with ``output_router_logits``.
LoRA reaches the experts in peft's transformers-5 layout (dsl/nn.py MoE, surogate/models/peft.py).

Checkpoints hold one tensor per expert (``mlp.experts.{e}.gate_proj.weight``); our parameters
are transformers 5's stacked ones (``mlp.experts.gate_up_proj`` [E, 2F, C], ``down_proj``
[E, C, F]), assembled at load (name_table.Experts) and exported under those names."""

from __future__ import annotations

import dataclasses

from surogate.dsl import nn
from surogate.errors import UnsupportedError
from surogate.io import gguf_config
from surogate.models import decoder
from surogate.models.family import ChatDefaults, Family, GGUFArchitecture, TinyModel
from surogate.models.gguf_names import GGUFName, GGUFNameTable
from surogate.models.name_table import Direct, Experts, NameTable

_ROPE = {"theta": 1000000.0, "rope_type": "default"}


def num_experts(cfg: dict) -> int:
    """The hub's configs say num_experts; transformers 5 writes num_local_experts (its attribute_map)."""
    return int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)


def sparse_layers(cfg: dict) -> tuple[int, ...]:
    """The layers with experts, as Qwen3MoeDecoderLayer picks them."""
    n, step = int(cfg["num_hidden_layers"]), int(cfg.get("decoder_sparse_step", 1) or 1)
    dense = set(cfg.get("mlp_only_layers") or [])
    if num_experts(cfg) <= 0:
        return ()
    return tuple(i for i in range(n) if i not in dense and (i + 1) % step == 0)


def spec_from_config(cfg: dict) -> nn.ModelSpec:
    spec = decoder.spec_from_config(cfg, "qwen3_moe", qk_norm=True)
    layers = sparse_layers(cfg)
    if not layers:
        return spec
    coef = float(cfg.get("router_aux_loss_coef", 0.001)) if cfg.get("output_router_logits", False) else 0.0
    moe = nn.MoESpec(num_experts=num_experts(cfg), top_k=int(cfg.get("num_experts_per_tok", 8)),
                     intermediate_size=int(cfg["moe_intermediate_size"]), layers=layers,
                     norm_topk_prob=bool(cfg.get("norm_topk_prob", False)), router_aux_loss_coef=coef)
    return dataclasses.replace(spec, moe=moe)


def hf_name_table() -> NameTable:
    L = "model.layers.{i}."
    table = decoder.hf_name_table(qk_norm=True)
    table = NameTable({
        **table.entries,
        "layers.{i}.mlp.gate.weight": Direct(L + "mlp.gate.weight"),
        "layers.{i}.mlp.experts.gate_up_proj": Experts(
            L + "mlp.experts.gate_up_proj", (L + "mlp.experts.{e}.gate_proj.weight", L + "mlp.experts.{e}.up_proj.weight")),
        "layers.{i}.mlp.experts.down_proj": Experts(L + "mlp.experts.down_proj", (L + "mlp.experts.{e}.down_proj.weight",)),
    })
    return table


def gguf_tensor_table() -> GGUFNameTable:
    L, B = "model.layers.{i}.", "blk.{i}."
    table = decoder.gguf_tensor_table(rope_permuted=False, qk_norm=True)
    return GGUFNameTable({
        **table.entries,
        L + "mlp.gate.weight": GGUFName(B + "ffn_gate_inp.weight"),
        # llama.cpp's convert_hf_to_gguf.py stacks each projection over the experts: gate and up
        # apart, [E, F, C] each (our gate_up_proj is the two along axis 1), down [E, C, F].
        L + "mlp.experts.gate_up_proj": GGUFName(B + "ffn_gate_exps.weight", parts=(B + "ffn_up_exps.weight",), axis=1),
        L + "mlp.experts.down_proj": GGUFName(B + "ffn_down_exps.weight"),
    })


def expert_config(gf, config: dict) -> dict:
    """The experts' Qwen3MoeConfig keys from a GGUF's ``{arch}.expert_*`` keys (``config``: the
    file's other HF keys): every layer sparse, as llama.cpp's qwen3moe and qwen3vlmoe graphs run
    them (Qwen3-VL-MoE's text GGUF reads them here too)."""
    a = gf.architecture
    return dict(num_experts=int(gf.get(f"{a}.expert_count") or 0),
                num_experts_per_tok=int(gf.get(f"{a}.expert_used_count") or 0),
                moe_intermediate_size=int(gf.get(f"{a}.expert_feed_forward_length") or config["intermediate_size"]),
                decoder_sparse_step=1, mlp_only_layers=[])


def config_from_gguf(gf) -> dict:
    """llama.cpp's qwen3moe keys -> Qwen3MoeConfig's. Every layer of a qwen3moe file is sparse
    and its top-k weights are renormalised (llama.cpp's qwen3moe graph does both)."""
    config = gguf_config.hf_config(gf, "Qwen3MoeForCausalLM", "qwen3_moe")
    config.update(expert_config(gf, config),
                  norm_topk_prob=bool(gf.get(f"{gf.architecture}.expert_weights_norm", True)))
    return config


def expert_metadata(arch: str, config: dict, norm_topk_prob: bool) -> dict:
    """The ``{arch}.expert_*`` keys of a config whose layers are all sparse (llama.cpp's qwen3moe
    and qwen3vlmoe have experts in every layer: a dense one is refused)."""
    n = int(config["num_hidden_layers"])
    dense = sorted(set(range(n)) - set(sparse_layers(config)))
    if dense:
        raise UnsupportedError(f"{arch} GGUF: layers {dense} are dense (mlp_only_layers / decoder_sparse_step); "
                               f"llama.cpp's {arch} has experts in every layer",
                               hint="keep the model as a Hugging Face folder")
    return {f"{arch}.expert_count": num_experts(config),
            f"{arch}.expert_used_count": int(config.get("num_experts_per_tok", 8)),
            f"{arch}.expert_feed_forward_length": int(config["moe_intermediate_size"]),
            f"{arch}.expert_weights_norm": bool(norm_topk_prob)}


def gguf_metadata(config: dict, rope: dict) -> dict:
    return {**gguf_config.hyperparameters("qwen3moe", config, rope),
            **expert_metadata("qwen3moe", config, bool(config.get("norm_topk_prob", False)))}


def _tiny_moe(**kw) -> dict:
    base = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": True,
            "decoder_sparse_step": 1, "mlp_only_layers": [1], "output_router_logits": True,
            "router_aux_loss_coef": 0.05}
    return base | kw


def bench_hf_config(spec: nn.ModelSpec) -> dict:
    """Qwen3MoeConfig's keys of a bench shape (bench/shapes.py hf_config gives the common ones): the
    layers not listed as sparse are dense (mlp_only_layers)."""
    m = spec.moe
    return dict(num_experts=m.num_experts, num_experts_per_tok=m.top_k, moe_intermediate_size=m.intermediate_size,
                norm_topk_prob=m.norm_topk_prob, decoder_sparse_step=1,
                mlp_only_layers=[i for i in range(spec.num_layers) if i not in m.layers])


FAMILY = Family(
    name="qwen3_moe",
    hf_architectures=("Qwen3MoeForCausalLM",),
    model_types=("qwen3_moe",),
    spec_from_config=spec_from_config,
    architecture=nn.CausalLM,
    bench_hf_config=bench_hf_config,
    # Every projection: on the sparse layers gate / up / down_proj mean the experts' stacked weights
    # (peft's target_parameters gate_up_proj with rank 2r, down_proj; dsl/nn.py expert_lora), and
    # the dense layers' MLPs get none, as peft 0.21 does on transformers 5.
    lora_targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    name_table=hf_name_table,
    # Qwen/Qwen3-30B-A3B-FP8's layout: attention, the dense layers' MLPs and each expert's gate /
    # up / down_proj quantized (per expert, train/fp8_export.py); the routers and the norms kept
    # and listed, as its config's modules_to_not_convert lists them.
    fp8_linears=r"model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(experts\.\d+\.)?(gate|up|down)_proj)\.weight",
    fp8_kept=r"model\.layers\.\d+\.(input_layernorm|mlp\.gate|post_attention_layernorm)",
    gguf=GGUFArchitecture(
        name="qwen3moe",
        tensors=gguf_tensor_table,
        config_from_gguf=config_from_gguf,
        metadata=gguf_metadata,
    ),
    # Qwen3's templates (qwen3.py): <think> reasoning, Hermes tool calls. The "qwen3" prefix of
    # Qwen3's own defaults already covers this model type; these say the same.
    chat=ChatDefaults(reasoning_parser="qwen3", tool_parser="hermes", model_types=("qwen3_moe",)),
    bench_shapes={
        # Qwen/Qwen3-30B-A3B's config.json: 48 layers, all sparse, 128 experts, 8 per token.
        "qwen3-30b-a3b": dict(vocab_size=151936, hidden_size=2048, num_layers=48, num_heads=32, num_kv_heads=4,
                              head_dim=128, intermediate_size=6144, rms_norm_eps=1e-6, qk_norm=True,
                              tie_word_embeddings=False, rope=dict(_ROPE),
                              moe=nn.MoESpec(num_experts=128, top_k=8, intermediate_size=768, layers=tuple(range(48)),
                                             norm_topk_prob=True)),
        # Its first 12 layers: the HF + peft peer runs out of memory on the whole 30B shape on one
        # 141 GB GPU, and fits this one (the same layers, so tokens/s compare per layer).
        "qwen3-30b-a3b-l12": dict(vocab_size=151936, hidden_size=2048, num_layers=12, num_heads=32, num_kv_heads=4,
                                  head_dim=128, intermediate_size=6144, rms_norm_eps=1e-6, qk_norm=True,
                                  tie_word_embeddings=False, rope=dict(_ROPE),
                                  moe=nn.MoESpec(num_experts=128, top_k=8, intermediate_size=768,
                                                 layers=tuple(range(12)), norm_topk_prob=True)),
    },
    # Three layers, the middle one dense (mlp_only_layers), 8 experts of width 32, top 2
    # renormalised, the aux loss on (coefficient large enough that its gradients show).
    tiny=TinyModel(
        tokenizer="chatml",
        config={"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 256, "rope_theta": 1000000.0,
                "rms_norm_eps": 1e-6, "tie_word_embeddings": False, **_tiny_moe()},
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        vocab_multiple=64,
        variants={
            "e4-top1": _tiny_moe(num_experts=4, num_experts_per_tok=1, norm_topk_prob=False),
            "e16-top8": _tiny_moe(num_experts=16, num_experts_per_tok=8, norm_topk_prob=False, mlp_only_layers=[]),
            "e16-top8-renorm-step2": _tiny_moe(num_experts=16, num_experts_per_tok=8, decoder_sparse_step=2,
                                               mlp_only_layers=[]),
            "no-aux-tied": _tiny_moe(output_router_logits=False, tie_word_embeddings=True),
        },
        # Every layer sparse and renormalised, as llama.cpp's qwen3moe runs.
        # transformers' GGUF reader does not read expert_feed_forward_length (it keeps Qwen3MoeConfig's
        # 768): the tiny GGUF uses that width. The top-k of a random tiny router is full of near ties,
        # which any rounding of the weights flips (a jump in the logits, not the quantization's error):
        # here every token goes to all 6 experts (top 6 of 6; 2 and 8 met a near tie on the Q8_0
        # blocks greedy path), so the GGUF bounds measure the rounding alone.
        gguf={"hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 768, "mlp_only_layers": [],
              "num_hidden_layers": 2, "num_experts": 6, "num_experts_per_tok": 6,
              "norm_topk_prob": True, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 128},
    ),
)
