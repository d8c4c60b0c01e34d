"""Data parallel training: ``gpus: R`` ranks, one thread each in this process (the original
Surogate's design), each with its own Programs, weights, gradients and inputs. (Past 400 lines
for this header: the one account of the step at every ZeRO level.)

One optimizer step (`Trainer._step_with_metrics`, which every trainer shares: sft, pt, dpo,
distill; grpo's adds its rollouts):

1. The iterator yields global micro-batches of B * R rows; the trainer's `_split` cuts each
   into R micro-batches of B consecutive rows (sft: `split_rows`; dpo: pair slots; grpo:
   prompts), rank r taking part r (`Trainer._shares`). The order and the checkpointed
   position are those of a one-rank run with B * R rows per micro-batch, so a run resumes on
   any rank count with the same global batch.
2. `each(fn, grads=True)`: every rank runs the forward and backward phases of its
   micro-batches at once (the native runs release the GIL). Each loss seed is over the whole
   global step (sft: 1 / its target tokens; dpo: 1 / its pairs; grpo: the step's completions),
   so the rank gradients add up to the one-rank gradient: they are summed, not averaged. Each
   rank returns its per-micro-batch values; `in_step_order` lays them out as a one-rank run
   with B rows per micro-batch and R times the accumulation steps meets them (micro-batch m
   of rank r at m * R + r, the order of the LoRA dropout seeds too), which the trainer
   reduces to the step's loss and metrics. GRPO adds phases without gradients (`each(fn)`):
   each rank samples its prompts' groups with its own engine; the rewards of all come back,
   to normalise advantages over the step as one rank would.
3. Gradients, during each rank's last backward of the step, layer by layer: all-reduced (plain
   DP, ZeRO-1), or reduced to the rank that owns the parameter (ZeRO-2/3, `reduce_to_owners`: a
   reduce-scatter over whole tensors). A compile pass (surogate/compile/grad_reduce.py) puts a
   ``grad_reduce`` op after the last backward instruction touching a layer's accumulators (each
   parameter outside the layers a group of its own) and a ``grad_wait`` at the backward's end;
   the rank's `_native.GradReducer` (kernels_native/dist/grad_reducer.h) runs the reductions on a
   thread of its own, in program order, through a thread group of their own (ZeRO-3's gathers use
   the Program's communicator meanwhile), so layer L-1's gradients move while layers L-2 .. 0
   compute theirs. The ops act only when armed: `Trainer._last_backward` arms the step's last
   backward (sft, dpo: the last micro-batch; distill: its last pass; grpo: the last micro-batch
   with prompts), when each accumulator holds every micro-batch; a rank that armed none (grpo's
   rank without prompts) makes the same reductions after its backward (`_reduce_groups`), meeting
   the others'. The threads backend sums each element over the ranks in rank order in f32
   whatever the grouping, so this is the bucketed path's result bit for bit
   (tests/train/test_grad_reduce.py). Ranks in processes do the same through a second TCP
   channel (`join_group`: each rank connects twice to rank 0's one port), whose rank-order f32
   sums are the threads backend's. `_reduce_gradients` (buckets of about BUCKET_BYTES after the
   backward, last layers first) is the path of a Program built without the pass: no trainer
   builds one now; the tests keep it as the reference the overlapped path equals.
   Gradient sharding (ZeRO-2/3, rank threads and processes alike; not GRPO, whose rank without
   prompts runs no backward): a rank keeps accumulators only for the decoder-layer parameters it owns (and every
   one outside the layers, reduced as above). A layer's others are views of one of two staging
   buffers (layer i in buffer i % 2, `Trainer._grad_staging`), reduced to their owners in every
   backward (``grad_reduce`` with ``every``: the owner's accumulator adds the ranks' sum of the
   micro-batch) and zeroed by the reducer thread after; a ``grad_wait {tag: i + 2}`` before layer
   i's first gradient write waits until the buffer is free. So a rank's gradient memory is about
   1/R of the layers' plus two layers' (`Trainer.grad_bytes`); the numbers are the bucketed path's
   bit for bit without accumulation, within f32 reduction order with it (sum_m sum_r, not
   sum_r sum_m).
   Delayed FP8 scaling's amax histories are made their elementwise max over the ranks after the
   backward (`_merge_fp8_histories`), so every rank quantizes the next step with the same scales.
4. The optimizer phase on every rank. Plain DP: every rank steps everything (the same numbers:
   the ranks stay bit-identical). ZeRO-1/2: the parameters are split among the ranks
   (`shard_owners`), each rank holds the optimizer state of its own and steps only those,
   then the updated weights are all-gathered from their owners (`gather_from_owners`). ZeRO-2
   clips with the global norm made of the ranks' partial norms (`AdamW.partial_norm`).
5. Rank 0 reports (the loss and metrics from every rank's values) and writes
   checkpoints holding the full state: the weights and every rank's optimizer shard under the
   one-rank names, so any rank count reads them back.

ZeRO-3 (``zero_level: 3``, surogate/train/zero3.py) shards the weights too: each parameter of the
decoder layers (``layers.N.*``) the training Program reads, trained or frozen (a full fine-tune's
layers; under LoRA the base weights and the adapters), is kept by one rank only (whole tensors,
the trained ones by their owner; trained and frozen each split evenly by `shard_owners`), about
1/R of the layers' bytes per rank. The weights outside the layers (embeddings, final norm, head)
stay whole on every rank, as under ZeRO-2. The gathers are ops of the rank's Programs, serving's
weight streaming scheme (surogate/compile/offload.py) with the bytes coming from their owners:
each layer's parameters packed at fixed offsets, layer i staged in the rank's buffer i % 2, every
Program binding the layer's parameters to their bytes there. surogate/compile/gather.py puts
``weight_gather`` (cpu/weight_gather.cpp: the rank copies its pieces in, `gather_from_owners`
through the Program's communicator fills the rest) before the first instruction reading a layer
its buffer does not hold: the forward gathers layers 0, 1, ... as it reaches them (a layer is
released when the layer two on takes its buffer), the backward gathers them again from the last
down (a block's recompute, inside the next block's backward, reads its own buffer). Each phase
gathers anew at its start, so the two buffers serve every Program of the rank (training,
evaluation, DPO's reference) in any phase order. The step is ZeRO-2's (gradients reduced to
their owners during the backward; the norm from the partial norms), the optimizer a Program of its own over the arrays the rank keeps (`AdamW(homes=)`), then only the
weights outside the layers are gathered: ZeRO-3 trains as ZeRO-2 up to the rounding of the
partial norms. Rank threads keep the model's own arrays (each layer tensor stepped in place by
its owner: the process holds the weights once); a rank in a process of its own lets its model
drop the others' pieces (`Trainer._release_others`). Checkpoints and outputs take each weight
from its keeper (`trained_state`), under the one-rank names. Evaluation runs on every rank at once
(the gathers are collectives), rank 0 reporting. GRPO is refused (each rank's rollout engine
reads the weights whole). Its gradients are ZeRO-2's (sharded, step 3). Not built yet: GPU ranks
(cuda/weight_gather.cu compiles, untested; a gather overlapping the previous layer's compute on a
stream of its own is the GPU follow-up).

The collectives are `_native.Communicator`s (kernels_native/dist/collective.h); the threads
backend moves host memory, so ranks run on the CPU backend (``device: cpu``). GPU ranks need
the NCCL backend behind the same interface and a device per rank; neither is built yet.

Ranks in separate processes (`ProcessRank`, given by a launcher: surogate/train/ray_launch.py
starts one per node): the process's trainer is rank r of R, its `DataParallel` holds that one
rank and a TCP communicator (`_native.tcp_group`: rank 0 listens, the others connect). The step
is the same: the same rows, the same collectives, and the TCP backend reduces in the threads
backend's order, so R processes train bit for bit as ``gpus: R`` threads. What one process
knows of the others' step (each rank's values from `each`, MoE tallies; under ZeRO the
optimizer shards for a checkpoint) comes through all-gathers. One rank per process for now
(``gpus: 1`` each).

Threads: Python code between the native calls (copying a micro-batch into the input arrays,
reading the loss) holds the GIL and so runs one rank at a time; Program runs and collectives
release it; each rank has a second thread, its reducer's (a failing rank aborts both groups). The CPU kernels share one thread pool whose parallel loops take turns, so CPU ranks
add no speed: the CPU path is for testing every data-parallel and ZeRO path without GPUs.
"""

