"""Write models as Hugging Face folders: full checkpoints and merged LoRA fine-tunes (``surogate
merge``; ``--type FP8`` writes the merged folder as a block-FP8 one, train/fp8_export.py).

A folder is assembled under a temp name beside the destination and renamed into place, so a
crash never leaves a half-written model where a user (or `surogate serve`) would load it.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from surogate.errors import FileFormatError, InvalidArgumentError, NotFoundError
from surogate.io import ModelFolder, resolve_model_path, save_safetensors
from surogate.models.name_table import transposed_experts
from surogate.models.peft import PROJECTOR_MODULES, is_expert_lora
from surogate.models.registry import family_for
from surogate.train.fp8_export import quantize_to_fp8
from surogate.train.lora import _replace_dir, load_peft_adapter, merge_into_hf

# Files that travel with the weights: tokenizer, chat template, generation defaults.
SIDECAR_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                 "chat_template.json", "generation_config.json", "tokenizer.model", "vocab.json", "merges.txt",
                 "preprocessor_config.json", "processor_config.json")


def read_hf_tensors(folder: ModelFolder) -> dict[str, np.ndarray]:
    weights = folder.open_weights()
    return {name: np.asarray(weights.get(name)) for name in weights.keys()}


def write_sidecars(source: ModelFolder | str | Path | None, folder: Path) -> None:
    """The tokenizer, chat template and generation defaults of `source` (an HF folder, or a GGUF
    file whose metadata holds them) written into `folder`."""
    if source is None:
        return
    from surogate.io.gguf import is_gguf

    if not isinstance(source, ModelFolder):
        if is_gguf(source):
            from surogate.io.gguf_tokenizer import save_hf_tokenizer

            save_hf_tokenizer(source, folder)
            return
        source = ModelFolder(source)
    for name in SIDECAR_FILES:
        f = source.path / name
        if f.is_file():
            shutil.copy2(f, folder / name)


def save_hf_folder(out: str | Path, tensors: dict[str, np.ndarray], config: dict,
                   source: ModelFolder | str | Path | None = None, dtype: str | None = None) -> Path:
    """config.json + model.safetensors (+ the source's tokenizer and template files)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        cfg = dict(config)
        cfg.pop("quantization_config", None)  # the tensors written here are plain (a block-FP8 base's dequantized)
        if dtype is not None:
            cfg["torch_dtype"] = dtype
            cfg["dtype"] = dtype
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        save_safetensors(tmp / "model.safetensors", tensors, metadata={"format": "pt"})
        write_sidecars(source, tmp)
        _replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def checkpoint_prefix(tensors: dict, family, params: dict) -> str:
    """Where a checkpoint keeps the modules an adapter names (``layers.0.self_attn.q_proj``):
    ``model.``, or the first of the family's checkpoint aliases it holds (Gemma 3 with images:
    ``language_model.model.`` or ``model.language_model.``)."""
    if family.checkpoint_aliases is None:
        return "model."
    module = next((n.rsplit(".", 1)[0] for n in params if n.endswith(".lora_A")), None)
    if module is None:
        return "model."
    # a module's weight, or a MoE layer's stacked experts (layers.0.mlp.experts.down_proj) themselves
    suffix = module if is_expert_lora(module + ".lora_A") else f"{module}.weight"
    hit = next((a for a in family.checkpoint_aliases(f"model.{suffix}") if a in tensors), None)
    if hit is None:
        raise FileFormatError(f"the adapter adapts {module}, which the base model's checkpoint does not hold "
                              "under any of its names", hint="is this adapter for another model?")
    return hit[:-len(suffix)]


def merge_into_checkpoint(base: str | Path, params: dict[str, np.ndarray], cfg, output: str | Path,
                          whole: dict[str, np.ndarray] | None = None) -> Path:
    """``base``'s checkpoint with the adapter folded in, every tensor under the checkpoint's own
    name (a multimodal model's tower and projector as they are, or ``whole``: hub-named tensors
    trained beside the adapter, the projector with train_projector, replacing the checkpoint's)."""
    folder = ModelFolder(base)
    tensors = read_hf_tensors(folder)
    family = family_for(folder.config)
    merged = merge_into_hf(tensors, params, cfg, module_prefix=checkpoint_prefix(tensors, family, params))
    _replace_whole(merged, whole, family, folder)
    return save_hf_folder(output, merged, folder.config, source=folder, dtype=str(next(iter(tensors.values())).dtype))


def _replace_whole(merged: dict[str, np.ndarray], whole: dict[str, np.ndarray] | None, family, folder) -> None:
    """Hub-named tensors trained whole (a projector with train_projector) over the checkpoint's own."""
    for name, a in (whole or {}).items():
        key = next((k for k in family.checkpoint_aliases(name) if k in merged), None)
        if key is None:
            raise FileFormatError(f"{folder.path} holds no {name} under any of its names",
                                  hint="is this adapter for another model?")
        merged[key] = np.asarray(a).astype(merged[key].dtype)


def _tied(config: dict) -> bool:
    return bool(config.get("tie_word_embeddings", (config.get("text_config") or {}).get("tie_word_embeddings", False)))


def merge_adapter(base: str | Path | None, adapter: str | Path, output: str | Path,
                  quantize: str | None = None, warn: Callable[[str], None] | None = None) -> Path:
    """Fold a PEFT LoRA adapter into its base model and write the merged HF folder; ``quantize="FP8"``:
    the merged folder (made beside ``output``, then removed) written as a block-FP8 folder."""
    if quantize is None:
        return _merge_adapter(base, adapter, output)
    if quantize.upper() != "FP8":
        raise InvalidArgumentError(f"merge quantizes to FP8 only, not {quantize!r}",
                                   hint="for a GGUF, merge first, then `surogate quantize MERGED --type ...`")
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.merged.", dir=output.parent))
    try:
        return quantize_to_fp8(_merge_adapter(base, adapter, tmp / "merged"), output, warn=warn)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _merge_adapter(base: str | Path | None, adapter: str | Path, output: str | Path) -> Path:
    adapter = Path(adapter)
    cfg, params = load_peft_adapter(adapter)
    whole = {n: params.pop(n) for n in list(params) if n.startswith(PROJECTOR_MODULES)}
    if base is None:
        meta = json.loads((adapter / "adapter_config.json").read_text())
        base = meta.get("base_model_name_or_path")
        if not base:
            raise NotFoundError(f"{adapter}/adapter_config.json names no base model", hint="pass --base MODEL")
    from surogate.io.gguf import is_gguf

    path = resolve_model_path(base)
    if is_gguf(path):  # a GGUF base: dequantized to f32, written out as an HF folder
        from surogate.model import load_model

        if whole:
            raise FileFormatError(f"{adapter} trains the multimodal projector, which the GGUF base {path} does not "
                                  "hold", hint="merge it into the Hugging Face folder of the model: --base FOLDER")
        model = load_model(path)
        merged = merge_into_hf(model.to_hf(model.params), params, cfg,
                               transposed_experts=transposed_experts(model.family.name_table()))
        return save_hf_folder(output, merged, model.config, source=path, dtype="float32")
    folder = ModelFolder(path)
    tensors = read_hf_tensors(folder)
    family = family_for(folder.config)
    prefix = checkpoint_prefix(tensors, family, params)
    if not any(k.endswith("lm_head.weight") for k in tensors) and not _tied(folder.config):
        raise FileFormatError(f"{folder.path}: no lm_head.weight and embeddings are not tied")
    merged = merge_into_hf(tensors, params, cfg, module_prefix=prefix,
                           transposed_experts=transposed_experts(family.name_table()))
    _replace_whole(merged, whole, family, folder)
    dtype = str(next(iter(tensors.values())).dtype)
    if folder.config.get("quantization_config"):  # a block-FP8 base, read dequantized: merged in bf16
        dtype = "bfloat16"
        import ml_dtypes

        merged = {k: v.astype(ml_dtypes.bfloat16) if v.dtype == np.float32 else v for k, v in merged.items()}
    return save_hf_folder(output, merged, folder.config, source=folder, dtype=dtype)
