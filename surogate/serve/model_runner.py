"""The model runner: a model's serving Program over the paged KV cache, one per shape bucket.

The engine hands over a StepInput (this step's tokens of S sequences, their cache slots, block
tables, query starts and context lengths, the rows that need logits). Shapes change every step,
Programs have fixed shapes, so each step is padded up to a bucket and the Program of that bucket
(compiled on first use, then reused) runs it:

- tokens: exact up to 16 (decode batches), then powers of two up to 256, then multiples of 256;
  the padding tokens form one extra sequence that writes and reads a few scratch blocks at the
  end of the cache, which the engine never hands out;
- sequences: a power of two; padding sequences have no queries and an empty context;
- block-table width and logits rows: powers of two (padding rows read row 0 and are dropped).

Weights are bound to every Program without copies (on a GPU: the model's one device copy); the
KV cache is one array per layer and per K / V (numpy on the CPU, a device tensor on a GPU),
shared by all Programs. On a GPU the step's small index arrays are copied up before each run
and only the rows of logits that sampling needs come back.
"""

from __future__ import annotations

import math

import numpy as np

from surogate import _native
from surogate.compile import Executable
from surogate.dsl.nn import KVCache
from surogate.model import Model, _np_dtype

SMALL_T = 16
MAX_PAD = 256  # padding tokens never exceed this (the bucket steps above SMALL_T)


def _pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def bucket_tokens(t: int) -> int:
    if t <= SMALL_T:
        return t
    if t <= MAX_PAD:
        return _pow2(t)
    return -(-t // MAX_PAD) * MAX_PAD


class ProgramRunner:
    """An engine ModelRunner (``vocab_size`` and ``run(step)``) for a loaded Model."""

    def __init__(self, model: Model, num_blocks: int, block_size: int = 16):
        self.model = model
        self.block_size = block_size
        self.num_blocks = num_blocks  # what the engine may hand out
        self.pad_blocks = math.ceil(MAX_PAD / block_size)
        self.total_blocks = num_blocks + self.pad_blocks
        s = model.spec
        shape = (self.total_blocks, block_size, s.num_kv_heads, s.head_dim)
        dt = _np_dtype(model.dtype)
        self.caches = {}
        for i in range(s.num_layers):
            for kv in ("k", "v"):
                self.caches[f"layers.{i}.{kv}_cache"] = np.zeros(shape, dt) if model.device == "cpu" else \
                    _native.zeros(list(shape), model.dtype, model.device)
        self.vocab_size = s.vocab_size
        self._programs: dict[tuple[int, int, int, int], tuple[Executable, dict[str, np.ndarray]]] = {}

    @property
    def kv_bytes(self) -> int:
        return sum(a.nbytes for a in self.caches.values())

    def _program(self, T: int, S: int, B: int, R: int) -> tuple[Executable, dict[str, np.ndarray]]:
        key = (T, S, B, R)
        hit = self._programs.get(key)
        if hit is not None:
            return hit
        m = self.model
        g = m.arch.build(mode="serve", dtype=m.dtype, kv=KVCache(self.total_blocks, self.block_size), quant=m.quant)
        exe = Executable(g, {"N": T, "S": S, "S1": S + 1, "B": B, "R": R}, m.device, keep=[g.outputs["logits"]])
        for name in exe.external_names("param"):
            exe.bind(name, m.params[name], m.device_param(name))
        for name, arr in self.caches.items():
            exe.bind(name, arr)
        inputs = {"input_ids": np.zeros(T, np.int32), "position_ids": np.zeros(T, np.int32),
                  "slot_mapping": np.zeros(T, np.int32), "block_tables": np.full((S, B), -1, np.int32),
                  "cu_q": np.zeros(S + 1, np.int32), "context_lens": np.zeros(S, np.int32),
                  "logits_rows": np.zeros(R, np.int32)}
        for name, arr in inputs.items():
            exe.bind(name, arr)
        exe.use_graphs()  # a decode step is hundreds of small kernels: one graph launch on a GPU
        self._programs[key] = (exe, inputs)
        return exe, inputs

    def run(self, step) -> np.ndarray:
        ids = np.asarray(step.token_ids, np.int32)
        t = len(ids)
        cu = np.asarray(step.cu_q, np.int32)
        s = len(cu) - 1
        tables = np.asarray(step.block_tables, np.int32).reshape(s, -1)
        rows = np.asarray(step.logits_rows, np.int32)
        tp = bucket_tokens(t)
        pad = tp - t
        sp = _pow2(s + (1 if pad else 0))
        pad_table = math.ceil(pad / self.block_size)
        bp = _pow2(max(tables.shape[1], pad_table, 1))
        rp = _pow2(max(len(rows), 1))
        exe, x = self._program(tp, sp, bp, rp)

        x["input_ids"][:t] = ids
        x["input_ids"][t:] = 0
        x["position_ids"][:t] = step.positions
        x["slot_mapping"][:t] = step.slot_mapping
        x["block_tables"].fill(-1)
        x["block_tables"][:s, :tables.shape[1]] = tables
        x["cu_q"][:s + 1] = cu
        x["cu_q"][s + 1:] = tp
        x["context_lens"].fill(0)
        x["context_lens"][:s] = step.context_lens
        if pad:  # the padding sequence: its own scratch blocks at the end of the cache
            scratch = self.num_blocks * self.block_size
            x["position_ids"][t:] = np.arange(pad, dtype=np.int32)
            x["slot_mapping"][t:] = scratch + np.arange(pad, dtype=np.int32)
            x["block_tables"][s, :pad_table] = self.num_blocks + np.arange(pad_table, dtype=np.int32)
            x["context_lens"][s] = pad
        x["logits_rows"][:len(rows)] = rows
        x["logits_rows"][len(rows):] = 0
        for name in x:
            exe.push(name)
        exe.run()
        return np.ascontiguousarray(exe.read("logits")[:len(rows)], dtype=np.float32)
