"""surogate._native.Program: buffers, views, instructions, binding, running; plus the module's
memory, DLPack and threading behaviour that a trainer relies on."""

import threading
import time

import ml_dtypes
import numpy as np
import pytest
import torch

from surogate import _native
from surogate.errors import DTypeError, InvalidArgumentError, NotFoundError, ShapeError


def test_build_bind_run_get():
    p = _native.Program()
    x = p.external("x", [2, 3], "float32")
    y = p.buffer("y", [2, 3], "float32")
    z = p.buffer("z", [2, 3], "bfloat16")
    p.op("add", [x, x], [y], {"alpha": 1.5, "beta": 0.5})
    p.op("cast", [y], [z])
    assert (p.num_buffers, p.num_instrs) == (3, 2)
    assert p.find("y") == y and p.find("nope") == -1
    assert p.instr(0) == "add(x, x) -> (y)"
    xs = np.arange(6, dtype=np.float32).reshape(2, 3)
    p.bind(x, xs)
    p.prepare()
    p.prepare()  # idempotent
    p.run()
    np.testing.assert_array_equal(p.get(y).numpy(), 2 * xs)
    assert p.get(z).dtype == "bfloat16"
    np.testing.assert_array_equal(p.get(z).numpy(), (2 * xs).astype(ml_dtypes.bfloat16))


def test_arena_buffers_share_memory():
    p = _native.Program()
    a = p.buffer("a", [16], "float32", arena_offset=0)
    b = p.buffer("b", [16], "float32", arena_offset=0)  # planned to reuse a's bytes
    c = p.buffer("c", [3], "float32", arena_offset=128)
    p.op("fill", [], [a], {"value": 3.0})
    p.prepare()
    assert p.arena_bytes == 128 + 3 * 4
    assert p.get(a).data_ptr == p.get(b).data_ptr == p.get(c).data_ptr - 128
    p.run()
    assert p.get(b).numpy().tolist() == [3.0] * 16
    with pytest.raises(InvalidArgumentError, match="'d': arena offset 100 must be a multiple of 64"):
        _native.Program().buffer("d", [4], "float32", arena_offset=100)


def test_views_of_views_alias_their_base():
    p = _native.Program()
    x = p.external("x", [4, 6], "float32")
    rows = p.view("rows", x, [2, 6], offset=6)  # rows 1 and 2
    mid = p.view("mid", rows, [3], offset=2)  # x[1, 2:5]
    p.op("fill", [], [mid], {"value": 2.0})
    xs = np.zeros((4, 6), np.float32)
    p.bind(x, xs)
    p.run()
    expected = np.zeros((4, 6), np.float32)
    expected[1, 2:5] = 2.0
    np.testing.assert_array_equal(xs, expected)
    assert p.get(mid).data_ptr == xs.ctypes.data + (6 + 2) * 4
    with pytest.raises(ShapeError, match="view 'big' of 'rows': reaches element 13 of a buffer of 12 elements"):
        p.view("big", rows, [6], offset=8)


def test_rebinding_an_external_moves_its_views():
    p = _native.Program()
    x = p.external("x", [8], "float32")
    v = p.view("v", x, [2], offset=4)
    first, second = np.zeros(8, np.float32), np.zeros(8, np.float32)
    p.bind(x, first)
    assert p.get(v).data_ptr == first.ctypes.data + 16
    p.bind(x, second)
    assert p.get(v).data_ptr == second.ctypes.data + 16  # not a stale view of `first`


def test_zero_copy_external_is_written_in_place():
    p = _native.Program()
    x = p.external("x", [3, 5], "float32")
    p.op("fill", [], [x], {"value": 7.0})
    xs = np.zeros((3, 5), np.float32)
    p.bind(x, xs)
    p.run()
    assert (xs == 7.0).all()
    assert p.get(x).data_ptr == xs.ctypes.data


def test_run_ranges():
    p = _native.Program()
    x = p.external("x", [4], "float32")
    p.op("fill", [], [x], {"value": 1.0})
    for _ in range(3):
        p.op("scale", [x], [x], {"alpha": 2.0})
    xs = np.zeros(4, np.float32)
    p.bind(x, xs)
    p.run(0, 2)  # fill, one scale
    assert xs[0] == 2.0
    p.run(3)  # the last instruction only
    assert xs[0] == 4.0
    p.run(2, 3)
    assert xs[0] == 8.0
    p.run(3, 3)  # empty range
    p.run(-5, 100)  # clamped: everything
    assert xs[0] == 8.0


def test_profiling_accumulates_per_op():
    p = _native.Program()
    x = p.external("x", [1024], "float32")
    p.op("fill", [], [x], {"value": 1.0})
    p.op("scale", [x], [x], {"alpha": 2.0})
    p.bind(x, np.zeros(1024, np.float32))
    p.run()
    assert dict(p.profile()) == {"fill": 0.0, "scale": 0.0}  # off by default
    p.set_profiling(True)
    p.run()
    p.run()
    prof = dict(p.profile())
    assert set(prof) == {"fill", "scale"} and all(s >= 0 for s in prof.values()) and sum(prof.values()) > 0
    p.reset_profile()
    assert sum(dict(p.profile()).values()) == 0.0


