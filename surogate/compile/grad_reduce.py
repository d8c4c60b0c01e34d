"""Data-parallel gradient reduction during the backward: a lowered training Program's gradient
accumulators reduced among the ranks layer by layer, each as soon as the backward has finished
writing it, on a communication thread while the backward goes on (the design:
surogate/train/data_parallel.py; the thread: kernels_native/dist/grad_reducer.h).

`reduce_gradients` is a pass over the lowered instructions, after lowering (so a block's
recompute inside the next block's backward, the tiled MLPs and ZeRO-3's gathers are seen as they
run). The accumulators are grouped by decoder layer (``layers.N.*``; a parameter outside the
layers, the embedding, final norm or head, is a group of its own); each group's
``grad_reduce(accumulators)`` goes right after the last backward instruction that reads or
writes any of them (a tied embedding's: after its last use, the embedding's backward), so the
last layer's gradients start moving while the layers below are still computing. An accumulator
the backward never touches is final from the start: its group goes first. ``grad_wait()`` ends
the backward phase, so the phases after it (the optimizer, ZeRO-2's partial norm) read reduced
gradients. Under ZeRO-2/3 each accumulator is reduced to its owner (``owners``), otherwise
all-reduced. The ops do something only when the rank's reducer is armed (the step's last
backward): the accumulators hold every micro-batch by then, as the bucketed path's did.

Gradient sharding (``stage_rank``, ZeRO-2/3): rank ``stage_rank`` keeps accumulators only for the
layer parameters it owns (and every parameter outside the layers); a layer's others are staged:
packed at aligned offsets into staging buffer ``layer % 2`` (`GradGroup.staged`; the trainer binds
them there), reduced to their owners every backward (``every``: the owner's accumulator adds the
ranks' micro-batch sums; the reducer zeroes the staging after) and the buffer reused two layers on:
a ``grad_wait {tag}`` for the layer that used it last goes before the first backward instruction
touching a staged layer's accumulators.
"""

from __future__ import annotations

from dataclasses import dataclass

from surogate.compile.buffers import Instr
from surogate.compile.gather import ALIGN, LAYER
from surogate.compile.lower import Lowered
from surogate.errors import InvalidArgumentError, UnsupportedError

PHASE = "backward"
GRAD = "grad."


@dataclass(frozen=True)
class GradGroup:
    """One grad_reduce: the parameters whose accumulators it reduces, in order, and their owners."""

    tag: int  # the decoder layer, -1 outside the layers
    names: tuple[str, ...]
    owners: tuple[int, ...] | None  # ZeRO-2/3: each one's rank; None: all-reduced
    staged: tuple[tuple[str, int, int], ...] = ()  # gradient sharding: (name, slot, byte offset) of the staged ones

    @property
    def every(self) -> bool:
        """Reduced every backward (its staged accumulators hold one micro-batch)."""
        return bool(self.staged)

    @property
    def buffers(self) -> list[str]:
        return [GRAD + n for n in self.names]


