"""Start serving a model: load it, size its KV cache, start its engine, describe it for the
gateway. `surogate serve` and the TUI call this; tests can too. ``launch(path).llm()`` is the
model's generation API.

The KV cache on a GPU is sized as vLLM sizes it: a profile run (a runner with the smallest cache
runs the largest steps the limits allow) measures what a step needs beside the weights, the
driver says what other processes hold, and the cache gets what is left of
--gpu-memory-utilization x the GPU's memory, less room for the Programs of buckets compiled
later, counted as the allocator rounds its arrays."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import cached_property

from surogate.errors import ConfigError, InvalidArgumentError, OutOfMemoryError
from surogate.model import Model, load_model
from surogate.serve.embedder import Embedder
from surogate.serve.engine_client import EngineClient
from surogate.serve.llm import LLM
from surogate.serve.model_runner import ProgramRunner
from surogate.serve.multimodal import ImageEncoder
from surogate.serve.offload import WeightOffload, check_flags as check_offload_flags
from surogate.serve.types import EngineConfig

log = logging.getLogger(__name__)


@dataclass
class Launched:
    name: str
    model: Model
    client: EngineClient | None  # None: an encoder (bidirectional attention), served for embeddings only
    max_model_len: int
    kv_cache_tokens: int
    runner: ProgramRunner | None
    adapters: dict[str, int] = field(default_factory=dict)  # served adapter name -> engine slot
    offload: WeightOffload | None = None  # the decoder layers whose weights stream from host memory

    @property
    def generates(self) -> bool:
        return self.client is not None

    def llm(self, **kw) -> LLM:
        """The generation API over this engine: parsers detected from the chat template (``kw``:
        ``reasoning_parser``, ``tool_parser``, ``template_defaults``, ``chat_template``). A model
        with images (ModelSpec.vision) takes them: its family's ImagePrompt, one encoder per model."""
        return LLM.for_model(self.client, self.model.tokenizer, self.max_model_len,
                             model_type=self.model.config.get("model_type"), images=self.images, **kw)

    @cached_property
    def images(self) -> ImageEncoder | None:
        """The model's image path (its family's ImagePrompt around Model.encode_images, the served
        adapters' projectors by slot: Model.projectors); None: text only."""
        m = self.model
        if m.spec.vision is None or self.client is None:
            return None
        if m.family.image_prompt is None:
            log.warning("%s: the model has a vision tower, but its family does not say how prompts carry images "
                        "(Family.image_prompt): served for text only", m.spec.family)
            return None
        try:
            prompt = m.family.image_prompt(m.spec, m.tokenizer, m.mmproj or m.path)
        except ConfigError as e:  # e.g. a tokenizer without the image tokens: the model still serves text
            log.warning("%s: served for text only, without images: %s (%s)", self.name, e.message, e.hint)
            return None
        # Adapters that trained the projector: their images through it (the model's tower, their weights).
        encoder = ImageEncoder(prompt, m.encode_images, has_projector=m.projectors.__contains__)
        self.client.on_adapter_drop(encoder.forget_adapter)
        return encoder

    def embedder(self, pooling: str = "last") -> Embedder:
        """Embeddings from this model's final hidden states (``last`` or ``mean`` pooling, normalised)."""
        return Embedder.for_model(self.model, pooling)


SPECULATIVE_METHODS = ("ngram", "draft")  # the engine's proposers (kernels_native/serve/engine.h)
CPU_KV_TOKENS = 16384  # the CPU's default KV cache, in tokens
MIN_KV_BLOCKS = 16  # a GPU KV cache smaller than this is an error, not a server
MAX_KV_TOKENS = 2**31  # a step's slots (block x block_size + offset) are int32
# Room kept for the Programs of the buckets a server meets after the profile run: each holds its
# own activations arena and CUDA graph. Over the 38 token buckets of a 2048-token budget the
# planner's arenas add up to 10-22 times the largest (qwen3-0.6b, llama-3.2-1b); 16 times the
# profiled step, and at least 1 GiB.
LATER_PROGRAMS = 16
LATER_PROGRAMS_MIN = 1 << 30


