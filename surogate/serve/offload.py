"""Serving a model whose weights do not all fit on the GPU: some decoder layers' weights stay in
host memory and stream to the device every step (``surogate serve --cpu-offload-gb G`` or
``--offload-layers N``).

``--cpu-offload-gb G`` has vLLM's meaning: at least G GiB of the model's weights stay in host
memory (whole decoder layers here, the fewest that hold G GiB); ``--offload-layers N`` asks for N
layers. The streamed layers are spread evenly over the depth, so that each copy has resident
layers' work beside it to hide behind; the embeddings, the head and every other layer stay on the
device.

`WeightOffload.plan` picks the layers and packs each one's weights, as the serving Programs read
them (q, k and v fused where the runner fuses them), into one host buffer at 256-byte aligned
offsets: page-locked on a GPU (cudaHostAlloc: copies at the host link's speed, capturable in a
CUDA graph). The model's parameters then are views of those buffers (one host copy of the
weights), and its `device_param` refuses them (no other Program uploads them behind the runner's
back). A runner over the plan holds a `Staging`: two device buffers of the largest layer's
packed size, which the streamed layers take turns in (the k-th in buffer k % 2), each layer's
parameters bound to their offsets there; surogate/compile/offload.py puts the copies into every
serving Program (weight_fetch after the last reader of the layer two before, weight_wait before the
first reader of the layer), and kernels_native/cuda/weight_stream.cu runs them on a copy stream.
On the CPU the same Programs run with host buffers for staging (the copy is a memcpy): the same
kernels on the same bytes, the same tokens.

Every step copies every streamed layer once (per adapter sub-step: a step mixing adapters runs
one Program per adapter), so decode is bound by the host link: at most ``link bytes/s /
streamed bytes`` steps a second, each step one token for every running sequence.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from surogate import _native
from surogate.compile import fuse_serving
from surogate.compile.offload import SLOTS, StreamedLayer, stream_weights
from surogate.dsl.graph import Graph
from surogate.dsl.nn import KVCache
from surogate.errors import InvalidArgumentError, UnsupportedError
from surogate.model import Model, _np_dtype

GiB = 1 << 30
ALIGN = 256  # each parameter's offset in its layer's pack (cudaMalloc's alignment)
_LAYER = re.compile(r"^layers\.(\d+)\.")
QKV = ("q", "k", "v")


@dataclass(frozen=True)
class PackedParam:
    name: str
    shape: tuple[int, ...]
    dtype: str
    offset: int  # bytes into the layer's pack (and its staging buffer)
    nbytes: int


def check_flags(cpu_offload_gb: float | None, offload_layers: int | None) -> bool:
    """Whether the flags ask for weights in host memory (None and 0: no); an error naming the
    flag for a value no model takes (before the model loads)."""
    if cpu_offload_gb is not None and offload_layers is not None:
        raise InvalidArgumentError("--cpu-offload-gb and --offload-layers both given",
                                   hint="give one: the GiB of weights to keep in host memory, or the layers")
    if cpu_offload_gb is not None:
        g = float(cpu_offload_gb)
        if not math.isfinite(g) or g < 0:
            raise InvalidArgumentError(f"--cpu-offload-gb {cpu_offload_gb} is not a number >= 0",
                                       hint="the GiB of weights to keep in host memory; 0 for none")
        return g > 0
    if offload_layers is not None:
        if int(offload_layers) != offload_layers or offload_layers < 0:
            raise InvalidArgumentError(f"--offload-layers {offload_layers} is not a whole number >= 0",
                                       hint="the decoder layers whose weights stay in host memory; 0 for none")
        return offload_layers > 0
    return False


def size_str(nbytes: int) -> str:
    return f"{nbytes / GiB:.2f} GiB" if nbytes >= GiB // 10 else f"{nbytes / 2**20:.2f} MiB"


def spread(n: int, num_layers: int) -> list[int]:
    """n layer indices spread evenly over num_layers (the middle of each n-th of the depth)."""
    return [int((k + 0.5) * num_layers / n) for k in range(n)]


def serving_graph(model: Model, fuse_qkv: bool) -> Graph:
    """A serving graph of the model as the runner builds it (its parameters do not depend on the
    bucket)."""
    kv = KVCache(1, 16, fuse_qkv, num_state_slots=1, sample=True)
    return fuse_serving(model.arch.build(mode="serve", dtype=model.dtype, quant=model.quant, kv=kv))


def layer_params(g: Graph) -> dict[int, list[tuple[str, tuple[int, ...], str]]]:
    """Each decoder layer's parameters as the serving graph ``g`` reads them (name, shape, dtype),
    in the order it first reads them; the LoRA slices of adapters are not the model's."""
    out: dict[int, list] = {}
    seen: set[str] = set()
    for n in g.nodes:
        for v in n.inputs:
            if v is None or v.kind != "param" or v.name in seen or v.meta.get("lora"):
                continue
            m = _LAYER.match(v.name)
            if m is None:
                continue
            seen.add(v.name)
            out.setdefault(int(m.group(1)), []).append((v.name, tuple(int(d) for d in v.shape), v.dtype))
    return out


