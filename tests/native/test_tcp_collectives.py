"""The TCP backend of the collectives (kernels_native/dist/tcp_group.cpp): ranks that are
separate processes (multiprocessing spawn) on this host. Every call on 2 and 3 processes equals
numpy's rank-order f32 reduction and the threads backend's results, bit for bit; the failure
paths name the peer: a mismatched call fails every rank and leaves the group usable, a rank
that exits fails the others at once (not at the timeout), a rank that never joins times out,
an abort fails the group. Two channels of one group (one port) run at once from two threads each.

One spawn per rank per scenario (each imports numpy and the module: about a second)."""

from __future__ import annotations

import numpy as np
import pytest

from sgtest.tcp_ranks import BF16, SIZES, every_call, free_port, inputs, on_processes, on_ranks, rank_sum
from surogate import _native



@pytest.mark.parametrize("world", [2, 3])
def test_every_call_equals_numpy_and_the_threads_backend(world):
    got = on_processes(world, "every_call")
    assert sorted(got) == list(range(world)), got
    assert all(status == "ok" for status, *_ in got.values()), got
    threads = on_ranks(world, every_call)
    xs = [inputs(r, world) for r in range(world)]
    for r in range(world):
        res = got[r][1]
        assert set(res) == set(threads[r])
        for key, arrays in res.items():
            if key == "objects":
                assert arrays == [{"rank": k, "pad": "x" * (10 * k)} for k in range(world)]
                continue
            for a, b in zip(arrays, threads[r][key], strict=True):
                assert a.dtype == b.dtype
                np.testing.assert_array_equal(a, b, err_msg=f"{key} rank {r}")
        # and numpy's rank-order f32 sum
        for i in range(len(SIZES)):
            ref = rank_sum([x["f32"][i] for x in xs])
            np.testing.assert_array_equal(res["all_reduce/f32/sum"][i], ref)
            np.testing.assert_array_equal(res["all_reduce/f32/mean"][i], ref / np.float32(world))
            ref16 = rank_sum([x["bf16"][i] for x in xs])
            np.testing.assert_array_equal(res["all_reduce/bf16/sum"][i], ref16.astype(BF16))
            np.testing.assert_array_equal(res["gather_from_owners"][i], ref)
        np.testing.assert_array_equal(res["reduce_scatter"][0], rank_sum([x["scatter"] for x in xs])[5 * r:5 * r + 5])
        np.testing.assert_array_equal(res["all_gather"][0], np.concatenate([x["gather"] for x in xs]))
        np.testing.assert_array_equal(res["broadcast"][0], xs[world - 1]["bcast"][0])


def test_a_mismatched_call_fails_every_rank_and_the_group_goes_on():
    got = on_processes(2, "mismatch")
    for r in range(2):
        status, res = got[r]
        assert status == "ok", got
        assert res["failed"].startswith("ShapeError") and "rank 1 tensor 0" in res["failed"], res
        np.testing.assert_array_equal(res["after"][0], np.full(4, 3, np.float32))


def test_a_rank_that_exits_fails_the_others_at_once_naming_it():
    got = on_processes(3, "one_dies", timeout_s=120)  # the timeout is far: the failure must not wait for it
    assert 1 not in got
    status, msg = got[0]
    assert status == "error" and "rank 1 (127.0.0.1:" in msg and "closed the connection" in msg, msg
    assert msg.startswith("NetworkError: "), msg  # surogate.errors.NetworkError, a ConnectionError
    status, msg = got[2]  # rank 0 shut its sockets: rank 2 fails too, naming rank 0
    assert status == "error" and "rank 0 (127.0.0.1:" in msg, msg


def test_abort_fails_the_group():
    got = on_processes(2, "aborts", timeout_s=120)
    assert got[1] == ("ok", {"failed": got[1][1]["failed"]}) and "rank 1 gave up" in got[1][1]["failed"]
    status, msg = got[0]
    assert status == "error" and "rank 1 (127.0.0.1:" in msg, msg


def test_a_rank_that_never_joins_times_out_naming_it():
    got = on_processes(3, "every_call", ranks=[0, 2], timeout_s=1.5)
    status, msg = got[0]
    assert status == "error" and "waited 1.5 s for rank(s) 1 of 3" in msg, msg
    status, msg = got[2]
    assert status == "error" and "rank 0" in msg, msg


def test_bad_arguments_are_refused():
    from surogate.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="rank 2 of a world of 2"):
        _native.tcp_group(2, 2, "127.0.0.1", 1234)
    with pytest.raises(InvalidArgumentError, match="port 0"):
        _native.tcp_group(0, 2, "127.0.0.1", 0)
    single = _native.tcp_group(0, 1, "127.0.0.1", free_port())  # a group of one: no sockets
    a = [np.arange(4, dtype=np.float32)]
    single.all_reduce(a)
    assert single.backend == "tcp" and single.world_size == 1
    np.testing.assert_array_equal(a[0], np.arange(4, dtype=np.float32))


def test_two_channels_of_one_group_run_at_once():
    got = on_processes(3, "two_channels", channels=2)
    for r in range(3):
        status, out = got[r]
        assert status == "ok", out
        for c in (0, 1):  # each all-reduce its own channel's sum, in order: no message crossed over
            assert out[c] == [float(sum((k + 1) * 10 ** c + i for k in range(3))) for i in range(20)]


def test_ranks_opening_other_channel_counts_are_refused():
    got = on_processes(2, "two_channels", channels=[2, 1], timeout_s=5.0)
    status, msg = got[0]
    assert status == "error" and "joins channel 0 of 1, rank 0 opened 2" in msg, msg
    status, msg = got[1]
    assert status == "error" and "another number of channels" in msg, msg
