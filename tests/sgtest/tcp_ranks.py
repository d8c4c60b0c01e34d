"""The collective tests' ranks (tests/native/test_collectives.py, test_tcp_collectives.py): the
scenarios each spawned process runs on its TCP communicator, the launcher that spawns them, a
threads group's runner and the rank-order sum both backends promise. A module of sgtest (on the tests'
path), not of the test file: a spawned child imports its target by module name, and the test
module's name (tests.native...) would need the repository root on the child's path, where the
source tree's surogate (without the built _native of an installed one) would shadow the installed
package."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
import time

import ml_dtypes
import numpy as np

from surogate import _native
from surogate.train.data_parallel import RankThreads, gather_objects

BF16 = ml_dtypes.bfloat16
SIZES = [7, 4097, 1, 33]  # a bucket whose rank shares cut across tensors and 2048-element blocks


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def inputs(rank: int, world: int):
    """Rank `rank`'s tensors of the "every call" scenario (a function of rank and world only)."""
    rng = np.random.default_rng(100 + rank)
    f32 = [rng.standard_normal(n).astype(np.float32) for n in SIZES]
    return {"f32": f32, "bf16": [x.astype(BF16) for x in f32],
            "scatter": rng.standard_normal(5 * world).astype(np.float32),
            "gather": rng.standard_normal(6).astype(np.float32) + rank,
            "bcast": [rng.standard_normal(9).astype(np.float32)]}


def every_call(rank: int, comm) -> dict:
    """Each collective once (the same script on the threads backend and on the TCP one)."""
    world = comm.world_size
    x = inputs(rank, world)
    out = {}
    for key in ("f32", "bf16"):
        for op in ("sum", "mean"):
            bufs = [a.copy() for a in x[key]]
            comm.all_reduce(bufs, op)
            out[f"all_reduce/{key}/{op}"] = bufs
    part = np.zeros(5, np.float32)
    comm.reduce_scatter(x["scatter"], part, "sum")
    out["reduce_scatter"] = [part]
    whole = np.zeros(6 * world, np.float32)
    comm.all_gather(x["gather"], whole)
    out["all_gather"] = [whole]
    b = [a.copy() for a in x["bcast"]]
    comm.broadcast(b, world - 1)
    out["broadcast"] = b
    owners = [r % world for r in range(len(SIZES))]
    bufs = [a.copy() for a in x["f32"]]
    comm.reduce_to_owners(bufs, owners, "sum")
    out["reduce_to_owners"] = [bufs[i] for i in range(len(SIZES)) if owners[i] == rank]
    comm.gather_from_owners(bufs, owners)
    out["gather_from_owners"] = bufs
    comm.barrier()
    out["objects"] = gather_objects(comm, {"rank": rank, "pad": "x" * (10 * rank)})
    return out


def mismatch(rank: int, comm) -> dict:
    """A call whose sizes differ fails on every rank; the next one works."""
    try:
        comm.all_reduce([np.ones(3 + rank, np.float32)])
        failed = None
    except Exception as e:  # noqa: BLE001 (reported to the test)
        failed = f"{type(e).__name__}: {e}"
    a = [np.full(4, rank + 1, np.float32)]
    comm.all_reduce(a)
    return {"failed": failed, "after": a}


def one_dies(rank: int, comm) -> dict:
    comm.barrier()
    if rank == 1:
        os._exit(3)
    comm.all_reduce([np.ones(8, np.float32)])
    return {}


def aborts(rank: int, comm) -> dict:
    comm.barrier()
    if rank == 1:
        comm.abort("rank 1 gave up")
        try:
            comm.barrier()
        except Exception as e:  # noqa: BLE001
            return {"failed": str(e)}
        return {}
    comm.all_reduce([np.ones(8, np.float32)])
    return {}


def two_channels(rank: int, comms) -> dict:
    """Both channels of one group at once, each from a thread of its own (a Program's collectives
    beside its gradient reducer's): 20 all-reduces each, interleaved as the threads run."""
    import threading

    out = {}

    def work(c):
        xs = []
        for i in range(20):
            a = np.full(1000, (rank + 1) * (10 ** c) + i, np.float32)
            comms[c].all_reduce([a])
            xs.append(float(a[0]))
        out[c] = xs

    threads = [threading.Thread(target=work, args=(c,)) for c in range(len(comms))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


SCENARIOS = {"every_call": every_call, "mismatch": mismatch, "one_dies": one_dies, "aborts": aborts,
             "two_channels": two_channels}


def _rank_main(rank, world, port, scenario, timeout_s, q, channels=1):
    try:
        if channels == 1:
            comm = _native.tcp_group(rank, world, "127.0.0.1", port, timeout_s)
        else:
            comm = _native.tcp_groups(rank, world, "127.0.0.1", port, channels, timeout_s)
        q.put((rank, "ok", SCENARIOS[scenario](rank, comm)))
    except Exception as e:  # noqa: BLE001 (the parent asserts on it)
        q.put((rank, "error", f"{type(e).__name__}: {e}"))


def on_processes(world: int, scenario: str, ranks=None, timeout_s: float = 30.0, channels=1) -> dict:
    """{rank: ("ok", result) or ("error", message)} of `scenario` on processes `ranks` of a group of
    `world` (``channels``: an int for all, or one per rank; > 1: the scenario gets that many
    communicators)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    ranks = list(range(world) if ranks is None else ranks)
    per = channels if isinstance(channels, list) else [channels] * len(ranks)
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, scenario, timeout_s, q, c))
             for r, c in zip(ranks, per)]
    for p in procs:
        p.start()
    out, deadline = {}, time.monotonic() + 120
    try:
        while len(out) < len(procs) and time.monotonic() < deadline:
            try:
                r, *res = q.get(timeout=0.2)
            except queue.Empty:  # (a rank that died sends nothing)
                if not any(p.is_alive() for p in procs) and q.empty():
                    break
                continue
            out[r] = tuple(res)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return out


def on_ranks(world: int, fn) -> list:
    """fn(rank, comm) on every rank of a fresh threads group, at once."""
    comms = _native.thread_group(world)
    threads = RankThreads(comms)
    try:
        return threads.run(lambda r: fn(r, comms[r]))
    finally:
        threads.close()


def rank_sum(xs) -> np.ndarray:
    """The rank-order f32 sum the backends promise."""
    acc = xs[0].astype(np.float32)
    for x in xs[1:]:
        acc = acc + x.astype(np.float32)
    return acc
