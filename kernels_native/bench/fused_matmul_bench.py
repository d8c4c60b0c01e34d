"""The serving fusions at decode sizes against their composition: add_rmsnorm_matmul vs
add_rmsnorm_fwd + matmul, and gated_matmul vs swiglu_fwd + matmul, bf16, M = 1..16.

For each M and each fused projection of a Qwen3-0.6B layer (the fused qkv and gate_up after their
norms, down_proj after the activation; and Qwen3-1.7B's down_proj, whose F = 6144 is past the
fused path's bound of 4096 and so runs the composition either way) it prints the time per fused
op and per pair of ops, both measured in this process, and the ratio pair / fused (> 1: the
fusion is faster). The `layer` row sums the three Qwen3-0.6B rows.

Each time comes from a CUDA graph of --calls units (one fused op, or the pair) replayed --reps
times, as the serving engine replays its decode step; the units cycle through enough copies of
the weight (>= --rotate MiB in all) that each one is read from HBM. Reported: the best of
--trials such timings.

    python3 kernels_native/bench/fused_matmul_bench.py [--ms 1,4,8,16] [--calls 64] [--reps 20]
"""

from __future__ import annotations

import argparse

import numpy as np
from bench_common import BF16, device_name, graph_seconds, require_cuda, timing_args, weight_copies

from surogate import _native

# name: (prologue, N, K) with K the matmul's inner dim (F for the activation)
CASES = {
    "qkv": ("norm", 4096, 1024),
    "gate_up": ("norm", 6144, 1024),
    "down": ("silu", 1024, 3072),
    "down_1.7b": ("silu", 2048, 6144),
}
LAYER = ("qkv", "gate_up", "down")


def dev(a: np.ndarray):
    return _native.tensor(a.astype(BF16)).to("cuda")


def program(kind: str, fused: bool, M: int, weights: list, calls: int):
    """A cuda Program of `calls` units over the weights; its inputs and outputs bound."""
    N, K = weights[0].shape
    rng = np.random.default_rng(M)
    p = _native.Program("cuda")
    y = p.external("y", [M, N], "bfloat16")
    ws = [p.external(f"w{i}", [N, K], "bfloat16") for i in range(len(weights))]
    bind = {y: _native.zeros([M, N], "bfloat16", "cuda")}
    if kind == "norm":
        x, r, h = (p.external(n, [M, K], "bfloat16") for n in ("x", "r", "h"))
        nw = p.external("nw", [K], "bfloat16")
        bind.update({x: dev(rng.standard_normal((M, K))), r: dev(rng.standard_normal((M, K))),
                     nw: dev(1 + 0.1 * rng.standard_normal(K)), h: _native.zeros([M, K], "bfloat16", "cuda")})
        if not fused:
            xn, rstd = p.external("xn", [M, K], "bfloat16"), p.external("rstd", [M], "float32")
            bind.update({xn: _native.zeros([M, K], "bfloat16", "cuda"), rstd: _native.zeros([M], "float32", "cuda")})
    else:
        gu = p.external("gu", [M, 2 * K], "bfloat16")
        bind[gu] = dev(rng.standard_normal((M, 2 * K)))
        if not fused:
            a = p.external("a", [M, K], "bfloat16")
            bind[a] = _native.zeros([M, K], "bfloat16", "cuda")
    for i in range(max(calls, len(ws))):
        w = ws[i % len(ws)]
        if kind == "norm" and fused:
            p.op("add_rmsnorm_matmul", [x, r, nw, w, -1], [y, h], {"eps": 1e-6})
        elif kind == "norm":
            p.op("add_rmsnorm_fwd", [x, r, nw], [xn, h, rstd], {"eps": 1e-6})
            p.op("matmul", [xn, w], [y], {"trans_b": 1})
        elif fused:
            p.op("gated_matmul", [gu, w], [y], {"act": kind})
        else:
            p.op("swiglu_fwd", [gu], [a])
            p.op("matmul", [a, w], [y], {"trans_b": 1})
    for b, t in bind.items():
        p.bind(b, t)
    for b, t in zip(ws, weights, strict=True):
        p.bind(b, t)
    return p, y


def time_units(kind: str, fused: bool, M: int, weights: list, args) -> float:
    """Seconds per unit (one fused op, or the pair), from graph replays."""
    p, y = program(kind, fused, M, weights, args.calls)
    return graph_seconds(p, y, max(args.calls, len(weights)), args)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", default="1,4,8,16", help="rows (tokens)")
    timing_args(ap, calls=64, unit="units", rotate=True)
    args = ap.parse_args()
    ms = [int(m) for m in args.ms.split(",")]
    require_cuda("fused_matmul_bench")
    times = {}
    for name, (kind, N, K) in CASES.items():
        weights = weight_copies(N, K, args.rotate)
        for M in ms:
            times[(M, name)] = (time_units(kind, True, M, weights, args), time_units(kind, False, M, weights, args))
        del weights

    print(f"fused vs composed (add_rmsnorm_fwd / swiglu_fwd, then matmul), bf16, on "
          f"{device_name()}; graphs of {args.calls} units, best of {args.trials}")
    head = f"{'M':>3} {'W':10} {'N x K':>12} {'fused us':>9} {'composed us':>12} {'ratio':>6}"
    print(head)
    print("-" * len(head))

    def row(M, name, dims, t, tc):
        print(f"{M:>3} {name:10} {dims:>12} {t * 1e6:9.2f} {tc * 1e6:12.2f} {tc / t:5.2f}x")

    for M in ms:
        for name, (kind, N, K) in CASES.items():
            row(M, name, f"{N} x {K}", *times[(M, name)])
        row(M, "layer", "3 fused", sum(times[(M, n)][0] for n in LAYER), sum(times[(M, n)][1] for n in LAYER))


if __name__ == "__main__":
    main()