from __future__ import annotations

import pickle
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from surogate import _native
from surogate.errors import ConfigError

BUCKET_BYTES = 32 << 20  # gradients (and weights) moved per collective call


@dataclass(frozen=True)
class ProcessRank:
    """This process's place in a data-parallel group of processes: rank ``rank`` of ``world``;
    rank 0 listens on host:port (its node's address, a free port), the others connect to it.
    ``timeout_s`` bounds joining and every wait for a peer inside a collective."""

    rank: int
    world: int
    host: str
    port: int
    timeout_s: float = 1800.0


def join_group(d: ProcessRank):
    """This process's two TCP communicators (the Program's, the gradient reducer's), both over
    host:port: rank 0 listens until every rank has joined each."""
    return tuple(_native.tcp_groups(d.rank, d.world, d.host, d.port, 2, d.timeout_s))


def resolve_ranks(cfg, device: str, dist: ProcessRank | None = None) -> int:
    """How many ranks the config key ``gpus`` asks for on the model's device (or, ranks in
    processes, the group's size), or a ConfigError naming the key."""
    gpus = cfg.gpus
    if dist is not None:
        if gpus > 1:
            raise ConfigError(f"gpus: {gpus} with one rank per process: several local ranks per process (node) "
                              "are not built yet", where="gpus",
                              hint="set gpus: 1; the distributed group has one rank per node")
        if device != "cpu" and dist.world > 1:
            raise ConfigError("ranks in several processes on GPUs need NCCL across nodes, not built yet",
                              where="distributed", hint="set device: cpu (the TCP backend moves host memory)")
        return dist.world
    if device == "cpu":
        if gpus > 1 and cfg.device != "cpu":  # "auto" found no GPU
            raise ConfigError(f"gpus: {gpus}, but this machine has no CUDA device", where="gpus",
                              hint="set device: cpu to run the ranks as CPU threads (the CI path), or gpus: 1")
        return max(gpus, 1)
    n = len(_native.cuda_devices())
    gpus = gpus or n
    if gpus > n:
        raise ConfigError(f"gpus: {gpus}, but this machine has {n} CUDA device(s)", where="gpus",
                          hint=f"set gpus to at most {n} (0 uses every GPU); `surogate doctor` lists them")
    if gpus > 1:
        raise ConfigError(f"gpus: {gpus}: data parallel on GPUs needs the NCCL collective backend, not built yet",
                          where="gpus", hint="set gpus: 1, or device: cpu to run the ranks as CPU threads")
    return gpus


