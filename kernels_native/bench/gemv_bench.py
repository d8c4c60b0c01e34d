"""The CUDA matmul at decode sizes: y[M, N] = x[M, K] @ W[N, K]^T (trans_b), bf16, M = 1..16.

For each M and each linear layer of Qwen3-0.6B (and its LM head, and Qwen3-8B's down projection,
whose K = 12288 is past gemv's resident-x bound of 4096) it prints the time per call and
the TB/s of weight bytes that time reads, for the gemv fast path (cuda/gemv.cu) and for cuBLASLt,
measured in a child process started with SUROGATE_NO_GEMV=1 (the switch is read once per
process), and the ratio cuBLASLt / gemv (> 1: gemv is faster). The `layer` row sums one decoder
layer's six projections (31.5 MB of weights).

Each time comes from a CUDA graph of --calls matmuls replayed --reps times, synchronised at the
end, so launch overhead is amortised as it is in the serving engine's captured decode step (the
gap a graph leaves between two kernels, under a microsecond, is counted in both columns). The
calls cycle through enough copies of the weight (>= --rotate MiB in all) that each one is read
from HBM, not from the 50 MB L2. Reported: the best of --trials such timings.

    python3 kernels_native/bench/gemv_bench.py [--ms 1,4,8,16] [--calls 64] [--reps 20]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
from bench_common import BF16, child_json, device_name, graph_seconds, require_cuda, timing_args, weight_copies

from surogate import _native

# name: (N, K) of W, Qwen3-0.6B (hidden 1024, 16 q heads and 8 kv heads of 128, intermediate 3072)
SHAPES = {
    "q": (2048, 1024),
    "k": (1024, 1024),
    "v": (1024, 1024),
    "o": (1024, 2048),
    "gate_up": (6144, 1024),
    "down": (1024, 3072),
    "lm_head": (151936, 1024),
    "down_8b": (4096, 12288),  # Qwen3-8B (hidden 4096, intermediate 12288): gemv's streamed-x regime
}
LAYER = ("q", "k", "v", "o", "gate_up", "down")


def time_matmul(M: int, weights: list, args) -> float:
    """Seconds per matmul call, from graph replays of calls cycling through `weights`."""
    N, K = weights[0].shape
    p = _native.Program("cuda")
    x = p.external("x", [M, K], "bfloat16")
    y = p.external("y", [M, N], "bfloat16")
    ws = [p.external(f"w{i}", [N, K], "bfloat16") for i in range(len(weights))]
    for i in range(max(args.calls, len(ws))):
        p.op("matmul", [x, ws[i % len(ws)]], [y], {"trans_b": 1})
    rng = np.random.default_rng(M)
    p.bind(x, _native.tensor(rng.standard_normal((M, K), dtype=np.float32).astype(BF16)).to("cuda"))
    p.bind(y, _native.zeros([M, N], "bfloat16", "cuda"))
    for w, t in zip(ws, weights, strict=True):
        p.bind(w, t)
    return graph_seconds(p, y, p.num_instrs, args)


def measure(args) -> dict[str, float]:
    """{'M name': seconds per call} for every shape and M."""
    times = {}
    for name, (N, K) in SHAPES.items():
        weights = weight_copies(N, K, args.rotate)
        for M in args.ms:
            times[f"{M} {name}"] = time_matmul(M, weights, args)
        del weights
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", default="1,4,8,16", help="rows of x")
    timing_args(ap, calls=64, unit="matmuls", rotate=True, child="the cuBLASLt side")
    args = ap.parse_args()
    args.ms = [int(m) for m in args.ms.split(",")]
    require_cuda("gemv_bench")
    if args.child:
        print(json.dumps(measure(args)))
        return
    if os.environ.get("SUROGATE_NO_GEMV"):
        sys.exit("gemv_bench: unset SUROGATE_NO_GEMV; the bench sets it for its cuBLASLt child itself")

    ours = measure(args)
    peer = child_json(__file__, sys.argv[1:], dict(os.environ, SUROGATE_NO_GEMV="1"))

    print(f"matmul x[M, K] @ W[N, K]^T, bf16, on {device_name()}: gemv vs cuBLASLt (SUROGATE_NO_GEMV=1); "
          f"graphs of {args.calls} calls, best of {args.trials}")
    head = f"{'M':>3} {'W':8} {'N x K':>13} {'MB':>6} {'gemv us':>8} {'TB/s':>5} {'cuBLASLt us':>11} {'TB/s':>5} {'ratio':>6}"
    print(head)
    print("-" * len(head))

    def row(M, name, dims, w_bytes, t, tp):
        print(f"{M:>3} {name:8} {dims:>13} {w_bytes / 1e6:6.1f} {t * 1e6:8.2f} {w_bytes / t / 1e12:5.2f} "
              f"{tp * 1e6:11.2f} {w_bytes / tp / 1e12:5.2f} {tp / t:5.2f}x")

    for M in args.ms:
        for name, (N, K) in SHAPES.items():
            row(M, name, f"{N} x {K}", N * K * BF16.itemsize, ours[f"{M} {name}"], peer[f"{M} {name}"])
        layer_bytes = sum(SHAPES[n][0] * SHAPES[n][1] * BF16.itemsize for n in LAYER)
        row(M, "layer", "6 matmuls", layer_bytes, sum(ours[f"{M} {n}"] for n in LAYER),
            sum(peer[f"{M} {n}"] for n in LAYER))


if __name__ == "__main__":
    main()
