"""Write models as Hugging Face folders: full checkpoints, merged LoRA fine-tunes, and block-FP8
checkpoints (`surogate quantize MODEL --type FP8`).

A folder is assembled under a temp name beside the destination and renamed into place, so a
crash never leaves a half-written model where a user (or `surogate serve`) would load it.

The FP8 folder has the layout of Qwen's official ``*-FP8`` releases (Qwen/Qwen3-8B-FP8), which
vLLM's and transformers' fp8 loaders read: config.json is the source's plus ``quantization_config``
``{"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size":
[128, 128]}``; each projection the family names (``Family.fp8_linears``: q/k/v/o, gate/up/down)
is ``weight`` float8_e4m3fn beside ``weight_scale_inv`` f32 [ceil(out/128), ceil(in/128)]
(io/fp8_blocks.py); embeddings, lm_head, norms and biases stay as the source has them (neither
loader quantizes embeddings or lm_head, so no ``modules_to_not_convert`` is written, as in the
release). Every other top-level file of the source (tokenizer, chat template, generation config,
README) is copied as it is.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from surogate.errors import FileFormatError, InvalidArgumentError, NotFoundError, UnsupportedError
from surogate.io import ModelFolder, PendingTensor, resolve_model_path, save_safetensors, save_sharded_safetensors
from surogate.io.fp8_blocks import block_scale_inv, quantize_block_fp8
from surogate.models.name_table import transposed_experts
from surogate.models.peft import PROJECTOR_MODULES, is_expert_lora
from surogate.models.registry import family_for
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
    cfg, params = load_peft_adapter(adapter, whole=True)
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


FP8_BLOCK = (128, 128)
SHARD_BYTES = 5 * 10**9  # transformers' save_pretrained default of 5GB shards
# Weight files of the source that the FP8 folder replaces (the rest of its top level is copied).
_WEIGHT_FILES = ("*.safetensors", "*.safetensors.index.json", "*.bin", "*.bin.index.json", "*.pt", "*.pth",
                 "*.ckpt", "*.h5", "*.msgpack", "*.onnx", "*.ot", "*.tflite", "*.gguf")
_KEPT_2D = re.compile(r"(^|\.)(embed_tokens|lm_head)\.weight$")  # 2-D, not a Linear any fp8 loader quantizes

Progress = Callable[[int, int, str, str, tuple], None]  # (index, count, name, type, shape)


def fp8_quantization_config(block: tuple[int, int] = FP8_BLOCK) -> dict:
    return {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": list(block)}


def quantize_to_fp8(model: str | Path, output: str | Path, *, block: tuple[int, int] = FP8_BLOCK,
                    shard_bytes: int = SHARD_BYTES, progress: Progress | None = None,
                    warn: Callable[[str], None] | None = None, download: bool = False) -> Path:
    """An HF model folder (or a cached hub id) written as a block-FP8 folder (the module header)."""
    from surogate.io.gguf import is_gguf

    if len(block) != 2 or not all(isinstance(b, int) and b > 0 for b in block):
        raise InvalidArgumentError(f"FP8 block {block!r} is not two positive integers", hint="the releases use 128, 128")
    path = resolve_model_path(model, download=download)
    if path.is_file() or is_gguf(path):
        raise UnsupportedError(f"{path} is a file; --type FP8 reads a Hugging Face model folder",
                               hint="a GGUF's weights are quantized already: quantize the HF model it was made from "
                                    "(or write an HF folder from it with `surogate merge`)")
    folder = ModelFolder(path)
    config = folder.config
    qc = config.get("quantization_config")
    if qc:
        method = qc.get("quant_method", "?") if isinstance(qc, dict) else "?"
        raise UnsupportedError(f"{folder.path} is quantized already (quantization_config quant_method {method!r})",
                               hint="quantize the unquantized model it came from: quantizing dequantized weights adds "
                                    "the errors of both")
    family = family_for(config, source=str(folder.path / "config.json"))
    family.spec_from_config(config)  # a config we cannot run fails before any work
    if family.fp8_linears is None:
        from surogate.models.registry import REGISTRY

        known = ", ".join(f.name for f in REGISTRY if f.fp8_linears)
        raise UnsupportedError(f"{folder.path}: the {family.name} family is not written as block FP8 by this version "
                               "(which of its tensors are the Linear weights an FP8 loader expects is not mapped)",
                               hint=f"FP8 export covers {known}; GGUF types (--type Q8_0, ...) cover more")
    output = Path(output)
    if output.resolve() == folder.path.resolve():
        raise InvalidArgumentError(f"--output {output} is the source folder",
                                   hint="write the FP8 model to a new folder")
    if output.exists() and not output.is_dir():
        raise InvalidArgumentError(f"--output {output} is a file; --type FP8 writes a folder",
                                   hint="give a folder name (it is created, or replaced whole)")
    weights = folder.open_weights()
    plan, uneven = _fp8_plan(weights, re.compile(family.fp8_linears), block, str(folder.path), progress)
    if uneven:
        (warn or _warn)(_uneven_warning(uneven, block))
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        save_sharded_safetensors(tmp, plan, shard_bytes, metadata={"format": "pt"})
        cfg = {**config, "quantization_config": fp8_quantization_config(block)}
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        for f in sorted(folder.path.iterdir()):
            if (f.is_file() and f.name != "config.json" and not f.name.startswith(".")
                    and not any(fnmatch.fnmatch(f.name, g) for g in _WEIGHT_FILES)):
                shutil.copy2(f, tmp / f.name)
        _replace_dir(tmp, output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return output


def _fp8_plan(weights, linears: re.Pattern, block: tuple[int, int], source: str,
              progress: Progress | None) -> tuple[dict[str, PendingTensor], list[tuple[str, tuple]]]:
    """The FP8 folder's tensors in checkpoint order (layers by number), each made when written;
    and the quantized weights whose shape is not whole blocks."""
    import ml_dtypes

    names = sorted(weights.keys(), key=lambda n: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", n)])
    plan: dict[str, PendingTensor] = {}
    uneven = []
    bo, bi = block
    done = [0]  # tensors written so far (the writer takes them by dtype, not in this order)

    for name in names:
        info = weights.info(name)
        shape = tuple(info.shape)
        if info.dtype.startswith("F8"):
            raise UnsupportedError(f"{source}: {name} is {info.dtype} already, without a quantization_config",
                                   hint="quantize the unquantized model it came from")

        def report(kind: str, name=name, shape=shape) -> None:
            if progress is not None:
                progress(done[0], len(names), name, kind, shape)
            done[0] += 1

        if linears.fullmatch(name):
            if len(shape) != 2:
                raise FileFormatError(f"{source}: {name} is {list(shape)}, not a 2-D Linear weight")
            if shape[0] % bo or shape[1] % bi:
                uneven.append((name, shape))
            scale_shape = (-(-shape[0] // bo), -(-shape[1] // bi))

            def weight(name=name, report=report):
                report("FP8")
                return quantize_block_fp8(weights.get(name), block, f"{source}: {name}")[0]

            # The scale is written first (f32 before 1-byte tensors) and recomputed, cheaply, from the
            # weight: holding the quantized weights until their turn would hold a whole shard.
            plan[name + "_scale_inv"] = PendingTensor(
                np.dtype(np.float32), scale_shape, lambda name=name: block_scale_inv(weights.get(name), block,
                                                                                       f"{source}: {name}"))
            plan[name] = PendingTensor(np.dtype(ml_dtypes.float8_e4m3fn), shape, weight)
        elif len(shape) >= 2 and not _KEPT_2D.search(name):
            raise UnsupportedError(f"{source}: {name} {list(shape)} is neither a projection FP8 export quantizes "
                                   "nor an embedding or lm_head", hint="this checkpoint holds modules its family's "
                                   "FP8 layout does not know; please report it")
        else:
            def kept(name=name, report=report, kind=info.dtype):
                report(kind)
                return weights.get(name)

            plan[name] = PendingTensor(info.numpy_dtype, shape, kept)
    return plan, uneven


def _uneven_warning(uneven: list[tuple[str, tuple]], block: tuple[int, int]) -> str:
    """What a weight that is not whole blocks means to the other loaders: vLLM fuses q/k/v and gate/up
    and refuses a part whose rows are not whole blocks (Fp8LinearMethod.create_weights; under tensor
    parallelism each shard's too); transformers' CPU dequantize takes the block from the scale grid."""
    bo, bi = block
    fused = [(n, s) for n, s in uneven if re.search(r"\.(q|k|v|gate|up)_proj\.", n) and s[0] % bo]
    name, shape = (fused or uneven)[0]
    vllm = (f"vLLM refuses {len(fused)} of them (fused q/k/v or gate/up rows must be whole blocks)" if fused
            else "vLLM reads them on one GPU (tensor parallelism needs whole blocks per shard)")
    return (f"{len(uneven)} FP8 weights are not whole {bo}x{bi} blocks (e.g. {name} {list(shape)}): surogate reads "
            f"them; {vllm}; transformers' CPU dequantize needs whole blocks")


def _warn(message: str) -> None:
    import warnings

    warnings.warn(message, stacklevel=3)
