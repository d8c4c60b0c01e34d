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

LoRA adapters per request: ``add_adapter(slot, config, params)`` registers an adapter under the
engine's adapter slot; a step whose sequences use several adapters (or the base model, -1) runs
as one sub-step per adapter, each through a Program with that adapter's LoRA slices bound (the
KV writes and reads of each sequence are its own, so splitting changes no result). The engine
keeps each adapter's prefix-cache chain apart.

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
from surogate.dsl.nn import KVCache, LoRAConfig
from surogate.errors import InvalidArgumentError
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
        self._programs: dict[tuple[int, int, int, int, int], tuple[Executable, dict[str, np.ndarray]]] = {}
        # adapter slot -> (its LoRA config, our-named params in the model dtype, their device twins)
        self.adapters: dict[int, tuple[LoRAConfig, dict[str, np.ndarray], dict[str, object]]] = {}

    def add_adapter(self, slot: int, cfg: LoRAConfig, params: dict[str, np.ndarray]) -> None:
        """Serve requests submitted with adapter ``slot`` through these LoRA weights (our parameter
        names, as surogate.train.lora.load_peft_adapter returns them)."""
        if slot < 0:
            raise InvalidArgumentError(f"adapter slot {slot} is negative (-1 is the base model)")
        g = self.model.arch.build(mode="logits", dtype=self.model.dtype, lora=cfg, quant=self.model.quant)
        want = {p.name: p.shape for p in g.params() if p.meta.get("lora")}
        missing = sorted(set(want) - set(params))
        unknown = sorted(set(params) - set(want))
        if missing or unknown:
            raise InvalidArgumentError(
                f"adapter {slot}: its tensors do not fit this model (missing {missing[:3]}, unexpected {unknown[:3]})",
                hint="the adapter was trained on another base model or with other target modules")
        dt = _np_dtype(self.model.dtype)
        host = {}
        for name, shape in want.items():
            if tuple(params[name].shape) != tuple(shape):
                raise InvalidArgumentError(f"adapter {slot}: {name} has shape {tuple(params[name].shape)}, "
                                           f"the model needs {tuple(shape)}",
                                           hint="the adapter was trained on another base model")
            host[name] = np.ascontiguousarray(params[name].astype(dt))
        dev = {} if self.model.device == "cpu" else {
            n: _native.tensor(a).to(self.model.device) for n, a in host.items()}
        self.adapters[slot] = (cfg, host, dev)
        self._programs = {k: v for k, v in self._programs.items() if k[4] != slot}  # re-registered: rebuild

    @property
    def kv_bytes(self) -> int:
        return sum(a.nbytes for a in self.caches.values())

    def _program(self, T: int, S: int, B: int, R: int, slot: int = -1) -> tuple[Executable, dict[str, np.ndarray]]:
        key = (T, S, B, R, slot)
        hit = self._programs.get(key)
        if hit is not None:
            return hit
        m = self.model
        lora = self.adapters[slot][0] if slot >= 0 else None
        g = m.arch.build(mode="serve", dtype=m.dtype, kv=KVCache(self.total_blocks, self.block_size), quant=m.quant,
                         lora=lora)
        exe = Executable(g, {"N": T, "S": S, "S1": S + 1, "B": B, "R": R}, m.device, keep=[g.outputs["logits"]])
        for name in exe.external_names("param"):
            if name in m.params:  # the adapter's LoRA tensors are bound below
                exe.bind(name, m.params[name], m.device_param(name))
        for name, arr in self.caches.items():
            exe.bind(name, arr)
        if slot >= 0:
            _, host, dev = self.adapters[slot]
            for name, arr in host.items():
                exe.bind(name, arr, dev.get(name))
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
        cu = np.asarray(step.cu_q, np.int32)
        s = len(cu) - 1
        tables = np.asarray(step.block_tables, np.int32).reshape(s, -1)
        rows = np.asarray(step.logits_rows, np.int32)
        pos = np.asarray(step.positions, np.int32)
        slots = np.asarray(step.slot_mapping, np.int32)
        ctx = np.asarray(step.context_lens, np.int32)
        used = np.unique(np.asarray(step.adapter_ids, np.int32))
        for a in used:
            if a >= 0 and int(a) not in self.adapters:
                raise InvalidArgumentError(f"no adapter in slot {int(a)}", hint="register it with add_adapter first")
        if len(used) <= 1:  # the usual step: one adapter (or the base model) for every sequence
            return self._run(ids, pos, slots, cu, tables, ctx, rows, int(used[0]) if len(used) else -1)
        # Several adapters in one step: one sub-step per adapter, logits put back in row order.
        adapters = np.asarray(step.adapter_ids, np.int32)
        out = np.empty((len(rows), self.vocab_size), np.float32)
        row_seq = np.searchsorted(cu, rows, side="right") - 1  # the sequence each logits row belongs to
        for a in used:
            sel = np.flatnonzero(adapters == a)
            lens = cu[sel + 1] - cu[sel]
            sub_cu = np.zeros(len(sel) + 1, np.int32)
            sub_cu[1:] = np.cumsum(lens)
            tok = np.concatenate([np.arange(cu[i], cu[i + 1]) for i in sel]).astype(np.int64)
            mine = np.flatnonzero(np.isin(row_seq, sel))
            where = np.searchsorted(sel, row_seq[mine])  # index of each row's sequence within the group
            sub_rows = (sub_cu[where] + rows[mine] - cu[row_seq[mine]]).astype(np.int32)
            out[mine] = self._run(ids[tok], pos[tok], slots[tok], sub_cu, tables[sel], ctx[sel], sub_rows, int(a))
        return out

    def _run(self, ids, positions, slot_mapping, cu, tables, context_lens, rows, slot: int) -> np.ndarray:
        t = len(ids)
        s = len(cu) - 1
        tp = bucket_tokens(t)
        pad = tp - t
        sp = _pow2(s + (1 if pad else 0))
        pad_table = math.ceil(pad / self.block_size)
        bp = _pow2(max(tables.shape[1], pad_table, 1))
        rp = _pow2(max(len(rows), 1))
        exe, x = self._program(tp, sp, bp, rp, slot)

        x["input_ids"][:t] = ids
        x["input_ids"][t:] = 0
        x["position_ids"][:t] = positions
        x["slot_mapping"][:t] = slot_mapping
        x["block_tables"].fill(-1)
        x["block_tables"][:s, :tables.shape[1]] = tables
        x["cu_q"][:s + 1] = cu
        x["cu_q"][s + 1:] = tp
        x["context_lens"].fill(0)
        x["context_lens"][:s] = context_lens
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
