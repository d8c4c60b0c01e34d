"""The config tree of `surogate sft` and `surogate pt`: one frozen msgspec Struct per YAML mapping.

Field order follows the YAML reference (run and IO, data, batch, optimization, LoRA, precision,
checkpoints and logging). Defaults are those of the original Surogate where it had one. Types
and enums are checked by msgspec; ranges and cross-field rules by ``surogate.config.loader``,
so every failure names its key. ``load_config`` is the way in; building a Struct by hand skips
those checks.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import msgspec

DatasetType = Literal["auto", "messages", "instruction", "text", "preference", "prompt"]
TrainOn = Literal["assistant", "last_turn", "all"]
# gate_up_proj: a MoE layer's stacked expert weight by its own name (peft's target_parameters;
# GPT-OSS has no gate_proj / up_proj modules to name).
LoRATarget = Literal["all", "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "gate_up_proj"]

# The projections LoRA adapts when lora_target_modules is ["all"].
ALL_LORA_TARGETS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class DatasetConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """One source of rows: a local file or folder, or a Hugging Face dataset repo id."""

    path: str
    # auto picks per row: messages/conversations -> messages, instruction+output -> instruction, text -> text.
    type: DatasetType = "auto"
    split: str = "train"  # which files of a folder or hub repo (names containing the split)
    subset: str | None = None  # a hub dataset's config name: files under a folder of that name
    samples: int | None = None  # read at most this many rows (the first ones, in file order)
    # Field names. messages_field None looks for "messages", then "conversations", then "conversation".
    messages_field: str | None = None
    text_field: str = "text"
    instruction_field: str = "instruction"
    input_field: str = "input"
    output_field: str = "output"
    system_field: str = "system"  # a per-row system prompt, when the row has it
    system_prompt: str | None = None  # a fixed system prompt for rows without one
    tools_field: str = "tools"
    # preference (surogate dpo): TRL's prompt / chosen / rejected rows, messages or plain strings;
    # without a prompt field the prompt is the messages chosen and rejected share at the start.
    prompt_field: str = "prompt"
    chosen_field: str = "chosen"
    rejected_field: str = "rejected"
    # prompt (surogate grpo): rows whose prompt_field is a string or a list of messages; the
    # completions are sampled. A path "builtin:NAME" is a generated set (surogate.train.grpo_env).
    train_on: TrainOn | None = None  # overrides the run's train_on for this dataset


class DistributedConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """Multi-node data parallel through Ray (the original Surogate's keys; surogate/train/ray_launch.py):
    one rank per node, the collectives over TCP (host memory: device: cpu for now)."""

    # "auto": the running cluster, "local": a new one on this machine, "ray://HOST:PORT": a Ray
    # client (`surogate sft --ray ADDRESS` sets it, and makes the block when the config has none).
    ray_address: str = "auto"
    num_nodes: int = 0  # ranks, one per node; 0: every alive node of the cluster


class SFTConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """`surogate sft`: supervised fine-tuning on chat, instruction or text rows."""

    kind: ClassVar[str] = "sft"

    # -- run and IO --
    model: str  # a local HF model folder or a hub id; need not exist when the config is loaded
    output_dir: str = "output"
    chat_template: str | None = None  # a template name of the model, or a whole Jinja template
    device: Literal["auto", "cpu", "cuda"] = "auto"
    seed: int = 1234

    # -- data --
    datasets: list[DatasetConfig]
    validation_datasets: list[DatasetConfig] = []
    # Share of the training documents held out for evaluation; None means 0.1, or 0 when
    # validation_datasets are given. Setting both is an error.
    validation_split_ratio: float | None = None
    sequence_len: int = 1024
    sample_packing: bool = True
    train_on: TrainOn = "assistant"
    skip_bad_rows: bool = False  # false: a malformed row stops the run; true: it is skipped and counted

    # -- batch and length --
    per_device_train_batch_size: int = 2
    gradient_accumulation_steps: int = 4
    num_epochs: int = 3
    max_steps: int = -1  # -1: num_epochs decides; > 0 wins over num_epochs

    # -- data parallel (the original Surogate's keys) --
    # Ranks, one thread each in this process, each with its own Programs and its share of every
    # micro-batch: global batch = per_device_train_batch_size x gradient_accumulation_steps x gpus.
    # 0: every GPU of the machine. With device: cpu the ranks are CPU threads over host memory
    # (how CI runs the data-parallel paths).
    gpus: int = 1
    # ZeRO with gpus > 1: 1 shards the optimizer state (each rank steps its share of the
    # parameters, then the updated weights are all-gathered), 2 also the gradients (reduced to
    # their owner instead of all-reduced), 3 also the decoder layers' weights (each rank keeps
    # its share, trained or frozen; a layer's weights are gathered from their owners just before
    # it runs, in forward and again in backward; not with surogate grpo); 0 keeps a full
    # optimizer on every rank (plain DP).
    zero_level: int = 1
    distributed: DistributedConfig | None = None  # several nodes through Ray (DistributedConfig)

    # -- optimization --
    # normuon / muon: 2-D matrices (projections, LoRA A / B) by Newton-Schulz orthogonalized
    # momentum; embeddings, head, norms and biases by AdamW with the adamw_* keys.
    optimizer: Literal["adamw", "adamw_8bit", "normuon", "muon"] = "adamw"
    learning_rate: float = 2e-4
    lr_scheduler_type: Literal["constant", "linear", "cosine", "wsd"] = "linear"
    warmup_steps: int = 0
    warmup_ratio: float = 0.0  # of the total steps; set warmup_steps or warmup_ratio, not both
    wsd_decay_steps_fraction: float = 0.1  # wsd: the share of steps spent decaying at the end
    final_lr_fraction: float = 0.0  # linear / cosine / wsd decay to learning_rate * this
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0  # 0 disables clipping
    adamw_beta1: float = 0.9
    adamw_beta2: float = 0.999
    adamw_epsilon: float = 1e-8
    normuon_momentum: float = 0.95  # beta1 of the momentum that is orthogonalized (normuon and muon)
    normuon_beta2: float = 0.95  # normuon: the per-neuron (row) second moment's decay
    normuon_epsilon: float = 1e-8
    normuon_cautious_wd: bool = True  # decay only where the update moves the weight toward 0
    muon_learning_rate: float | None = None  # the matrices' lr; None: learning_rate
    muon_nesterov: bool = True  # muon only (Keller Jordan's Muon); NorMuon's paper has none
    muon_ns_steps: int = 5  # Newton-Schulz iterations
    muon_ns_coefficients: list[float] = msgspec.field(default_factory=lambda: [3.4445, -4.7750, 2.0315])

    # -- LoRA --
    lora: bool = True  # false: full fine-tuning
    lora_rank: int = 16
    lora_alpha: float = 32
    lora_dropout: float = 0.0
    lora_target_modules: list[LoRATarget] = msgspec.field(default_factory=lambda: ["all"])
    # QLoRA over GGML blocks: the base's projection weights stay quantized (frozen) on the device.
    # true: a GGUF model's own blocks; a `surogate quantize` type (Q8_0, Q6_K, Q5_K_M, Q4_K_M):
    # quantize any checkpoint's projections at load.
    qlora_gguf: bool | str = False
    # QLoRA over bitsandbytes NF4 (the original Surogate's keys): the projections quantized at load
    # exactly as bitsandbytes' quantize_4bit does, kept 4-bit (+ absmax) in the model's tensors.
    qlora_bnb: bool = False
    qlora_bnb_block_size: int = 64
    qlora_bnb_double_quant: bool = True  # the absmax as 8-bit codes in blocks of 256 (bnb's nested state)

    # -- mixture of experts (the original Surogate's keys) --
    # The router weight (mlp.gate) trains: true under LoRA too (saved in the adapter as peft's
    # modules_to_save), false freezes it in a full fine-tune; unset: trained exactly without LoRA.
    train_router: bool | None = None
    router_z_loss_coef: float = 0.0  # ST-MoE's z-loss (mean logsumexp(router logits)^2) times this; 0: off

    # -- vision (Gemma 3, Qwen3-VL and Qwen3-VL-MoE with images) --
    # The multimodal projector trains beside the LoRA (or with the full fine-tune), saved in the
    # adapter as peft's modules_to_save: Gemma 3's [multi_modal_projector] (its norm and
    # projection), Qwen3-VL's [visual.merger, visual.deepstack_merger_list.0, ...] (the final and
    # the DeepStack mergers); the rest of the vision tower stays frozen.
    train_projector: bool = False

    # -- precision and memory --
    # fp8_hybrid (fp8-hybrid also accepted): bf16 weights and activations, the decoder blocks'
    # attention and MLP projections as FP8 GEMMs (surogate/compile/fp8.py): e4m3 forward, e5m2
    # gradients, per-tensor scales. fp32 for CPU runs and tests.
    recipe: Literal["bf16", "fp32", "fp8_hybrid", "fp8-hybrid"] = "bf16"
    # fp8_hybrid's scales: 0 is current scaling (each tensor's own amax, taken right before it is
    # quantized); H > 0 is TransformerEngine's delayed scaling, the max over the last H amaxes of
    # each quantized tensor (one per micro-batch; the original Surogate's default was 16).
    fp8_amax_history: int = 0
    # fp8_hybrid: this many decoder blocks at the start / the end keep their projections in bf16.
    skip_quant_first_layers: int = 0
    skip_quant_last_layers: int = 0
    recompute: bool = False
    # Tiled MLP: every dense MLP runs over chunks of min(tokens, hidden_size) rows, its [N, 2F]
    # interior recomputed per chunk in backward; the activation peak stops growing with the MLP.
    long_context: bool = False
    # AdamW's moments and f32 masters in host memory, its step on the CPU (gradients copied down,
    # weights up, once per step); a no-op on the CPU backend, where everything is host memory.
    offload_optimizer: bool = False
    cuda_graphs: bool = True  # on a GPU: replay each step as CUDA graphs (shapes are static)

    # -- checkpoints, evaluation, logging --
    save_steps: int = 50  # 0: save only at the end
    save_total_limit: int = 5  # checkpoints kept; 0 keeps all
    resume_from_checkpoint: bool | str = False  # true: the latest in output_dir; a string: that checkpoint
    merge_adapter: bool = False  # also write the base model with the adapter merged in
    eval_steps: int = 100  # 0 disables evaluation (and the validation split)
    logging_steps: int = 1
    report_to: list[Literal["jsonl", "wandb"]] = msgspec.field(default_factory=lambda: ["jsonl"])
    wandb_project: str | None = None
    wandb_name: str | None = None
    metrics_path: str | None = None  # load_config fills in <output_dir>/metrics.jsonl

    @property
    def dtype(self) -> str:
        """The dtype of weights and activations the recipe implies."""
        return {"bf16": "bfloat16", "fp32": "float32", "fp8_hybrid": "bfloat16", "fp8-hybrid": "bfloat16"}[self.recipe]

    @property
    def fp8(self) -> bool:
        """Whether the recipe is fp8_hybrid."""
        return self.recipe in ("fp8_hybrid", "fp8-hybrid")

    @property
    def eval_split_ratio(self) -> float:
        """The validation_split_ratio in effect (0 when evaluation is off or has its own datasets)."""
        if self.eval_steps == 0 or self.validation_datasets:
            return 0.0
        return 0.1 if self.validation_split_ratio is None else self.validation_split_ratio

    @property
    def lora_targets(self) -> tuple[str, ...]:
        """lora_target_modules with "all" expanded."""
        return ALL_LORA_TARGETS if "all" in self.lora_target_modules else tuple(self.lora_target_modules)

    def dataset_train_on(self, dataset: DatasetConfig) -> str:
        return dataset.train_on or self.train_on


class PTConfig(SFTConfig, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """`surogate pt`: (continued) pretraining. Every token is trained on, so train_on is "all"."""

    kind: ClassVar[str] = "pt"

    train_on: Literal["all"] = "all"