@dataclass(frozen=True)
class MemoryProfile:
    """A GPU's memory as the profile run found it, in bytes."""
    total: int  # the device's memory
    outside: int  # held outside our allocator: other processes, this process's CUDA context and graphs
    peak: int  # our allocator's peak during the run, its small KV cache left out: weights, other models, a step
    step: int  # of which the largest step's own buffers (arena, scratch, inputs)

    @property
    def later_programs(self) -> int:
        return max(LATER_PROGRAMS * self.step, LATER_PROGRAMS_MIN)

    def kv_budget(self, fraction: float, share: float) -> int:
        """The bytes a KV cache may take: ``share`` of what is left of ``fraction`` of the GPU once
        what others hold, our peak and room for later Programs are taken (vLLM's
        gpu_memory_utilization, split between the models of one GPU)."""
        return int((self.total * fraction - self.outside - self.peak - self.later_programs) * share)


def kv_tokens_for(budget: int, num_arrays: int, block_bytes: int, block_size: int, pad_blocks: int,
                  allocation_size=lambda n: n) -> int:
    """The largest KV cache, in tokens (whole blocks), whose ``num_arrays`` arrays (a K and a V per
    layer) of ``pad_blocks`` more blocks each fit in ``budget`` bytes as the allocator holds them
    (``allocation_size``: the bytes it reserves for a request, _native.allocation_size)."""
    def fits(blocks: int) -> bool:
        return num_arrays * allocation_size((blocks + pad_blocks) * block_bytes) <= budget

    lo, hi = 0, max(budget // (num_arrays * block_bytes) - pad_blocks, 0)  # the answer is in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo * block_size


def launch(source: str, *, name: str | None = None, dtype: str = "float32", device: str = "cpu",
           quantized: bool = False, loras: dict[str, str] | None = None, kv_cache_tokens: int | None = None,
           gpu_memory_utilization: float = 0.9, kv_share: float = 1.0, block_size: int = 16,
           max_num_seqs: int = 128, max_num_batched_tokens: int = 2048, max_model_len: int | None = None,
           seed: int | None = None, max_loras: int | None = None, speculative_method: str | None = None,
           num_speculative_tokens: int | None = None, prompt_lookup_min: int | None = None,
           prompt_lookup_max: int | None = None, speculative_disable_by_batch_size: int | None = None,
           mmproj: str | None = None, speculative_model: str | None = None, cpu_offload_gb: float | None = None,
           offload_layers: int | None = None) -> Launched:
    """``kv_cache_tokens`` None: 16,384 on the CPU; on a GPU, what is left of
    ``gpu_memory_utilization`` of its memory once a profile run measured the weights, a step of
    the largest bucket and what other processes hold (``kv_share`` of it, when several models
    share the GPU). ``max_loras``: how many LoRA adapters may be loaded at once (``loras`` and
    those loaded at run time, EngineClient.load_adapter); None: no limit. ``speculative_method``
    ("ngram", or "draft" with ``speculative_model``: a smaller model of the same tokenizer, on the
    same device in the same dtype, with a KV cache of as many blocks as the target's) with
    ``num_speculative_tokens``: speculative decoding (EngineConfig's fields). ``mmproj``: a GGUF
    model's vision tower, llama.cpp's mmproj file (--mmproj). ``cpu_offload_gb`` (vLLM's
    --cpu-offload-gb: at least that many GiB of weights, in whole decoder layers) or
    ``offload_layers`` (that many layers): weights kept in host memory and streamed to the device
    every step (surogate/serve/offload.py); the profile run then sees only the resident ones."""
    if speculative_method is not None and speculative_method not in SPECULATIVE_METHODS:
        raise InvalidArgumentError(f"--speculative-method {speculative_method!r} is not one of "
                                   f"{', '.join(SPECULATIVE_METHODS)}",
                                   hint="use ngram (prompt lookup) or draft (with --speculative-model)")
    if (speculative_method == "draft") != (speculative_model is not None):
        raise InvalidArgumentError("--speculative-method draft and --speculative-model go together",
                                   hint="e.g. --speculative-method draft --speculative-model Qwen/Qwen3-0.6B "
                                        "--num-speculative-tokens 4")
    if (speculative_method is None) != (num_speculative_tokens is None):
        raise InvalidArgumentError("--speculative-method and --num-speculative-tokens go together",
                                   hint="e.g. --speculative-method ngram --num-speculative-tokens 4")
    if speculative_method is None and (prompt_lookup_min is not None or prompt_lookup_max is not None):
        raise InvalidArgumentError("--prompt-lookup-min / --prompt-lookup-max are for --speculative-method ngram")
    if kv_cache_tokens is not None and kv_cache_tokens < block_size:
        raise InvalidArgumentError(f"--kv-cache-tokens {kv_cache_tokens} is less than one block ({block_size})")
    if max_loras is not None and len(loras or {}) > max_loras:
        raise InvalidArgumentError(f"{len(loras)} --lora adapters, more than --max-loras {max_loras}",
                                   hint="raise --max-loras or serve fewer adapters")
    if not 0 < gpu_memory_utilization <= 1:
        raise InvalidArgumentError(f"--gpu-memory-utilization {gpu_memory_utilization} is not in (0, 1]")
    check_offload_flags(cpu_offload_gb, offload_layers)  # (before the model loads)
    from surogate.model import resolve_device

    device = resolve_device(device)
    if dtype == "auto":
        dtype = "float32" if device == "cpu" else "bfloat16"
    from surogate.io.gguf import is_gguf
    from surogate.io.hf_folder import resolve_model_path

    quantized = quantized and is_gguf(resolve_model_path(source))  # an HF folder has no blocks to keep
    model = load_model(source, device=device, dtype=dtype, quantized=quantized, mmproj=mmproj)
    if model.tokenizer is None:
        raise InvalidArgumentError(f"{source} has no tokenizer", hint="serve a folder with tokenizer.json")
    offload = WeightOffload.plan(model, cpu_offload_gb=cpu_offload_gb, offload_layers=offload_layers)
    if offload is not None:
        log.info("%s: %s", source, offload.describe())
    if not model.spec.causal:  # an encoder (EmbeddingGemma): embeddings, no engine, no KV cache
        if loras:
            raise InvalidArgumentError(f"{source} is an encoder (bidirectional attention): it takes no --lora")
        limit = int(model.config.get("max_position_embeddings") or 2048)
        return Launched(name or _default_name(source), model, None,
                        min(limit, max_model_len) if max_model_len is not None else limit, 0, None)
    draft = None
    if speculative_model is not None:  # loaded first: a GPU's profile run then counts its weights
        draft = load_draft(speculative_model, model, dtype=dtype)
    if kv_cache_tokens is None:
        # a draft model's KV cache has the target's blocks: the two share the budget by bytes per block
        share = kv_share if draft is None else kv_share * kv_block_bytes(model) / (
            kv_block_bytes(model) + kv_block_bytes(draft))
        kv_cache_tokens = _auto_kv_tokens(model, gpu_memory_utilization, share, block_size, max_num_seqs,
                                          max_num_batched_tokens, num_speculative_tokens or 0, offload)
    num_blocks = kv_cache_tokens // block_size
    limit = int(model.config.get("max_position_embeddings") or num_blocks * block_size)
    limit = min(limit, num_blocks * block_size)
    if max_model_len is not None:
        limit = min(limit, max_model_len)
    runner = ProgramRunner(model, num_blocks=num_blocks, block_size=block_size, max_num_seqs=max_num_seqs,
                           offload=offload)
    draft_runner = None if draft is None else ProgramRunner(draft, num_blocks=num_blocks, block_size=block_size,
                                                            max_num_seqs=max_num_seqs)
    adapters = {}
    for slot, (adapter_name, adapter_path) in enumerate((loras or {}).items()):  # PEFT folders
        from surogate.models.peft import load_peft_adapter

        cfg, params = load_peft_adapter(adapter_path)
        runner.add_adapter(slot, cfg, params)
        adapters[adapter_name] = slot
    client = EngineClient(runner, EngineConfig(
        num_blocks=num_blocks, block_size=block_size, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, max_model_len=limit,
        eos_token_ids=list(model.tokenizer.eos_token_ids), seed=seed, speculative_method=speculative_method,
        num_speculative_tokens=num_speculative_tokens, prompt_lookup_min=prompt_lookup_min,
        prompt_lookup_max=prompt_lookup_max, speculative_disable_by_batch_size=speculative_disable_by_batch_size),
        adapters=adapters, max_loras=max_loras, draft=draft_runner)
    served_name = name or _default_name(source)
    return Launched(served_name, model, client, limit, num_blocks * block_size, runner, adapters, offload)


def load_draft(source: str, target: Model, *, dtype: str) -> Model:
    """The draft model of speculative decoding, loaded beside ``target`` (its device and dtype):
    an attention-only causal model whose tokenizer maps every token as the target's does."""
    draft = load_model(source, device=target.device, dtype=dtype)
    if not draft.spec.causal or "conv" in draft.spec.layer_kinds:
        raise InvalidArgumentError(f"--speculative-model {source}: a draft model must be a causal model of "
                                   "attention layers only (its rejected drafts must roll back with the KV cache)",
                                   hint="draft with a small model of the target's family, e.g. Qwen3-0.6B for Qwen3-8B")
    if draft.tokenizer is None or target.tokenizer is None:
        raise InvalidArgumentError(f"--speculative-model {source} has no tokenizer to compare with the target's",
                                   hint="use a folder or GGUF with its tokenizer")
    mine, theirs = draft.tokenizer.backend.get_vocab(), target.tokenizer.backend.get_vocab()
    if mine != theirs:
        differ = sorted(set(mine.items()) ^ set(theirs.items()), key=lambda kv: kv[1])[:3]
        raise InvalidArgumentError(
            f"--speculative-model {source}: its tokenizer differs from the target's ({len(mine)} vs {len(theirs)} "
            f"tokens; e.g. {', '.join(f'{t!r} -> {i}' for t, i in differ)})",
            hint="a draft model must share the target's tokenizer (the same family and tokenizer release)")
    return draft


def kv_block_bytes(model: Model) -> int:
    """The KV cache's bytes per token slot of a block, over all its layers' K and V arrays."""
    from surogate.model import _np_dtype

    s = model.spec
    return sum(2 * s.kv_heads_of(i) * s.head_dim_of(i) for i in s.cache_layers()) * _np_dtype(model.dtype).itemsize


def _auto_kv_tokens(model: Model, fraction: float, share: float, block_size: int, max_num_seqs: int,
                    max_num_batched_tokens: int, num_speculative_tokens: int = 0,
                    offload: WeightOffload | None = None) -> int:
    if model.device == "cpu":
        return CPU_KV_TOKENS
    from surogate import _native
    from surogate.model import _np_dtype

    s = model.spec
    p = profile_memory(model, block_size, max_num_seqs, max_num_batched_tokens, num_speculative_tokens, offload)
    layers = s.cache_layers()  # layers differ in K / V width (Gemma 4): counted at the widest
    return gpu_kv_tokens(p, fraction, share, num_arrays=2 * len(layers),
                         block_bytes=block_size * max(s.kv_heads_of(i) * s.head_dim_of(i) for i in layers)
                         * _np_dtype(model.dtype).itemsize,
                         block_size=block_size, allocation_size=_native.allocation_size, device=model.device,
                         step=f"--max-num-seqs {max_num_seqs}, {max_num_batched_tokens} batched tokens")


def gpu_kv_tokens(p: MemoryProfile, fraction: float, share: float, *, num_arrays: int, block_bytes: int,
                  block_size: int, allocation_size=lambda n: n, device: str = "cuda", step: str = "") -> int:
    """The KV cache a profiled GPU holds, in tokens; an error with the numbers when it has no
    room for MIN_KV_BLOCKS blocks. ``step`` names the limits the profiled step came from."""
    pad_blocks = ProgramRunner.pad_blocks_for(block_size)
    budget = p.kv_budget(fraction, share)
    tokens = kv_tokens_for(budget, num_arrays, block_bytes, block_size, pad_blocks, allocation_size)
    if tokens >= MIN_KV_BLOCKS * block_size:
        return min(tokens, MAX_KV_TOKENS // block_size * block_size - pad_blocks * block_size)
    GiB = 2**30
    need = num_arrays * allocation_size((MIN_KV_BLOCKS + pad_blocks) * block_bytes)
    at_least = (p.outside + p.peak + p.later_programs + need / share) / p.total
    raise InvalidArgumentError(
        f"{device} has no room for a KV cache at --gpu-memory-utilization {fraction}: "
        f"{fraction} x {p.total / GiB:.1f} GiB = {fraction * p.total / GiB:.1f} GiB, of which other processes "
        f"and this one's CUDA context hold {p.outside / GiB:.1f} GiB, the weights and a step of the largest "
        f"bucket ({step}) {p.peak / GiB:.1f} GiB, the Programs of later buckets {p.later_programs / GiB:.1f} GiB"
        + (f", the models sharing the GPU {1 - share:.0%} of the rest" if share < 1 else "")
        + f"; that leaves {max(budget, 0) / GiB:.2f} GiB, and {MIN_KV_BLOCKS * block_size} tokens need "
          f"{need / GiB:.2f} GiB",
        hint=(f"raise --gpu-memory-utilization to {at_least:.2f} or more" if at_least <= 1 else
              "free the GPU of other processes, or use a GPU with more memory or a smaller model")
        + ", lower --max-num-seqs, keep some weights in host memory (--cpu-offload-gb), or set --kv-cache-tokens")


def profile_memory(model: Model, block_size: int, max_num_seqs: int, max_num_batched_tokens: int,
                   num_speculative_tokens: int = 0, offload: WeightOffload | None = None) -> MemoryProfile:
    """The profile run (as vLLM's): a runner with the smallest KV cache runs the largest steps
    (ProgramRunner.profile), then our allocator's peak and the driver's view of the GPU say what
    a step needs and what others hold; the runner is dropped and its memory given back. With
    ``offload`` its weights are the resident ones and its two staging buffers."""
    from surogate import _native

    dev = model.device
    runner = None
    _native.reset_peak_stats(dev)  # this run's peak over what is held now, not an earlier high-water mark
    try:
        runner = ProgramRunner(model, ProgramRunner.profile_blocks(max_num_batched_tokens, max_num_seqs, block_size,
                                                                   num_speculative_tokens),
                               block_size, max_num_seqs=max_num_seqs, offload=offload)
        kv = sum(_native.allocation_size(a.nbytes) for a in runner.caches.values())
        step = runner.profile(max_num_batched_tokens, max_num_seqs, num_speculative_tokens)
        stats, mem = _native.allocator_stats(dev), _native.device_memory(dev)
    except OutOfMemoryError as e:  # not even the weights and one step fit beside what others hold
        raise OutOfMemoryError(
            f"{dev} cannot hold the weights and a step of the largest bucket (--max-num-seqs {max_num_seqs}, "
            f"{max_num_batched_tokens} batched tokens) before any KV cache: {e.message}",
            hint="free the GPU of other processes, lower --max-num-seqs, keep some weights in host memory "
                 "(--cpu-offload-gb), or use a GPU with more memory") from None
    finally:
        if runner is not None:
            runner.close()
        _native.empty_cache(dev)  # its blocks are of sizes no one asks for again
    return MemoryProfile(total=mem["total_bytes"],
                         outside=mem["total_bytes"] - mem["free_bytes"] - stats["reserved_bytes"],
                         peak=stats["peak_allocated_bytes"] - kv, step=step)


def _default_name(source: str) -> str:
    from pathlib import Path

    p = Path(str(source))
    if p.exists():
        return p.stem if p.suffix == ".gguf" else p.name
    return str(source)
