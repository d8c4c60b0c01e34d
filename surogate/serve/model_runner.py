"""The model runner: a model's serving Programs over the paged KV cache, one per shape bucket.

The stepping itself is native (``_native.serve.ProgramRunner``, kernels_native/serve/
program_runner.h): each step is padded up to a bucket (tokens, sequences, block-table width,
logits rows, adapter), that bucket's Program runs it, and only the rows of logits that sampling
reads come back: each Program ends in the sample op (``KVCache(sample=True)``), so a greedy row
needs only its argmax and a plain sampled row only its draw and logprob, made on the device under
the step's ``sample_params``. No Python
runs in a step except the first time a bucket is met: then the native runner calls
``ProgramRunner._compile`` (this module) with the GIL, which builds the Program.

LoRA adapters per request: ``add_adapter(slot, config, params)`` registers an adapter under the
engine's adapter slot (``remove_adapter(slot)`` drops it again, at run time); a step whose
sequences use several adapters (or the base model, -1) runs as one sub-step per adapter, each
through a Program with that adapter's LoRA slices bound. The engine keeps each adapter's
prefix-cache chain apart (so the engine client never reuses a slot number for another adapter).

Weights are bound to every Program without copies (on a GPU: the model's one device copy), but
those of the layers an ``offload`` plan keeps in host memory (surogate/serve/offload.py), which
every Program copies into the runner's two staging buffers as it runs; the
KV cache is one array per layer and per K / V (each layer's own shape; none for a layer that
shares an earlier layer's K / V) (numpy on the CPU, a device tensor on a GPU),
shared by all Programs. The padding tokens of a bucket write and read scratch blocks at the end
of the cache, which the engine never hands out.
"""

from __future__ import annotations

import math
import weakref

import numpy as np

from surogate import _native
from surogate.compile import Executable, fuse_serving
from surogate.compile.offload import stream_weights
from surogate.dsl.nn import KVCache, LoRAConfig
from surogate.errors import InvalidArgumentError
from surogate.model import Model, _np_dtype
from surogate.models.peft import PROJECTOR_MODULES, ROUTER
from surogate.serve.offload import Staging, WeightOffload

MAX_PAD = _native.serve.ProgramRunner.MAX_PAD  # padding tokens never exceed this


def bucket_tokens(t: int) -> int:
    """The token count a step of ``t`` tokens is padded to."""
    return _native.serve.ProgramRunner.bucket_tokens(t)


