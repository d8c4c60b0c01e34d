"""What the kernel benches here share: the timing options, the CUDA check, weight copies that
defeat the L2, the graph-replay timing and the child process that measures the other side of a
switch read once per process (SUROGATE_NO_GEMV, SUROGATE_MOE_ROWS).

Each bench runs as a script (`python3 kernels_native/bench/NAME.py`), so this module is found
beside it on sys.path.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import ml_dtypes
import numpy as np

from surogate import _native

BF16 = np.dtype(ml_dtypes.bfloat16)


def timing_args(ap: argparse.ArgumentParser, *, calls: int, unit: str = "calls", rotate: bool = False,
                child: str | None = None) -> None:
    """--calls / --reps / --trials (and --rotate, --child where the bench has them)."""
    ap.add_argument("--calls", type=int, default=calls, help=f"{unit} per graph")
    ap.add_argument("--reps", type=int, default=20, help="graph replays per timing")
    ap.add_argument("--trials", type=int, default=5, help="timings per case; the best is kept")
    if rotate:
        ap.add_argument("--rotate", type=int, default=256, help="MiB of weight copies each graph cycles through")
    if child is not None:
        ap.add_argument("--child", action="store_true", help=f"measure and print JSON ({child})")


def require_cuda(bench: str) -> None:
    if not _native.cuda_devices():
        sys.exit(f"{bench}: no CUDA device (or surogate was built without CUDA)")


def device_name() -> str:
    return _native.cuda_devices()[0]["name"]


def weight_copies(N: int, K: int, rotate_mib: int) -> list:
    """Device copies of one random [N, K] bf16 weight, at least rotate_mib MiB in all (two or
    more), so calls cycling through them read HBM, not the 50 MB L2."""
    w0 = np.random.default_rng(0).standard_normal((N, K), dtype=np.float32) / np.sqrt(K)
    w0 = _native.tensor(w0.astype(BF16)).to("cuda")
    copies = []
    for _ in range(max(2, -(-rotate_mib * 2**20 // (N * K * BF16.itemsize)))):
        t = _native.empty([N, K], "bfloat16", "cuda")
        t.copy_from(w0)
        copies.append(t)
    return copies


def graph_seconds(p, out, units: int, args) -> float:
    """Seconds per unit of a cuda Program of `units` units: captured into a CUDA graph and
    replayed --reps times per timing, the best of --trials. `out` is one of its outputs (a
    device-to-host copy of it waits for the GPU)."""
    p.set_graphs(True)
    p.run()  # eager: plans, caches, occupancy
    p.run()  # captured, then launched
    res = p.get(out)
    res.to("cpu")
    best = float("inf")
    for _ in range(args.trials):
        t0 = time.perf_counter()
        for _ in range(args.reps):
            p.run()
        res.to("cpu")
        best = min(best, (time.perf_counter() - t0) / (args.reps * units))
    assert p.graphs_active, "the ops did not capture into a CUDA graph"
    return best


def child_json(script: str, argv: list[str], env: dict[str, str]):
    """Run `script --child argv` with `env` and return the JSON its last line prints."""
    r = subprocess.run([sys.executable, script, "--child", *argv], check=True, capture_output=True, text=True,
                       env=env)
    return json.loads(r.stdout.strip().splitlines()[-1])
