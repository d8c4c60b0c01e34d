"""Start serving a model: load it, size its KV cache, start its engine, describe it for the
gateway. `surogate serve` and the TUI call this; tests can too."""

from __future__ import annotations

from dataclasses import dataclass, field

from surogate.errors import InvalidArgumentError
from surogate.model import Model, load_model
from surogate.serve.engine_client import EngineClient
from surogate.serve.model_runner import ProgramRunner
from surogate.serve.types import EngineConfig


@dataclass
class Launched:
    name: str
    model: Model
    client: EngineClient
    max_model_len: int
    adapters: dict[str, int] = field(default_factory=dict)  # served adapter name -> engine slot


def launch(source: str, *, name: str | None = None, dtype: str = "float32", device: str = "cpu",
           quantized: bool = False, loras: dict[str, str] | None = None, kv_cache_tokens: int = 16384,
           block_size: int = 16, max_num_seqs: int = 128, max_num_batched_tokens: int = 2048,
           max_model_len: int | None = None, seed: int | None = None) -> Launched:
    if kv_cache_tokens < block_size:
        raise InvalidArgumentError(f"--kv-cache-tokens {kv_cache_tokens} is less than one block ({block_size})")
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
        eos_token_ids=list(model.tokenizer.eos_token_ids), seed=seed))
    served_name = name or _default_name(source)
    return Launched(served_name, model, client, limit, adapters)


def _default_name(source: str) -> str:
    from pathlib import Path

    p = Path(str(source))
    if p.exists():
        return p.stem if p.suffix == ".gguf" else p.name
    return str(source)
