"""The threads backend of the collectives (kernels_native/dist) against numpy: every call on
1, 2 and 3 ranks, f32 and bf16 (f32 accumulation), in place where the interface allows it,
and the failure paths (a mismatched call fails every rank; an abort wakes a waiting rank).

The reference reduction is numpy's elementwise f32 adds in rank order, ((x0 + x1) + x2): the
backend promises exactly that order, so results are compared for equality, not closeness."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from sgtest.tcp_ranks import BF16, SIZES, on_ranks, rank_sum
from surogate import _native
from surogate.errors import InvalidArgumentError, ShapeError, SurogateError


def data(world: int, dtype, sizes=SIZES, seed=0) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal(n).astype(np.float32).astype(dtype) for n in sizes] for _ in range(world)]


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("dtype", [np.float32, BF16])
@pytest.mark.parametrize("op", ["sum", "mean"])
def test_all_reduce_is_the_rank_order_f32_sum_on_every_rank(world, dtype, op):
    xs = data(world, dtype)
    bufs = [[x.copy() for x in rank] for rank in xs]
    on_ranks(world, lambda r, c: c.all_reduce(bufs[r], op))
    for i in range(len(SIZES)):
        ref = rank_sum([xs[r][i] for r in range(world)])
        if op == "mean":
            ref = ref / np.float32(world)
        for r in range(world):
            assert bufs[r][i].dtype == dtype
            np.testing.assert_array_equal(bufs[r][i], ref.astype(dtype))


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("in_place", [False, True])
def test_reduce_scatter_and_all_gather(world, in_place):
    C = 1031
    xs = [x[0] for x in data(world, np.float32, sizes=[world * C])]
    bufs = [x.copy() for x in xs]
    outs = [bufs[r][r * C:(r + 1) * C] if in_place else np.zeros(C, np.float32) for r in range(world)]
    on_ranks(world, lambda r, c: c.reduce_scatter(bufs[r], outs[r], "sum"))
    ref = rank_sum(xs)
    for r in range(world):
        np.testing.assert_array_equal(outs[r], ref[r * C:(r + 1) * C])

    # all_gather back: every rank's whole buffer is the reduced vector
    gathered = [bufs[r] if in_place else np.zeros(world * C, np.float32) for r in range(world)]
    on_ranks(world, lambda r, c: c.all_gather(outs[r], gathered[r]))
    for r in range(world):
        np.testing.assert_array_equal(gathered[r], ref)


def test_reduce_scatter_in_bf16_rounds_once():
    world, C = 2, 300
    xs = [x[0] for x in data(world, BF16, sizes=[world * C])]
    outs = [np.zeros(C, BF16) for _ in range(world)]
    on_ranks(world, lambda r, c: c.reduce_scatter(xs[r], outs[r], "mean"))
    ref = (rank_sum(xs) / np.float32(world)).astype(BF16)
    for r in range(world):
        np.testing.assert_array_equal(outs[r], ref[r * C:(r + 1) * C])


@pytest.mark.parametrize("root", [0, 2])
def test_broadcast(root):
    xs = data(3, BF16)
    bufs = [[x.copy() for x in rank] for rank in xs]
    on_ranks(3, lambda r, c: c.broadcast(bufs[r], root))
    for r in range(3):
        for i in range(len(SIZES)):
            np.testing.assert_array_equal(bufs[r][i], xs[root][i])


def test_owner_reduce_and_gather_are_zero_s_reduce_scatter_and_all_gather():
    world, owners = 3, [2, 0, 0, 1]
    xs = data(world, np.float32)
    bufs = [[x.copy() for x in rank] for rank in xs]
    on_ranks(world, lambda r, c: c.reduce_to_owners(bufs[r], owners, "sum"))
    for i, o in enumerate(owners):
        ref = rank_sum([xs[r][i] for r in range(world)])
        for r in range(world):  # the owner holds the reduction, the others keep their own values
            np.testing.assert_array_equal(bufs[r][i], ref if r == o else xs[r][i])
    on_ranks(world, lambda r, c: c.gather_from_owners(bufs[r], owners))
    for i, o in enumerate(owners):
        for r in range(world):
            np.testing.assert_array_equal(bufs[r][i], bufs[o][i])


def test_a_group_reports_its_shape_and_barrier_passes():
    comms = _native.thread_group(2)
    assert [c.rank for c in comms] == [0, 1] and {c.world_size for c in comms} == {2}
    assert comms[0].backend == "threads"
    on_ranks(2, lambda r, c: c.barrier())


def every_rank_raises(world: int, fn) -> list[BaseException]:
    """Run fn(rank, comm) on plain threads; every rank's exception (None where it returned)."""
    comms = _native.thread_group(world)
    errors: list[BaseException | None] = [None] * world

    def rank(r):
        try:
            fn(r, comms[r])
        except BaseException as e:
            errors[r] = e

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "a rank is still waiting"
    return errors


def test_a_mismatched_call_fails_every_rank():
    a = [np.ones(5, np.float32), np.ones(6, np.float32)]
    errors = every_rank_raises(2, lambda r, c: c.all_reduce([a[r].copy()]))
    assert all(isinstance(e, ShapeError) for e in errors), errors
    assert "rank 1 tensor 0" in str(errors[0]) and str(errors[0]) == str(errors[1])

    errors = every_rank_raises(2, lambda r, c: c.barrier() if r else c.all_reduce([np.ones(3, np.float32)]))
    assert all(isinstance(e, InvalidArgumentError) for e in errors), errors
    assert "rank 1 called barrier, rank 0 called all_reduce" in str(errors[0])


def test_read_only_and_integer_buffers_are_refused_on_every_rank():
    frozen = np.ones(4, np.float32)
    frozen.flags.writeable = False
    errors = every_rank_raises(2, lambda r, c: c.all_reduce([frozen if r else np.ones(4, np.float32)]))
    assert all(isinstance(e, InvalidArgumentError) and "read-only" in str(e) for e in errors), errors
    errors = every_rank_raises(2, lambda r, c: c.all_reduce([np.ones(4, np.int32)]))
    assert all(isinstance(e, SurogateError) and "cannot reduce int32" in str(e) for e in errors), errors


def test_abort_wakes_a_rank_waiting_for_one_that_failed():
    def fn(r, c):
        if r == 1:
            c.abort("rank 1 hit an error")
            return
        c.barrier()  # rank 1 never comes

    errors = every_rank_raises(2, fn)
    assert isinstance(errors[0], SurogateError) and "rank 1 hit an error" in str(errors[0])
    assert errors[1] is None


def test_rank_threads_raise_the_first_error_not_the_aborts_it_caused():
    def fn(r, c):
        if r == 1:
            raise ValueError("the data of rank 1 is bad")
        c.barrier()

    with pytest.raises(ValueError, match="rank 1 is bad"):
        on_ranks(3, fn)


def test_the_nccl_group_says_why_it_is_not_there():
    if _native.build_info()["cuda"] and _native.cuda_devices():
        pytest.skip("a GPU machine: the NCCL backend's own tests belong there")
    with pytest.raises(SurogateError) as e:  # not built (SUROGATE_NCCL=OFF), or built but no GPU
        _native.nccl_group([0])
    assert e.value.hint
