"""Liveness-based placement of internal buffers in one arena.

A buffer is live from the instruction that first touches it to the one that last does (views
count as their base). Buffers are placed largest first at the lowest 64-byte aligned offset
that overlaps no placed buffer whose lifetime intersects its own: the usual greedy heuristic,
close to optimal for the stack-like lifetimes of a forward + backward pass.

Planning is incremental: a buffer placed by an earlier call keeps its offset, and only the
unplaced ones are fitted around it. A phase appended later (the optimizer step) gets its
temporaries planned without moving anything the Program already holds; on a first call nothing
is placed yet and the result is the plain greedy one.
"""

from __future__ import annotations

from surogate.compile.buffers import Buf, Instr

ALIGN = 64


def lifetimes(instrs: list[Instr]) -> dict[Buf, tuple[int, int]]:
    life: dict[Buf, tuple[int, int]] = {}
    end = len(instrs)
    for i, ins in enumerate(instrs):
        for b in [*ins.inputs, *ins.outputs]:
            if b is None:
                continue
            r = b.root()
            if r.kind != "internal":
                continue
            first, last = life.get(r, (i, i))
            life[r] = (min(first, i), max(last, i))
    for r, (first, last) in list(life.items()):
        if r.pinned:
            life[r] = (first, end)
    return life


def _size(b: Buf) -> int:
    return (b.nbytes + ALIGN - 1) // ALIGN * ALIGN


def plan(instrs: list[Instr], extra: list[Buf] = ()) -> int:
    """Assign arena_offset to every internal buffer touched by `instrs` (and pinned `extra`
    buffers) that has none yet; returns the arena size in bytes."""
    life = lifetimes(instrs)
    for b in extra:
        if b.kind == "internal" and b not in life:
            life[b] = (0, len(instrs))
    placed: list[tuple[int, int, int, int]] = []  # (offset, end, first, last)
    for b, (first, last) in life.items():
        if b.arena_offset >= 0:
            placed.append((b.arena_offset, b.arena_offset + _size(b), first, last))
    arena = max((e for _, e, _, _ in placed), default=0)
    order = sorted((b for b in life if b.arena_offset < 0), key=lambda b: (-b.nbytes, life[b][0]))
    for b in order:
        first, last = life[b]
        size = _size(b)
        busy = sorted((o, e) for o, e, f, l in placed if not (l < first or f > last))
        offset = 0
        for o, e in busy:
            if offset + size <= o:
                break
            offset = max(offset, e)
        b.arena_offset = offset
        placed.append((offset, offset + size, first, last))
        arena = max(arena, offset + size)
    return arena