class ProgramRunner:
    """A loaded Model served through a native ``_native.serve.ProgramRunner`` (``.native``,
    what EngineClient hands the engine); ``run(step)`` runs one step outside an engine."""

    def __init__(self, model: Model, num_blocks: int, block_size: int = 16, fuse_qkv: bool | None = None,
                 max_num_seqs: int = 128, offload: WeightOffload | None = None):
        """``fuse_qkv``: serve each layer's q, k and v projections as one matmul over a fused copy
        of their weights, made here (default: on a GPU, where a decode step's small matmuls cost
        their launch more than their bytes). The copy is taken now: a runner whose model's
        weights change afterwards (training) must be made anew, unless the model keeps them
        stacked (``Model.stack_qkv``): then the runner binds the model's stack, no copy. ``max_num_seqs``: the engine's,
        the number of per-sequence state slots a model with conv layers keeps. ``offload``: the
        decoder layers whose weights stay in host memory and stream to the device every step
        (surogate/serve/offload.py; planned for this model with the runner's ``fuse_qkv``)."""
        if offload is not None and offload.model is not model:
            raise InvalidArgumentError("the weight offload plan was made for another model",
                                       hint="plan it with WeightOffload.plan(model, ...) for this runner's model")
        self.model = model
        self.offload = offload
        self.staging: Staging | None = None  # the streamed layers' device buffers (with offload)
        self.block_size = block_size
        self.num_blocks = num_blocks  # what the engine may hand out
        self.pad_blocks = self.pad_blocks_for(block_size)
        self.total_blocks = num_blocks + self.pad_blocks
        s = model.spec
        self.vocab_size = s.vocab_size
        self.fuse_qkv = model.device != "cpu" if fuse_qkv is None else fuse_qkv
        if offload is not None and offload.fuse_qkv != self.fuse_qkv:
            raise InvalidArgumentError(f"the weight offload plan packs q, k, v {'fused' if offload.fuse_qkv else 'apart'}"
                                       f", the runner serves them {'fused' if self.fuse_qkv else 'apart'}",
                                       hint="plan it with the runner's fuse_qkv (WeightOffload.plan(fuse_qkv=...))")
        self.max_num_seqs = max_num_seqs
        self.caches: dict[str, object] = {}
        self.tables: dict[str, object] = {}  # constant inputs of the steps with request rows
        self.fused: dict[str, tuple[np.ndarray | None, object]] = {}  # name -> (host array, device twin)
        self.released = False
        self._allocate()
        self._programs: dict[tuple[int, int, int, int, int, int], Executable] = {}  # (T, S, B, R, slot, E)
        # adapter slot -> (its LoRA config, our-named params in the model dtype, their device twins)
        self.adapters: dict[int, tuple[LoRAConfig, dict[str, np.ndarray], dict[str, object]]] = {}
        # The native runner calls back through a weak reference: a strong one (the bound method)
        # would make a cycle through C++ that Python's collector cannot see, and every runner (a
        # launch's profile run, a model unloaded from the server) would keep its model for good.
        compile_ = weakref.WeakMethod(self._compile)

        def compile_program(*key):
            fn = compile_()
            if fn is None:
                raise RuntimeError("the ProgramRunner that builds this engine's Programs is gone: keep it while "
                                   "its .native runs steps")
            return fn(*key)

        self.native = _native.serve.ProgramRunner(model.device, s.vocab_size, block_size, num_blocks,
                                                  self.pad_blocks, compile_program, model.arch.embed_width)

    @property
    def has_recurrent_state(self) -> bool:
        """Whether the model keeps per-sequence state beside its KV blocks (conv layers), which
        the prefix cache cannot restore: the engine runs such a model without prefix caching."""
        return "conv" in self.model.spec.layer_kinds

    def _allocate(self) -> None:
        """The KV cache (zeros: one array per attention layer and K / V), the conv state of each
        conv layer (one row per state slot) and the fused q/k/v weights."""
        m, s = self.model, self.model.spec
        dt = _np_dtype(m.dtype)
        def zeros(shape):
            return np.zeros(shape, dt) if m.device == "cpu" else _native.zeros(list(shape), m.dtype, m.device)

        for i in range(s.num_layers):
            if s.is_conv(i):
                self.caches[f"layers.{i}.conv_state"] = zeros((self.max_num_seqs, s.conv_kernel - 1, s.hidden_size))
        for i in s.cache_layers():  # a KV-shared layer reads its source's (Gemma 4)
            shape = (self.total_blocks, self.block_size, s.kv_heads_of(i), s.head_dim_of(i))
            for kv in ("k", "v"):
                self.caches[f"layers.{i}.{kv}_cache"] = zeros(shape)
        if self.fuse_qkv:
            self._fuse_qkv()
        if self.offload is not None:
            self.staging = self.offload.staging()
        # Constant inputs of the steps with request rows (Qwen3-VL: MRoPE's cos / sin by position),
        # one copy for all their Programs.
        tables = m.arch.serve_tables(KVCache(self.total_blocks, self.block_size))
        self.tables = {n: a if m.device == "cpu" else _native.tensor(a).to(m.device) for n, a in tables.items()}

    def close(self) -> None:
        """Drop what this runner made: its Programs with their scratch and graphs, the KV cache,
        the fused weights (the model's weights stay); a runner closed is not used again."""
        self.native.forget(-2)
        self._programs.clear()
        self.caches.clear()
        self.fused.clear()
        self.staging = None
        self.tables = {}

    def release(self) -> None:
        """Give the memory back (a sleeping model): what ``close`` drops, and the adapters' and
        the model's device copies (host arrays stay). The engine must be idle with its prefix
        cache reset (the cache's contents are gone); ``restore`` makes it all again, and the
        Programs compile anew as steps meet them."""
        self.close()
        for slot, (cfg, host, _) in list(self.adapters.items()):
            self.adapters[slot] = (cfg, host, {})
        self.model.release_device_memory()
        self.released = True

    def restore(self) -> None:
        """Undo ``release``: a zeroed KV cache, the fused weights, the adapters' device copies."""
        if not self.released:
            return
        self._allocate()
        if self.model.device != "cpu":
            for slot, (cfg, host, _) in list(self.adapters.items()):
                self.adapters[slot] = (cfg, host, {n: _native.tensor(a).to(self.model.device) for n, a in host.items()})
        self.released = False

    def _fuse_qkv(self) -> None:
        """layers.{i}.self_attn.qkv_proj.{weight,bias}: q, k, v rows stacked, in the model dtype.
        On a GPU only the device copy is kept (the host stack is made one layer at a time)."""
        m = self.model
        for i in range(m.spec.num_layers):
            for kind in ("weight", "bias"):
                parts = [f"layers.{i}.self_attn.{p}_proj.{kind}" for p in "qkv"]
                name = f"layers.{i}.self_attn.qkv_proj.{kind}"
                if self.offload is not None and name in self.offload.names:
                    continue  # streamed: its rows are in the layer's host pack, never on the device
                if name in m.stacks:  # the model keeps q, k, v as views of this stack: no copy
                    self.fused[name] = (m.stacks[name][0], None) if m.device == "cpu" else (None, m.device_param(name))
                    continue
                if not all(p in m.params for p in parts) or any(p in m.quant for p in parts):
                    continue
                stacked = np.ascontiguousarray(np.concatenate([m.params[p] for p in parts], axis=0))
                if m.device == "cpu":
                    self.fused[name] = (stacked, None)
                else:
                    self.fused[name] = (None, _native.tensor(stacked).to(m.device))

    def add_adapter(self, slot: int, cfg: LoRAConfig, params: dict[str, np.ndarray]) -> None:
        """Serve requests submitted with adapter ``slot`` through these LoRA weights (our parameter
        names, as surogate.models.peft.load_peft_adapter returns them). A multimodal projector
        trained beside them (train_projector) goes to the model's tower calls under the slot's key
        (Model.projectors: the encoder runs the slot's images through it)."""
        if slot < 0:
            raise InvalidArgumentError(f"adapter slot {slot} is negative (-1 is the base model)")
        params = dict(params)
        projector = {n: params.pop(n) for n in list(params) if n.startswith(PROJECTOR_MODULES)}
        g = self.model.arch.build(mode="logits", dtype=self.model.dtype, lora=cfg, quant=self.model.quant)
        # LoRA tensors, and a router trained beside them (train_router; peft's modules_to_save),
        # which this adapter's programs read instead of the base model's.
        want = {p.name: p.shape for p in g.params() if p.meta.get("lora") or (p.name in params and
                                                                              p.name.endswith(ROUTER))}
        missing = sorted(set(want) - set(params))
        unknown = sorted(set(params) - set(want))
        if missing or unknown:
            raise InvalidArgumentError(
                f"adapter {slot}: its tensors do not fit this model (missing {missing[:3]}, unexpected {unknown[:3]})",
                hint="the adapter was trained on another base model or with other target modules")
        dt = _np_dtype(self.model.dtype)
        host = {}
        for name, shape in want.items():
            if tuple(params[name].shape) != tuple(shape):
                raise InvalidArgumentError(f"adapter {slot}: {name} has shape {tuple(params[name].shape)}, "
                                           f"the model needs {tuple(shape)}",
                                           hint="the adapter was trained on another base model")
            host[name] = np.ascontiguousarray(params[name].astype(dt))
        self.model.projectors.add(slot, projector, what=f"adapter {slot}")  # checked, before anything is kept
        dev = {} if self.model.device == "cpu" else {
            n: _native.tensor(a).to(self.model.device) for n, a in host.items()}
        self._register(slot, cfg, host, dev)

    def bind_adapter(self, slot: int, cfg: LoRAConfig, host: dict[str, np.ndarray], device: dict | None = None) -> None:
        """Serve adapter ``slot`` from these very arrays, with no copy: a trainer's live LoRA
        weights (GRPO's co-located rollouts). ``host``: our parameter names -> contiguous arrays
        in the model dtype (the Programs read them on the CPU); ``device``: their device tensors
        on a GPU (the trainer's own). Updates made in place show in the next step; the caller
        resets the prefix cache when they change (cached blocks hold the old adapter's K / V)."""
        if slot < 0:
            raise InvalidArgumentError(f"adapter slot {slot} is negative (-1 is the base model)")
        g = self.model.arch.build(mode="logits", dtype=self.model.dtype, lora=cfg, quant=self.model.quant)
        want = {p.name: tuple(p.shape) for p in g.params() if p.meta.get("lora")}
        dt = _np_dtype(self.model.dtype)
        if set(want) != set(host):
            raise InvalidArgumentError(f"adapter {slot}: its tensors do not fit this model "
                                       f"(missing {sorted(set(want) - set(host))[:3]}, "
                                       f"unexpected {sorted(set(host) - set(want))[:3]})")
        for name, a in host.items():
            if tuple(a.shape) != want[name] or a.dtype != dt or not a.flags.c_contiguous:
                raise InvalidArgumentError(f"adapter {slot}: {name} is {a.dtype} {tuple(a.shape)}, the model needs a "
                                           f"contiguous {dt} array of shape {want[name]}")
        device = dict(device or {})
        if self.model.device != "cpu" and set(device) != set(host):
            raise InvalidArgumentError(f"adapter {slot}: a GPU model needs the device tensor of every LoRA array")
        self._register(slot, cfg, dict(host), device)

    def _register(self, slot: int, cfg: LoRAConfig, host: dict[str, np.ndarray], dev: dict) -> None:
        self.native.forget(slot)  # re-registered: rebuild (after any step in flight)
        self._programs = {k: v for k, v in self._programs.items() if k[4] != slot}
        self.adapters[slot] = (cfg, host, dev)

    def remove_adapter(self, slot: int) -> None:
        """Forget adapter ``slot``: its Programs, LoRA tensors (host and device) and projector. No
        step of it may run any more (the engine client calls this once its last request finished)."""
        if slot not in self.adapters:
            raise InvalidArgumentError(f"no adapter in slot {slot}")
        self.model.projectors.remove(slot)
        self.native.forget(slot)
        self._programs = {k: v for k, v in self._programs.items() if k[4] != slot}
        del self.adapters[slot]

    @property
    def kv_bytes(self) -> int:
        return sum(a.nbytes for a in self.caches.values())

    def _compile(self, T: int, S: int, B: int, R: int, slot: int = -1, E: int = 0) -> Executable:
        """The Executable of one bucket (called by the native runner, with the GIL): weights, the
        KV cache and the adapter's LoRA tensors bound; the step inputs are the native runner's.
        ``E`` > 0: a step with (up to E) embedding rows of requests' EmbedSpans, and kv_limit."""
        key = (T, S, B, R, slot, E)
        hit = self._programs.get(key)
        if hit is not None:
            return hit
        if self.released:
            raise InvalidArgumentError("the model's memory is released (asleep)", hint="wake it (restore()) first")
        if slot >= 0 and slot not in self.adapters:
            raise InvalidArgumentError(f"no adapter in slot {slot}", hint="register it with add_adapter first")
        m = self.model
        lora = self.adapters[slot][0] if slot >= 0 else None
        kv = KVCache(self.total_blocks, self.block_size, self.fuse_qkv, num_state_slots=self.max_num_seqs, embeds=E > 0,
                     sample=True)
        g = fuse_serving(m.arch.build(mode="serve", dtype=m.dtype, quant=m.quant, lora=lora, kv=kv))
        streamed = []
        if self.offload is not None:  # an adapter's own tensors (a router) are bound resident, below
            streamed = self.offload.streamed(set(self.adapters[slot][1]) if slot >= 0 else set())
            stream_weights(g, streamed, self.offload.flag)
        on_host = {n for layer in streamed for n in layer.params}
        dims = {"N": T, "S": S, "S1": S + 1, "B": B, "R": R} | ({"E": E} if E else {})
        exe = Executable(g, dims, m.device,
                         keep=[g.outputs[k] for k in ("logits", "sampled", "sampled.logprob", "sampled.rank")])
        if streamed:
            self.staging.bind(exe, streamed)
        for name in exe.external_names("param"):
            if name in on_host or name.startswith("offload."):
                continue  # bound inside the staging buffers, above
            if name in self.fused:
                host, dev = self.fused[name]
                exe.bind(name, host if host is not None else dev)
            elif name in m.params and (slot < 0 or name not in self.adapters[slot][1]):
                # (the adapter's LoRA tensors and routers are bound below)
                exe.bind(name, m.params[name], m.device_param(name))
        for name, arr in self.caches.items():
            exe.bind(name, arr)
        if E:
            for name, arr in self.tables.items():
                exe.bind(name, arr)
        if slot >= 0:
            _, host, dev = self.adapters[slot]
            for name, arr in host.items():
                exe.bind(name, arr, dev.get(name))
        exe.use_graphs()  # a decode step is hundreds of small kernels: one graph launch on a GPU
        self._programs[key] = exe
        return exe

    @staticmethod
    def pad_blocks_for(block_size: int) -> int:
        """The scratch blocks after the engine's, for the padding tokens of a bucket."""
        return math.ceil(MAX_PAD / block_size)

    @staticmethod
    def profile_blocks(max_num_batched_tokens: int, max_num_seqs: int, block_size: int,
                       num_speculative_tokens: int = 0) -> int:
        """The KV blocks ``profile`` needs (beside the pad blocks)."""
        blocks = _profile_shape(max_num_batched_tokens, max_num_seqs, block_size)[2]
        if num_speculative_tokens:
            S, n = _spec_shape(max_num_batched_tokens, max_num_seqs, num_speculative_tokens)
            blocks = max(blocks, S * -(-n // block_size))
        return blocks

    def profile(self, max_num_batched_tokens: int, max_num_seqs: int, num_speculative_tokens: int = 0) -> int:
        """The profile run: the largest steps an engine of these limits schedules, each run three
        times (eagerly, captured into a CUDA graph, replayed) so that the allocator sees all a
        step needs. One is a full token budget (a prefill chunk beside one decode token of every
        other sequence, a logits row each), one a full decode batch, and with speculative decoding
        a full verification batch (1 + num_speculative_tokens tokens per sequence, a logits row
        each). Returns the bytes the steps
        took at their peak above what was allocated once their Programs were compiled (which
        uploads the weights): arenas, scratch, inputs. Resets the device's peak statistics. The
        runner's KV cache needs ``profile_blocks`` blocks; its contents are scratch after."""
        need = self.profile_blocks(max_num_batched_tokens, max_num_seqs, self.block_size, num_speculative_tokens)
        if need > self.num_blocks:
            raise InvalidArgumentError(f"the profile run needs {need} KV blocks, the runner has {self.num_blocks}",
                                       hint="make it with num_blocks=ProgramRunner.profile_blocks(...)")
        steps = _profile_steps(max_num_batched_tokens, max_num_seqs, self.block_size)
        if num_speculative_tokens:
            S, n = _spec_shape(max_num_batched_tokens, max_num_seqs, num_speculative_tokens)
            per = -(-n // self.block_size)
            steps.append(_step([n] * S, [list(range(i * per, (i + 1) * per)) for i in range(S)], self.block_size,
                               all_rows=True))
        for step in steps:
            self._compile(*self.native.bucket_key(step, -1))
        device = self.model.device
        _native.reset_peak_stats(device)
        base = _native.allocator_stats(device)["allocated_bytes"]
        for step in steps:
            for _ in range(3):
                self.run(step, logits=False)
        return _native.allocator_stats(device)["peak_allocated_bytes"] - base

    def run(self, step, logits: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """One step (a ``_native.serve.StepInput``) outside an engine: (logits float32 [R, V],
        tokens int32 [R]: each row's argmax, or its draw under ``step.sample_params``); rows whose
        ``need_logits`` is 0 may be left unfilled. ``logits=False``: no logits come back (timing
        the step as the engine sees it)."""
        return self.native.run(step, logits)


def _profile_shape(max_num_batched_tokens: int, max_num_seqs: int, block_size: int) -> tuple[int, int, int]:
    """(sequences of the full-budget step, tokens of its prefill chunk, blocks the profile run uses)."""
    S = max(min(max_num_seqs, max_num_batched_tokens), 1)
    first = max_num_batched_tokens - (S - 1)  # the other sequences decode one token each
    return S, first, max(-(-first // block_size) + S - 1, max_num_seqs)


def _profile_steps(max_num_batched_tokens: int, max_num_seqs: int, block_size: int) -> list:
    """The profile run's steps (see ProgramRunner.profile). Every sequence starts at position 0
    in blocks of its own; block tables are padded with -1."""
    S, first, _ = _profile_shape(max_num_batched_tokens, max_num_seqs, block_size)
    n0 = -(-first // block_size)
    tables = [list(range(n0))] + [[n0 + i] + [-1] * (n0 - 1) for i in range(S - 1)]
    mixed = _step([first] + [1] * (S - 1), tables, block_size)
    decode = _step([1] * max_num_seqs, [[i] for i in range(max_num_seqs)], block_size)
    return [mixed, decode]


def _spec_shape(max_num_batched_tokens: int, max_num_seqs: int, k: int) -> tuple[int, int]:
    """(sequences, tokens each) of the largest verification step: 1 + k tokens per sequence."""
    return max(min(max_num_seqs, max_num_batched_tokens // (1 + k)), 1), 1 + k


def _step(lens: list[int], tables: list[list[int]], block_size: int, all_rows: bool = False):
    """A step of sequences starting at position 0, ``lens[s]`` tokens each, their last token's
    logits row wanted (every row's: ``all_rows``, a verification step)."""
    positions = np.concatenate([np.arange(n) for n in lens]).astype(np.int32)
    slots = np.concatenate([[t[p // block_size] * block_size + p % block_size for p in range(n)]
                            for n, t in zip(lens, tables)]).astype(np.int32)
    cu_q = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    return _native.serve.StepInput.make(
        token_ids=np.zeros(len(positions), np.int32), positions=positions, slot_mapping=slots, cu_q=cu_q,
        context_lens=np.asarray(lens, np.int32), block_tables=np.asarray(tables, np.int32).reshape(-1),
        logits_rows=np.arange(len(positions), dtype=np.int32) if all_rows else cu_q[1:] - 1, block_size=block_size)
