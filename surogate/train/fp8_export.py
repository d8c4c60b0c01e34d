"""Write an HF model folder as a block-FP8 checkpoint (`surogate quantize MODEL --type FP8`, and
`surogate merge --type FP8` after its merge), in the layout of Qwen's official ``*-FP8`` releases,
which vLLM's and transformers' fp8 loaders read.

config.json is the source's plus ``quantization_config`` ``{"activation_scheme": "dynamic", "fmt":
"e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}``; each weight the family names
(``Family.fp8_linears``) is ``weight`` float8_e4m3fn beside ``weight_scale_inv`` f32
[ceil(out/128), ceil(in/128)] (io/fp8_blocks.py); every other tensor stays as the source has it.

- Dense decoders (Qwen/Qwen3-8B-FP8): q/k/v/o and gate/up/down quantized; embeddings, lm_head,
  norms and biases kept; no ``modules_to_not_convert`` (neither loader quantizes an embedding or
  lm_head), as in the release.
- Qwen3-MoE (Qwen/Qwen3-30B-A3B-FP8): each expert's gate / up / down_proj one 2-D FP8 weight,
  ``mlp.experts.{e}.gate_proj.weight`` and its scale, as the release stores them (a source holding
  transformers 5's stacked ``mlp.experts.gate_up_proj`` / ``down_proj`` is written per expert, the
  same bytes); the router ``mlp.gate`` and the norms kept, and ``modules_to_not_convert`` listing
  what the release's config lists: ``lm_head``, then per layer ``input_layernorm``, ``mlp.gate``,
  ``post_attention_layernorm`` (the router is a Linear an fp8 loader would otherwise convert).
- Qwen3-VL: the language model's projections quantized; the vision tower (patch conv, blocks,
  merger, DeepStack mergers) kept whole, as Qwen's and RedHat's FP8 VL releases keep it, and
  ``modules_to_not_convert`` naming ``lm_head`` and each of the tower's modules (Qwen's VL FP8
  configs list them one by one; a loader that matches names exactly finds them).

Which tensors are which is the family's (``Family.fp8_linears``, ``Family.fp8_kept``); a family
without them is refused by name, as is a 2-D tensor that is neither quantized, nor kept by the
family, nor an embedding or lm_head. Every other top-level file of the source (tokenizer, chat
template, generation and processor configs, README) is copied as it is.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from surogate.errors import FileFormatError, InvalidArgumentError, UnsupportedError
from surogate.io import ModelFolder, PendingTensor, resolve_model_path, save_sharded_safetensors
from surogate.io.fp8_blocks import block_scale_inv, quantize_block_fp8
from surogate.models.name_table import Experts, experts_transposed
from surogate.models.registry import family_for
from surogate.train.lora import _replace_dir

FP8_BLOCK = (128, 128)
SHARD_BYTES = 5 * 10**9  # transformers' save_pretrained default of 5GB shards
# Weight files of the source that the FP8 folder replaces (the rest of its top level is copied).
_WEIGHT_FILES = ("*.safetensors", "*.safetensors.index.json", "*.bin", "*.bin.index.json", "*.pt", "*.pth",
                 "*.ckpt", "*.h5", "*.msgpack", "*.onnx", "*.ot", "*.tflite", "*.gguf")
_KEPT_2D = re.compile(r"(^|\.)(embed_tokens|lm_head)\.weight$")  # 2-D, not a Linear any fp8 loader quantizes

Progress = Callable[[int, int, str, str, tuple], None]  # (index, count, name, type, shape)


def fp8_quantization_config(block: tuple[int, int] = FP8_BLOCK, not_converted: list[str] | None = None) -> dict:
    qc = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": list(block)}
    return qc if not not_converted else {**qc, "modules_to_not_convert": not_converted}


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
        from surogate.models.registry import FAMILIES

        known = ", ".join(sorted({f.name for f in FAMILIES.values() if f.fp8_linears}))
        raise UnsupportedError(f"{folder.path}: the {family.name} family is not written as block FP8 by this version "
                               "(which of its tensors an FP8 loader expects quantized, in which layout, is not mapped)",
                               hint=f"FP8 export covers {known}; GGUF types (--type Q8_0, ...) cover more")
    output = Path(output)
    if output.resolve() == folder.path.resolve():
        raise InvalidArgumentError(f"--output {output} is the source folder",
                                   hint="write the FP8 model to a new folder")
    if output.exists() and not output.is_dir():
        raise InvalidArgumentError(f"--output {output} is a file; --type FP8 writes a folder",
                                   hint="give a folder name (it is created, or replaced whole)")
    tensors = _source_tensors(folder.open_weights(), family, int(_text(config)["num_hidden_layers"]))
    kept = re.compile(family.fp8_kept) if family.fp8_kept else None
    plan, uneven = _fp8_plan(tensors, re.compile(family.fp8_linears), kept, block, str(folder.path), progress)
    if uneven:
        (warn or _warn)(_uneven_warning(uneven, block))
    not_converted = None
    if kept is not None:  # lm_head, then the kept modules in checkpoint order (the releases' lists)
        modules = dict.fromkeys(n.rsplit(".", 1)[0] for n in tensors if kept.fullmatch(n.rsplit(".", 1)[0]))
        not_converted = ["lm_head", *modules]
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        save_sharded_safetensors(tmp, plan, shard_bytes, metadata={"format": "pt"})
        cfg = {**config, "quantization_config": fp8_quantization_config(block, not_converted)}
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


def _text(config: dict) -> dict:
    return config.get("text_config") or config


@dataclass(frozen=True)
class _Tensor:
    """A tensor of the source as the FP8 folder names it: the checkpoint's own, or one expert's
    projection cut from a stacked expert tensor."""

    dtype: str            # safetensors dtype code ("BF16")
    numpy_dtype: np.dtype
    shape: tuple
    read: Callable[[], np.ndarray]


def _source_tensors(weights, family, n_layers: int) -> dict[str, _Tensor]:
    """The source's tensors in checkpoint order (layers by number), a stacked expert tensor
    (transformers 5's ``mlp.experts.gate_up_proj`` [E, 2F, C], ``down_proj`` [E, C, F], or the
    hub's transposed pair, by their shapes) as the per-expert 2-D weights its name-table recipe's
    parts name (``mlp.experts.{e}.gate_proj.weight``, ``up_proj``, ``down_proj``)."""
    out = {}
    for name in weights.keys():  # noqa: SIM118 (a reader, not a dict)
        info = weights.info(name)
        out[name] = _Tensor(info.dtype, info.numpy_dtype, tuple(info.shape), lambda n=name: weights.get(n))
    recipes = [r for r in family.name_table().entries.values() if isinstance(r, Experts) and r.parts]
    for i in range(n_layers):
        for r in recipes:
            stacked = r.hf.format(i=i)
            if stacked not in out:
                continue
            t = out.pop(stacked)
            flip = r.transposed
            if r.layer:
                layer = [h.format(i=i) for h in r.layer]
                flip = experts_transposed(*(tuple(weights.info(h).shape) for h in layer), stacked)
            E, rows, cols = (t.shape[0], t.shape[2], t.shape[1]) if flip else t.shape
            parts = [p.replace("{i}", str(i)) for p in r.parts]
            if r.axis != 0 or rows % len(parts):
                raise FileFormatError(f"{stacked} {list(t.shape)} does not split into {len(parts)} per-expert weights",
                                      hint="the weights and the config do not belong together")
            step = rows // len(parts)
            for e in range(E):
                for k, p in enumerate(parts):
                    def read(t=t, e=e, k=k, flip=flip, step=step):
                        w = np.asarray(t.read()[e])
                        return (w.T if flip else w)[k * step:(k + 1) * step]
                    out[p.format(e=e)] = _Tensor(t.dtype, t.numpy_dtype, (step, cols), read)
    return dict(sorted(out.items(), key=lambda kv: [int(s) if s.isdigit() else s for s in re.split(r"(\d+)", kv[0])]))


def _fp8_plan(tensors: dict[str, _Tensor], linears: re.Pattern, kept: re.Pattern | None, block: tuple[int, int],
              source: str, progress: Progress | None) -> tuple[dict[str, PendingTensor], list[tuple[str, tuple]]]:
    """The FP8 folder's tensors in checkpoint order, each made when written; and the quantized
    weights whose shape is not whole blocks."""
    import ml_dtypes

    plan: dict[str, PendingTensor] = {}
    uneven = []
    bo, bi = block
    done = [0]  # tensors written so far (the writer takes them by dtype, not in this order)

    for name, t in tensors.items():
        shape = t.shape
        if t.dtype.startswith("F8"):
            raise UnsupportedError(f"{source}: {name} is {t.dtype} already, without a quantization_config",
                                   hint="quantize the unquantized model it came from")

        def report(kind: str, name=name, shape=shape) -> None:
            if progress is not None:
                progress(done[0], len(tensors), name, kind, shape)
            done[0] += 1

        if linears.fullmatch(name):
            if len(shape) != 2:
                raise FileFormatError(f"{source}: {name} is {list(shape)}, not a 2-D Linear weight")
            if shape[0] % bo or shape[1] % bi:
                uneven.append((name, shape))
            scale_shape = (-(-shape[0] // bo), -(-shape[1] // bi))

            def weight(name=name, t=t, report=report):
                report("FP8")
                return quantize_block_fp8(t.read(), block, f"{source}: {name}")[0]

            # The scale is written first (f32 before 1-byte tensors) and recomputed, cheaply, from the
            # weight: holding the quantized weights until their turn would hold a whole shard.
            plan[name + "_scale_inv"] = PendingTensor(
                np.dtype(np.float32), scale_shape, lambda name=name, t=t: block_scale_inv(t.read(), block,
                                                                                         f"{source}: {name}"))
            plan[name] = PendingTensor(np.dtype(ml_dtypes.float8_e4m3fn), shape, weight)
        elif len(shape) >= 2 and not _KEPT_2D.search(name) and not (kept and kept.fullmatch(name.rsplit(".", 1)[0])):
            raise UnsupportedError(f"{source}: {name} {list(shape)} is neither a projection FP8 export quantizes "
                                   "nor an embedding or lm_head", hint="this checkpoint holds modules its family's "
                                   "FP8 layout does not know; please report it")
        else:
            def kept_as_is(t=t, report=report, kind=t.dtype):
                report(kind)
                return t.read()

            plan[name] = PendingTensor(t.numpy_dtype, shape, kept_as_is)
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
