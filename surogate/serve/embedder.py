"""Embedder: a model's final hidden states pooled into one vector per input (/v1/embeddings).

The native forward of the model's "hidden" build (surogate.dsl.nn.CausalLM.build: the blocks and
the final norm, no head; HF's ``last_hidden_state``) runs over the inputs packed as documents,
each attending only to itself. Pooling then takes each document's last row (``last``: what a
causal model has read the whole input at) or the mean of its rows (``mean``), and L2-normalises.

A sentence-transformers folder (``modules.json``: EmbeddingGemma's Transformer -> Pooling ->
Dense -> Dense -> Normalize) says its own pipeline: its pooling mode, its dense projections
(``N_Dense/``: ``linear.weight`` [out, in], an optional bias, identity or tanh), applied on the
host to the pooled vectors (one small matmul per input), and whether it normalises.

Inputs are batched up to ``max_batch_tokens`` tokens (a longer one runs alone) and each batch is
padded to a power of two of documents (at least one padding document) and of tokens (at least
16), so a server compiles a few Programs per size, not one per request. The
Programs are the model's (``Model.executable``), not the serving engine's: one lock orders the
callers; the engine's own Programs are separate and run beside them.

Shape letters: T tokens of a batch, C hidden size, n inputs.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from surogate.errors import FileFormatError, InvalidArgumentError, UnsupportedError

POOLINGS = ("last", "mean")
MIN_BUCKET = 16
_ST = "sentence_transformers.models."
_ST_POOLING = {"pooling_mode_mean_tokens": "mean", "pooling_mode_lasttoken": "last"}
_ST_ACTIVATIONS = {"torch.nn.modules.linear.Identity": None, "torch.nn.modules.activation.Tanh": np.tanh}


@dataclass(frozen=True)
class Dense:
    """A sentence-transformers Dense module: y = act(x @ weight.T + bias)."""

    weight: np.ndarray  # [out, in] float32
    bias: np.ndarray | None
    activation: object = None  # None: identity

    def __call__(self, x: np.ndarray) -> np.ndarray:
        y = x @ self.weight.T
        if self.bias is not None:
            y += self.bias
        return y if self.activation is None else self.activation(y)


@dataclass(frozen=True)
class Pipeline:
    """What a sentence-transformers folder applies after the transformer."""

    pooling: str
    dense: tuple[Dense, ...]
    normalize: bool


def sentence_transformers_pipeline(folder: str | Path) -> Pipeline | None:
    """The pipeline a folder's ``modules.json`` describes; None without one. Modules we do not
    run (other poolings, activations, kinds) are errors naming the file and the key."""
    folder = Path(folder)
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        return None
    modules = _json(modules_file)
    pooling, dense, normalize = None, [], False
    for m in sorted(modules, key=lambda m: m.get("idx", 0)):
        kind, where = str(m.get("type", "")), folder / str(m.get("path", ""))
        if kind == _ST + "Transformer":
            continue
        if kind == _ST + "Pooling":
            cfg = _json(where / "config.json")
            modes = [v for k, v in _ST_POOLING.items() if cfg.get(k)]
            others = [k for k, v in cfg.items() if k.startswith("pooling_mode_") and v and k not in _ST_POOLING]
            if others or len(modes) != 1:
                raise UnsupportedError(
                    f"{where / 'config.json'}: pooling {others or modes or 'none'} is not supported",
                    hint="supported: pooling_mode_mean_tokens or pooling_mode_lasttoken, one of them")
            pooling = modes[0]
        elif kind == _ST + "Dense":
            dense.append(_dense(where))
        elif kind == _ST + "Normalize":
            normalize = True
        else:
            raise UnsupportedError(f"{modules_file}: module {kind!r} is not supported",
                                   hint="supported: Transformer, Pooling (mean, last token), Dense, Normalize")
    if pooling is None:
        raise FileFormatError(f"{modules_file}: no Pooling module", hint="a sentence-transformers folder pools")
    return Pipeline(pooling, tuple(dense), normalize)


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FileFormatError(f"{path} is missing", hint="the sentence-transformers folder is incomplete") from None
    except ValueError as e:
        raise FileFormatError(f"{path} is not valid JSON: {e}") from None


def _dense(where: Path) -> Dense:
    from surogate.io import open_safetensors

    cfg = _json(where / "config.json")
    act = cfg.get("activation_function", "torch.nn.modules.linear.Identity")
    if act not in _ST_ACTIVATIONS:
        raise UnsupportedError(f"{where / 'config.json'}: activation_function {act!r} is not supported",
                               hint="supported: " + ", ".join(_ST_ACTIVATIONS))
    weights = where / "model.safetensors"
    if not weights.is_file():
        raise FileFormatError(f"{where}: no model.safetensors",
                              hint="save the model with a recent sentence-transformers (safetensors weights)")
    f = open_safetensors(weights)
    w = np.array(f.get("linear.weight"), np.float32)
    if w.shape != (int(cfg["out_features"]), int(cfg["in_features"])):
        raise FileFormatError(f"{weights}: linear.weight has shape {w.shape}, config.json says "
                              f"({cfg['out_features']}, {cfg['in_features']})")
    bias = np.array(f.get("linear.bias"), np.float32) if cfg.get("bias", True) and "linear.bias" in f else None
    return Dense(w, bias, _ST_ACTIVATIONS[act])


def _bucket(t: int) -> int:
    return max(MIN_BUCKET, 1 << (t - 1).bit_length())


class Embedder:
    def __init__(self, model, pooling: str = "last", normalize: bool = True, max_batch_tokens: int = 2048,
                 dense: Sequence[Dense] = ()):
        if pooling not in POOLINGS:
            raise InvalidArgumentError(f"--pooling {pooling!r} is not one of {', '.join(POOLINGS)}")
        width = model.spec.hidden_size
        for i, d in enumerate(dense):
            if d.weight.shape[1] != width:
                raise FileFormatError(f"dense projection {i} takes {d.weight.shape[1]} inputs, the model gives {width}")
            width = d.weight.shape[0]
        self.model = model
        self.pooling = pooling
        self.normalize = normalize
        self.max_batch_tokens = max_batch_tokens
        self.dense = tuple(dense)
        self.dimensions = width
        self._lock = threading.Lock()

    @classmethod
    def for_model(cls, model, pooling: str = "last") -> Embedder:
        """The model folder's sentence-transformers pipeline when it has one (its pooling wins
        over ``pooling``), else ``pooling`` and normalisation."""
        pipe = sentence_transformers_pipeline(model.path) if model.path and Path(model.path).is_dir() else None
        if pipe is None:
            return cls(model, pooling)
        return cls(model, pipe.pooling, normalize=pipe.normalize, dense=pipe.dense)

    def embed(self, inputs: Sequence[Sequence[int]]) -> np.ndarray:
        """float32 [n, C]: one pooled (and normalised) vector per input of token ids."""
        if not inputs or any(len(x) == 0 for x in inputs):
            raise InvalidArgumentError("every input needs at least one token")
        out = np.empty((len(inputs), self.dimensions), np.float32)
        for batch in self._batches(inputs):
            docs = [list(inputs[i]) for i in batch]
            T, S = sum(len(d) for d in docs), 1 << len(docs).bit_length()  # S > len(docs)
            with self._lock:
                h = self.model.hidden_states(docs, pad_to=_bucket(T + S - len(docs)), pad_docs_to=S)  # [T, C]
            start = 0
            for i, d in zip(batch, docs):
                rows = h[start:start + len(d)]
                pooled = rows[-1] if self.pooling == "last" else rows.mean(axis=0)
                for layer in self.dense:
                    pooled = layer(pooled)
                out[i] = pooled
                start += len(d)
        if self.normalize:
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out

    def _batches(self, inputs: Sequence[Sequence[int]]) -> list[list[int]]:
        batches: list[list[int]] = [[]]
        tokens = 0
        for i, x in enumerate(inputs):
            if batches[-1] and tokens + len(x) > self.max_batch_tokens:
                batches.append([])
                tokens = 0
            batches[-1].append(i)
            tokens += len(x)
        return batches


def truncate(vectors: np.ndarray, dimensions: int, normalize: bool) -> np.ndarray:
    """The first ``dimensions`` components of each vector (OpenAI's ``dimensions``, Matryoshka
    style), renormalised when the embedder normalises."""
    v = np.ascontiguousarray(vectors[:, :dimensions])
    if normalize:
        v /= np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
    return v
