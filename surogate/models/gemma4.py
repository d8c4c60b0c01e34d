"""Gemma 4 (text: Gemma4ForCausalLM, model_type gemma4_text; the language model of
google/gemma-4-E2B-it, E4B-it and 31B-it), dense layers only.

What Gemma 4 changes from Gemma 3 (gemma3.py), as transformers' modeling_gemma4.py does it (the
graph is dsl/nn_gemma4.py's): RMSNorm weights used as they are (no 1 + w); attention scores
unscaled; values RMS-normed; full-attention layers with their own head dim (global_head_dim,
saved by transformers as per_layer_config) and, with attention_k_eq_v, their own kv heads
(num_global_key_value_heads) and values taken from the key projection; their rope
"proportional" (only partial_rotary_factor of the pairs rotate); the last num_kv_shared_layers
layers attending over the K / V of the last earlier layer of their kind (and, with
use_double_wide_mlp, an MLP twice as wide); per-layer input embeddings (hidden_size_per_layer_input,
the E2B / E4B models); a scalar per layer (layer_scalar, a checkpoint buffer); final logit
soft-capping (30 in Google's configs), in training and inference.

Refused by name: enable_moe_block (the 26B-A4B's mixture of experts, issue 17) and
use_bidirectional_attention (the vision / embedding uses).

GGUF (llama.cpp's "gemma4": convert_hf_to_gguf.py's Gemma4Model, llama.cpp's
llama_model_gemma4 loader): norm weights stored as they are (no 1 added, unlike Gemma 1 - 3);
the full-attention geometry in the plain keys (attention.key_length = global head dim,
rope.dimension_count = the whole head, rope.freq_base) and the sliding one in the *_swa keys;
head_count_kv and feed_forward_length per layer where the kinds differ (num_global_key_value_heads,
use_double_wide_mlp); attention.sliding_window_pattern one bool per layer; KV sharing as
attention.shared_kv_layers (the last n layers, each reading the last earlier layer of its kind,
as transformers does); embedding_length_per_layer_input (0: none); final_logit_softcapping when
set. The proportional rope is rope_freqs.weight: one divisor per frequency of the full head, the
rope factor on the pairs that rotate and 1e30 (no rotation) on the rest. A full layer without
attn_v takes its values from the key projection (attention_k_eq_v). A config llama.cpp's
architecture cannot say (another activation, biases, a scaled or partial sliding rope, a
per-layer vocabulary other than the model's, KV sharing whose source layers llama.cpp would pick
differently) is refused when writing rather than written as a file llama.cpp would run
differently. (The file is past 400 lines for the GGUF mapping, both ways, beside the config
rules it mirrors.)
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from surogate.dsl import nn
from surogate.dsl.nn_gemma4 import Gemma4CausalLM
from surogate.errors import ConfigError, FileFormatError, UnsupportedError
from surogate.io import gguf_config
from surogate.models import decoder, gemma3
from surogate.models.family import ChatDefaults, Family, GGUFArchitecture, TinyModel
from surogate.models.gguf_names import GGUFName, GGUFNameTable
from surogate.models.name_table import Direct, NameTable, Slice

SOFTCAP = 30.0  # final_logit_softcapping of every Google Gemma 4 config


def layer_types(cfg: dict) -> list[str]:
    """Gemma 3's rule (gemma3.layer_types), and the last layer full attention, as
    Gemma4TextConfig forces it."""
    types = gemma3.layer_types(cfg)
    types[-1] = "full_attention"
    return types


def kv_sources(types: list[str], shared: int) -> list[int]:
    """Each layer's K / V source (Gemma4TextConfig.kv_sharing_modes): the last `shared` layers
    read the last earlier layer of their kind."""
    n = len(types)
    if not 0 <= shared < n:
        raise ConfigError(f"config.json: num_kv_shared_layers is {shared}, it must be in [0, {n})",
                          hint="some layer has to compute the keys and values the others share")
    first = n - shared
    out = list(range(n))
    for i in range(first, n):
        own = [j for j in range(first) if types[j] == types[i]]
        if not own:
            raise ConfigError(f"config.json: layer {i} ({types[i]}) shares K / V, but no earlier layer of its kind "
                              f"computes them", hint="check layer_types and num_kv_shared_layers")
        out[i] = own[-1]
    return out


def _per_layer(cfg: dict, types: list[str]) -> tuple[list[int], list[int]]:
    """(head dims, kv heads) per layer: transformers' saved per_layer_config, else the rule of
    Gemma4TextConfig (full layers: global_head_dim, and num_global_key_value_heads with
    attention_k_eq_v)."""
    head_dim = int(cfg.get("head_dim") or 256)
    kv = int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
    saved = cfg.get("per_layer_config")
    if saved is None:
        glob = {"head_dim": int(cfg.get("global_head_dim") or 512)}
        if cfg.get("attention_k_eq_v") and cfg.get("num_global_key_value_heads"):
            glob["num_key_value_heads"] = int(cfg["num_global_key_value_heads"])
        saved = {i: glob for i, t in enumerate(types) if t == "full_attention"}
    saved = {int(k): v for k, v in saved.items()}
    dims = [int(saved.get(i, {}).get("head_dim", head_dim)) for i in range(len(types))]
    heads = [int(saved.get(i, {}).get("num_key_value_heads", kv)) for i in range(len(types))]
    return dims, heads


def _rope(params: dict, head_dim: int) -> dict:
    if params.get("rope_type") == "proportional":
        # HF: rope_angles = int(partial_rotary_factor * head_dim // 2) pairs rotate, at
        # theta^(-2i / head_dim); the rest do not.
        angles = int(float(params.get("partial_rotary_factor", 1.0)) * head_dim // 2)
        return {"theta": float(params["rope_theta"]), "rope_type": "proportional", "rope_angles": angles,
                "factor": float(params.get("factor", 1.0))}
    return decoder.rope_from_config({"rope_parameters": params})


DEFAULT_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                   "rope_theta": 1_000_000.0}}


def spec_from_config(cfg: dict) -> nn.ModelSpec:
    if cfg.get("enable_moe_block"):
        raise UnsupportedError("config.json: enable_moe_block is set (Gemma 4's mixture-of-experts layers, as in "
                               "gemma-4-26B-A4B): not supported yet", hint="dense Gemma 4 models run; MoE is issue 17")
    if cfg.get("use_bidirectional_attention"):
        raise UnsupportedError(f"config.json: use_bidirectional_attention is {cfg['use_bidirectional_attention']!r}: "
                               "only causal Gemma 4 language models run here", hint="set it to null")
    types = layer_types(cfg)
    dims, heads = _per_layer(cfg, types)
    n = len(types)
    srcs = kv_sources(types, int(cfg.get("num_kv_shared_layers") or 0))
    rope = {**DEFAULT_ROPE, **(cfg.get("rope_parameters") or {})}
    full = next((i for i, t in enumerate(types) if t == "full_attention"), 0)
    sliding = next((i for i, t in enumerate(types) if t == "sliding_attention"), full)
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
    base = {**cfg, "hidden_act": act, "head_dim": dims[sliding], "num_key_value_heads": heads[sliding],
            "layer_types": types, "rope_parameters": None, "rope_scaling": None,
            "tie_word_embeddings": cfg.get("tie_word_embeddings", True), "sliding_window": cfg.get("sliding_window", 512)}
    spec = decoder.spec_from_config(base, "gemma4", qk_norm=True)
    F = spec.intermediate_size
    double = bool(cfg.get("use_double_wide_mlp"))
    P = int(cfg.get("hidden_size_per_layer_input") or 0)
    uniform = len(set(dims)) == 1 and len(set(heads)) == 1
    return dataclasses.replace(
        spec, rope=_rope(rope["full_attention"], dims[full]), rope_sliding=_rope(rope["sliding_attention"], dims[sliding]),
        embed_scale=True, attn_scale=1.0, final_softcap=float(cfg.get("final_logit_softcapping") or 0.0),
        layer_head_dims=[] if uniform else dims, layer_kv_heads=[] if uniform else heads,
        kv_sources=[] if srcs == list(range(n)) else srcs,
        layer_intermediate_sizes=[2 * F if double and srcs[i] != i else F for i in range(n)] if double else [],
        per_layer_input_size=P,
        per_layer_vocab_size=int(cfg.get("vocab_size_per_layer_input") or spec.vocab_size) if P else 0,
        attention_k_eq_v=bool(cfg.get("attention_k_eq_v")), value_norm=True, layer_scalar=True)


_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm",
          "post_per_layer_input_norm")


def hf_name_table() -> NameTable:
    t = decoder.hf_name_table(qk_norm=True)
    L = "model.layers.{i}."
    extra = {f"layers.{{i}}.{n}.weight": Direct(f"{L}{n}.weight") for n in _NORMS}
    extra.update({
        "layers.{i}.layer_scalar": Direct(L + "layer_scalar"),
        "layers.{i}.per_layer_input_gate.weight": Direct(L + "per_layer_input_gate.weight"),
        "layers.{i}.per_layer_projection.weight": Direct(L + "per_layer_projection.weight"),
        "layers.{i}.embed_tokens_per_layer.weight": Slice("model.embed_tokens_per_layer.weight", axis=1),
        "layers.{i}.per_layer_model_projection.weight": Slice("model.per_layer_model_projection.weight", axis=0),
        "per_layer_projection_norm.weight": Direct("model.per_layer_projection_norm.weight"),
    })
    return NameTable({**t.entries, **extra})


# llama.cpp's names (gguf-py's MODEL_TENSORS and tensor_mapping for gemma4; llama_model_gemma4's loader).
_GGUF = {"input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
         "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
         "post_per_layer_input_norm": "post_norm", "self_attn.q_norm": "attn_q_norm",
         "self_attn.k_norm": "attn_k_norm", "per_layer_input_gate": "inp_gate", "per_layer_projection": "proj"}


def gguf_tensor_table() -> GGUFNameTable:
    e = dict(decoder.gguf_tensor_table(rope_permuted=False, qk_norm=True).entries)
    L, B = "model.layers.{i}.", "blk.{i}."
    for hf, gg in _GGUF.items():
        e[f"{L}{hf}.weight"] = GGUFName(f"{B}{gg}.weight")
    e[L + "layer_scalar"] = GGUFName(B + "layer_output_scale.weight")
    e["model.embed_tokens_per_layer.weight"] = GGUFName("per_layer_token_embd.weight")
    e["model.per_layer_model_projection.weight"] = GGUFName("per_layer_model_proj.weight")
    e["model.per_layer_projection_norm.weight"] = GGUFName("per_layer_proj_norm.weight")
    return GGUFNameTable(e)


# ---- GGUF (llama.cpp's "gemma4") ------------------------------------------------------------

ARCH = "gemma4"
NO_ROTATION = 1e30  # llama.cpp's rope_freqs divisor for a pair that does not rotate (its converter's value)


def _kind_values(values: list[int], types: list[str], what: str, source: str) -> dict[str, int]:
    """{kind: the one value its layers share} of per-layer ``values``."""
    out: dict[str, int] = {}
    for v, t in zip(values, types):
        if out.setdefault(t, v) != v:
            raise UnsupportedError(f"{source}: {what} differs between {t} layers ({sorted(set(values))})",
                                   hint="llama.cpp's gemma4 has one value per attention kind")
    return out


def _rope_freqs(angles: int, head_dim: int, factor: float) -> np.ndarray:
    return np.array([factor] * angles + [NO_ROTATION] * (head_dim // 2 - angles), np.float32)


def llama_cpp_kv_sources(types: list[str], shared: int) -> list[int]:
    """Each layer's K / V source as llama.cpp's gemma4 (and gemma3n) cache has it: a shared layer
    reads layer first - 1 if it is a full-attention layer, first - 2 if sliding (first: the first
    shared layer). transformers' rule (kv_sources) agrees where those two layers are a sliding
    and a full one, as in every Gemma 4 model."""
    first = len(types) - shared
    return [i if i < first else first - (2 if types[i] == "sliding_attention" else 1) for i in range(len(types))]


def gguf_extra_tensors(config: dict) -> dict[str, np.ndarray]:
    """rope_freqs.weight: the full-attention layers' proportional rope as llama.cpp runs it
    (NEOX rope over the whole head, the frequencies past rope_angles divided away)."""
    spec = spec_from_config(config)
    full = next(i for i in range(spec.num_layers) if not spec.window(i))
    rope, head_dim = spec.rope, spec.head_dim_of(full)
    return {"rope_freqs.weight": _rope_freqs(rope.get("rope_angles", head_dim // 2), head_dim,
                                             float(rope.get("factor", 1.0)))}


def gguf_metadata(config: dict, rope: dict) -> dict:
    spec = spec_from_config(config)
    n, src = spec.num_layers, "config.json"
    types = ["sliding_attention" if spec.window(i) else "full_attention" for i in range(n)]
    dims = _kind_values([spec.head_dim_of(i) for i in range(n)], types, "head_dim", src)
    kv = _kind_values([spec.kv_heads_of(i) for i in range(n)], types, "num_key_value_heads", src)
    full, swa = "full_attention", "sliding_attention"
    refused = {
        "hidden_activation": spec.activation != "gelu_pytorch_tanh",
        "attention_bias": spec.attention_bias or spec.mlp_bias,
        "rope_parameters.sliding_attention": spec.rope_sliding.get("rope_type") != "default",
        "rope_parameters.full_attention": spec.rope.get("rope_type") != "proportional",
        "vocab_size_per_layer_input": bool(spec.per_layer_input_size) and spec.per_layer_vocab_size != spec.vocab_size,
        "attn_logit_softcapping": bool(spec.attn_softcap),
    }
    for key, bad in refused.items():
        if bad:
            raise UnsupportedError(f"{src}: {key} is not what llama.cpp's gemma4 architecture runs (GELU-tanh, no "
                                   "biases, an unscaled full-head sliding rope, a proportional full rope, per-layer "
                                   "inputs over the model's vocabulary); a GGUF file cannot say otherwise",
                                   hint="keep this model as a Hugging Face folder")
    shared = sum(spec.kv_source(i) != i for i in range(n))
    if [spec.kv_source(i) for i in range(n)] != llama_cpp_kv_sources(types, shared):
        raise UnsupportedError(f"{src}: num_kv_shared_layers is {shared}, and llama.cpp's gemma4 reads a shared layer's "
                               "K / V from the last layer before the shared ones (full attention) or the one before "
                               "(sliding), where transformers reads the last earlier layer of its kind: here they "
                               "differ", hint="keep this model as a Hugging Face folder")
    F = spec.intermediate_size
    hf = {**config, "head_dim": dims.get(full, spec.head_dim), "num_key_value_heads": kv.get(swa, spec.num_kv_heads),
          "intermediate_size": F, "rms_norm_eps": spec.rms_norm_eps, "vocab_size": spec.vocab_size,
          "partial_rotary_factor": 1.0}
    meta = gguf_config.hyperparameters(ARCH, hf, rope)
    kv_layers = [spec.kv_heads_of(i) for i in range(n)]
    widths = spec.layer_intermediate_sizes or [F] * n
    head_full, head_swa = dims.get(full, spec.head_dim), dims.get(swa, spec.head_dim)
    meta.update({
        f"{ARCH}.attention.head_count_kv": kv_layers[0] if len(set(kv_layers)) == 1 else kv_layers,
        f"{ARCH}.feed_forward_length": F if len(set(widths)) == 1 else widths,
        f"{ARCH}.attention.key_length": head_full, f"{ARCH}.attention.value_length": head_full,
        f"{ARCH}.attention.key_length_swa": head_swa, f"{ARCH}.attention.value_length_swa": head_swa,
        f"{ARCH}.rope.dimension_count": head_full, f"{ARCH}.rope.dimension_count_swa": head_swa,
        f"{ARCH}.rope.freq_base_swa": float(spec.rope_sliding["theta"]),
        f"{ARCH}.attention.sliding_window": int(config.get("sliding_window") or 512),
        f"{ARCH}.attention.sliding_window_pattern": [t == swa for t in types],
        f"{ARCH}.attention.shared_kv_layers": shared,
        f"{ARCH}.embedding_length_per_layer_input": spec.per_layer_input_size,
    })
    if spec.final_softcap:
        meta[f"{ARCH}.final_logit_softcapping"] = float(spec.final_softcap)
    return meta


class _SlidingView:
    """A gemma4 GGUF file as the common reader (gguf_config.hf_config) takes it: one value per
    key (the sliding layers' head dim, kv heads and MLP width) and no rope_freqs.weight (not a
    Llama 3 rope scaling here)."""

    def __init__(self, gf, values: dict):
        self._gf, self._values = gf, values
        self.tensors = {k: v for k, v in gf.tensors.items() if k != "rope_freqs.weight"}

    def get(self, key: str, default=None):
        return self._values[key] if key in self._values else self._gf.get(key, default)

    def __getattr__(self, name: str):
        return getattr(self._gf, name)


def _per_layer_key(gf, key: str, n: int, default=None) -> list:
    value = gf.get(key, default) if default is not None else gf.require(key)
    if not isinstance(value, list):
        return [value] * n
    if len(value) != n:
        raise FileFormatError(f"{gf.path}: {key} has {len(value)} entries for {n} layers", hint="the file is damaged")
    return value


def _proportional_rope(gf, head_dim: int, theta: float) -> dict:
    """HF's rope_parameters.full_attention from rope_freqs.weight: the leading pairs divided by
    one factor rotate, the rest (divided by ~1e30) do not."""
    if "rope_freqs.weight" not in gf.tensors:
        raise FileFormatError(f"{gf.path}: no tensor rope_freqs.weight (the full-attention layers' rope)",
                              hint="llama.cpp's gemma4 needs it; the file is incomplete")
    f = gf.tensor("rope_freqs.weight").dequantize().reshape(-1).astype(np.float64)
    still = f >= 1e20
    angles = int(np.argmax(still)) if still.any() else len(f)
    if len(f) != head_dim // 2 or still[angles:].sum() != len(f) - angles or (
            angles and not np.allclose(f[:angles], f[0], rtol=1e-6)) or (angles and f[0] <= 0):
        raise UnsupportedError(f"{gf.path}: rope_freqs.weight ({len(f)} values for a head of {head_dim}) is not a "
                               "proportional rope (one factor on the leading pairs, ~1e30 on the rest)",
                               hint="only Gemma 4's proportional rope is read from gemma4 files")
    partial = 2 * angles / head_dim
    while int(partial * head_dim // 2) < angles:  # transformers' rope_angles = int(partial * head_dim // 2)
        partial = math.nextafter(partial, 1.0)
    params = {"rope_type": "proportional", "partial_rotary_factor": partial, "rope_theta": theta}
    if angles and float(f[0]) != 1.0:
        params["factor"] = float(np.float32(f[0]))
    return params


def config_from_gguf(gf) -> dict:
    a = ARCH
    n = int(gf.require(f"{a}.block_count"))
    if gf.get(f"{a}.expert_count") or any(name.endswith(".ffn_gate_inp.weight") for name in gf.tensors):
        raise UnsupportedError(f"{gf.path}: a gemma4 file with mixture-of-experts layers (gemma-4-26B-A4B): "
                               "not supported yet", hint="dense Gemma 4 models run; MoE is issue 17")
    pattern = _per_layer_key(gf, f"{a}.attention.sliding_window_pattern", n)
    if not all(isinstance(v, (bool, int)) for v in pattern):
        raise FileFormatError(f"{gf.path}: {a}.attention.sliding_window_pattern is not one bool per layer",
                              hint="the file is damaged")
    types = ["sliding_attention" if v else "full_attention" for v in pattern]
    swa, full = "sliding_attention", "full_attention"
    if types[-1] != full:
        raise UnsupportedError(f"{gf.path}: {a}.attention.sliding_window_pattern makes the last layer sliding; "
                               "Gemma 4's last layer is full attention (transformers forces it)",
                               hint="the file is not Gemma 4's")
    heads = _kind_values([int(v) for v in _per_layer_key(gf, f"{a}.attention.head_count", n)], ["all"] * n,
                         "attention.head_count", str(gf.path))["all"]
    kv = _kind_values([int(v) for v in _per_layer_key(gf, f"{a}.attention.head_count_kv", n, heads)], types,
                      "attention.head_count_kv", str(gf.path))
    if heads <= 0 or any(v <= 0 or heads % v for v in kv.values()):
        raise FileFormatError(f"{gf.path}: {heads} query heads do not group over {a}.attention.head_count_kv {kv}",
                              hint="the file is damaged")
    hidden = int(gf.require(f"{a}.embedding_length"))
    head_full = int(gf.get(f"{a}.attention.key_length") or hidden // max(heads, 1))
    head_swa = int(gf.require(f"{a}.attention.key_length_swa"))
    for k, want in (("attention.value_length", head_full), ("attention.value_length_swa", head_swa),
                    ("rope.dimension_count", head_full), ("rope.dimension_count_swa", head_swa)):
        got = gf.get(f"{a}.{k}") if k != "attention.value_length_swa" else gf.require(f"{a}.{k}")
        if got is not None and int(got) != want:
            raise UnsupportedError(f"{gf.path}: {a}.{k} is {got}, not {want} (llama.cpp's gemma4 needs value heads "
                                   "as wide as key heads, and rotates whole heads)", hint="the file is not Gemma 4's")
    shared = int(gf.get(f"{a}.attention.shared_kv_layers") or 0)
    if shared and (shared >= n or kv_sources(types, shared) != llama_cpp_kv_sources(types, shared)):
        raise UnsupportedError(f"{gf.path}: {a}.attention.shared_kv_layers is {shared}: llama.cpp reads those layers' "
                               "K / V from the two layers before them, which are not the last sliding and full ones "
                               "(where transformers reads them from)", hint="the file is not Gemma 4's")
    widths = [int(v) for v in _per_layer_key(gf, f"{a}.feed_forward_length", n)]
    F, first_shared = widths[0], n - shared
    double = len(set(widths)) > 1
    if double and widths != [F if i < first_shared else 2 * F for i in range(n)]:
        raise UnsupportedError(f"{gf.path}: {a}.feed_forward_length is {widths}: not one width, nor the double-wide "
                               f"MLPs of the {shared} KV-sharing layers", hint="the file is not Gemma 4's")
    P = int(gf.require(f"{a}.embedding_length_per_layer_input"))
    sliding = {"rope_type": "default"}
    view = _SlidingView(gf, {f"{a}.attention.head_count_kv": kv.get(swa, kv.get(full)), f"{a}.feed_forward_length": F,
                             f"{a}.attention.key_length": head_swa, f"{a}.rope.dimension_count": head_swa})
    cfg = gguf_config.hf_config(view, "Gemma4ForCausalLM", "gemma4_text")
    gf.require(f"{a}.attention.layer_norm_rms_epsilon")
    theta = cfg.pop("rope_theta")
    sliding["rope_theta"] = float(gf.get(f"{a}.rope.freq_base_swa") or theta)  # llama.cpp's default: freq_base
    rope = {"sliding_attention": sliding, "full_attention": _proportional_rope(gf, head_full, theta)}
    own = [i for i in range(first_shared) if types[i] == full]
    no_v = {i for i in own if f"blk.{i}.attn_v.weight" not in gf.tensors}
    if no_v and no_v != set(own):
        raise UnsupportedError(f"{gf.path}: full-attention layers {sorted(no_v)} have no attn_v but "
                               f"{sorted(set(own) - no_v)} do", hint="transformers' attention_k_eq_v is all or none")
    per_layer_vocab = gf.tensors["per_layer_token_embd.weight"].shape[0] if "per_layer_token_embd.weight" in \
        gf.tensors else cfg["vocab_size"]
    cfg.update(
        hidden_activation="gelu_pytorch_tanh", hidden_act="gelu_pytorch_tanh", head_dim=head_swa,
        layer_types=types, sliding_window=int(gf.require(f"{a}.attention.sliding_window")),
        per_layer_config={i: {"head_dim": head_full, "num_key_value_heads": kv[full]}
                          for i, t in enumerate(types) if t == full},
        num_kv_shared_layers=shared, use_double_wide_mlp=double, hidden_size_per_layer_input=P,
        vocab_size_per_layer_input=int(per_layer_vocab), attention_k_eq_v=bool(no_v),
        final_logit_softcapping=gf.get(f"{a}.final_logit_softcapping"), rope_parameters=rope,
        enable_moe_block=False)
    cfg.pop("partial_rotary_factor", None)
    cfg.pop("rope_scaling", None)
    return cfg


def _shape(**kw) -> dict:
    """A bench shape from a real config's numbers (Gemma 4's fixed choices around them)."""
    layers, pattern, window = kw.pop("num_layers"), kw.pop("pattern"), kw.pop("window")
    glob_dim, glob_kv, shared = kw.pop("global_head_dim"), kw.pop("global_kv_heads"), kw.pop("kv_shared")
    double, F = kw.pop("double_wide"), kw["intermediate_size"]
    types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    types[-1] = "full_attention"
    srcs = kv_sources(types, shared)
    full = [t == "full_attention" for t in types]
    return dict(num_layers=layers, head_dim=256, rms_norm_eps=1e-6, qk_norm=True, tie_word_embeddings=True,
                activation="gelu_pytorch_tanh", embed_scale=True, attn_scale=1.0, final_softcap=SOFTCAP,
                sliding_windows=[0 if f else window for f in full],
                rope={"theta": 1_000_000.0, "rope_type": "proportional", "rope_angles": glob_dim // 8, "factor": 1.0},
                rope_sliding={"theta": 10_000.0, "rope_type": "default"},
                layer_head_dims=[glob_dim if f else 256 for f in full],
                layer_kv_heads=[glob_kv if f else kw["num_kv_heads"] for f in full],
                kv_sources=srcs if shared else [],
                layer_intermediate_sizes=[2 * F if srcs[i] != i else F for i in range(layers)] if double else [],
                attention_k_eq_v=glob_kv != kw["num_kv_heads"], value_norm=True, layer_scalar=True, **kw)


def bench_hf_config(spec: nn.ModelSpec) -> dict:
    """Gemma4TextConfig's keys for what a Gemma 4 bench shape holds per layer (bench/shapes.py
    hf_config gives the common ones)."""
    n = spec.num_layers
    types = ["sliding_attention" if spec.window(i) else "full_attention" for i in range(n)]
    full = types.index("full_attention")
    angles = spec.rope.get("rope_angles", spec.head_dim_of(full) // 2)
    return dict(
        layer_types=types, sliding_window=max(spec.sliding_windows or [0]) or 512,
        per_layer_config={i: {"head_dim": spec.head_dim_of(i), "num_key_value_heads": spec.kv_heads_of(i)}
                          for i in range(n) if types[i] == "full_attention"},
        num_kv_shared_layers=sum(spec.kv_source(i) != i for i in range(n)),
        use_double_wide_mlp=len(set(spec.layer_intermediate_sizes)) > 1,
        hidden_size_per_layer_input=spec.per_layer_input_size,
        vocab_size_per_layer_input=spec.per_layer_vocab_size or spec.vocab_size,
        attention_k_eq_v=spec.attention_k_eq_v, final_logit_softcapping=spec.final_softcap or None,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": spec.rope_sliding["theta"]},
                         "full_attention": {"rope_type": "proportional", "rope_theta": spec.rope["theta"],
                                            "partial_rotary_factor": 2 * angles / spec.head_dim_of(full)}})


FAMILY = Family(
    name="gemma4",
    hf_architectures=("Gemma4ForCausalLM",),
    model_types=("gemma4_text",),
    spec_from_config=spec_from_config,
    architecture=Gemma4CausalLM,
    bench_hf_config=bench_hf_config,
    name_table=hf_name_table,
    gguf=GGUFArchitecture(
        name=ARCH,
        tensors=gguf_tensor_table,
        config_from_gguf=config_from_gguf,
        metadata=gguf_metadata,
        extra_tensors=gguf_extra_tensors,
    ),
    # Gemma 4's template writes <|tool_call> and <|channel>thought (serve/parsers/registry.py
    # detects both); for a template that takes tools without showing them, the same parsers.
    chat=ChatDefaults(reasoning_parser="gemma4", tool_parser="gemma4", model_types=("gemma4",)),
    bench_shapes={
        # google/gemma-4-E2B-it's text_config: 35 layers (4 sliding : 1 full), the last 20 sharing K / V,
        # double-wide MLPs there, per-layer inputs of 256.
        "gemma-4-e2b": _shape(vocab_size=262144, hidden_size=1536, num_layers=35, num_heads=8, num_kv_heads=1,
                              intermediate_size=6144, pattern=5, window=512, global_head_dim=512, global_kv_heads=1,
                              kv_shared=20, double_wide=True, per_layer_input_size=256, per_layer_vocab_size=262144),
        # google/gemma-4-31B-it's text_config: 60 layers (5 : 1), K = V on the full layers (4 kv heads of 512).
        "gemma-4-31b": _shape(vocab_size=262144, hidden_size=5376, num_layers=60, num_heads=32, num_kv_heads=16,
                              intermediate_size=21504, pattern=6, window=1024, global_head_dim=512, global_kv_heads=4,
                              kv_shared=0, double_wide=False),
    },
    # Five layers (sliding, sliding, full, sliding, full) with a window of 4; the full layers with head 32
    # (p-rope over a quarter) beside the sliding ones' 16; per-layer inputs of 8; the last two layers
    # sharing K / V (double-wide MLPs); soft-capped logits; Gemma's template.
    tiny=TinyModel(
        tokenizer="gemma",
        config={"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 5, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 16, "global_head_dim": 32, "max_position_embeddings": 256,
                "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "sliding_window": 4,
                "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
                                "full_attention"],
                "num_kv_shared_layers": 2, "use_double_wide_mlp": True, "hidden_size_per_layer_input": 8,
                "final_logit_softcapping": SOFTCAP, "pad_token_id": None,
                "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                                    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                       "rope_theta": 1e6}}},
        bos_token="<bos>",
        eos_token="<eos>",
        variants={
            # The 31B's layout: K = V on the full layers with their own kv heads, no sharing, no
            # per-layer inputs, untied, no soft-capping.
            "k-eq-v": {"attention_k_eq_v": True, "num_global_key_value_heads": 1, "num_kv_shared_layers": 0,
                       "use_double_wide_mlp": False, "hidden_size_per_layer_input": 0, "tie_word_embeddings": False,
                       "final_logit_softcapping": None, "num_hidden_layers": 3,
                       "layer_types": ["sliding_attention", "full_attention", "full_attention"]},
        },
        # GGUF: rows of 256 values (every K type applies), the per-layer inputs over the model's
        # own vocabulary (llama.cpp's per_layer_token_embd has one row per token), and still the
        # layout llama.cpp's metadata has to carry: sliding / full layers of their own head dims,
        # the last two sharing K / V with double-wide MLPs, per-layer inputs, soft-capping.
        gguf={"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 8, "num_key_value_heads": 2,
              "head_dim": 32, "global_head_dim": 64, "num_hidden_layers": 4, "vocab_size": 512,
              "vocab_size_per_layer_input": 512, "hidden_size_per_layer_input": 256,
              "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]},
    ),
)