def reduce_gradients(lowered: Lowered, owners: dict[str, int] | None = None,
                     stage_rank: int | None = None) -> list[GradGroup]:
    """Insert the grad_reduce / grad_wait instructions into ``lowered`` in place; returns the
    groups in the order the Program starts them (every rank's Program the same order).
    ``owners``: parameter -> the rank it is reduced to (ZeRO-2/3), None to all-reduce;
    ``stage_rank``: this Program's rank, whose layers' accumulators of other owners are staged."""
    if stage_rank is not None and owners is None:
        raise InvalidArgumentError("gradient sharding needs the owners of the parameters", hint="zero_level: 2 or 3")
    if PHASE not in lowered.phases:
        raise InvalidArgumentError("gradient reduction: the Program has no backward phase",
                                   hint="build the training Program with grads=True")
    grads = [b.name for b in lowered.bufs if b.kind == "external" and b.name.startswith(GRAD)]
    if not grads:
        raise InvalidArgumentError("gradient reduction: the Program has no gradient accumulators (grad.*)",
                                   hint="nothing trains: check the LoRA targets or the trainable parameters")
    begin, end = lowered.phases[PHASE]
    known = set(grads)
    last: dict[str, int] = {n: begin - 1 for n in grads}  # begin - 1: untouched by the backward
    first: dict[str, int] = {}
    for i in range(begin, end):
        ins = lowered.instrs[i]
        for b in (*ins.inputs, *ins.outputs):
            name = b.root().name if b is not None else None
            if name in known:
                last[name] = i
                first.setdefault(name, i)
    members: dict[object, list[str]] = {}
    for g in grads:
        m = LAYER.match(g[len(GRAD):])
        members.setdefault(int(m.group(1)) if m else g, []).append(g)
    at = {key: max(last[g] for g in gs) for key, gs in members.items()}
    groups: dict[int, list[GradGroup]] = {}  # instruction index -> the groups placed right after it
    order: list[GradGroup] = []
    for key in sorted(members, key=lambda k: (at[k], str(k))):
        names = tuple(g[len(GRAD):] for g in members[key])
        if owners is not None:
            missing = [n for n in names if n not in owners]
            if missing:
                raise InvalidArgumentError(f"gradient reduction: no owner for {missing[0]}",
                                           hint="give the owner of every trained parameter (ZeRO's shard split)")
        staged = ()
        if stage_rank is not None and isinstance(key, int):
            off, staged = 0, []
            for n in names:
                if owners[n] != stage_rank and GRAD + n in first:  # (an untouched one stays: it is zeros)
                    staged.append((n, key % 2, off))
                    off = -(-(off + lowered.by_value[GRAD + n].nbytes) // ALIGN) * ALIGN
            staged = tuple(staged)
        group = GradGroup(key if isinstance(key, int) else -1, names,
                          None if owners is None else tuple(owners[n] for n in names), staged)
        groups.setdefault(at[key], []).append(group)
        order.append(group)
    waits = _slot_waits(order, first, at)  # instruction index -> the layer whose staging it waits for
    by = lowered.by_value
    bwd = [_reduce(group, by) for group in groups.get(begin - 1, [])]
    for i in range(begin, end):
        for tag in waits.get(i, []):
            bwd.append(Instr("grad_wait", [], [], {"tag": tag},
                             node=f"data parallel: layers.{tag}'s staged gradients reduced"))
        bwd.append(lowered.instrs[i])
        bwd += [_reduce(group, by) for group in groups.get(i, [])]
    bwd.append(Instr("grad_wait", [], [], {}, node="data parallel: the gradients reduced"))
    delta = len(bwd) - (end - begin)
    lowered.instrs[begin:end] = bwd
    for name, (b0, e0) in lowered.phases.items():  # (phases are contiguous: none starts inside the backward)
        lowered.phases[name] = (b0 if b0 <= begin else b0 + delta, e0 if e0 < end else e0 + delta)
    lowered.phases[PHASE] = (begin, end + delta)
    return order


def _slot_waits(order: list[GradGroup], first: dict[str, int], at: dict) -> dict[int, list[int]]:
    """Before the first instruction touching a staged layer's accumulators: wait for the staged
    layer that used its buffer last (its reduction placed before that instruction)."""
    staged = sorted((g for g in order if g.staged), key=lambda g: min(first[GRAD + n] for n, _, _ in g.staged))
    waits, held = {}, {}
    for g in staged:
        slot = g.staged[0][1]
        i = min(first[GRAD + n] for n, _, _ in g.staged)
        prev = held.get(slot)
        if prev is not None:
            if at[prev.tag] >= i:
                raise UnsupportedError(f"gradient sharding: layers {prev.tag} and {g.tag}'s gradients are written "
                                       "together, and take turns in one staging buffer", hint="use zero_level: 1")
            waits.setdefault(i, []).append(prev.tag)
        held[slot] = g
    return waits


def _reduce(group: GradGroup, by_value) -> Instr:
    attrs = {"tag": group.tag}
    if group.owners is not None:
        attrs["owners"] = list(group.owners)
    if group.every:
        attrs["every"] = 1
    what = f"layers.{group.tag}" if group.tag >= 0 else group.names[0]
    return Instr("grad_reduce", [by_value[b] for b in group.buffers], [], attrs,
                 node=f"data parallel: {what}'s gradients reduced")
