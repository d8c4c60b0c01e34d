"""Multi-node data parallel through Ray: `surogate sft|pt|dpo|distill|grpo CONFIG --ray ADDRESS`,
or a config's ``distributed: {ray_address, num_nodes}`` block (the original Surogate's keys).

One Ray actor per node, each a trainer rank in its own process (the kind's trainer,
`trainer_class(kind)(..., dist=ProcessRank)`: one rank per process for now, ``gpus: 1`` each).
On a cluster of several nodes the actors are pinned one per node by a placement group with the
STRICT_SPREAD strategy; on a one-node
cluster (a local test cluster, ``--ray local``) they are plain actors, processes of one
machine. Rank 0's actor picks its node's IP and a free port, every rank joins the TCP group
there (`_native.tcp_group`), and all run the same steps as ``gpus: N`` threads would. The
driver prints rank 0's step lines as they come; the first actor to fail fails the run with its
error (the others' errors are the aborts it caused).

Every node reads the model and the datasets from the paths in the config, and rank 0 writes
output_dir: on a real cluster those paths must be on a filesystem every node sees.
"""

from __future__ import annotations

import io
import os
import socket
import sys
import threading
import time

from surogate.errors import ConfigError
from surogate.train.data_parallel import ProcessRank

CONSEQUENCES = ("collective aborted", "tcp collective", "tcp_group")  # errors caused by another rank's


class LineBuffer(io.TextIOBase):
    """The stream rank 0's trainer reports to: complete lines kept for the driver to fetch."""

    def __init__(self):
        self._lines: list[str] = []
        self._part = ""
        self._lock = threading.Lock()

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        with self._lock:
            *done, self._part = (self._part + text).split("\n")
            self._lines.extend(done)
        return len(text)

    def since(self, n: int) -> list[str]:
        with self._lock:
            return self._lines[n:]


class RankWorker:
    """One node's rank (a Ray actor: `launch` wraps it in ray.remote)."""

    def __init__(self):
        self.stream = LineBuffer()
        self._reserved: socket.socket | None = None

    def address(self) -> tuple[str, int]:
        """This node's IP and a port free on it (rank 0's listening address). The port stays bound
        (SO_REUSEADDR, not listening) until the group has joined: a port only probed and released
        could be taken meanwhile by one of the many processes Ray starts (a rank then reached
        another server: "not a surogate rank 0"); the native listener binds beside the reservation,
        which Linux allows while the reservation does not listen."""
        import ray

        ip = ray.util.get_node_ip_address()
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("", 0))
        self._reserved = s
        return ip, s.getsockname()[1]

    def train(self, cfg, dist: ProcessRank):
        import logging

        from surogate.train.run import trainer_class

        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
        try:
            trainer = trainer_class(cfg.kind)(cfg, stream=self.stream if dist.rank == 0 else None, dist=dist)
        finally:  # joined (the trainer's first act) or failed: the port is the group's now, or no one's
            if self._reserved is not None:
                self._reserved.close()
                self._reserved = None
        return trainer.train()

    def lines(self, n: int) -> list[str]:
        return self.stream.since(n)


def init_ray(address: str | None = None, **kw) -> None:
    """``ray.init``, from the folder that holds the surogate package this process runs. Ray puts
    the driver's working directory on its workers' sys.path, ahead of site-packages: started
    from a source checkout whose native module is not built in place, the workers would import
    that tree's surogate instead of the installed one (and fail on surogate._native)."""
    import ray

    import surogate

    here = os.getcwd()
    os.chdir(os.path.dirname(os.path.dirname(os.path.abspath(surogate.__file__))))
    try:
        ray.init(address=address, include_dashboard=False, logging_level="warning", log_to_driver=False, **kw)
    finally:
        os.chdir(here)


def _cluster_nodes(ray) -> int:
    return sum(1 for n in ray.nodes() if n.get("Alive"))


def launch(cfg, address: str, num_nodes: int = 0, stream=None, timeout_s: float = 1800.0):
    """Train ``cfg`` on ``num_nodes`` Ray actors (0: one per alive node of the cluster) of the
    cluster at ``address`` ("auto": the running one, "local": a new one on this machine,
    "ray://HOST:PORT": a Ray client). Returns rank 0's TrainResult."""
    try:
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    except ImportError as e:
        raise ConfigError("multi-node training needs Ray", where="distributed.ray_address",
                          hint="pip install 'surogate[dist]'") from e
    stream = stream or sys.stderr
    started = not ray.is_initialized()
    if started:
        kw = {"num_cpus": max(num_nodes, os.cpu_count() or 1)} if address == "local" else {}
        init_ray(address, **kw)
    pg, actors = None, []
    try:
        nodes = _cluster_nodes(ray)
        n = num_nodes or nodes
        if 1 < nodes < n:
            raise ConfigError(f"distributed.num_nodes: {n}, but the Ray cluster at {address} has {nodes} nodes",
                              where="distributed.num_nodes", hint=f"set num_nodes to at most {nodes}, or add nodes")
        cpus = ray.cluster_resources().get("CPU", 0)
        if cpus < n:  # (the actors would wait for CPUs forever)
            raise ConfigError(f"{n} ranks need {n} CPUs of the Ray cluster at {address}, it has {cpus:g}",
                              where="distributed.num_nodes", hint="one CPU per rank: fewer nodes, or more CPUs")
        worker = ray.remote(num_cpus=1, max_concurrency=2)(RankWorker)
        if nodes > 1:  # one rank per node
            pg = placement_group([{"CPU": 1}] * n, strategy="STRICT_SPREAD")
            ray.get(pg.ready(), timeout=timeout_s)
            actors = [worker.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
                pg, placement_group_bundle_index=i)).remote() for i in range(n)]
        else:  # one machine (a local cluster): the ranks are its processes
            actors = [worker.remote() for _ in range(n)]
        host, port = ray.get(actors[0].address.remote())
        runs = [a.train.remote(cfg, ProcessRank(r, n, host, port, timeout_s)) for r, a in enumerate(actors)]
        return _follow(ray, actors[0], runs, stream)
    finally:
        for a in actors:
            ray.kill(a)
        if pg is not None:
            remove_placement_group(pg)
        if started:
            ray.shutdown()


def _follow(ray, rank0, runs, stream):
    """Rank 0's lines to ``stream`` until every rank is done; the first real failure raised."""
    shown, pending, failures = 0, list(runs), []

    def show():
        nonlocal shown
        for line in ray.get(rank0.lines.remote(shown)):
            stream.write(line + "\n")
            shown += 1
        stream.flush()

    grace = None
    while pending:
        done, pending = ray.wait(pending, timeout=0.5)
        for ref in done:
            try:
                ray.get(ref)
            except Exception as e:  # noqa: BLE001 (a rank's error)
                failures.append((runs.index(ref), _cause(e)))
                grace = grace or time.monotonic() + 10  # the others fail from the abort; wait for theirs
        if failures and time.monotonic() > grace:
            break
        try:
            show()
        except Exception:  # noqa: BLE001 (rank 0's actor is gone: its error comes from its run)
            pass
    if failures:  # the error that is not the consequence of another rank's
        first = next((f for f in failures if not str(f[1]).startswith(CONSEQUENCES)), failures[0])
        raise first[1]
    show()
    return ray.get(runs[0])


def _cause(e: BaseException) -> BaseException:
    """The rank's own exception from Ray's wrapper (RayTaskError.cause), with the rank's traceback text
    kept as a note."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, BaseException):
        return cause
    return e
