"""The six matmuls of one LoRA-adapted projection in a training step, as the lowering emits them
(surogate/compile/lower.py: linear / linear_bwd), bf16, at a Llama-3.1-8B layer's shapes:

    forward   t  = x @ A^T          [N, K] x [r, K]^T -> [N, r]     (skinny output, reads x)
              y += s t @ B^T        [N, r] x [O, r]^T -> [N, O]     (rank-r update of y)
    backward  dB += s dy^T @ t      [O, N] x [N, r]   -> [O, r]     (reduction over the tokens)
              dt = s dy @ B         [N, O] x [O, r]   -> [N, r]     (skinny output, reads dy)
              dA += dt^T @ x        [r, N] x [N, K]   -> [r, K]     (reduction over the tokens)
              dx += dt @ A          [N, r] x [r, K]   -> [N, K]     (rank-r update of dx)

For each projection it prints the time per call, the bytes the call must move at least (its
operands read once, its output written, read too where it accumulates) and the TB/s that makes,
against the H200's 4.8 TB/s: a skinny GEMM that spreads over too few CTAs shows as a low rate.

Each time comes from a CUDA graph of --calls calls replayed --reps times (best of --trials); the
operands are distinct per projection but reused across calls, so the larger ones come from HBM
(x and dy are 16 to 112 MiB) while the adapters sit in L2.

    python3 kernels_native/bench/lora_gemm_bench.py [--tokens 2048] [--rank 16] [--calls 32]
"""

from __future__ import annotations

import argparse

import numpy as np
from bench_common import BF16, device_name, graph_seconds, require_cuda, timing_args

from surogate import _native

# Llama-3.1-8B: hidden 4096, 8 KV heads of 128, intermediate 14336 (gate and up: slices of one weight)
PROJECTIONS = {"q": (4096, 4096), "k": (1024, 4096), "v": (1024, 4096), "o": (4096, 4096),
               "gate": (14336, 4096), "up": (14336, 4096), "down": (4096, 14336)}  # name: (O, K)
STEPS = ("x@A^T", "t@B^T", "dy^T@t", "dy@B", "dt^T@x", "dt@A")


def dev(rng, shape, scale=1.0):
    return _native.tensor((rng.standard_normal(shape) * scale).astype(BF16)).to("cuda")


def step_program(step: str, N: int, O: int, K: int, r: int, calls: int):
    """A cuda Program of `calls` copies of one of the six matmuls; returns it, an output, and the
    bytes one call moves at least."""
    rng = np.random.default_rng(0)
    p = _native.Program("cuda")
    shapes = {"x@A^T": ([N, K], [r, K], [N, r], dict(trans_b=1), False),
              "t@B^T": ([N, r], [O, r], [N, O], dict(trans_b=1, beta=1.0), True),
              "dy^T@t": ([N, O], [N, r], [O, r], dict(trans_a=1, beta=1.0), True),
              "dy@B": ([N, O], [O, r], [N, r], {}, False),
              "dt^T@x": ([N, r], [N, K], [r, K], dict(trans_a=1, beta=1.0), True),
              "dt@A": ([N, r], [r, K], [N, K], dict(beta=1.0), True)}
    a_shape, b_shape, c_shape, attrs, accumulates = shapes[step]
    a, b, c = (p.external(n, s, "bfloat16") for n, s in (("a", a_shape), ("b", b_shape), ("c", c_shape)))
    for _ in range(calls):
        p.op("matmul", [a, b], [c], attrs)
    p.bind(a, dev(rng, a_shape))
    p.bind(b, dev(rng, b_shape, 0.01))
    p.bind(c, _native.zeros(c_shape, "bfloat16", "cuda"))
    size = lambda s: int(np.prod(s)) * 2  # noqa: E731
    moved = size(a_shape) + size(b_shape) + size(c_shape) * (2 if accumulates else 1)
    return p, c, moved


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--rank", type=int, default=16)
    timing_args(ap, calls=32)
    args = ap.parse_args()
    require_cuda("lora_gemm_bench")
    N, r = args.tokens, args.rank
    print(f"LoRA r{r} matmuls of a Llama-3.1-8B layer at {N} tokens, bf16, on {device_name()}; "
          f"graphs of {args.calls} calls, best of {args.trials}")
    head = f"{'projection':10} {'O x K':>12} " + " ".join(f"{s:>15}" for s in STEPS)
    print(head + "\n" + "-" * len(head))
    totals = dict.fromkeys(STEPS, 0.0)
    for name, (O, K) in PROJECTIONS.items():
        cells = []
        for step in STEPS:
            p, c, moved = step_program(step, N, O, K, r, args.calls)
            t = graph_seconds(p, c, args.calls, args)
            totals[step] += t
            cells.append(f"{t * 1e6:6.1f}us {moved / t / 1e12:4.2f}TB/s")
        print(f"{name:10} {f'{O} x {K}':>12} " + " ".join(f"{x:>15}" for x in cells))
    print(f"{'layer':10} {'':>12} " + " ".join(f"{totals[s] * 1e6:13.1f}us" for s in STEPS))
    print(f"one layer's LoRA matmuls: {sum(totals.values()) * 1e6:.1f} us (x 32 layers: "
          f"{sum(totals.values()) * 32e3:.2f} ms a step)")


if __name__ == "__main__":
    main()
