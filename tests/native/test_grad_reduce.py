"""grad_reduce / grad_wait on the CPU (dist/grad_reducer.h): armed, a rank's Program hands its
gradient accumulators to its reducer's thread, which sums them over the ranks (all-reduce, or to
their owners) while the Program goes on; grad_wait waits for them. Unarmed both do nothing. The
rank threads run their Programs at once (runs release the GIL)."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from surogate import _native
from surogate.errors import InvalidArgumentError

R = 3


def rank_program(grads: list[np.ndarray], owners=None):
    """grad_reduce(grads) then a copy (work the reduction overlaps), then grad_wait."""
    p = _native.Program("cpu")
    ids = []
    for i, g in enumerate(grads):
        ids.append(p.external(f"grad.{i}", [g.size], "float32"))
        p.bind(ids[-1], g)
    src, dst = p.buffer("src", [1 << 16], "float32"), p.buffer("dst", [1 << 16], "float32")
    p.op("grad_reduce", ids, [], {"tag": 7, **({"owners": owners} if owners is not None else {})})
    p.op("copy", [src], [dst])
    p.op("grad_wait", [], [])
    return p


def run_ranks(programs):
    with ThreadPoolExecutor(len(programs)) as pool:
        list(pool.map(lambda p: p.run(), programs))


def grads_of(seed: int) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal(n).astype(np.float32) for n in (5, 4099)] for _ in range(R)]


def test_armed_all_reduce_sums_in_rank_order_and_unarmed_does_nothing():
    grads = grads_of(0)
    start = [[g.copy() for g in gs] for gs in grads]
    reducers = [_native.GradReducer(c) for c in _native.thread_group(R)]
    programs = []
    for gs, red in zip(grads, reducers):
        programs.append(rank_program(gs))
        programs[-1].set_grad_reducer(red)
    run_ranks(programs)  # unarmed
    for gs, s in zip(grads, start):
        for g, g0 in zip(gs, s):
            np.testing.assert_array_equal(g, g0)
    for red in reducers:
        red.arm()
        red.record()
    run_ranks(programs)
    for i in range(2):
        want = (start[0][i] + start[1][i]) + start[2][i]  # f32, rank order: bit for bit
        for gs in grads:
            np.testing.assert_array_equal(gs[i], want)
    for red in reducers:
        assert not red.armed and red.take_steps() == 1 and red.take_steps() == 0
        assert [(k, t) for k, t, _ in red.events()][:1] == [("start", 7)]
        kinds = [k for k, _, _ in red.events()]
        assert sorted(kinds) == ["begin", "end", "start", "wait"]


def test_reduce_to_owners_leaves_the_others_as_they_were():
    grads = grads_of(1)
    start = [[g.copy() for g in gs] for gs in grads]
    reducers = [_native.GradReducer(c) for c in _native.thread_group(R)]
    programs = []
    for gs, red in zip(grads, reducers):
        programs.append(rank_program(gs, owners=[2, 0]))
        programs[-1].set_grad_reducer(red)
        red.arm()
    run_ranks(programs)
    for i, owner in enumerate([2, 0]):
        want = (start[0][i] + start[1][i]) + start[2][i]
        for r in range(R):
            np.testing.assert_array_equal(grads[r][i], want if r == owner else start[r][i])


def test_start_from_python_matches_the_op():
    """The trainer's fallback for a rank that ran no backward: the same calls through start()."""
    grads = grads_of(2)
    want = [(grads[0][i] + grads[1][i]) + grads[2][i] for i in range(2)]
    reducers = [_native.GradReducer(c) for c in _native.thread_group(R)]
    p0 = rank_program(grads[0])
    p0.set_grad_reducer(reducers[0])
    reducers[0].arm()

    def rank(r):
        if r == 0:
            p0.run()
        else:
            reducers[r].arm()
            reducers[r].start(grads[r])
            reducers[r].wait()

    with ThreadPoolExecutor(R) as pool:
        list(pool.map(rank, range(R)))
    for gs in grads:
        for g, w in zip(gs, want):
            np.testing.assert_array_equal(g, w)


def test_errors_name_what_is_missing():
    g = np.zeros(4, np.float32)
    p = rank_program([g])
    with pytest.raises(InvalidArgumentError, match="no gradient reducer"):
        p.run()
    red = _native.GradReducer(_native.thread_group(2)[0])
    p = rank_program([g], owners=[5])
    p.set_grad_reducer(red)
    with pytest.raises(InvalidArgumentError, match="owned by rank 5 of a group of 2"):
        p.run()


def test_a_failed_peer_fails_the_wait_instead_of_hanging():
    comms = _native.thread_group(2)
    red = _native.GradReducer(comms[0])
    p = rank_program([np.zeros(4, np.float32)])
    p.set_grad_reducer(red)
    red.arm()
    red.abort("rank 1 failed: test")
    with pytest.raises(Exception, match="rank 1 failed: test"):
        p.run()


def test_staged_reductions_run_unarmed_zero_the_staging_and_wait_by_tag():
    """ZeRO-2/3 gradient sharding: rank r's tensors of other owners are staging; after the
    reduction the owner holds the sum and every other rank's staging is zero again."""
    grads = grads_of(3)
    start = [[g.copy() for g in gs] for gs in grads]
    reducers = [_native.GradReducer(c) for c in _native.thread_group(R)]
    programs = []
    for gs, red in zip(grads, reducers):
        p = _native.Program("cpu")
        ids = []
        for i, g in enumerate(gs):
            ids.append(p.external(f"grad.{i}", [g.size], "float32"))
            p.bind(ids[-1], g)
        p.op("grad_reduce", ids, [], {"tag": 4, "owners": [1, 2], "every": 1})
        p.op("grad_wait", [], [], {"tag": 4})  # (before the staging's reuse)
        p.set_grad_reducer(red)
        programs.append(p)
    run_ranks(programs)  # unarmed: staged reductions run anyway
    for i, owner in enumerate([1, 2]):
        want = (start[0][i] + start[1][i]) + start[2][i]
        for r in range(R):
            np.testing.assert_array_equal(grads[r][i], want if r == owner else 0 * want)
    assert all(red.take_steps() == 0 for red in reducers)  # (no step counted: none was armed)
    with pytest.raises(InvalidArgumentError, match="every .staged. needs owners"):
        p = _native.Program("cpu")
        p.op("grad_reduce", [], [], {"every": 1})
        p.set_grad_reducer(reducers[0])
        p.run()