def test_program_errors_name_what_is_wrong():
    p = _native.Program()
    x = p.external("weights", [2, 3], "float32")
    y = p.buffer("y", [2, 3], "float32")
    with pytest.raises(NotFoundError, match="no op 'nope'"):
        p.op("nope", [x], [y])
    with pytest.raises(InvalidArgumentError, match="add: takes 2..2 inputs, got 1"):
        p.op("add", [x], [y])
    with pytest.raises(InvalidArgumentError, match="add: no buffer with id 9"):
        p.op("add", [x, 9], [y])
    with pytest.raises(ShapeError, match="bind 'weights': expected shape \\[2, 3\\], got \\[3, 2\\]"):
        p.bind(x, np.zeros((3, 2), np.float32))
    with pytest.raises(DTypeError, match="bind 'weights': expected float32, got float16"):
        p.bind(x, np.zeros((2, 3), np.float16))
    with pytest.raises(InvalidArgumentError, match="'y' is not external"):
        p.bind(y, np.zeros((2, 3), np.float32))
    with pytest.raises(InvalidArgumentError, match="'y' has no memory yet"):
        p.get(y)
    with pytest.raises(InvalidArgumentError, match="no instruction 0"):
        p.instr(0)
    p.op("add", [x, x], [y])
    with pytest.raises(InvalidArgumentError, match="buffer 'weights' is not bound"):
        p.run()


def test_failing_instruction_is_named():
    p = _native.Program()
    a = p.buffer("a", [2, 3], "float32")
    b = p.buffer("b", [3, 2], "float32")
    p.op("fill", [], [a])
    p.op("add", [a, b], [a])
    with pytest.raises(ShapeError, match="instruction 1 \\(add\\(a, b\\) -> \\(a\\)\\): add: a \\[2, 3\\] and b"):
        p.run()


def test_read_only_binding_is_not_written():
    p = _native.Program()
    x = p.external("frozen", [4], "float32")
    v = p.view("part", x, [2], offset=2)
    p.op("fill", [], [v], {"value": 1.0})
    xs = np.zeros(4, np.float32)
    xs.flags.writeable = False
    p.bind(x, xs)
    with pytest.raises(InvalidArgumentError, match="writes buffer 'part', which is bound to read-only memory"):
        p.run()
    assert (xs == 0).all()
    p.bind(x, np.zeros(4, np.float32))  # a writeable one runs
    p.run()


def test_dlpack_round_trip_with_torch_is_zero_copy():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4).to(torch.bfloat16)
    nt = _native.tensor(t)
    assert (nt.dtype, nt.shape, nt.data_ptr) == ("bfloat16", (3, 4), t.data_ptr())
    back = torch.from_dlpack(nt)
    assert back.dtype == torch.bfloat16 and back.data_ptr() == t.data_ptr()
    assert torch.equal(back, t)
    # A torch tensor bound as an external is written in place.
    p = _native.Program()
    x = p.external("x", [3, 4], "bfloat16")
    p.op("fill", [], [x], {"value": -1.5})
    p.bind(x, t)
    p.run()
    assert (t == -1.5).all()
    # And the other way: memory surogate allocated, seen by torch without a copy.
    e = _native.zeros([5], "bfloat16")
    te = torch.from_dlpack(e)
    assert te.data_ptr() == e.data_ptr and _native.tensor(te).data_ptr == e.data_ptr


def test_allocator_serves_a_freed_block_from_its_cache():
    _native.empty_cache()
    before = _native.allocator_stats()
    x = _native.empty([12345], "float32")
    first = _native.allocator_stats()
    assert first["num_backend_allocs"] == before["num_backend_allocs"] + 1
    del x
    y = _native.empty([12345], "float32")
    second = _native.allocator_stats()
    assert second["num_allocs"] == first["num_allocs"] + 1
    assert second["num_backend_allocs"] == first["num_backend_allocs"]  # reused, not allocated
    assert second["allocated_bytes"] == first["allocated_bytes"]
    del y


def test_set_num_threads():
    before = _native.num_threads()
    a = np.random.default_rng(0).standard_normal(1 << 18).astype(np.float32)
    try:
        results = []
        for n in (1, 3):
            _native.set_num_threads(n)
            assert _native.num_threads() == n
            y = np.empty_like(a)
            _native.call_op("scale", [a], [y], {"alpha": 3.0})
            results.append(y)
        np.testing.assert_array_equal(results[0], results[1])
        _native.set_num_threads(0)
        assert _native.num_threads() == 1
    finally:
        _native.set_num_threads(before)
    assert _native.num_threads() == before


def test_run_releases_the_gil():
    # The program sets `started`, does ~0.1-0.5 s of work, then sets `done`. Run in a thread, the
    # main thread watches both through zero-copy arrays. It can see started == 1 and then
    # done == 0 only by executing Python while run() is in progress; had run() kept the GIL,
    # the main thread would first run again after `done` was set.
    n = 1 << 20
    p = _native.Program()
    started, done = p.external("started", [1], "float32"), p.external("done", [1], "float32")
    a = p.buffer("a", [n], "float32")
    p.op("fill", [], [a], {"value": 1.0})
    p.op("fill", [], [started], {"value": 1.0})
    for _ in range(1000):
        p.op("add", [a, a], [a], {"alpha": 0.5, "beta": 0.5})
    p.op("fill", [], [done], {"value": 1.0})
    s, d = np.zeros(1, np.float32), np.zeros(1, np.float32)
    p.bind(started, s)
    p.bind(done, d)
    runner = threading.Thread(target=p.run)
    runner.start()
    done_when_started_seen = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if s[0] == 1.0:
            done_when_started_seen = d[0]
            break
    runner.join()
    assert d[0] == 1.0
    assert done_when_started_seen == 0.0
