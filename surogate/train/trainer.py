"""The trainer: `surogate sft` / `surogate pt` from a validated config to an adapter or model.

One optimizer step is `gradient_accumulation_steps` micro-batches through the native training
Program (its `forward` and `backward` phases, gradients accumulating in f32), then its
`optimizer` phase (global grad norm, clipping, AdamW, zeroing the accumulators). Python only
feeds inputs and reads the loss between those calls. The loss is the mean over every target
token of the step: each micro-batch's loss seed is 1 / (target tokens in the whole step).

Everything that decides the numbers is a function of the config and the seed (LoRA init, data
order, kernels with a fixed reduction order), so a run resumed from a checkpoint reproduces the
uninterrupted loss curve.

``gpus: R`` > 1 (data_parallel.py): this trainer is rank 0 of R, the others its replicas
(`_replica`: the same config, model and data; their own Program, weights, gradients, inputs and
optimizer shard); a step splits each global micro-batch of B * R rows among them. With
``dist`` (a `ProcessRank` from a launcher) this trainer is one rank of a group of processes:
the same step, the collectives over TCP; rank 0 writes the logs, checkpoints and outputs.

The step is one path for every trainer (`_step_with_metrics`): a subclass says what a step's
loss is a mean over (`_step_count`), how a global micro-batch splits (`_split`), what one
rank's micro-batches do (`_micro_batches`, forward and backward, returning values per
micro-batch) and how those values, in the one-rank order, become the loss and metrics
(`_reduce_step`); what a rank holds beyond the training Program it builds in `_build_rank`.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import io
import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from surogate import _native
from surogate.compile.fp8 import HISTORY_PREFIX, Fp8Recipe
from surogate.compile.grad_reduce import reduce_gradients
from surogate.config import SFTConfig
from surogate.dsl.nn import LORA_RNG, LoRAConfig
from surogate.errors import ConfigError
from surogate.model import ROUTER_LOSSES, Model, _np_dtype, load_model, resolve_device
from surogate.train.checkpoint import TrainerState, latest_checkpoint, load_checkpoint, save_checkpoint
from surogate.train.data import Batch, build_datasets, split_rows
from surogate.train.data_parallel import (DataParallel, ProcessRank, in_step_order, join_group, resolve_ranks,
                                          shard_owners)
from surogate.train.export import merge_into_checkpoint, save_hf_folder, write_sidecars
from surogate.train.image_feed import has_feed, images_per_batch, make_feed
from surogate.models.name_table import transposed_experts
from surogate.models.peft import LANGUAGE_MODEL_PREFIX, VISION_MODULES
from surogate.train.lora import init_lora, merge_into_hf, save_peft_adapter
from surogate.train.metrics import MetricsFeed
from surogate.train.optimizer import AdamW, AdamWParams
from surogate.train.schedule import Schedule
from surogate.train.zero3 import Zero3

MICRO_BATCH = ("forward", "backward")  # the phases one micro-batch runs (one CUDA graph)


@dataclass
class TrainResult:
    steps: int
    final_loss: float
    eval_loss: float | None
    output: Path  # the adapter or model folder written
    merged: Path | None = None


def qlora_load_args(cfg) -> dict:
    """load_model's keywords for ``qlora_gguf``: a GGUF model's own blocks (true) or projections
    quantized at load (a type name); nothing without it."""
    if getattr(cfg, "qlora_bnb", False):
        from surogate.io.nf4 import NF4Spec

        return {"quantize": "NF4", "nf4": NF4Spec(cfg.qlora_bnb_block_size, cfg.qlora_bnb_double_quant)}
    q = cfg.qlora_gguf
    if q is False:
        return {}
    from surogate.io import resolve_model_path
    from surogate.io.gguf import is_gguf

    gguf = is_gguf(resolve_model_path(cfg.model))
    if q is True:
        if not gguf:
            raise ConfigError(f"qlora_gguf: true keeps a GGUF model's blocks; {cfg.model} is not a GGUF file",
                              where="qlora_gguf", hint="name the type to quantize it to at load, e.g. qlora_gguf: Q4_K_M")
        return {"quantized": True}
    return {"quantize": q.upper()}


class Trainer:
    graph_kw: dict = {}  # extra Model.executable arguments of the training and reference Programs (GRPO's temperature)
    image_prompt = None  # the family's ImagePrompt, for a vision model's rows with images (_datasets)
    _frozen = None  # a full fine-tune's reference weights (reference_executable), shared by the ranks
    # ZeRO-2/3 on rank threads: a rank keeps the accumulators of the layer parameters it owns only
    # (the others staged, reduced every backward): every rank must run the same backwards.
    SHARD_GRADS = True

    def __init__(self, cfg: SFTConfig, model: Model | None = None, stream=None, dist: ProcessRank | None = None):
        self.cfg = cfg
        self.out = Path(cfg.output_dir)
        device = model.device if model is not None else resolve_device(cfg.device)
        self.dist = dist  # this process's rank of a group of processes (None: every rank is a thread here)
        self.world, self.dp = resolve_ranks(cfg, device, dist), None  # data parallel ranks (gpus, or processes)
        # Ranks in processes join their TCP group before loading anything: rank 0 listens on the
        # port its launcher found free at once (a port left free for a minute's loading may be
        # taken by then), and a rank that cannot join fails before it loads.
        # Two communicators over the one port: the Program's collectives and the gradient reducer's.
        self.group, self.reducer_group = join_group(dist) if dist is not None and self.world > 1 else (None, None)
        self.rank = dist.rank if dist is not None else 0
        self.local_rank = 0  # among this process's ranks (rank 0's Program shares the model's weights)
        self.model = model or load_model(cfg.model, device=device, dtype=cfg.dtype, **qlora_load_args(cfg))
        self._moe_options()
        self._vision_options()
        if self.model.tokenizer is None:
            raise ConfigError(f"{cfg.model} has no tokenizer.json", where="model",
                              hint="training needs the model's tokenizer")
        self.train_data, self.eval_data = self._datasets()
        self.B = cfg.per_device_train_batch_size  # rows per micro-batch of one rank
        self.N = self.B * self._tokens_per_row()
        per_epoch = math.ceil(self.train_data.num_batches(self.B * self.world) / cfg.gradient_accumulation_steps)
        self.total_steps = cfg.max_steps if cfg.max_steps > 0 else max(1, per_epoch * cfg.num_epochs)
        self.steps_per_epoch = per_epoch
        warmup = cfg.warmup_steps or int(round(cfg.warmup_ratio * self.total_steps))
        self.schedule = Schedule(cfg.lr_scheduler_type, cfg.learning_rate, self.total_steps, warmup,
                                 cfg.final_lr_fraction, cfg.wsd_decay_steps_fraction)
        # "all": every projection of the family, by its own HF names (LFM2's out_proj, w1, in_proj ...).
        targets = self.model.family.lora_targets if "all" in cfg.lora_target_modules else tuple(cfg.lora_targets)
        self.lora = LoRAConfig(cfg.lora_rank, float(cfg.lora_alpha), tuple(targets),
                               dropout=float(cfg.lora_dropout)) if cfg.lora else None
        # recipe fp8_hybrid: the block projections of every Program below as FP8 GEMMs.
        self.fp8 = Fp8Recipe(cfg.fp8_amax_history, cfg.skip_quant_first_layers,
                             cfg.skip_quant_last_layers) if cfg.fp8 else None
        if self.fp8 is not None and self.N % 16:
            raise ConfigError(f"recipe fp8_hybrid: a micro-batch of {self.N} tokens (per_device_train_batch_size x "
                              "sequence_len) is not a multiple of 16, which FP8 GEMMs need", where="sequence_len",
                              hint="make sequence_len a multiple of 16")
        self._moe_load = None  # this step's routed rows [MoE layers, E], summed over micro-batches
        self._router_values: dict[str, list[float]] = {}  # this step's aux_loss / z_loss per micro-batch
        # ZeRO-3: the decoder layers' weights split among the ranks (planned by rank 0's Program).
        self.zero3 = Zero3(self.world) if self.world > 1 and cfg.zero_level == 3 else None
        if self.zero3 is not None and self.fp8 is not None:  # (a rank holds a shard of each frozen weight: no copies)
            self.fp8 = dataclasses.replace(self.fp8, cache_weights=False)
        self._build()
        self._names = list(self.model.params)  # every parameter of the model (the full model's outputs)
        if self.world > 1:
            self.dp = DataParallel(self)
        if self.zero3 is not None and self.dist is not None:
            self._release_others()
        quiet = self.rank != 0  # another process's rank: rank 0 reports
        self.feed = MetricsFeed(cfg.metrics_path if "jsonl" in cfg.report_to and not quiet else None,
                                use_wandb="wandb" in cfg.report_to and not quiet, wandb_project=cfg.wandb_project,
                                wandb_name=cfg.wandb_name, config=_jsonable(cfg),
                                resume_id_file=self.out / "wandb_id.txt",
                                stream=io.StringIO() if quiet else stream, total_steps=self.total_steps)

    # ---- setup ------------------------------------------------------------------------------
    def _moe_options(self) -> None:
        """train_router and router_z_loss_coef into the model's MoE spec (the graph reads them)."""
        c, m = self.cfg, self.model
        if c.train_router is None and c.router_z_loss_coef == 0:
            return
        if m.spec.moe is None:
            key = "train_router" if c.train_router is not None else "router_z_loss_coef"
            raise ConfigError(f"{c.model} has no mixture-of-experts layers", where=key, hint=f"remove {key}")
        m.spec = dataclasses.replace(m.spec, moe=dataclasses.replace(
            m.spec.moe, train_router=c.train_router, router_z_loss_coef=float(c.router_z_loss_coef)))
        m.arch = m.family.architecture(m.spec)
        m._cache.clear()  # programs built from the old spec

    def _vision_options(self) -> None:
        """train_projector into the model's vision spec (the graph reads it)."""
        c, m = self.cfg, self.model
        if not c.train_projector:
            return
        v = m.spec.vision
        if v is None or not hasattr(v, "train_projector"):
            raise ConfigError(f"{c.model} has no multimodal projector to train", where="train_projector",
                              hint="remove train_projector (it is for Gemma 3 and Qwen3-VL models with images)")
        m.spec = dataclasses.replace(m.spec, vision=dataclasses.replace(v, train_projector=True))
        m.arch = m.family.architecture(m.spec)
        m._cache.clear()  # programs built from the old spec

    def _datasets(self):
        """(train, eval or None): what the iterator and `_step` consume (a DPO trainer's are pairs)."""
        m = self.model  # a vision model's image placeholders (None: rows with images are errors)
        hook = m.family.image_prompt if m.spec.vision is not None and has_feed(m.family.name) else None
        self.image_prompt, refused = None, None
        if m.spec.vision is not None and hook is None:  # text rows still train
            refused = (f"this model's family ({m.family.name}) has a vision tower but no training feed for images yet",
                       "remove the rows' images, or train a Gemma 3 or Qwen3-VL model on them")
        if hook is not None:
            try:
                self.image_prompt = hook(m.spec, m.tokenizer, str(m.path))
            except ConfigError as e:  # (a tokenizer without the image tokens): text rows still train
                logging.getLogger(__name__).warning("%s: rows with images are refused (%s)", self.cfg.model, e.message)
                refused = (f"this model cannot take them: {e.message}", e.hint or "check the model's tokenizer")
        return build_datasets(self.cfg, m.tokenizer, image_prompt=self.image_prompt, images_refused=refused)

    def _tokens_per_row(self) -> int:
        """Tokens per batch row: a micro-batch is B rows, N = B * this tokens."""
        return self.cfg.sequence_len

    @property
    def mlp_chunk(self) -> int:
        """Rows per chunk of a tiled MLP (long_context: min(tokens, hidden_size), the original's
        choice), 0 when off."""
        return min(self.N, self.model.spec.hidden_size) if self.cfg.long_context else 0

    def _build(self) -> None:
        self._build_rank()
        m = self.model
        self.eval_exe = None
        # (ranks in other processes: rank 0 evaluates; under ZeRO-3 every rank, the gathers being collectives)
        if self.eval_data is not None and (self.rank == 0 or self.zero3 is not None):
            self._build_eval()

    def _build_eval(self) -> None:
        """The evaluation Program over this rank's training inputs and weights."""
        m, image_kw = self.model, {"images": self.images} if self.images else {}
        z = self.shard
        self.eval_exe = m.executable("train", self.N, self.N, lora=self.lora, grads=False, mlp_chunk=self.mlp_chunk,
                                     fp8=self.fp8, **({"shared": False, "rewrite": z.rewrite} if z else {}),
                                     **image_kw)
        self._bind_fp8_histories(self.eval_exe)  # (histories of its own: eval leaves training's alone)
        # The same device buffers as the training program (the weights come from the model).
        for n, a in self.trainable.items() if self.lora is not None or z else ():
            if n in self.eval_exe.lowered.by_value and not (z and z.zero3.sharded(n)):
                self.eval_exe.bind(n, a, self.exe.tensor(n))
        if z:
            z.bind(self.eval_exe, self._homes())
        for n in ("input_ids", "position_ids", "cu_seqlens", "targets", *self._image_inputs()):
            if n in self.exe.lowered.by_value:
                self.eval_exe.bind(n, self.inputs[n], self.exe.tensor(n))
        self.eval_exe.use_graphs(self.cfg.cuda_graphs)

    def _replica(self, rank: int) -> Trainer:
        """Rank ``rank``'s view of this trainer (data parallel): the same config, model, data and
        schedule; its own training Program, trainable weights (LoRA: its adapters; full
        fine-tune: a copy of the weights, which rank 0 keeps in the model), gradients, inputs and
        optimizer (ZeRO: its shard). Frozen base weights are shared (host memory, read only)."""
        r = copy.copy(self)
        r.rank, r.local_rank, r.dp, r.eval_exe = rank, rank, None, None
        r._moe_load, r._router_values = None, {}
        r._build_rank()
        if self.eval_exe is not None and self.zero3 is not None:  # (ZeRO-3: every rank evaluates)
            r._build_eval()
        return r

    def _build_rank(self) -> None:
        """What each rank holds: the training Program with its weights, gradients, optimizer and inputs."""
        m = self.model
        # Images (a vision model's rows with images): the Program reads the rows of this many (image_feed.py).
        self.images = images_per_batch((self.train_data, self.eval_data), self.B, self.image_prompt)
        if self.images and self.world > 1:
            raise ConfigError("rows with images do not split among data-parallel ranks yet", where="gpus",
                              hint="set gpus: 1 for a dataset with images")
        image_kw = {"images": self.images} if self.images else {}
        # ZeRO-3: this rank's share of the layers' weights; its Programs are its own, with the gathers in.
        z = self.shard = self.zero3.rank(self.rank) if self.zero3 is not None else None
        rewrite = self._rewrite(z)
        self.exe = m.executable("train", self.N, self.N, lora=self.lora, grads=True, recompute=self.cfg.recompute,
                                mlp_chunk=self.mlp_chunk, shared=self.local_rank == 0 and rewrite is None, fp8=self.fp8,
                                **({"rewrite": rewrite} if rewrite else {}), **self.graph_kw, **image_kw)
        if self.fp8 is not None and not any(n.attrs.get("fp8") for n in self.exe.graph.nodes):
            raise ConfigError(f"recipe fp8_hybrid: no projection of {self.cfg.model} is left to run in FP8",
                              where="skip_quant_first_layers",
                              hint="lower skip_quant_first_layers / skip_quant_last_layers (the model has "
                                   f"{m.spec.num_layers} layers), or use recipe: bf16")
        self.fp8_state = self._bind_fp8_histories(self.exe)
        if self.mlp_chunk and not self.exe.lowered.tiled_mlps:
            raise ConfigError(f"long_context: {self.cfg.model} has no dense MLP to tile (its MLPs are experts)",
                              where="long_context", hint="remove long_context; recompute: true bounds a MoE's memory")
        storage = _np_dtype(m.dtype)
        if self.lora is not None:
            g = self.exe.graph
            self.masters = init_lora(g, self.cfg.seed)  # f32
            # Whole weights that train beside the adapters (a MoE router with train_router): copies,
            # so that the base model stays what the adapter applies to.
            for p in g.params():
                if p.trainable and not p.meta.get("lora"):
                    self.masters[p.name] = m.params[p.name].astype(np.float32)
            # (ZeRO-3: a rank keeps the adapters it owns, and the whole ones outside the layers)
            self.trainable = {n: np.ascontiguousarray(a.astype(storage)) for n, a in self.masters.items()
                              if z is None or z.keeps(n)}
            for n, a in self.trainable.items():
                if z is None or not z.zero3.sharded(n):
                    self.exe.bind(n, a)
        elif z is not None:  # the layers' pieces it owns are the model's arrays (each stepped by its owner only)
            names = [n for n in self.exe.external_names("param") if z.keeps(n)]
            self.trainable = {n: m.params[n] if self.local_rank == 0 or z.zero3.sharded(n) else m.params[n].copy()
                              for n in names}
            for n, a in self.trainable.items():
                if not z.zero3.sharded(n):
                    self.exe.bind(n, a)
        elif self.local_rank == 0:
            self.trainable = {n: m.params[n] for n in self.exe.external_names("param")}
        else:  # a replica updates weights of its own
            self.trainable = {n: m.params[n].copy() for n in self.exe.external_names("param")}
            for n, a in self.trainable.items():
                self.exe.bind(n, a)
        if z is not None:
            z.bind(self.exe, self._homes())
        self.grads = {}  # (ZeRO-2/3 rank threads: the layers' accumulators of other owners are views of the staging)
        staged = {n: (slot, at) for grp in self.grad_groups or () for n, slot, at in grp.staged}
        self.grad_staging = self._grad_staging(staged)
        for name in self.exe.external_names("grad"):
            b = self.exe.buf(name)
            if name[len("grad."):] in staged:
                slot, at = staged[name[len("grad."):]]
                arr = self.grad_staging[slot][at:at + b.nbytes].view(np.float32).reshape(b.shape)
            else:
                arr = np.zeros(b.shape, np.float32)
            self.exe.bind(name, arr)
            self.grads[name] = arr
        c = self.cfg
        adam = AdamWParams(c.learning_rate, c.adamw_beta1, c.adamw_beta2, c.adamw_epsilon, c.weight_decay,
                           c.max_grad_norm)
        self.owners = self._shard_owners()
        shard = {} if self.owners is None else {"owned": {n for n, r in self.owners.items() if r == self.rank},
                                                 "norm_input": c.zero_level >= 2}
        if z is not None:  # the step updates the arrays this rank keeps, in a Program of its own
            shard["homes"] = self.trainable
        if c.optimizer in ("muon", "normuon"):
            from surogate.train.muon import Muon, muon_params

            if c.offload_optimizer and self.exe.device != "cpu":
                raise ConfigError(f"offload_optimizer keeps AdamW's state on the host; optimizer {c.optimizer} "
                                  "has no host step yet", where="offload_optimizer",
                                  hint="use optimizer adamw / adamw_8bit with it, or remove offload_optimizer")

            self.opt = Muon(self.exe, self.trainable, adam, muon_params(c), name_table=m.family.name_table(), **shard)
        else:
            self.opt = self._optimizer_class()(self.exe, self.trainable, adam,
                                               bits=8 if c.optimizer == "adamw_8bit" else 32, **shard)
        # Persistent input arrays: refilled in place each micro-batch, bound once.
        self.inputs = {"input_ids": np.zeros(self.N, np.int32), "position_ids": np.zeros(self.N, np.int32),
                       "cu_seqlens": np.zeros(self.N + 1, np.int32), "targets": np.zeros(self.N, np.int32),
                       "dloss": np.zeros(self.N, np.float32)}
        if LORA_RNG in self.exe.lowered.by_value:  # lora_dropout: the per-micro-batch seed
            self.inputs[LORA_RNG] = np.zeros(2, np.int32)
        # A MoE model's load-balancing loss and router z-loss: their coefficients.
        self.router_losses = {o: (seed, getattr(m.spec.moe, field)) for o, (seed, field) in ROUTER_LOSSES.items()
                              if seed in self.exe.lowered.by_value}
        for seed, _ in self.router_losses.values():
            self.inputs[seed] = np.zeros(1, np.float32)
        self.image_feed = make_feed(m, self.image_prompt, self.images, self.N) if self.images else None
        if self.image_feed is not None:
            self.inputs.update(self.image_feed.arrays)
        for n, a in self.inputs.items():
            if n in self.exe.lowered.by_value:  # (Qwen3-VL with images: MRoPE tables, no position_ids)
                self.exe.bind(n, a)
        self.exe.use_graphs(self.cfg.cuda_graphs)  # GPU: each micro-batch and optimizer step is one graph

    def _rewrite(self, z):
        """The passes over this rank's training Program: ZeRO-3's weight gathers, then the
        gradient reductions during the backward (surogate/compile/grad_reduce.py;
        ``grad_groups``: what they reduce, in order)."""
        self.grad_groups, self.reducer = None, None  # (the reducer: DataParallel's)
        if self.world == 1:
            return z.rewrite if z else None

        def rewrite(g, lowered):
            if z is not None:
                z.rewrite(g, lowered)
            owners = None
            if self.cfg.zero_level >= 2:  # (the split `_shard_owners` makes: ZeRO-3's, planned by its pass above)
                owners = self.zero3.trained_owners if z is not None else shard_owners(
                    {b.name[len("grad."):]: int(np.prod(b.shape)) for b in lowered.bufs
                     if b.kind == "external" and b.name.startswith("grad.")}, self.world)
            stage = self.rank if self.cfg.zero_level >= 2 and self.SHARD_GRADS else None
            self.grad_groups = reduce_gradients(lowered, owners, stage)

        return rewrite

    def _grad_staging(self, staged: dict[str, tuple[int, int]]) -> list[np.ndarray]:
        """Gradient sharding: the two staging buffers the layers' accumulators of other owners
        take turns in (zeroed: the reducer zeroes them again after each reduction)."""
        if not staged:
            return []
        nbytes = max(at + self.exe.buf("grad." + n).nbytes for n, (_, at) in staged.items())
        out = [_native.host_empty([nbytes], "uint8").numpy() for _ in range(2)]  # (64-byte aligned)
        for a in out:
            a[...] = 0
        return out

    def grad_bytes(self) -> dict[str, int]:
        """This rank's gradient memory: its own accumulators and the staging buffers."""
        own = sum(a.nbytes for a in self.grads.values() if a.base is None)
        return {"accumulators": int(own), "staging": int(sum(a.nbytes for a in self.grad_staging))}

    def _last_backward(self, last: bool) -> None:
        """Before a backward: whether it is this rank's last of the step (data parallel: its
        gradients are reduced layer by layer as it goes; a rank that arms none reduces them after)."""
        if self.reducer is not None:
            self.reducer.arm(last)

    def _bind_fp8_histories(self, exe) -> dict[str, np.ndarray]:
        """fp8_amax_history > 0 (delayed scaling): zeroed amax histories for the Program's
        quantize sites (graph inputs that every run rewrites), by name; nothing otherwise."""
        out = {n: np.zeros(exe.buf(n).shape, np.float32) for n in exe.external_names("input")
               if n.startswith(HISTORY_PREFIX)}
        for n, a in out.items():
            exe.bind(n, a)
        return out

    def _release_others(self) -> None:
        """ZeRO-3 in a process of its own: the model lets go of the layer weights other ranks
        keep (no Program here reads them; checkpoints and outputs take them from their keepers).
        A LoRA run that merges its adapter at the end keeps the base whole for the merge."""
        if self.lora is not None and self.cfg.merge_adapter:
            return
        for n in self._names:
            if self.zero3.sharded(n) and not self.shard.owns(n):
                del self.model.params[n]

    def _homes(self) -> dict[str, np.ndarray]:
        """ZeRO-3: the arrays that keep this rank's pieces of the layers (trained: its own; frozen: the model's)."""
        return {n: self.trainable[n] if n in self.trainable else self.model.params[n]
                for n in self.zero3.pieces(self.rank)}

    def _shard_owners(self) -> dict[str, int] | None:
        """ZeRO (gpus > 1, zero_level 1, 2 or 3): which rank steps each trained parameter."""
        if self.world == 1 or self.cfg.zero_level == 0:
            return None
        if self.zero3 is not None:  # (the same split, made once with the layers')
            return self.zero3.trained_owners
        sizes = {n[len("grad."):]: int(np.prod(self.exe.buf(n).shape)) for n in self.exe.external_names("grad")}
        return shard_owners(sizes, self.world)

    def _optimizer_class(self):
        """AdamW in the training Program, or on the host with offload_optimizer on a GPU."""
        if not self.cfg.offload_optimizer:
            return AdamW
        if self.exe.device == "cpu":
            logging.getLogger(__name__).info("offload_optimizer: on the CPU the optimizer state is in host memory "
                                             "already; nothing to offload")
            return AdamW
        from surogate.train.offload import HostAdamW

        return HostAdamW

    def reference_executable(self):
        """A forward-only Program of the reference policy over this rank's training inputs (DPO,
        GRPO): under LoRA the base weights with the adapter left out; for a full fine-tune a
        frozen copy of the starting weights (the policy's are updated in place), one copy that
        every data-parallel rank of this process reads."""
        m, z = self.model, self.shard
        gathers = {"shared": False, "rewrite": z.rewrite} if z else {}
        if self.lora is not None:  # (a replica's Program of its own: the cached one reads rank 0's inputs)
            ref = m.executable("train", self.N, self.N, lora=None, grads=False, fp8=self.fp8,
                               **(gathers or {"shared": self.local_rank == 0}), **self.graph_kw)
            if z:  # the base's pieces from the model, the gathers' adapter pieces from this rank's adapters
                z.bind(ref, self._homes())
        else:
            ref = m.executable("train", self.N, self.N, lora=None, grads=False, shared=False, fp8=self.fp8,
                               **({"rewrite": z.rewrite} if z else {}), **self.graph_kw)
            if self._frozen is None:  # (rank 0's, before any step: replicas are copies of it)
                # (ZeRO-3 across processes: the layers' pieces of this process's rank only)
                keep = z.keeps if z and self.dist is not None else (lambda n: True)
                self._frozen = {n: m.params[n].copy() for n in ref.external_names("param")
                                if n in m.params and keep(n)}
            for name, a in self._frozen.items():
                if not (z and z.zero3.sharded(name)):
                    ref.bind(name, a)
            if z:
                z.bind(ref, {n: self._frozen[n] for n in z.zero3.pieces(self.rank)})
        for n in ("input_ids", "position_ids", "cu_seqlens", "targets"):
            ref.bind(n, self.inputs[n], self.exe.tensor(n))
        self._bind_fp8_histories(ref)
        ref.use_graphs(self.cfg.cuda_graphs)
        return ref

    def fingerprint(self) -> str:
        c = self.cfg
        # The global rows per micro-batch (B x gpus): a run resumes on another rank count with the same global batch.
        rows = c.per_device_train_batch_size * self.world
        key = [c.model, c.sequence_len, rows, c.gradient_accumulation_steps, c.seed, c.lora, c.lora_rank,
               c.lora_alpha, sorted(c.lora_targets), c.recipe, [d.path for d in c.datasets], self.train_data.num_rows]
        if c.optimizer != "adamw":  # (appended so that adamw runs keep their fingerprints)
            key.append(c.optimizer)
        if c.lora and c.lora_dropout > 0:  # appended only when set: older fingerprints stay valid
            key.append(c.lora_dropout)
        if c.qlora_gguf is not False:
            key.append(["qlora_gguf", c.qlora_gguf])
        if c.fp8:
            key.append(["fp8", c.fp8_amax_history, c.skip_quant_first_layers, c.skip_quant_last_layers])
        if c.qlora_bnb:
            key.append(["qlora_bnb", c.qlora_bnb_block_size, c.qlora_bnb_double_quant])
        if c.train_router is not None or c.router_z_loss_coef:  # likewise
            key.append(["moe", c.train_router, c.router_z_loss_coef])
        if c.train_projector:
            key.append("train_projector")
        return hashlib.sha256(json.dumps(key, default=str).encode()).hexdigest()[:16]

    # ---- one step ---------------------------------------------------------------------------
    def _load_batch(self, b: Batch) -> None:
        s = len(b.cu_seqlens)
        self.inputs["input_ids"][:] = b.input_ids
        self.inputs["position_ids"][:] = b.position_ids
        cu = self.inputs["cu_seqlens"]
        cu[:s] = b.cu_seqlens
        cu[s:] = self.N  # empty documents fill the fixed-size boundary list
        self.inputs["targets"][:] = b.targets
        if self.image_feed is not None:
            self.image_feed.load(b, self.inputs["input_ids"])
        for n in ("input_ids", "position_ids", "cu_seqlens", "targets", *self._image_inputs()):
            if n in self.exe.lowered.by_value:
                self.exe.push(n)

    def _image_inputs(self):
        """The names of the image inputs the Programs read (image_feed.py), none without images."""
        return self.image_feed.arrays if self.image_feed is not None else ()

    def _dropout_seed(self, step: int, micro: int) -> None:
        """The LoRA dropout seed of one micro-batch: a function of (cfg.seed, step, micro, rank)
        only, so a resumed run draws the masks the uninterrupted one drew."""
        if LORA_RNG in self.inputs:
            micro = micro * self.world + self.rank  # (data parallel: each rank's micro-batches their own masks)
            key = hashlib.sha256(f"lora_dropout:{self.cfg.seed}:{step}:{micro}".encode()).digest()[:8]
            self.inputs[LORA_RNG].view(np.uint32)[:] = np.frombuffer(key, np.uint32)
            self.exe.push(LORA_RNG)

    def _step(self, batches: list[Batch], step: int = 0) -> tuple[float, int]:
        loss, count, _ = self._step_with_metrics(batches, step)
        return loss, count

    def _step_with_metrics(self, batches: list[Batch], step: int) -> tuple[float, int, dict]:
        """(the step's loss, its count (`_step_count`), further metrics for the step line): each
        rank's share of every micro-batch forward and backward, the gradients reduced, then the
        ranks' per-micro-batch values reduced in the one-rank order (data_parallel.py)."""
        total = self._step_count(batches)
        shares = self._shares(batches)
        parts = self._on_ranks(lambda t: t._micro_batches(shares[t.rank], step, total), grads=True)
        if self.dp is not None:
            self.dp.merge_moe_tallies()
        loss, metrics = self._reduce_step(in_step_order(parts), total)
        return loss, total, metrics

    def _step_count(self, batches: list[Batch]) -> int:
        """What the step's loss is a mean over (sft: target tokens), all ranks' micro-batches."""
        return sum(b.num_target_tokens for b in batches)

    def _split(self, batch: Batch) -> list[Batch]:
        """A global micro-batch (B * R rows) as the ranks' micro-batches, rank r's part r."""
        return split_rows(batch, self.world)

    def _shares(self, batches: list) -> list[list]:
        """Each rank's micro-batches of the step (``[rank][micro]``)."""
        if self.world == 1:
            return [batches]
        parts = [self._split(b) for b in batches]
        return [[p[r] for p in parts] for r in range(self.world)]

    def _on_ranks(self, fn, grads: bool = False) -> list:
        """``fn(rank's trainer)`` on every rank (without data parallel: this trainer), with
        ``grads`` then the gradients reduced; every rank's result, in rank order."""
        return [fn(self)] if self.dp is None else self.dp.each(fn, grads=grads)

    def _micro_batches(self, batches: list[Batch], step: int, total: int) -> list[tuple[float, float]]:
        """Forward and backward of this rank's micro-batches, gradients accumulating; ``total``:
        the target tokens of the whole step (every rank's). Per micro-batch: the loss summed over
        its target tokens and its share of the router losses."""
        seed = 1.0 / max(total, 1)
        out = []
        for micro, b in enumerate(batches):
            self._dropout_seed(step, micro)
            self._load_batch(b)
            valid = b.targets != -100
            self.inputs["dloss"][:] = np.where(valid, seed, 0.0)
            self.exe.push("dloss")
            for seed_input, coef in self.router_losses.values():  # coef * the mean over micro-batches
                self.inputs[seed_input][:] = coef / (len(batches) * self.world)
                self.exe.push(seed_input)
            self._last_backward(micro == len(batches) - 1)
            self.exe.run(*MICRO_BATCH)
            aux = 0.0
            for o, (seed_input, _) in self.router_losses.items():
                value = float(self.exe.read(o)[0])
                aux += float(self.inputs[seed_input][0]) * value
                self._router_values.setdefault(o, []).append(value)
            self._tally_expert_load(self.exe)
            out.append((float(self.exe.read("loss")[valid].sum(dtype=np.float64)), aux))
        return out

    def _reduce_step(self, parts: list, total: int) -> tuple[float, dict]:
        """The step's loss and further metrics from every micro-batch's `_micro_batches` values,
        in the one-rank order."""
        return sum(p[0] for p in parts) / max(total, 1) + sum(p[1] for p in parts), {}

    def _tally_expert_load(self, exe) -> None:
        """After a micro-batch: the rows each expert of each MoE layer got (its permute offsets)."""
        offsets = exe.graph.moe_offsets
        if not offsets:
            return
        load = np.stack([np.diff(exe.read(v.name).astype(np.int64)) for v in offsets])
        self._moe_load = load if self._moe_load is None else self._moe_load + load

    def _moe_metrics(self) -> dict:
        """The step line's MoE values, and a fresh tally for the next step: the routed rows per
        expert (over the MoE layers; padding rows are routed too), their max and mean, max / mean
        (1: balanced) overall and per layer, and the unscaled aux / z losses."""
        load, values = self._moe_load, self._router_values
        self._moe_load, self._router_values = None, {}
        out = {f"moe_{o}": float(np.mean(v)) for o, v in values.items()}
        if load is not None:
            total = load.sum(axis=0)
            mean = float(total.mean())
            out.update(moe_tokens_per_expert=total.tolist(), moe_load_max=int(total.max()), moe_load_mean=mean,
                       moe_load_imbalance=float(total.max() / mean) if mean > 0 else 0.0,
                       moe_layer_imbalance=[round(float(r.max() / r.mean()), 4) if r.mean() > 0 else 0.0
                                            for r in load])
        return out

    def evaluate(self) -> float | None:
        if self.eval_exe is None:
            return None
        loss_sum, count = 0.0, 0
        for b in self.eval_data.batches(self.B, shuffle=False):
            self._load_batch(b)
            self.eval_exe.run()
            valid = b.targets != -100
            loss_sum += float(self.eval_exe.read("loss")[valid].sum(dtype=np.float64))
            count += int(valid.sum())
        return loss_sum / max(count, 1)

    def _eval_metrics(self) -> dict:
        """The eval line's values; ``eval_loss`` first."""
        return {"eval_loss": self.evaluate()}

    def _evaluate(self) -> dict:
        """`_eval_metrics`; under ZeRO-3 on every rank at once (its Programs gather the weights
        from all ranks), each over the whole evaluation set, rank 0's values reported."""
        if self.zero3 is None:
            return self._eval_metrics()
        return self._on_ranks(lambda t: t._eval_metrics())[0]

    # ---- checkpoints ------------------------------------------------------------------------
    def _sync_to_host(self) -> None:
        """On a GPU: bring the trained weights and the optimizer's state into their host arrays."""
        if self.exe.device != "cpu":
            for n in self.trainable:
                self.exe.pull(n)
            self.opt.sync_to_host()

    def _masters(self) -> dict[str, np.ndarray]:
        """The f32 master weights of parameters stored narrower (data parallel: every rank's)."""
        return self.opt.master if self.dp is None else self.dp.masters()

    def _optimizer_state(self) -> dict[str, np.ndarray]:
        state = self.opt.state() if self.dp is None else self.dp.optimizer_state()
        # Delayed scaling's amax histories resume with the run (a fresh history would rescale).
        return {**state, **{"fp8/" + n: self.exe.pull(n).copy() for n in self.fp8_state}}

    def _apply(self, lr: float) -> float:
        """The optimizer step; returns the gradient norm before clipping."""
        return self.opt.apply(lr) if self.dp is None else self.dp.apply(lr)

    def _trainable_state(self) -> dict[str, np.ndarray]:
        self._sync_to_host()
        if self.zero3 is not None:  # each rank keeps its pieces of the layers: from every rank
            return self.dp.trained_state()
        masters = self._masters()
        return {n: masters.get(n, self.trainable[n]) for n in self.trainable}

    def _restore(self, path: Path) -> TrainerState:
        state, trainable, opt_state = load_checkpoint(path)
        if state.fingerprint and state.fingerprint != self.fingerprint():
            raise ConfigError(f"checkpoint {path} was written by a different run setup",
                              where="resume_from_checkpoint",
                              hint="resume with the same model, data, batch geometry and LoRA settings")
        for n, a in self.trainable.items():
            a[...] = trainable[n].astype(a.dtype)
            self.exe.push(n)
        self.opt.load_state(opt_state)
        for n, a in self.fp8_state.items():
            if "fp8/" + n not in opt_state:
                raise ConfigError(f"checkpoint {path} has no amax history {n}", where="fp8_amax_history",
                                  hint="resume with the fp8_amax_history the checkpoint was written with")
            if opt_state["fp8/" + n].shape != a.shape:
                raise ConfigError(f"checkpoint {path} holds amax history {n} of {opt_state['fp8/' + n].shape[0]} "
                                  f"values, this run {a.shape[0]} (fp8_amax_history + 1: this run's amax first)",
                                  where="fp8_amax_history",
                                  hint="resume with the fp8_amax_history the checkpoint was written with (a "
                                       "checkpoint from before this layout holds one value less: start it anew)")
            a[...] = opt_state["fp8/" + n]
            self.exe.push(n)
        if self.dp is not None:
            self.dp.load(trainable, opt_state)
        return state

    # ---- the loop ---------------------------------------------------------------------------
    def train(self) -> TrainResult:
        c = self.cfg
        ckpt_root = self.out / "checkpoints"
        state = TrainerState(fingerprint=self.fingerprint())
        if c.resume_from_checkpoint:
            path = latest_checkpoint(ckpt_root) if c.resume_from_checkpoint is True else Path(
                c.resume_from_checkpoint)
            if path is None:
                self.feed.message(f"no checkpoint under {ckpt_root}: starting from scratch")
            else:
                state = self._restore(path)
                self.feed.message(f"resumed from {path} at step {state.step}")
        it = self.train_data.iterator(self.B * self.world, position=(state.epoch, state.batch_index))
        start = state.step
        self.feed.write({"type": "start", "total_steps": self.total_steps, "start_step": start,
                         "tokens_per_step": self.N * c.gradient_accumulation_steps * self.world,
                         **({"ranks": self.world, "zero_level": self.dp.zero} if self.dp else {}),
                         **({"zero3": self.shard.report(self._homes())} if self.shard else {}),
                         "memory": str(self.exe.memory()), "output_dir": str(self.out)})
        eval_loss = None
        loss = float("nan")
        try:
            while state.step < self.total_steps:
                t0 = time.perf_counter()
                batches = [next(it) for _ in range(c.gradient_accumulation_steps)]
                loss, targets, extra = self._step_with_metrics(batches, state.step)
                extra = {**self._moe_metrics(), **extra}
                lr = self.schedule.lr_at(state.step + 1)
                norm = self._apply(lr)
                dt = time.perf_counter() - t0
                state.step += 1
                state.epoch, state.batch_index = it.position
                state.tokens_seen += self.N * len(batches) * self.world
                state.losses.append(loss)
                if not math.isfinite(loss):
                    raise FloatingPointError(f"loss is {loss} at step {state.step}")
                if state.step % max(c.logging_steps, 1) == 0 or state.step == self.total_steps:
                    self.feed.step(state.step, loss=loss, lr=lr, grad_norm=norm, start_step=start,
                                   tokens_per_second=self.N * len(batches) * self.world / dt, target_tokens=targets,
                                   epoch=state.step / self.steps_per_epoch, step_time=dt,
                                   elapsed=round(time.monotonic() - self.feed.t0, 3), **extra)
                if c.eval_steps > 0 and self.eval_exe is not None and state.step % c.eval_steps == 0:
                    record = self._evaluate()
                    eval_loss = record["eval_loss"]
                    self.feed.eval(state.step, **record)
                if c.save_steps > 0 and state.step % c.save_steps == 0 and state.step < self.total_steps:
                    self._save_checkpoint(ckpt_root, state)
            if self.eval_exe is not None and (c.eval_steps == 0 or self.total_steps % c.eval_steps != 0):
                record = self._evaluate()
                eval_loss = record["eval_loss"]
                self.feed.eval(state.step, **record)
            self._save_checkpoint(ckpt_root, state)
            if self.dp is not None and self.dist is not None:
                self.dp.freeze()  # (every rank: under ZeRO the shards come to rank 0)
            output, merged = self.save_outputs() if self.rank == 0 else (None, None)
            self.feed.write({"type": "end", "step": state.step, "loss": loss, "eval_loss": eval_loss,
                             "output": str(output)})
            if self.dp is not None:
                self.dp.finish()
        except BaseException as e:
            if self.dp is not None:  # the other processes' ranks fail now, not at their timeout
                self.dp.abort(f"rank {self.rank} failed: {type(e).__name__}: {e}")
            raise
        finally:
            self.feed.close()
            if self.dp is not None:
                self.dp.close()
        return TrainResult(state.step, loss, eval_loss, output, merged)

    def _save_checkpoint(self, root: Path, state: TrainerState) -> None:
        """Every rank gathers the state (ranks in processes under ZeRO: collectives), rank 0 writes."""
        trainable, opt_state = self._trainable_state(), self._optimizer_state()
        if self.rank == 0:
            save_checkpoint(root, state, trainable, opt_state, self.cfg.save_total_limit)

    def save_outputs(self) -> tuple[Path, Path | None]:
        m, c = self.model, self.cfg
        self._sync_to_host()
        source = m.path  # an HF folder or a GGUF file: either carries the tokenizer
        if self.lora is not None:
            vision = m.spec.vision is not None  # peft's names for the multimodal model's language model
            state = self._trainable_state()
            # train_projector: the projector saved whole (peft's modules_to_save), under the hub's names
            # (peft's module paths are model.*: Gemma 3's multi_modal_projector.* gets the prefix)
            modules = m.spec.vision.projector_modules if vision and c.train_projector else ()
            whole = m.to_hf({n: state.pop(n) for n in list(state) if n.startswith(tuple(p + "." for p in modules))})
            adapter = save_peft_adapter(self.out / "adapter", state, self.lora, base_model=c.model,
                                        **({"module_prefix": LANGUAGE_MODEL_PREFIX, "exclude_modules": VISION_MODULES}
                                           if vision else {}),
                                        **({"modules_to_save": list(modules),
                                            "whole": {n if n.startswith("model.") else "model." + n: a
                                                      for n, a in whole.items()}} if whole else {}))
            write_sidecars(source, adapter)  # a tokenizer beside the adapter, as peft users expect
            merged = None
            if c.merge_adapter and vision:  # into the checkpoint's own tensors, tower (and projector) as they are
                merged = merge_into_checkpoint(m.path, state, self.lora, self.out / "merged", whole=whole)
            elif c.merge_adapter and c.qlora_bnb:  # NF4: the dequantized base + the adapter, in bf16
                from surogate.model import nf4_dequantized

                hf = m.to_hf(nf4_dequantized(m))
                merged = save_hf_folder(self.out / "merged", merge_into_hf(hf, self._trainable_state(), self.lora),
                                        m.config, source=source, dtype="bfloat16")
            elif c.merge_adapter and m.quant:  # QLoRA: fold into the full-precision base, not the blocks
                from surogate.train.export import merge_adapter

                merged = merge_adapter(c.model, adapter, self.out / "merged")
            elif c.merge_adapter:
                hf = m.to_hf(m.params)
                merged = save_hf_folder(self.out / "merged", merge_into_hf(
                    hf, self._trainable_state(), self.lora,
                    transposed_experts=transposed_experts(m.family.name_table())),
                                        m.config, source=source, dtype=m.dtype)
            return adapter, merged
        masters = self._masters()
        # (ZeRO-3: each layer weight from the rank that keeps it; a process's model has let go of the others')
        state = self._trainable_state() if self.zero3 is not None else masters
        full = {n: state[n] if n in state else m.params[n] for n in self._names}
        return save_hf_folder(self.out / "model", m.to_hf(full), m.config, source=source,
                              dtype="float32" if masters else m.dtype), None


def _jsonable(cfg) -> dict:
    import msgspec

    return json.loads(msgspec.json.encode(cfg))