def in_step_order(per_rank: list[list]) -> list:
    """Every rank's per-micro-batch values (``per_rank[r][m]``) in the order a one-rank run with
    R times the accumulation steps meets those micro-batches: m * R + r."""
    if len(per_rank) == 1:
        return list(per_rank[0])
    assert len({len(p) for p in per_rank}) == 1, [len(p) for p in per_rank]
    return [p[m] for m in range(len(per_rank[0])) for p in per_rank]


def by_rank(values: list, world: int) -> list[list]:
    """`in_step_order`'s inverse: rank r's per-micro-batch values."""
    return [values[r::world] for r in range(world)]


def shard_owners(sizes: dict[str, int], world: int) -> dict[str, int]:
    """ZeRO's split of the parameters among the ranks, whole tensors: largest first, each to the
    rank with the fewest elements so far (ties: the lower rank). A function of the names and
    sizes only, so every rank computes the same split."""
    load = [0] * world
    owners = {}
    for n in sorted(sizes, key=lambda n: (-sizes[n], n)):
        r = min(range(world), key=lambda k: (load[k], k))
        owners[n] = r
        load[r] += sizes[n]
    return owners


def buckets(names: list[str], nbytes: dict[str, int], cap: int = BUCKET_BYTES) -> list[list[str]]:
    """Consecutive names grouped into buckets of at most ``cap`` bytes (a bigger tensor alone)."""
    out: list[list[str]] = []
    size = cap
    for n in names:
        if size + nbytes[n] > cap and (not out or out[-1]):
            out.append([])
            size = 0
        out[-1].append(n)
        size += nbytes[n]
    return [b for b in out if b]


