from surogate.compile.buffers import Buf, Instr
from surogate.compile.planner import lifetimes, plan


def test_buffers_with_disjoint_lifetimes_share_memory_and_overlapping_ones_do_not():
    a = Buf("a", (256,), "float32", "internal")
    b = Buf("b", (256,), "float32", "internal")
    c = Buf("c", (256,), "float32", "internal")
    x = Buf("x", (256,), "float32", "external")
    instrs = [
        Instr("scale", [x], [a]),
        Instr("scale", [a], [b]),  # a dies here
        Instr("scale", [b], [c]),  # c may reuse a's bytes
        Instr("scale", [c], [x]),
    ]
    arena = plan(instrs)
    assert a.arena_offset != b.arena_offset
    assert c.arena_offset != b.arena_offset
    assert arena == 2 * 1024
    life = lifetimes(instrs)
    for p in (a, b, c):
        for q in (a, b, c):
            if p is q:
                continue
            overlap_time = not (life[p][1] < life[q][0] or life[q][1] < life[p][0])
            overlap_mem = not (p.arena_offset + p.nbytes <= q.arena_offset or q.arena_offset + q.nbytes <= p.arena_offset)
            assert not (overlap_time and overlap_mem), (p, q)


def test_views_keep_their_base_alive_and_pinned_buffers_live_to_the_end():
    base = Buf("base", (64,), "float32", "internal", pinned=True)
    v = Buf("v", (8, 8), "float32", "view", base=base)
    t = Buf("t", (64,), "float32", "internal")
    x = Buf("x", (64,), "float32", "external")
    instrs = [Instr("scale", [x], [base]), Instr("scale", [v], [t]), Instr("scale", [t], [x])]
    plan(instrs)
    life = lifetimes(instrs)
    assert life[base] == (0, 3)
    assert base.arena_offset != t.arena_offset
