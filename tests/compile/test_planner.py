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


def test_a_second_plan_keeps_every_placement_and_fits_new_buffers_around_the_live_ones():
    x = Buf("x", (256,), "float32", "external")
    a = Buf("a", (256,), "float32", "internal")
    kept = Buf("kept", (256,), "float32", "internal", pinned=True)
    instrs = [Instr("scale", [x], [a]), Instr("scale", [a], [kept])]
    plan(instrs)
    before = (a.arena_offset, kept.arena_offset)
    # A phase appended later: its temporary is live with `kept` (pinned to the end), not with `a`.
    t = Buf("t", (256,), "float32", "internal")
    instrs += [Instr("scale", [kept], [t]), Instr("scale", [t], [x])]
    arena = plan(instrs)
    assert (a.arena_offset, kept.arena_offset) == before
    assert t.arena_offset == a.arena_offset != kept.arena_offset  # a is dead by then: its bytes are reused
    assert arena == 2 * 1024


# ---- phases: a graph lowered after the program, as a named section -----------------------------

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from surogate.compile import Executable  # noqa: E402
from surogate.dsl.graph import Graph  # noqa: E402
from surogate.errors import InvalidArgumentError, NotFoundError  # noqa: E402


def _program():
    """y = 2 x kept to the end, through a temporary h = x + w that dies inside the graph."""
    g = Graph("g")
    x, w = g.input("x", (64,), "float32"), g.param("w", (64,), "float32")
    (h,) = g.node("add", [x, w], [("h", (64,), "float32")])
    (y,) = g.node("add", [h, w], [("y", (64,), "float32")], beta=-1.0)
    exe = Executable(g, {}, keep=[y])
    return exe, exe.buf(h.name), exe.buf(y.name)


def _phase(name="y", dtype="float32", **attrs):
    """z = 3 y into a new external, through a temporary of the phase."""
    p = Graph("p")
    y = p.input(name, (64,), dtype)
    (t,) = p.node("scale", [y], [("p.t", (64,), "float32")], alpha=3.0)
    z = p.input("p.z", (64,), "float32")
    p.node("copy", [t], [z])
    return p


def test_a_phase_is_lowered_after_the_program_and_runs_by_name():
    exe, h, y = _program()
    placed = {b.name: b.arena_offset for b in exe.lowered.bufs if b.kind == "internal"}
    exe.add_phase("post", _phase())
    assert list(exe.phases) == ["forward", "post"]
    (f0, f1), (p0, p1) = exe.phases["forward"], exe.phases["post"]
    assert f1 == p0 and p1 == exe.program.num_instrs == len(exe.lowered.instrs) == 4
    assert [i.op for i in exe.lowered.instrs[p0:]] == ["scale", "copy"]
    # Its temporary is planned (beside the kept y, over the dead h); nothing placed before moved.
    t = exe.buf("p.t")
    assert t.kind == "internal" and t.arena_offset == h.arena_offset != y.arena_offset
    assert {b.name: b.arena_offset for b in exe.lowered.bufs if b.name in placed} == placed
    assert exe.buf("p.z").kind == "external" and exe.buf("y") is y  # the phase read the program's y
    x, w, z = np.arange(64, dtype=np.float32), np.ones(64, np.float32), np.zeros(64, np.float32)
    for n, a in (("x", x), ("w", w), ("p.z", z)):
        exe.bind(n, a)
    exe.run("forward")
    assert np.array_equal(exe.read("y"), x) and not z.any()
    exe.run("post")
    assert np.array_equal(z, 3 * x)
    z[:] = 0
    exe.run("forward", "post")  # consecutive phases run as one range
    assert np.array_equal(z, 3 * x)
    assert "# post" in exe.listing().splitlines()


def test_phase_errors_name_what_to_fix():
    exe, h, y = _program()
    with pytest.raises(InvalidArgumentError, match="value h is a temporary of an earlier phase"):
        exe.add_phase("bad", _phase(name="h"))  # h is a temporary of the forward pass, long dead
    with pytest.raises(InvalidArgumentError, match="float16"):
        exe.add_phase("bad", _phase(dtype="float16"))
    with pytest.raises(InvalidArgumentError, match="already has a phase 'forward'"):
        exe.add_phase("forward", _phase())
    exe.add_phase("post", _phase())
    n = exe.program.num_instrs
    exe.add_phase("post", _phase())  # the same phase again: nothing added
    assert exe.program.num_instrs == n
    other = _phase()
    other.nodes[0].attrs["alpha"] = 4.0
    with pytest.raises(InvalidArgumentError, match="built differently"):
        exe.add_phase("post", other)
    with pytest.raises(NotFoundError, match="phases: forward, post"):
        exe.run("backward")
    with pytest.raises(InvalidArgumentError, match="not adjacent"):
        exe.run("post", "forward")
    exe, _, _ = _program()
    for n in ("x", "w"):
        exe.bind(n, np.ones(64, np.float32))
    exe.run()
    with pytest.raises(InvalidArgumentError, match="before the first run"):
        exe.add_phase("post", _phase())