class RankThreads:
    """One thread per rank. ``run(fn)`` calls fn(rank) on every rank at once (a collective needs
    all of them inside it) and returns the results in rank order. A rank that raises aborts the
    group, so that ranks waiting for it in a collective fail instead of waiting forever; the
    error raised is the first one, not the aborts it caused."""

    def __init__(self, comms, also=()):
        self.comms = comms
        self.also = also  # (per rank, aborted with it: its gradient reducer)
        self.pool = ThreadPoolExecutor(max_workers=len(comms), thread_name_prefix="surogate-rank")

    def run(self, fn) -> list:
        first: list[BaseException] = []
        lock = threading.Lock()

        def rank(r):
            try:
                return fn(r)
            except BaseException as e:
                with lock:
                    if not first:
                        first.append(e)
                why = f"rank {r} failed: {type(e).__name__}: {e}"
                self.comms[r].abort(why)
                for a in self.also[r:r + 1]:
                    a.abort(why)
                raise

        futures = [self.pool.submit(rank, r) for r in range(len(self.comms))]
        try:
            for f in futures:
                f.exception()  # waits for it
        except BaseException:  # (KeyboardInterrupt in the main thread) stop the ranks at their next collective
            self.comms[0].abort("interrupted")
            for a in self.also[:1]:
                a.abort("interrupted")
            for f in futures:
                f.exception()
            raise
        if first:
            raise first[0]
        return [f.result() for f in futures]

    def close(self) -> None:
        self.pool.shutdown(wait=True)


def gather_objects(comm, obj) -> list:
    """Every rank's picklable ``obj``, in rank order, on every rank (two all-gathers: the sizes,
    then the padded bytes)."""
    data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
    sizes = np.zeros(comm.world_size, np.int64)
    comm.all_gather(np.array([data.size], np.int64), sizes)
    m = int(sizes.max())
    mine, out = np.zeros(m, np.uint8), np.zeros(m * comm.world_size, np.uint8)
    mine[:data.size] = data
    comm.all_gather(mine, out)
    return [pickle.loads(out[k * m:k * m + int(sizes[k])].tobytes()) for k in range(comm.world_size)]


