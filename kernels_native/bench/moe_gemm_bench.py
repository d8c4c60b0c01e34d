"""The CUDA grouped GEMM over experts (moe_grouped_matmul, cuda/moe_gemm.cu) at decode sizes:
y[M, N] = x[M, K] @ W[e][N, K]^T per expert, bf16, M = tokens * top_k rows routed at random.

For each MoE projection below and each token count it prints the time per call and the TB/s of the
weight bytes that call must read (the experts its routing touches, each once), for the default
path (the small-rows kernel wherever M <= 8 E) and for the tiled tensor-core kernel, measured in a
child process started with SUROGATE_MOE_ROWS=0 (read once per process), and the ratio tiled /
default (> 1: the default is faster). --force runs the default side with SUROGATE_MOE_ROWS=1 (the
small-rows kernel at every M: where its bound of 8 rows an expert should sit).

Each time comes from a CUDA graph of --calls calls replayed --reps times; the calls cycle through
--routings random routings, so consecutive calls touch different experts and read them from HBM
(Qwen3-30B-A3B's 128 experts of gate_up are 805 MB), not from the 50 MB L2. Best of --trials.

    python3 kernels_native/bench/moe_gemm_bench.py [--tokens 1,8,64] [--calls 48] [--reps 20]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
from bench_common import BF16, child_json, device_name, graph_seconds, require_cuda, timing_args

from surogate import _native

# name: (E experts, top_k, N out, K in) of W[E, N, K]
SHAPES = {
    "qwen3_30b_gate_up": (128, 8, 1536, 2048),  # Qwen3-30B-A3B: hidden 2048, expert intermediate 768
    "qwen3_30b_down": (128, 8, 2048, 768),
    "gpt_oss_20b_gate_up": (32, 4, 5760, 2880),  # GPT-OSS-20B: hidden 2880, intermediate 2880
    "gpt_oss_20b_down": (32, 4, 2880, 2880),
}


def routing_offsets(n: int, E: int, k: int, rng) -> np.ndarray:
    """offsets[E + 1] of n tokens choosing k distinct experts each, uniformly."""
    counts = np.zeros(E, np.int64)
    for _ in range(n):
        counts[rng.choice(E, size=k, replace=False)] += 1
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)


_WEIGHTS: dict[str, object] = {}


def expert_weights(name: str):
    """W[E, N, K] of a shape on the device, made once per process: a 2^22-sample normal pool
    repeated (drawing and converting ~400M-1.6G values afresh per case took minutes on the host)."""
    if name not in _WEIGHTS:
        E, _, N, K = SHAPES[name]
        pool = (np.random.default_rng(0).standard_normal(1 << 22, dtype=np.float32) / np.sqrt(K)).astype(BF16)
        _WEIGHTS[name] = _native.tensor(np.resize(pool, (E, N, K))).to("cuda")
    return _WEIGHTS[name]


def time_case(name: str, n: int, args) -> tuple[float, float]:
    """(seconds per call, weight bytes a call reads on average)."""
    E, k, N, K = SHAPES[name]
    M = n * k
    rng = np.random.default_rng(n)
    offs = [routing_offsets(n, E, k, rng) for _ in range(args.routings)]
    touched = np.mean([np.count_nonzero(np.diff(o)) for o in offs])
    p = _native.Program("cuda")
    x = p.external("x", [M, K], "bfloat16")
    y = p.external("y", [M, N], "bfloat16")
    w = p.external("w", [E, N, K], "bfloat16")
    os_ = [p.external(f"off{i}", [E + 1], "int32") for i in range(len(offs))]
    for i in range(args.calls):
        p.op("moe_grouped_matmul", [x, w, os_[i % len(os_)]], [y], {"trans_b": 1})
    p.bind(x, _native.tensor(rng.standard_normal((M, K), dtype=np.float32).astype(BF16)).to("cuda"))
    p.bind(y, _native.zeros([M, N], "bfloat16", "cuda"))
    p.bind(w, expert_weights(name))
    for v, o in zip(os_, offs, strict=True):
        p.bind(v, _native.tensor(o).to("cuda"))
    return graph_seconds(p, y, args.calls, args), touched * N * K * BF16.itemsize


def measure(args) -> dict[str, list[float]]:
    return {f"{n} {name}": list(time_case(name, n, args)) for name in SHAPES for n in args.tokens}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="1,8,64,128", help="tokens per step (M = tokens * top_k)")
    timing_args(ap, calls=48, child="one side")
    ap.add_argument("--routings", type=int, default=16, help="random routings the calls cycle through")
    ap.add_argument("--force", action="store_true", help="the default side with SUROGATE_MOE_ROWS=1")
    args = ap.parse_args()
    args.tokens = [int(t) for t in args.tokens.split(",")]
    require_cuda("moe_gemm_bench")
    if args.child:
        print(json.dumps(measure(args)))
        return

    def child(mode: str | None) -> dict:
        env = dict(os.environ)
        env.pop("SUROGATE_MOE_ROWS", None)
        if mode is not None:
            env["SUROGATE_MOE_ROWS"] = mode
        return child_json(__file__, [a for a in sys.argv[1:] if a != "--force"], env)

    ours, tiled = child("1" if args.force else None), child("0")
    print(f"moe_grouped_matmul bf16 trans_b on {device_name()}: {'small-rows (forced)' if args.force else 'default'} "
          f"vs tiled (SUROGATE_MOE_ROWS=0); graphs of {args.calls} calls, best of {args.trials}")
    head = f"{'tok':>4} {'W':20} {'MB read':>8} {'ours us':>8} {'TB/s':>5} {'tiled us':>9} {'TB/s':>5} {'ratio':>6}"
    print(head)
    print("-" * len(head))
    for n in args.tokens:
        for name in SHAPES:
            (t, b), (tp, _) = ours[f"{n} {name}"], tiled[f"{n} {name}"]
            print(f"{n:>4} {name:20} {b / 1e6:8.1f} {t * 1e6:8.2f} {b / t / 1e12:5.2f} {tp * 1e6:9.2f} "
                  f"{b / tp / 1e12:5.2f} {tp / t:5.2f}x")


if __name__ == "__main__":
    main()
