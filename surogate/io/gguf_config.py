"""llama.cpp's hyper-parameter keys, both ways: the HF config.json keys a GGUF file's
``{arch}.*`` metadata gives (so a model family builds its spec from a GGUF as from a Hugging
Face folder), and the ``{arch}.*`` keys ``surogate quantize`` writes from an HF config; and Llama 3
rope scaling, which llama.cpp stores as per-frequency divisors (``rope_freqs.weight``) rather than
as the parameters transformers and our rope kernel take.

The keys here are the ones every llama.cpp architecture has (context length, sizes, heads, rope
base, norm epsilon). This module knows no family: which architecture a file is and the HF names
it maps to come from the caller (each family's GGUFArchitecture, surogate/models/), and a family
with keys of its own reads and writes them around these.
"""

from __future__ import annotations

import math

import numpy as np

from surogate.errors import FileFormatError, UnsupportedError
from surogate.io.gguf import GGUFFile


def hf_config(gf: GGUFFile, hf_arch: str, model_type: str) -> dict:
    """HF config.json keys from a GGUF's hyper-parameters, for the transformers class
    ``hf_arch`` (config.json's ``architectures``) of ``model_type``."""
    arch = gf.architecture

    def key(name: str, default=None, required: bool = False):
        full = f"{arch}.{name}"
        value = gf.get(full)
        if value is None:
            if required:
                gf.require(full)
            return default
        if isinstance(value, list):  # some converters write one value per layer
            value = _per_layer_constant(gf, full, value)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise FileFormatError(f"{gf.path}: {full} is {value!r}, not a size or a rate", hint="the file is damaged")
        return value

    hidden = int(key("embedding_length", required=True))
    heads = int(key("attention.head_count", required=True))
    if not hidden or not heads:
        raise FileFormatError(f"{gf.path}: {arch}.embedding_length and attention.head_count must not be 0",
                              hint="the file is damaged")
    kv_heads = int(key("attention.head_count_kv", heads))
    head_dim = int(key("attention.key_length", hidden // heads))
    embed = gf.tensors.get("token_embd.weight")
    vocab = embed.shape[0] if embed is not None else key("vocab_size") or len(gf.get("tokenizer.ggml.tokens") or [])
    config = {
        "architectures": [hf_arch],
        "model_type": model_type,
        "hidden_size": hidden,
        "intermediate_size": int(key("feed_forward_length", required=True)),
        "num_hidden_layers": int(key("block_count", required=True)),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(key("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(key("context_length", 2048)),
        "vocab_size": int(vocab),
        "tie_word_embeddings": "output.weight" not in gf.tensors,
        "hidden_act": "silu",
        "attention_bias": "blk.0.attn_q.bias" in gf.tensors,
        "torch_dtype": "float32",
    }
    sizes = (config["num_hidden_layers"], config["intermediate_size"], kv_heads, head_dim, config["vocab_size"])
    if not all(sizes) or heads % kv_heads:
        raise FileFormatError(f"{gf.path}: hyper-parameters that do not make a model (layers, feed-forward, kv heads, "
                              f"head dim, vocabulary = {', '.join(map(str, sizes))}; {heads} heads)",
                              hint="the file is damaged")
    rope_dim = key("rope.dimension_count")
    if rope_dim is not None and int(rope_dim) != head_dim:
        config["partial_rotary_factor"] = int(rope_dim) / head_dim
    scaling = _rope_scaling(gf, arch, config["rope_theta"], int(rope_dim or head_dim))
    if scaling:
        config["rope_scaling"] = scaling
    for name in ("bos", "eos", "padding"):
        token_id = gf.get(f"tokenizer.ggml.{name}_token_id")
        if isinstance(token_id, int) and not isinstance(token_id, bool):
            config["pad_token_id" if name == "padding" else f"{name}_token_id"] = token_id
    return config


def hyperparameters(arch: str, config: dict, rope: dict) -> dict[str, object]:
    """``{arch}.*`` keys from an HF config and our rope attributes (``ModelSpec.rope``), as
    convert_hf_to_gguf.py writes them (the keys ``hf_config`` reads back)."""
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or hidden // heads)
    rope_dim = int(head_dim * float(config.get("partial_rotary_factor", 1.0)))
    meta = {
        f"{arch}.context_length": int(config.get("max_position_embeddings", 2048)),
        f"{arch}.embedding_length": hidden,
        f"{arch}.block_count": int(config["num_hidden_layers"]),
        f"{arch}.feed_forward_length": int(config["intermediate_size"]),
        f"{arch}.attention.head_count": heads,
        f"{arch}.attention.head_count_kv": int(config.get("num_key_value_heads") or heads),
        f"{arch}.attention.key_length": head_dim,
        f"{arch}.attention.value_length": head_dim,
        f"{arch}.rope.dimension_count": rope_dim,
        f"{arch}.rope.freq_base": float(rope.get("theta", 10000.0)),
        f"{arch}.attention.layer_norm_rms_epsilon": float(config.get("rms_norm_eps", 1e-6)),
        f"{arch}.vocab_size": int(config["vocab_size"]),
    }
    if rope["rope_type"] == "linear":
        meta[f"{arch}.rope.scaling.type"] = "linear"
        meta[f"{arch}.rope.scaling.factor"] = float(rope["factor"])
    elif rope["rope_type"] == "yarn":  # convert_hf_to_gguf.py's keys for rope_scaling type yarn
        meta[f"{arch}.rope.scaling.type"] = "yarn"
        meta[f"{arch}.rope.scaling.factor"] = float(rope["factor"])
        meta[f"{arch}.rope.scaling.original_context_length"] = int(rope["original_max_position"])
    return meta


# ---- helpers --------------------------------------------------------------------------------

def _per_layer_constant(gf: GGUFFile, key: str, value):
    # Some converters write a per-layer array; our specs have one value for all layers.
    if isinstance(value, list):
        if len(set(value)) != 1:
            raise UnsupportedError(f"{gf.path}: {key} differs between layers ({sorted(set(value))})",
                                   hint="models with per-layer shapes are not supported")
        return value[0]
    return value


def llama3_rope_factors(theta: float, dim: int, factor: float, low_freq_factor: float, high_freq_factor: float,
                        original_max_position: float) -> np.ndarray:
    """What llama.cpp stores in ``rope_freqs.weight`` for Llama 3 rope scaling: the divisor of
    each of the dim/2 rotary frequencies."""
    freqs = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    wavelen = 2 * math.pi / freqs
    smooth = (original_max_position / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    mid = 1.0 / ((1 - smooth) / factor + smooth)
    out = np.where(wavelen < original_max_position / high_freq_factor, 1.0,
                   np.where(wavelen > original_max_position / low_freq_factor, factor, mid))
    return out.astype(np.float32)


def llama3_rope_from_factors(stored: np.ndarray, theta: float, dim: int) -> dict | None:
    """Llama 3 rope-scaling parameters that give ``stored`` (rope_freqs.weight), or None.

    Between the two wavelength thresholds a factor f satisfies 1/f = (1 - s)/factor + s with
    s = (orig / wavelength - low) / (high - low): linear in 1/wavelength, so two such factors fix
    orig / (high - low) and low / (high - low), which is all the factors depend on. The usual
    low = 1, high = 4, orig = 8192 (Llama 3.1 - 3.3) is tried first, else low = 1 is fixed."""
    stored = np.asarray(stored, np.float64).reshape(-1)
    factor = float(stored.max())
    if len(stored) != dim // 2 or factor <= 1.0:
        return None
    candidates = [(1.0, 4.0, 8192.0)]
    wavelen = 2 * math.pi * theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    mid = (stored > 1 + 1e-6) & (stored < factor * (1 - 1e-6))
    if mid.sum() >= 2:
        s = (1 / stored[mid] - 1 / factor) / (1 - 1 / factor)
        a, b = np.polyfit(1 / wavelen[mid], s, 1)
        if b < 0:
            candidates.append((1.0, 1 - 1 / b, round(-a / b, 3)))
    for low, high, orig in candidates:
        if np.allclose(llama3_rope_factors(theta, dim, factor, low, high, orig), stored, rtol=1e-4, atol=1e-6):
            return {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                    "high_freq_factor": round(high, 6), "original_max_position_embeddings": orig}
    return None


def _rope_scaling(gf: GGUFFile, arch: str, theta: float, dim: int) -> dict | None:
    kind = gf.get(f"{arch}.rope.scaling.type")
    factor = gf.get(f"{arch}.rope.scaling.factor")
    if "rope_freqs.weight" in gf.tensors:
        # llama.cpp keeps only the per-frequency divisors of Llama 3 rope scaling; find the
        # parameters that give them, so the model runs the same rope as transformers does.
        stored = gf.tensor("rope_freqs.weight").dequantize().reshape(-1)
        if np.all(stored == 1.0):
            return None
        scaling = llama3_rope_from_factors(stored, theta, dim)
        if scaling is not None:
            return scaling
        raise UnsupportedError(f"{gf.path}: rope_freqs.weight is not a Llama 3 rope scaling we recognise",
                               hint="models with custom rope frequency factors are not supported")
    if kind in (None, "none") or (kind == "linear" and factor in (None, 1.0)):
        return None
    original = gf.get(f"{arch}.rope.scaling.original_context_length")
    if not isinstance(kind, str) or not isinstance(factor, (int, float, type(None))) or not isinstance(
            original, (int, type(None))):
        raise FileFormatError(f"{gf.path}: {arch}.rope.scaling.* hold values of the wrong type",
                              hint="the file is damaged")
    scaling = {"rope_type": kind, "factor": float(factor or 1.0)}
    if original is not None:
        scaling["original_max_position_embeddings"] = original
    return scaling


def mmproj_image_processor(folder) -> dict:
    """The image processor settings convert_hf_to_gguf.py writes into an mmproj: the folder's
    preprocessor_config.json and processor_config.json merged in that order (a nested
    ``image_processor`` object flattened); an error when they hold no image_mean / image_std."""
    from surogate.errors import NotFoundError
    from surogate.io.hf_folder import read_json

    pre = {}
    for name in ("preprocessor_config.json", "processor_config.json"):
        path = folder.path / name
        if path.is_file():
            cfg = read_json(path)
            pre.update({**cfg, **(cfg.get("image_processor") or {})})
    if "image_mean" not in pre or "image_std" not in pre:
        raise NotFoundError(f"{folder.path}: no image_mean / image_std in preprocessor_config.json",
                            hint="llama.cpp's mmproj carries the image processor's normalisation; add the model's "
                                 "preprocessor_config.json")
    return pre