class DataParallel:
    """The ranks of one data-parallel run held by this process: threads (rank 0 the trainer
    itself, the others its replicas, `Trainer._replica`), or, with ``trainer.dist``, the
    trainer's one rank of a group of processes."""

    def __init__(self, trainer):
        self.world, self.zero = trainer.world, trainer.cfg.zero_level if trainer.world > 1 else 0
        d = self.dist = trainer.dist
        reducer_groups = None
        if d is None:
            self.comms = _native.thread_group(self.world)
            self.ranks = [trainer] + [trainer._replica(r) for r in range(1, self.world)]
        else:  # (ours now: closed with the others)
            self.comms, reducer_groups, trainer.group, trainer.reducer_group = [trainer.group], [trainer.reducer_group], \
                None, None
            self.ranks = [trainer]
        self._full: tuple | None = None  # (masters, optimizer state, ZeRO-3's weights) gathered at the end (`freeze`)
        self.owners = trainer.owners  # name -> rank (ZeRO), None for plain DP
        self.zero3 = trainer.zero3  # the layers' split (ZeRO-3), None otherwise
        # Each rank reduces its gradients during the backward on a thread of its own (the
        # Program's grad_reduce ops), through a group of their own (threads: a second thread
        # group; processes: the second TCP channel).
        self.reducers = []
        if trainer.grad_groups is not None:
            self.reducers = [_native.GradReducer(c) for c in reducer_groups or _native.thread_group(self.world)]
            for t, red in zip(self.ranks, self.reducers):
                for grp in t.grad_groups:  # (the pass's owners are the optimizer's split)
                    assert grp.owners is None if self.zero < 2 else \
                        grp.owners == tuple(self.owners[n] for n in grp.names), grp
                t.exe.program.set_grad_reducer(red)
                t.reducer = red
        self.threads = RankThreads(self.comms, self.reducers)
        for t, comm in zip(self.ranks, self.comms):
            if t.shard is not None:
                t.shard.connect(comm)
        exe = trainer.exe
        # As backward produces the gradients: the last layers' first.
        order = [p.name for p in reversed(exe.graph.params()) if "grad." + p.name in exe.lowered.by_value]
        self.grad_buckets = buckets(order, {n: exe.buf("grad." + n).nbytes for n in order})
        whole = [n for n in order if self.zero3 is None or not self.zero3.sharded(n)]  # (ZeRO-3: the layers' gathered per use)
        self.weight_buckets = buckets(whole, {n: trainer.trainable[n].nbytes for n in whole})
        self.threads.run(self._same_start)

    def _same_start(self, r: int) -> None:  # (r: the index of one of this process's ranks, here and below)
        """Every rank from rank 0's weights (they are built equal; this makes it so by construction;
        ZeRO-3: the weights outside the layers, each layer piece being kept by one rank only)."""
        t = self.ranks[r]
        names = [n for n in sorted(t.trainable) if self.zero3 is None or not self.zero3.sharded(n)]
        self.comms[r].broadcast([t.exe.tensor(n) for n in names], root=0)

    # ---- one step ---------------------------------------------------------------------------
    def each(self, fn, grads: bool = False) -> list:
        """``fn(rank's trainer)`` on every rank at once, with ``grads`` then that rank's
        gradients reduced (the step's forward and backward phases); every rank's result, in rank
        order (ranks in processes: all-gathered, so the results must pickle)."""

        def rank(r):
            out = fn(self.ranks[r])
            if grads and not self.reducers:
                self._reduce_gradients(r)
            elif grads:  # (reduced during its last backward; a rank that ran none reduces them now)
                done = self.reducers[r].take_steps()
                assert done <= 1, f"rank {r} reduced its gradients {done} times in one step"
                if done == 0:
                    self._reduce_groups(r)
            if grads and self.ranks[r].fp8_state:
                self._merge_fp8_histories(r)
            return out

        out = self.threads.run(rank)
        if self.dist is not None:
            out = gather_objects(self.comms[0], out[0])
        return out

    def _reduce_groups(self, r: int) -> None:
        """The reductions the Program's grad_reduce ops make, in their order and through their
        group (the other ranks' may be making them in their backward right now)."""
        red, exe = self.reducers[r], self.ranks[r].exe
        assert not any(g.every for g in self.ranks[r].grad_groups), "staged gradients are reduced every backward"
        red.arm()
        for grp in self.ranks[r].grad_groups:
            bufs = [exe.tensor(n) for n in grp.buffers]
            red.start(bufs, grp.owners)
        red.wait()
        assert red.take_steps() == 1

    def _all_gather(self, r: int, mine: np.ndarray) -> np.ndarray:
        """Rank r's f32 vector ``mine`` and every other rank's, on the host, [world, len(mine)]."""
        exe = self.ranks[r].exe
        every = exe.place(np.zeros((self.world, mine.size), np.float32))
        self.comms[r].all_gather(exe.place(mine), every)
        return np.asarray(every if exe.device == "cpu" else every.to("cpu").numpy()).reshape(self.world, -1)

    def _merge_fp8_histories(self, r: int) -> None:
        """Delayed FP8 scaling: every rank's amax histories made their elementwise max (NaN
        skipped unless every rank's is NaN). The ranks ran the same micro-batches, so slot k holds
        each rank's k-th last run and the max is what one rank running all their rows would hold
        (compile/fp8.py): the next step quantizes with the same scales on every rank."""
        t = self.ranks[r]
        names = sorted(t.fp8_state)
        merged = np.fmax.reduce(self._all_gather(r, np.concatenate([t.exe.pull(n) for n in names])), axis=0)
        at = 0
        for n in names:
            a = t.fp8_state[n]
            a[...] = merged[at:at + a.size]
            at += a.size
            t.exe.push(n)

    def _reduce_gradients(self, r: int) -> None:
        comm, exe = self.comms[r], self.ranks[r].exe
        for b in self.grad_buckets:  # what the Program reads (on the CPU: the host arrays themselves)
            bufs = [exe.tensor("grad." + n) for n in b]
            if self.zero >= 2:
                comm.reduce_to_owners(bufs, [self.owners[n] for n in b], "sum")
            else:
                comm.all_reduce(bufs, "sum")

    def apply(self, lr: float) -> float:
        """The optimizer step on every rank (ZeRO: each its shard, then the weights gathered);
        returns the gradient norm before clipping."""

        def rank(r):
            t, comm = self.ranks[r], self.comms[r]
            if self.zero >= 2:  # the global norm from each rank's norm over its own reduced gradients
                parts = self._all_gather(r, np.array([t.opt.partial_norm()], np.float32))
                t.opt.set_norm(float(np.sqrt(np.sum(parts.astype(np.float64) ** 2))))
            norm = t.opt.apply(lr)
            # into what the Program reads (ZeRO-3: the weights outside the layers); host copies are pulled for checkpoints
            if self.owners is not None:
                for b in self.weight_buckets:
                    comm.gather_from_owners([t.exe.tensor(n) for n in b], [self.owners[n] for n in b])
            return norm

        norms = self.threads.run(rank)
        assert len(set(norms)) == 1, norms  # every rank clipped with the same norm
        return norms[0]

    def merge_moe_tallies(self) -> None:
        """The replicas' expert loads and router losses into rank 0's tallies (rank order)."""
        t0 = self.ranks[0]
        others = self.ranks[1:]
        if self.dist is not None and (t0._moe_load is not None or t0._router_values):  # (the same on every rank)
            tallies = gather_objects(self.comms[0], (t0._moe_load, t0._router_values))
            t0._moe_load, t0._router_values = tallies[0]
            others = [_Tally(*x) for x in tallies[1:]]
        for t in others:
            if t._moe_load is not None:
                t0._moe_load = t._moe_load if t0._moe_load is None else t0._moe_load + t._moe_load
            for o, values in t._router_values.items():
                t0._router_values.setdefault(o, []).extend(values)
            t._moe_load, t._router_values = None, {}

    # ---- the full state ---------------------------------------------------------------------
    def masters(self) -> dict[str, np.ndarray]:
        """Every rank's f32 master weights (ZeRO: each rank holds its own parameters'; across
        processes a collective: every rank calls it)."""
        if self._full is not None:
            return self._full[0]
        return self._every(lambda t: t.opt.master)

    def optimizer_state(self) -> dict[str, np.ndarray]:
        """The optimizer state of all ranks under the one-rank names (a checkpoint's; across
        processes under ZeRO a collective)."""
        if self._full is not None:
            return self._full[1]
        return self._every(lambda t: t.opt.state())

    def trained_state(self) -> dict[str, np.ndarray]:
        """ZeRO-3: the trained weights under the one-rank names (f32 masters where kept), each
        from the rank that keeps it: a layer's piece from its keeper, a stepped weight from its
        owner, the others (frozen, whole) from rank 0 (across processes a collective)."""
        if self._full is not None:
            return self._full[2]
        z = self.zero3

        def keeper(n: str) -> int:
            return z.owner.get(n, self.owners.get(n, 0))

        return self._every(lambda t: {n: t.opt.master.get(n, a) for n, a in t.trainable.items() if keeper(n) == t.rank})

    def _every(self, part) -> dict[str, np.ndarray]:
        out = {}
        if self.dist is not None and self.owners is not None:  # each process holds its shard
            for d in gather_objects(self.comms[0], part(self.ranks[0])):
                out.update(d)
            return out
        for t in self.ranks:
            out.update(part(t))
        return out

    def freeze(self) -> None:
        """After the last step, on every rank: the full state gathered once, so that rank 0 may
        read it any number of times while the others are gone."""
        self._full = (self.masters(), self.optimizer_state(), self.trained_state() if self.zero3 is not None else None)

    def load(self, trainable: dict[str, np.ndarray], opt_state: dict[str, np.ndarray]) -> None:
        """A checkpoint's weights into every rank, and each rank's share of its optimizer state."""
        for t in self.ranks[1:]:
            for n, a in t.trainable.items():
                a[...] = trainable[n].astype(a.dtype)
                t.exe.push(n)
            t.opt.load_state(opt_state)

    def finish(self) -> None:
        """The run is over on every rank (a barrier: nothing of a peer's is in flight), then the
        group is closed."""
        if self.dist is not None:
            self.comms[0].barrier()
        self.close()

    def abort(self, why: str) -> None:
        """This process failed: the other ranks' pending and next collectives fail with ``why``
        instead of waiting for it."""
        for c in (*self.comms, *self.reducers):
            c.abort(why)

    def close(self) -> None:
        self.threads.close()
        self.threads.comms = self.comms = []  # (TCP: the sockets close with the last reference)
        self.threads.also = []  # (a reducer's thread ends with its Program, the last reference)


@dataclass
class _Tally:
    """Another process's MoE tallies, as `merge_moe_tallies` reads a rank's."""

    _moe_load: np.ndarray | None
    _router_values: dict
