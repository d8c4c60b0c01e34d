"""Start serving a model: load it, size its KV cache, start its engine, describe it for the
gateway. `surogate serve` and the TUI call this; tests can too. ``launch(path).llm()`` is the
model's generation API."""

from __future__ import annotations

from dataclasses import dataclass, field

from surogate.errors import InvalidArgumentError
from surogate.model import Model, load_model
from surogate.serve.engine_client import EngineClient
from surogate.serve.llm import LLM
from surogate.serve.model_runner import ProgramRunner
from surogate.serve.types import EngineConfig


@dataclass
class Launched:
    name: str
    model: Model
    client: EngineClient
    max_model_len: int
    kv_cache_tokens: int
    runner: ProgramRunner
    adapters: dict[str, int] = field(default_factory=dict)  # served adapter name -> engine slot

    def llm(self, **kw) -> LLM:
        """The generation API over this engine: parsers detected from the chat template (``kw``:
        ``reasoning_parser``, ``tool_parser``, ``template_defaults``, ``chat_template``)."""
        return LLM.for_model(self.client, self.model.tokenizer, self.max_model_len,
                             model_type=self.model.config.get("model_type"), **kw)


CPU_KV_TOKENS = 16384  # the CPU's default KV cache, in tokens
GPU_RESERVE = 2 << 30  # bytes a GPU keeps beside weights and KV: CUDA context, cuBLAS, step activations, graphs


def kv_tokens_for(total: int, used: int, fraction: float, share: float, bytes_per_token: int,
                  block_size: int) -> int:
    """The KV cache a GPU holds, in tokens (whole blocks): ``share`` of what is left of
    ``fraction`` of its ``total`` memory once ``used`` bytes (weights, earlier models) and a
    reserve for everything else are taken (vLLM's gpu_memory_utilization, split between models)."""
    budget = (total * fraction - used - GPU_RESERVE) * share
    return max(int(budget // bytes_per_token) // block_size * block_size, 0)


def launch(source: str, *, name: str | None = None, dtype: str = "float32", device: str = "cpu",
           quantized: bool = False, loras: dict[str, str] | None = None, kv_cache_tokens: int | None = None,
           gpu_memory_utilization: float = 0.9, kv_share: float = 1.0, block_size: int = 16,
           max_num_seqs: int = 128, max_num_batched_tokens: int = 2048, max_model_len: int | None = None,
           seed: int | None = None) -> Launched:
    """``kv_cache_tokens`` None: 16,384 on the CPU; on a GPU, what fits in
    ``gpu_memory_utilization`` of its memory after the weights (``kv_share`` of it, when several
    models share the GPU)."""
    if kv_cache_tokens is not None and kv_cache_tokens < block_size:
        raise InvalidArgumentError(f"--kv-cache-tokens {kv_cache_tokens} is less than one block ({block_size})")
    if not 0 < gpu_memory_utilization <= 1:
        raise InvalidArgumentError(f"--gpu-memory-utilization {gpu_memory_utilization} is not in (0, 1]")
    from surogate.model import resolve_device

    device = resolve_device(device)
    if dtype == "auto":
        dtype = "float32" if device == "cpu" else "bfloat16"
    from surogate.io.gguf import is_gguf
    from surogate.io.hf_folder import resolve_model_path

    quantized = quantized and is_gguf(resolve_model_path(source))  # an HF folder has no blocks to keep
    model = load_model(source, device=device, dtype=dtype, quantized=quantized)
    if model.tokenizer is None:
        raise InvalidArgumentError(f"{source} has no tokenizer", hint="serve a folder with tokenizer.json")
    if kv_cache_tokens is None:
        kv_cache_tokens = _auto_kv_tokens(model, gpu_memory_utilization, kv_share, block_size)
    num_blocks = kv_cache_tokens // block_size
    limit = int(model.config.get("max_position_embeddings") or num_blocks * block_size)
    limit = min(limit, num_blocks * block_size)
    if max_model_len is not None:
        limit = min(limit, max_model_len)
    runner = ProgramRunner(model, num_blocks=num_blocks, block_size=block_size)
    adapters = {}
    for slot, (adapter_name, adapter_path) in enumerate((loras or {}).items()):  # PEFT folders
        from surogate.models.peft import load_peft_adapter

        cfg, params = load_peft_adapter(adapter_path)
        runner.add_adapter(slot, cfg, params)
        adapters[adapter_name] = slot
    client = EngineClient(runner, EngineConfig(
        num_blocks=num_blocks, block_size=block_size, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, max_model_len=limit,
        eos_token_ids=list(model.tokenizer.eos_token_ids), seed=seed), adapters=adapters)
    served_name = name or _default_name(source)
    return Launched(served_name, model, client, limit, num_blocks * block_size, runner, adapters)


def _auto_kv_tokens(model: Model, fraction: float, share: float, block_size: int) -> int:
    if model.device == "cpu":
        return CPU_KV_TOKENS
    from surogate import _native
    from surogate.model import _np_dtype

    index = int(model.device.partition(":")[2] or 0)
    total = next(d["total_memory"] for d in _native.cuda_devices() if d["index"] == index)
    used = _native.allocator_stats(model.device)["reserved_bytes"]
    s = model.spec
    per_token = 2 * s.num_layers * s.num_kv_heads * s.head_dim * _np_dtype(model.dtype).itemsize
    tokens = kv_tokens_for(total, used, fraction, share, per_token, block_size)
    if tokens < 16 * block_size:
        raise InvalidArgumentError(
            f"{model.device} has room for a KV cache of only {tokens} tokens at --gpu-memory-utilization {fraction} "
            f"({total / 2**30:.1f} GiB, {used / 2**30:.1f} GiB already in use)",
            hint="raise --gpu-memory-utilization, serve fewer models on this GPU, or set --kv-cache-tokens")
    return tokens


def _default_name(source: str) -> str:
    from pathlib import Path

    p = Path(str(source))
    if p.exists():
        return p.stem if p.suffix == ".gguf" else p.name
    return str(source)
