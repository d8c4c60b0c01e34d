"""Embedder: a model's final hidden states pooled into one vector per input (/v1/embeddings).

The native forward of the model's "hidden" build (surogate.dsl.nn.CausalLM.build: the blocks and
the final norm, no head; HF's ``last_hidden_state``) runs over the inputs packed as documents,
each attending only to itself. Pooling then takes each document's last row (``last``: what a
causal model has read the whole input at) or the mean of its rows (``mean``), and L2-normalises.

Inputs are batched up to ``max_batch_tokens`` tokens (a longer one runs alone) and each batch is
padded to a power of two (at least 16 tokens), so a server compiles a handful of Programs. The
Programs are the model's (``Model.executable``), not the serving engine's: one lock orders the
callers; the engine's own Programs are separate and run beside them.

Shape letters: T tokens of a batch, C hidden size, n inputs.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from surogate.errors import InvalidArgumentError

POOLINGS = ("last", "mean")
MIN_BUCKET = 16


def _bucket(t: int) -> int:
    return max(MIN_BUCKET, 1 << (t - 1).bit_length())


class Embedder:
    def __init__(self, model, pooling: str = "last", normalize: bool = True, max_batch_tokens: int = 2048):
        if pooling not in POOLINGS:
            raise InvalidArgumentError(f"--pooling {pooling!r} is not one of {', '.join(POOLINGS)}")
        self.model = model
        self.pooling = pooling
        self.normalize = normalize
        self.max_batch_tokens = max_batch_tokens
        self._lock = threading.Lock()

    @property
    def dimensions(self) -> int:
        return self.model.spec.hidden_size

    def embed(self, inputs: Sequence[Sequence[int]]) -> np.ndarray:
        """float32 [n, C]: one pooled (and normalised) vector per input of token ids."""
        if not inputs or any(len(x) == 0 for x in inputs):
            raise InvalidArgumentError("every input needs at least one token")
        out = np.empty((len(inputs), self.dimensions), np.float32)
        for batch in self._batches(inputs):
            docs = [list(inputs[i]) for i in batch]
            T = sum(len(d) for d in docs)
            with self._lock:
                h = self.model.hidden_states(docs, pad_to=_bucket(T))  # [T, C]
            start = 0
            for i, d in zip(batch, docs):
                rows = h[start:start + len(d)]
                out[i] = rows[-1] if self.pooling == "last" else rows.mean(axis=0)
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
