"""GGUF tensor names, and the trips through them: which GGUF tensor holds which HF checkpoint
tensor, and in which row order llama.cpp's converter stored it. The tables themselves are each
family's (``Family.gguf.tensors``, built in the family file); this module is the mechanism, and
knows no family (io/ knows none either, so it lives here, next to the HF name tables).

Loading runs GGUF -> HF names (the family's GGUF table) -> our parameters (the family's HF name
table, which fuses gate and up), so each recipe lives in one place: ``load_gguf_params``
dequantizes (the load path of ``load_model``), ``gguf_blocks_for`` keeps GGML blocks for
``gguf_matmul`` (the quantized path). Writing runs the table forwards: ``plan_gguf_tensors`` and
``quantize_to_gguf`` (``surogate quantize``) over io/gguf_writer.py.

Row order: llama.cpp rotates adjacent pairs (x0, x1), (x2, x3), ... of a Llama head, where HF
rotates halves (x_j, x_{j+D/2}); so convert_hf_to_gguf.py reorders the rows of q_proj and k_proj
(weights and biases) per head: HF row t*D/2 + j goes to GGUF row 2j + t (t in 0, 1; D the head
dim; heads of k counted with num_key_value_heads). ``rope_rows`` undoes or redoes that as a row
index, which works on raw blocks as well as on values (blocks never cross rows). A family's
table marks the tensors stored that way (``GGUFName.rope_rows``); Qwen2 / Qwen3 files keep HF's
order (llama.cpp runs those families with NEOX rope, which rotates halves).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from surogate.errors import FileFormatError, NotFoundError, UnsupportedError
from surogate.io.gguf import GGUFFile, GGUFTensor
from surogate.io.gguf_config import llama3_rope_factors
from surogate.io.gguf_writer import PlannedTensor, Progress, check_quant_type, tensor_type, write_gguf
from surogate.models.name_table import Direct, Fuse, NameTable

if TYPE_CHECKING:
    from surogate.models.family import Family


@dataclass(frozen=True)
class GGUFName:
    gguf: str
    rope_rows: str | None = None  # "q" / "k": rows in llama.cpp's interleaved rope order
    shift: float = 0.0  # the GGUF value is the HF value plus this (Gemma's norms: llama.cpp adds the 1)
    squeeze: int | None = None  # the GGUF tensor is the HF one without this axis of size 1 (LFM2's conv [C, 1, L])
    f32: bool = False  # written F32 whatever the type asked (what llama.cpp's op reads: ggml_ssm_conv)
    # More GGUF tensors of the same HF tensor: it is gguf's and these, equal parts concatenated
    # along `axis` (a MoE layer's stacked gate_up_proj [E, 2F, C] is llama.cpp's ffn_gate_exps
    # and ffn_up_exps, each [E, F, C]).
    parts: tuple[str, ...] = ()
    axis: int = 0
    # The parts are the HF tensor's slices along `axis` (that axis dropped in each) rather than
    # pieces concatenated along it (Qwen3-VL's patch Conv3d [C, 3, 2, P, P] is llama.cpp's two
    # Conv2d v.patch_embd.weight and v.patch_embd.weight.1, [C, 3, P, P] each).
    stacked: bool = False
    # GPT-OSS: the HF tensor is [E, in, out] where llama.cpp's is [E, out, in] (its last two axes
    # swapped), its parts interleaved along `axis` (part j is rows j, j + n, j + 2n, ...: HF's
    # gate / up columns 2k / 2k + 1) rather than equal halves, and written MXFP4 when the
    # checkpoint holds it so (quant_method mxfp4: a lossless repack, as convert_hf_to_gguf.py does
    # for gpt-oss), else by the recipe.
    transposed: bool = False
    interleaved: bool = False
    keep_mxfp4: bool = False

    def names(self) -> tuple[str, ...]:
        return (self.gguf, *self.parts)


class GGUFNameTable:
    """HF checkpoint names (``{i}`` the layer) <-> GGUF tensor names."""

    def __init__(self, entries: dict[str, GGUFName]):
        self.entries = entries
        self._forward = [(_pattern(hf), g) for hf, g in entries.items()]
        # Each part of a split HF tensor names it too (GGUFName.parts).
        self._backward = [(_pattern(name), hf) for hf, g in entries.items() for name in g.names()]

    def to_gguf(self, hf_name: str) -> GGUFName | None:
        for pat, g in self._forward:
            m = pat.match(hf_name)
            if m:
                groups = m.groupdict()
                return dataclasses.replace(g, gguf=g.gguf.format(**groups),
                                           parts=tuple(p.format(**groups) for p in g.parts))
        return None

    def to_hf(self, gguf_name: str) -> str | None:
        for pat, hf in self._backward:
            m = pat.match(gguf_name)
            if m:
                return hf.format(**m.groupdict())
        return None


def _pattern(name: str) -> re.Pattern:
    return re.compile("^" + re.escape(name).replace(r"\{i\}", r"(?P<i>\d+)") + "$")


def rope_rows(n_rows: int, n_heads: int, to_gguf: bool) -> np.ndarray:
    """Row index that reorders q/k rows into llama.cpp's order (``to_gguf``) or back to HF's."""
    d = n_rows // n_heads
    if d * n_heads != n_rows or d % 2:
        raise FileFormatError(f"{n_rows} q/k rows do not split into {n_heads} heads of an even size")
    h, j, t = np.meshgrid(np.arange(n_heads), np.arange(d // 2), np.arange(2), indexing="ij")
    hf_rows = (h * d + t * (d // 2) + j).reshape(-1)  # GGUF row h*d + 2j + t holds this HF row
    return hf_rows if to_gguf else np.argsort(hf_rows)


def heads_for(kind: str | None, config: dict) -> int:
    heads = int(config["num_attention_heads"])
    return int(config.get("num_key_value_heads") or heads) if kind == "k" else heads


class GGUFWeights:
    """The HF tensors of a GGUF file, by HF name, in HF row order: ``values`` dequantizes (the
    load path), ``blocks`` keeps GGML blocks for ``gguf_matmul``."""

    def __init__(self, gf: GGUFFile, table: GGUFNameTable, config: dict):
        self.file, self.table, self.config = gf, table, config

    def tensor(self, hf_name: str) -> tuple[GGUFTensor, np.ndarray | None]:
        """The GGUF tensor behind ``hf_name`` and the row index that puts it in HF order (or None)."""
        name = self.table.to_gguf(hf_name)
        if name is None or name.gguf not in self.file.tensors:
            want = name.gguf if name else "(no GGUF name)"
            raise FileFormatError(f"{self.file.path}: no tensor {want} for {hf_name}",
                                  hint="the file lacks a tensor this architecture needs; it may be damaged "
                                       "or written for another architecture")
        t = self.file.tensors[name.gguf]
        if name.rope_rows is None:
            return t, None
        return t, rope_rows(t.shape[0], heads_for(name.rope_rows, self.config), to_gguf=False)

    def values(self, hf_name: str, dtype: str = "float32") -> np.ndarray:
        name = self.table.to_gguf(hf_name)
        if name is not None and name.parts:  # one HF tensor in several GGUF tensors
            for part in name.names():
                if part not in self.file.tensors:
                    raise FileFormatError(f"{self.file.path}: no tensor {part} for {hf_name}",
                                          hint="the file lacks a tensor this architecture needs")
            parts = [self.file.tensors[p].dequantize(dtype) for p in name.names()]
            if name.stacked:
                joined = np.stack(parts, axis=name.axis)
            elif name.interleaved:
                joined = np.stack(parts, axis=name.axis + 1)
                shape = list(parts[0].shape)
                shape[name.axis] *= len(parts)
                joined = joined.reshape(shape)
            else:
                joined = np.concatenate(parts, axis=name.axis)
            return np.ascontiguousarray(np.swapaxes(joined, -1, -2)) if name.transposed else joined
        if name is not None and name.transposed:
            return np.ascontiguousarray(np.swapaxes(self._shifted(hf_name, dtype), -1, -2))
        if name is not None and name.squeeze is not None:
            return np.expand_dims(self._shifted(hf_name, dtype), name.squeeze)
        return self._shifted(hf_name, dtype)

    def _shifted(self, hf_name: str, dtype: str) -> np.ndarray:
        shift = self.table.to_gguf(hf_name).shift
        if shift:  # in f32, then to dtype: one rounding, as transformers' reader (weights - 1) has it
            from surogate.io.gguf import _np_dtype

            return (self._values(hf_name, "float32") - np.float32(shift)).astype(_np_dtype(dtype))
        return self._values(hf_name, dtype)

    def _values(self, hf_name: str, dtype: str) -> np.ndarray:
        t, order = self.tensor(hf_name)
        if order is None:
            return t.dequantize(dtype)
        if len(t.shape) == 1:  # a q/k bias: one row of blocks, reorder the values
            return t.dequantize(dtype)[order]
        return t.dequantize(dtype, rows=order)

    def blocks(self, hf_name: str) -> GGUFTensor:
        if self.table.to_gguf(hf_name).shift:
            raise UnsupportedError(f"{hf_name}: stored shifted (llama.cpp adds Gemma's 1); it cannot be kept as blocks",
                                   hint="dequantize it instead")
        t, order = self.tensor(hf_name)
        if len(t.shape) != 2:
            raise UnsupportedError(f"{t.name}: only 2-D weights are kept as blocks", hint="dequantize it instead")
        return t if order is None else GGUFTensor(t.name, t.type, t.shape, t.raw[order], t.source)

    def check_supported(self, hf_names: list[str]) -> None:
        for name in hf_names:
            g = self.table.to_gguf(name)
            if g is not None and g.parts:
                for part in g.names():
                    if part in self.file.tensors:
                        self.file.tensors[part].check_supported()
                continue
            self.tensor(name)[0].check_supported()


def gguf_blocks_for(weights: GGUFWeights, hf_table: NameTable, names: list[str]) -> dict[str, GGUFTensor]:
    """Our parameters as GGML blocks (the quantized-matmul path): a fused parameter stacks the
    rows of its parts, which must share a type."""
    out = {}
    for name in names:
        r = hf_table.recipe(name)
        if r is None:
            raise FileFormatError(f"no checkpoint tensor is known for parameter {name}")
        if isinstance(r, Direct):
            out[name] = weights.blocks(r.hf)
            continue
        if not isinstance(r, Fuse):  # a slice of a checkpoint tensor (Gemma 4's per-layer inputs), experts
            raise UnsupportedError(f"{name} is made from {type(r).__name__.lower()} of a checkpoint tensor, not "
                                   "whole rows of blocks", hint="dequantize this parameter instead")
        parts = [weights.blocks(h) for h in r.hf]
        if len({p.type for p in parts}) != 1 or r.axis != 0:
            raise UnsupportedError(f"{name}: its parts have different GGUF types "
                                   f"({', '.join(p.type_name for p in parts)}); they cannot be stacked as blocks",
                                   hint="dequantize this parameter instead")
        raw = np.concatenate([p.raw for p in parts], axis=0)
        shape = (sum(p.shape[0] for p in parts), *parts[0].shape[1:])
        out[name] = GGUFTensor("+".join(p.name for p in parts), parts[0].type, shape, raw, parts[0].source)
    return out


def load_gguf_params(gf: GGUFFile, family: Family, config: dict, names: list[str],
                     dtype: str = "float32", table: GGUFNameTable | None = None) -> dict[str, np.ndarray]:
    """Our parameters ``names`` from a GGUF file, dequantized to ``dtype`` (every tensor's type
    is checked first, so an unsupported one fails before any work); ``table``: the file's names
    (default the family's text table; an mmproj file has its own)."""
    weights = GGUFWeights(gf, table or family.gguf.tensors(), config)
    hf_table = family.name_table()
    hf_names = []
    for name in names:
        r = hf_table.recipe(name)
        if r is not None:
            hf_names.extend([r.hf] if isinstance(r.hf, str) else r.hf)
    weights.check_supported(hf_names)
    return hf_table.load(names, lambda hf: weights.values(hf, dtype), source=str(gf.path))


# ---- writing: an HF checkpoint -> GGUF tensors ---------------------------------------------

def plan_gguf_tensors(family: Family, config: dict, tensors: Mapping[str, Callable[[], np.ndarray]], qtype: str,
                      source: str = "checkpoint") -> list[PlannedTensor]:
    """Every GGUF tensor to write, from readers of the HF-named tensors: llama.cpp's name, the
    recipe's type, q/k rows in llama.cpp's order; token_embd first, then the layers in order."""
    table = family.gguf.tensors()
    tied = bool(config.get("tie_word_embeddings", False))
    tensors = stack_expert_tensors(family, config, tensors)
    mxfp4 = (config.get("quantization_config") or {}).get("quant_method") == "mxfp4"
    named = {}
    for hf_name, read in tensors.items():
        if hf_name.endswith("rotary_emb.inv_freq") or (tied and hf_name == "lm_head.weight"):
            continue  # a buffer transformers recomputes; a copy of the embedding
        g = table.to_gguf(hf_name)
        if g is None:
            raise UnsupportedError(f"{source}: tensor {hf_name} has no GGUF name in the {family.name} table",
                                   hint="the checkpoint has a part the GGUF writer does not know; please report it")
        if g.shift:
            read = (lambda r=read, shift=g.shift: np.asarray(r(), np.float32) + np.float32(shift))
        if g.squeeze is not None:
            read = (lambda r=read, axis=g.squeeze: np.squeeze(np.asarray(r()), axis))
        if g.transposed:
            read = (lambda r=read: np.swapaxes(np.asarray(r()), -1, -2))
        if g.parts:  # equal (or interleaved, or stacked) parts along g.axis, one GGUF tensor each
            for j, part in enumerate(g.names()):
                if g.stacked:
                    pick = (lambda r=read, j=j, ax=g.axis: np.take(np.asarray(r()), j, axis=ax))
                elif g.interleaved:
                    pick = (lambda r=read, j=j, n=len(g.names()), ax=g.axis:
                            np.take(np.asarray(r()), np.arange(j, np.shape(r())[ax], n), axis=ax))
                else:
                    pick = (lambda r=read, j=j, n=len(g.names()), ax=g.axis: np.split(np.asarray(r()), n, axis=ax)[j])
                named[part] = (pick, g.rope_rows, "MXFP4" if g.keep_mxfp4 and mxfp4 else g.f32)
            continue
        named[g.gguf] = (read, g.rope_rows, "MXFP4" if g.keep_mxfp4 and mxfp4 else g.f32)
    if not tied and "output.weight" not in named:
        raise FileFormatError(f"{source}: no lm_head.weight, and the config does not tie the embeddings",
                              hint="the checkpoint is incomplete")
    plan = []
    rope = family.spec_from_config(config).rope
    if family.gguf.rope_freqs and rope["rope_type"] == "llama3":
        # llama.cpp reads Llama 3 rope scaling from per-frequency divisors, not from metadata.
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // int(config["num_attention_heads"]))
        factors = llama3_rope_factors(rope["theta"], head_dim, rope["factor"], rope["low_freq_factor"],
                                      rope["high_freq_factor"], rope["original_max_position"])
        plan.append(PlannedTensor("rope_freqs.weight", "F32", factors.shape, lambda f=factors: f))
    extra = family.gguf.extra_tensors(config) if family.gguf.extra_tensors else {}
    for gguf_name, values in extra.items():
        values = np.asarray(values, np.float32)
        plan.append(PlannedTensor(gguf_name, "F32", values.shape, lambda v=values: v))
    n_layers = int(config["num_hidden_layers"])
    ordered = sorted(named, key=_gguf_order)
    attn_v = [n for n in ordered if n.startswith("blk.") and n.split(".")[2] == "attn_v" and n.endswith(".weight")]
    for gguf_name in ordered:
        read, rope_kind, f32 = named[gguf_name]
        shape = tuple(np.shape(read()))  # safetensors readers are mmap views: cheap
        if rope_kind is not None:
            order = rope_rows(shape[0], heads_for(rope_kind, config), to_gguf=True)
            read = (lambda r=read, order=order: np.asarray(r())[order])
        v = (attn_v.index(gguf_name), len(attn_v)) if gguf_name in attn_v else None
        t = "F32" if f32 is True else tensor_type(qtype, gguf_name, shape, n_layers,
                                                  has_output="output.weight" in named, attn_v=v)
        if f32 == "MXFP4":
            t = f32  # GGUFName.keep_mxfp4 on an MXFP4 checkpoint
        plan.append(PlannedTensor(gguf_name, t, shape, read))
    return plan


def stack_expert_tensors(family: Family, config: dict, tensors: Mapping[str, Callable[[], np.ndarray]]
                         ) -> dict[str, Callable[[], np.ndarray]]:
    """The HF tensors with a MoE layer's per-expert tensors (``mlp.experts.{e}.gate_proj.weight``)
    replaced by the stacked tensor of the family's name_table.Experts recipe, which the GGUF
    table names (llama.cpp stores each projection of all experts as one tensor); a stacked pair
    of either orientation (``Experts.layer``: Qwen3-VL-MoE's hub files hold [E, in, out]) read as
    ours, [E, out, in], which the GGUF table splits."""
    from surogate.models.name_table import Experts, experts_transposed

    out = dict(tensors)
    recipes = [r for r in family.name_table().entries.values() if isinstance(r, Experts)]
    for i in range(int(config["num_hidden_layers"])):
        for layer in {tuple(h.format(i=i) for h in r.layer) for r in recipes if r.layer}:
            if all(h in out for h in layer) and experts_transposed(*(np.shape(out[h]()) for h in layer), layer[0]):
                for h in layer:
                    out[h] = (lambda r=out[h]: np.swapaxes(np.asarray(r()), 1, 2))
        for r in recipes:
            fused = r.hf.format(i=i)
            parts = [p.replace("{i}", str(i)) for p in r.parts]
            if fused in out or not parts or parts[0].format(e=0) not in out:
                continue
            count = 0
            while all(p.format(e=count) in out for p in parts):
                count += 1
            names = [[p.format(e=e) for p in parts] for e in range(count)]

            def read(names=names, axis=r.axis, src=dict(out)):
                experts = [np.concatenate([np.asarray(src[n]()) for n in ns], axis=axis) for ns in names]
                return np.stack(experts)

            for ns in names:
                for n in ns:
                    del out[n]
            out[fused] = read
    return out


def quantize_to_gguf(model: str | os.PathLike, output: str | os.PathLike, qtype: str = "Q8_0", *,
                     progress: Progress | None = None, download: bool = False) -> Path:
    """``surogate quantize``: an HF model folder (or a cached hub id) -> a GGUF file."""
    from surogate.io import ModelFolder, Tokenizer, resolve_model_path
    from surogate.io.gguf_tokenizer import gguf_tokenizer_metadata
    from surogate.models import family_for

    qtype = check_quant_type(qtype)
    path = resolve_model_path(model, download=download)
    if path.is_file():
        raise UnsupportedError(f"{path} is a file; quantize reads a Hugging Face model folder",
                               hint="to requantize a GGUF, load it and save an HF folder first "
                                    "(quantizing dequantized weights adds the errors of both)")
    folder = ModelFolder(path)
    config = folder.config
    family = family_for(config, source=str(folder.path / "config.json"))
    spec = family.spec_from_config(config)  # a config we cannot run fails before any work
    mmproj = family.gguf.mmproj if spec.vision is not None else None
    if spec.vision is not None and mmproj is None:
        raise UnsupportedError(f"{folder.path}: {config.get('architectures', ['this model'])[0]} has a vision tower, "
                               f"which the {family.name} GGUF writer cannot write as llama.cpp's mmproj file",
                               hint="run it from the Hugging Face folder (load_model's quantize= keeps its "
                                    "projections as blocks)")
    text_config = mmproj.text_config(config) if mmproj is not None else config
    # The architecture's keys first: a model llama.cpp's graph cannot run (a dense layer in a
    # qwen3vlmoe) is refused before any work.
    arch_metadata = family.gguf.metadata(text_config, family.spec_from_config(text_config).rope)
    weights = folder.open_weights()
    readers = {name: (lambda n=name: weights.get(n)) for name in weights.keys()}  # noqa: SIM118 (not a dict)
    vision_plan = []
    if mmproj is not None:  # the text GGUF gets the language model's tensors, the mmproj the rest
        readers = {mmproj.checkpoint_name(n): r for n, r in readers.items()}
        vision = mmproj.tensors(config)
        vision_plan = plan_mmproj_tensors(vision, {n: r for n, r in readers.items() if vision.to_gguf(n)},
                                          source=str(folder.path))
        readers = {n: r for n, r in readers.items() if not vision.to_gguf(n)}
    plan = plan_gguf_tensors(family, text_config, readers, qtype, source=str(folder.path))
    if not (folder.path / "tokenizer.json").is_file():
        raise NotFoundError(f"no tokenizer.json in {folder.path}",
                            hint="llama.cpp needs the vocabulary inside the GGUF; add the model's tokenizer files")
    tokenizer = Tokenizer.from_folder(folder)
    arch = family.gguf.name
    name = str(config.get("_name_or_path") or "").rstrip("/").split("/")[-1] or folder.path.resolve().name
    metadata = {"general.name": name, **arch_metadata,
                **gguf_tokenizer_metadata(folder.tokenizer_file, tokenizer, spec.vocab_size)}
    if mmproj is None:
        return write_gguf(output, arch, metadata, plan, qtype, progress=progress)
    # llama.cpp's --mmproj file beside it (written first: the text file's appearance means both are there)
    vision_meta = {"general.name": name, **mmproj.metadata(config, folder)}
    vision = write_gguf(mmproj_path(output), "clip", vision_meta, vision_plan, MMPROJ_TYPE, progress=progress,
                        file_kind="mmproj")
    try:
        return write_gguf(output, arch, metadata, plan, qtype, progress=progress)
    except BaseException:
        vision.unlink(missing_ok=True)  # no mmproj without its text GGUF
        raise


MMPROJ_TYPE = "F16"  # an mmproj is written as convert_hf_to_gguf.py --mmproj --outtype f16 writes it


def mmproj_path(output: str | os.PathLike) -> Path:
    """Where ``surogate quantize`` writes a vision model's mmproj: ``mmproj-<name>.gguf`` beside the GGUF."""
    output = Path(output)
    return output.with_name(f"mmproj-{output.name}")


def plan_mmproj_tensors(table: GGUFNameTable, tensors: Mapping[str, Callable[[], np.ndarray]],
                        source: str = "checkpoint") -> list[PlannedTensor]:
    """An mmproj's tensors as llama.cpp's converter writes them at --outtype f16: 1-D and
    ``GGUFName.f32`` tensors F32, every other one F16, shifted norms with the 1 added, an HF
    tensor of stacked parts (``GGUFName.stacked``) as its slices."""
    named = {}
    for hf_name, read in tensors.items():
        g = table.to_gguf(hf_name)
        if g.shift:
            read = (lambda r=read, shift=g.shift: np.asarray(r(), np.float32) + np.float32(shift))
        if g.parts and not g.stacked:
            raise UnsupportedError(f"{source}: {hf_name} is split into {', '.join(g.names())} along an axis, which "
                                   "the mmproj writer does not do", hint="please report it")
        for j, name in enumerate(g.names()):
            named[name] = (read if not g.parts else
                           (lambda r=read, j=j, ax=g.axis: np.take(np.asarray(r()), j, axis=ax)), g.f32)
    plan = []
    for name in sorted(named, key=_mmproj_order):
        read, f32 = named[name]
        shape = tuple(np.shape(read()))
        plan.append(PlannedTensor(name, "F32" if f32 or len(shape) < 2 else "F16", shape, read))
    if not plan:
        raise FileFormatError(f"{source}: no vision tower tensors found", hint="the checkpoint is incomplete")
    return plan


def _mmproj_order(name: str) -> tuple:
    # The tower's embeddings, its layers in order, then its final norm and the projector.
    if name.startswith("v.blk."):
        return (1, int(name.split(".")[2]), name)
    return (0 if name.startswith(("v.patch_embd", "v.position_embd")) else 2, 0, name)


def _gguf_order(name: str) -> tuple:
    # As convert_hf_to_gguf.py writes a Llama: embedding, layers in order, final norm, head.
    if name.startswith("blk."):
        return (1, int(name.split(".")[1]), name)
    return (0 if name.startswith("token_embd") else 2, name != "output_norm.weight", name)
