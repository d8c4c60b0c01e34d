"""ZeRO-3 weight gathering: a lowered Program whose decoder layers' weights are sharded among the
data-parallel ranks and assembled, one layer at a time, in two staging buffers.

The staging scheme is weight streaming's (surogate/compile/offload.py), the bytes coming from
the ranks that own them instead of from host memory. Each sharded layer's parameters are packed
at fixed offsets of the layer's pack (`ShardedLayer`, the same on every rank and in every Program
of the run); layer i is staged in buffer ``zero3.slot.{i % 2}`` and every Program binds its
parameters to their bytes there. Piece by piece (whole tensors) the pack is owned by one rank,
which alone keeps those bytes between uses (its "home": an array the optimizer updates).

`gather_weights` puts the copies into a lowered Program, after lowering (so the blocks that
recompute re-emitted in the backward, and the tiled MLPs, are seen as they run): walking each
phase's instructions, the first one reading a layer whose buffer holds another layer (or, at a
phase's start, anything: a phase may run after another Program used the buffers) gets
``weight_gather(this rank's pieces) -> (zero3.slot.{s}[layer i])`` in front of it. In a training
Program the forward gathers layer 0, 1, ... as it reaches them and the backward gathers them again
from the last one down (the backward of layer i, and its recompute inside layer i + 1's backward,
read buffer i % 2 while i + 1's weights sit in the other). The gather is synchronous (the
op returns when every rank's pieces are in place), and a layer's bytes stay in its buffer until
the layer two further on needs it.

A layer's weights must not be read together with those of another layer of the same buffer (one
instruction reading layers i and i + 2, weights shared across layers): such a Program is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from surogate.compile.buffers import Buf, Instr
from surogate.compile.lower import Lowered
from surogate.errors import InvalidArgumentError, UnsupportedError

SLOTS = 2  # staging buffers: the layer being computed, the one before or after it
ALIGN = 256  # each piece's offset in its pack (cudaMalloc's alignment)
LAYER = re.compile(r"^layers\.(\d+)\.")
SLOT_NAME = "zero3.slot.{}"
HOME_NAME = "zero3.home.{}"


@dataclass(frozen=True)
class Piece:
    name: str  # the parameter
    shape: tuple[int, ...]
    dtype: str
    offset: int  # bytes into its layer's pack (and its staging buffer)
    nbytes: int
    owner: int  # the rank that keeps it


@dataclass(frozen=True)
class ShardedLayer:
    index: int  # the decoder layer
    pieces: tuple[Piece, ...]
    nbytes: int  # its packed size

    @property
    def slot(self) -> int:
        return self.index % SLOTS


def pack(index: int, params: list[tuple[str, tuple[int, ...], str, int, int]]) -> ShardedLayer:
    """Layer ``index``'s pieces (name, shape, dtype, nbytes, owner) at aligned offsets, in order."""
    at, pieces = 0, []
    for name, shape, dtype, nbytes, owner in params:
        pieces.append(Piece(name, tuple(shape), dtype, at, nbytes, owner))
        at = -(-(at + nbytes) // ALIGN) * ALIGN
    return ShardedLayer(index, tuple(pieces), max(at, ALIGN))


def reads(ins: Instr, owner: dict[str, int]) -> set[int]:
    """The sharded layers (by their index in ``owner``'s list) whose weights instruction ``ins`` reads."""
    out = set()
    for b in ins.inputs:
        k = owner.get(b.root().name) if b is not None else None
        if k is not None:
            out.add(k)
    return out


def gather_weights(lowered: Lowered, layers: list[ShardedLayer], rank: int, params: set[str],
                   flag: str = "zero_level: 3") -> None:
    """Insert the weight gathers of ``layers`` (sharded among the ranks) into ``lowered`` in
    place, as rank ``rank``'s Program (``params``: its graph's parameter names): the staging
    buffers and this rank's homes become external buffers (`SLOT_NAME`, `HOME_NAME` of each
    piece it owns), the phases grow to hold the gathers. ``flag`` names the option that asked
    for it, in errors."""
    owner = {p.name: k for k, layer in enumerate(layers) for p in layer.pieces}
    for name in params:
        if LAYER.match(name) and name in lowered.by_value and name not in owner:
            raise InvalidArgumentError(f"{flag}: the Program reads {name}, which no sharded layer holds",
                                       hint="build every Program of a ZeRO-3 rank from the training Program's layers")
    slot_bytes = max(layer.nbytes for layer in layers)
    slots = [_external(lowered, SLOT_NAME.format(s), (slot_bytes,), "uint8") for s in range(min(SLOTS, len(layers)))]
    homes = {p.name: _external(lowered, HOME_NAME.format(p.name), p.shape, p.dtype)
             for layer in layers for p in layer.pieces if p.owner == rank}
    dsts = {k: _view(lowered, layer, slots[layer.slot]) for k, layer in enumerate(layers)}
    instrs: list[Instr] = []
    phases = {}
    for phase, (begin, end) in sorted(lowered.phases.items(), key=lambda kv: kv[1]):
        start = len(instrs)
        held: list[int | None] = [None] * len(slots)  # which layer each buffer holds (unknown at a phase's start)
        for i in range(begin, end):
            ins = lowered.instrs[i]
            need = reads(ins, owner)
            by_slot: dict[int, int] = {}
            for k in sorted(need):
                s = layers[k].slot
                if s in by_slot:
                    raise UnsupportedError(
                        f"{flag}: instruction {i} ({ins.op}, {ins.node}) reads the weights of layers "
                        f"{layers[by_slot[s]].index} and {layers[k].index}, which take turns in one staging buffer",
                        hint="train this model with zero_level: 2")
                by_slot[s] = k
                if held[s] != k:
                    instrs.append(_gather(layers[k], dsts[k], homes, rank))
                    held[s] = k
            instrs.append(ins)
        phases[phase] = (start, len(instrs))
    lowered.instrs[:] = instrs
    lowered.phases.update(phases)


def _external(lowered: Lowered, name: str, shape: tuple[int, ...], dtype: str) -> Buf:
    if name in lowered.by_value:
        raise InvalidArgumentError(f"the Program already has a buffer {name}: weights gathered twice")
    b = Buf(name, tuple(shape), dtype, "external")
    lowered.bufs.append(b)
    lowered.by_value[name] = b
    return b


def _view(lowered: Lowered, layer: ShardedLayer, slot: Buf) -> Buf:
    """The bytes of ``slot`` that ``layer``'s pack takes."""
    dst = Buf(f"{slot.name}[layers.{layer.index}]", (layer.nbytes,), "uint8", "view", base=slot)
    lowered.bufs.append(dst)
    return dst


def _gather(layer: ShardedLayer, dst: Buf, homes: dict[str, Buf], rank: int) -> Instr:
    ps = layer.pieces
    return Instr("weight_gather", [homes[p.name] for p in ps if p.owner == rank], [dst],
                 {"offsets": [p.offset for p in ps], "sizes": [p.nbytes for p in ps], "owners": [p.owner for p in ps]},
                 node=f"zero3: layers.{layer.index} from its owners")