def _fused_parts(model: Model, name: str) -> list[str] | None:
    """The q, k, v parameters a fused ``...qkv_proj.{weight,bias}`` stacks (rows in that order)."""
    head, _, kind = name.rpartition(".")
    if not head.endswith(".qkv_proj"):
        return None
    parts = [f"{head[:-len('qkv_proj')]}{p}_proj.{kind}" for p in QKV]
    return parts if all(p in model.params for p in parts) else None


def _host_array(model: Model, name: str) -> np.ndarray:
    if name in model.stacks:  # the model keeps q, k, v as views of this stack
        return model.stacks[name][0]
    if name in model.params:
        return model.params[name]
    parts = _fused_parts(model, name)
    if parts is None:
        raise InvalidArgumentError(f"the serving Program reads {name}, which the model does not hold")
    return np.concatenate([model.params[p] for p in parts], axis=0)


class WeightOffload:
    """The streamed layers of one model and their packed host copies (shared by every runner
    over the model: the profile run's and the server's)."""

    def __init__(self, model: Model, layout: dict[int, list[PackedParam]], flag: str, fuse_qkv: bool):
        self.model = model
        self.flag = flag
        self.fuse_qkv = fuse_qkv  # the runners' (the packs hold fused q, k, v stacks where it is on)
        self.layout = layout  # streamed layer index -> its packed parameters
        self.layers = self._streamed_layers(layout)
        self.slot_bytes = max(layer.nbytes for layer in self.layers)
        self.names = {p.name for ps in layout.values() for p in ps}
        self.pinned = model.device != "cpu"
        self.packs: dict[int, tuple[object, np.ndarray]] = {}  # layer -> (what its Programs bind, a numpy view)
        self._pack()

    @staticmethod
    def _packed_size(ps: list[PackedParam]) -> int:
        return -(-(ps[-1].offset + ps[-1].nbytes) // ALIGN) * ALIGN

    @classmethod
    def _streamed_layers(cls, layout: dict[int, list[PackedParam]]) -> list[StreamedLayer]:
        return [StreamedLayer(i, tuple(p.name for p in ps), cls._packed_size(ps)) for i, ps in sorted(layout.items())]

    @property
    def nbytes(self) -> int:
        """The bytes every step copies to the device."""
        return sum(layer.nbytes for layer in self.layers)

    def describe(self) -> str:
        idx = [layer.index for layer in self.layers]
        return (f"{len(idx)} of {self.model.spec.num_layers} decoder layers ({', '.join(map(str, idx))}), "
                f"{size_str(self.nbytes)}, stream from host memory every step")

    @classmethod
    def plan(cls, model: Model, *, cpu_offload_gb: float | None = None, offload_layers: int | None = None,
             fuse_qkv: bool | None = None) -> WeightOffload | None:
        """The layers to keep in host memory for ``cpu_offload_gb`` GiB or ``offload_layers``
        layers (None or 0: none, and no plan). ``fuse_qkv``: the runner's (default: on a GPU)."""
        if not check_flags(cpu_offload_gb, offload_layers):
            return None
        flag = "--offload-layers" if offload_layers is not None else "--cpu-offload-gb"
        if not model.spec.causal:
            raise UnsupportedError(f"{flag}: {model.spec.family} is an encoder (bidirectional attention), served for "
                                   "embeddings only, with no serving runner to stream its weights",
                                   hint=f"serve it without {flag}")
        if model.stacks:
            raise UnsupportedError(f"{flag}: the model keeps its q, k, v weights stacked for a trainer that updates "
                                   "them in place (Model.stack_qkv), and streamed layers are copied into host buffers "
                                   "once", hint=f"serve a model that is not being trained with {flag}")
        fuse = model.device != "cpu" if fuse_qkv is None else fuse_qkv
        g = serving_graph(model, fuse)
        params = layer_params(g)
        L = model.spec.num_layers
        if not params or sorted(params) != list(range(L)):
            raise UnsupportedError(f"{flag}: the {model.spec.family} serving graph does not read its weights layer by "
                                   f"layer (layers.0 .. layers.{L - 1})", hint=f"serve this model without {flag}")
        sizes = [sum(int(np.prod(s, dtype=np.int64)) * _np_dtype(dt).itemsize for _, s, dt in params[i])
                 for i in range(L)]
        if offload_layers is not None:
            if offload_layers > L:
                raise InvalidArgumentError(f"--offload-layers {offload_layers} is more than the model's {L} decoder "
                                           "layers", hint=f"at most {L} (every layer)")
            chosen = spread(int(offload_layers), L)
        else:
            want = float(cpu_offload_gb) * GiB
            if want > sum(sizes):
                raise InvalidArgumentError(
                    f"--cpu-offload-gb {cpu_offload_gb} is more than the {size_str(sum(sizes))} of weights in the "
                    f"model's {L} decoder layers (the embeddings and the head stay on the device)",
                    hint=f"at most {sum(sizes) / GiB:.4g} (every layer, as --offload-layers {L})")
            chosen = next(sel for sel in (spread(n, L) for n in range(1, L + 1)) if sum(sizes[i] for i in sel) >= want)
        layout = {}
        for i in chosen:
            at, packed = 0, []
            for name, shape, dt in params[i]:
                nbytes = int(np.prod(shape, dtype=np.int64)) * _np_dtype(dt).itemsize
                packed.append(PackedParam(name, shape, dt, at, nbytes))
                at = -(-(at + nbytes) // ALIGN) * ALIGN
            layout[i] = packed
        # The serving graph takes the copies (a family whose layers read each other's weights does
        # not), checked before the model's parameters move into the packs.
        stream_weights(g, cls._streamed_layers(layout), flag)
        return cls(model, layout, flag, fuse)

    def _pack(self) -> None:
        """Copy each streamed layer's weights into its host pack; the model's parameters become
        views of the packs (a fused q/k/v stack's parts: row ranges of it)."""
        m = self.model
        for i, ps in self.layout.items():
            nbytes = self._packed_size(ps)
            t = _native.host_empty([nbytes], "uint8", pinned=self.pinned)
            buf = t.numpy()
            end = 0
            for p in ps:
                buf[end:p.offset] = 0  # the alignment gaps: no stale host bytes go up
                end = p.offset + p.nbytes
                src = np.ascontiguousarray(_host_array(m, p.name))
                if tuple(src.shape) != p.shape or str(src.dtype) != p.dtype:
                    raise InvalidArgumentError(f"{p.name}: the model holds {src.dtype} {tuple(src.shape)}, the serving "
                                               f"Program reads {p.dtype} {p.shape}")
                view = buf[p.offset:p.offset + p.nbytes].view(src.dtype).reshape(p.shape)
                view[...] = src
                self._repoint(p.name, view)
            buf[end:] = 0
            self.packs[i] = (t if self.pinned else buf, buf)

    def _repoint(self, name: str, view: np.ndarray) -> None:
        m = self.model
        if name in m.params:
            m.params[name] = view
            m.host_only.add(name)
            return
        at = 0
        for part in _fused_parts(m, name):
            rows = m.params[part].shape[0]
            m.params[part] = view[at:at + rows]
            m.host_only.add(part)
            at += rows

    def staging(self) -> Staging:
        return Staging(self)

    def streamed(self, exclude: set[str] = frozenset()) -> list[StreamedLayer]:
        """The streamed layers of a Program that binds the names in ``exclude`` itself (an
        adapter's own router): their parameters are left out (the pack keeps their bytes)."""
        if not exclude:
            return self.layers
        out = []
        for layer in self.layers:
            names = tuple(n for n in layer.params if n not in exclude)
            if names:
                out.append(StreamedLayer(layer.index, names, layer.nbytes))
        return out


class Staging:
    """A runner's two device buffers for the streamed layers, and the bindings of a Program's
    parameters inside them."""

    def __init__(self, offload: WeightOffload):
        self.offload = offload
        self.device = offload.model.device
        n = min(SLOTS, len(offload.layers))
        if self.device == "cpu":  # 64-byte aligned host memory, as the CPU allocator's
            self.slots = [_native.host_empty([offload.slot_bytes], "uint8").numpy() for _ in range(n)]
        else:
            self.slots = [_native.empty([offload.slot_bytes], "uint8", self.device) for _ in range(n)]

    @property
    def nbytes(self) -> int:
        return self.offload.slot_bytes * len(self.slots)

    def _view(self, slot, dtype: str, shape: tuple[int, ...], offset: int, nbytes: int):
        if self.device == "cpu":
            return slot[offset:offset + nbytes].view(_np_dtype(dtype)).reshape(shape)
        return slot.view(dtype, list(shape), offset)

    def bind(self, exe, layers: list[StreamedLayer]) -> None:
        """Bind the copies' buffers and the streamed parameters of the Program ``exe`` (its graph
        went through stream_weights with ``layers``)."""
        off = self.offload
        for k, layer in enumerate(layers):
            slot = self.slots[k % len(self.slots)]
            exe.bind(layer.host_name, off.packs[layer.index][0])
            exe.bind(layer.dst_name, self._view(slot, "uint8", (layer.nbytes,), 0, layer.nbytes))
            keep = set(layer.params)
            for p in off.layout[layer.index]:
                if p.name in keep:
                    exe.bind(p.name, self._view(slot, p.dtype, p.shape, p.offset, p.nbytes))
