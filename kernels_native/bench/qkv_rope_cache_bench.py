"""qkv_rope_cache against the three ops it replaces in a serving step (qk_norm_rope_fwd or rope_fwd
on q and on k, then kv_cache_write), bf16, per layer of a decode / prefill step.

Each Program holds --layers copies of the step (a model's layers), run as a CUDA graph on a GPU
(--graphs off: one launch per op), so the time per layer is what the serving engine pays, launch
gaps included. Shapes: Qwen3-0.6B (Hq 16, Hkv 8, D 128, q/k norm, theta 1e6) and Llama-3.2-1B
(Hq 32, Hkv 8, D 64, llama3 rope). Printed: microseconds per layer (median of --reps runs) of
the three ops and of the fused op, and their ratio.

    PYTHONPATH=. python3 kernels_native/bench/qkv_rope_cache_bench.py [--device cuda] [--layers 28] [--reps 50]
"""

from __future__ import annotations

import argparse
import time

import ml_dtypes
import numpy as np

from surogate import _native

MODELS = {
    "qwen3-0.6b": (16, 8, 128, True, {"theta": 1000000.0}),
    "llama3.2-1b": (32, 8, 64, False, {"theta": 500000.0, "rope_type": "llama3", "factor": 32.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position": 8192}),
}
BLOCK = 16


def build(device: str, fused: bool, n: int, model: str, layers: int) -> tuple[_native.Program, dict]:
    """A Program of `layers` steps over shared inputs and caches; returns it and the bound tensors."""
    hq, hkv, d, norm, rope = MODELS[model]
    rng = np.random.default_rng(0)
    bf16 = np.dtype(ml_dtypes.bfloat16)
    num_blocks = (n + BLOCK - 1) // BLOCK + 1
    arrays = {
        "q": rng.standard_normal((n, hq, d), dtype=np.float32).astype(bf16),
        "k": rng.standard_normal((n, hkv, d), dtype=np.float32).astype(bf16),
        "v": rng.standard_normal((n, hkv, d), dtype=np.float32).astype(bf16),
        "pos": (np.arange(n) + 1000).astype(np.int32),
        "slots": rng.permutation(num_blocks * BLOCK)[:n].astype(np.int32),
        "k_cache": np.zeros((num_blocks, BLOCK, hkv, d), bf16),
        "v_cache": np.zeros((num_blocks, BLOCK, hkv, d), bf16),
        "q_out": np.zeros((n, hq, d), bf16),
        "q_norm": np.ones(d, bf16),
        "k_norm": np.ones(d, bf16),
    }
    p = _native.Program(device)
    ids = {name: p.external(name, list(a.shape), str(a.dtype)) for name, a in arrays.items()}
    attrs = {"eps": 1e-6, **rope}
    if not fused:
        k_rope = p.buffer("k_rope", [n, hkv, d], "bfloat16")
        rstd = {"q": p.buffer("q_rstd", [n, hq], "float32"), "k": p.buffer("k_rstd", [n, hkv], "float32")}
    for _ in range(layers):
        if fused:
            norms = [ids["q_norm"], ids["k_norm"]] if norm else []
            p.op("qkv_rope_cache", [ids["q"], ids["k"], ids["v"], ids["pos"], ids["slots"], *norms],
                 [ids["q_out"], ids["k_cache"], ids["v_cache"]], attrs)
            continue
        for x, y in (("q", ids["q_out"]), ("k", k_rope)):
            if norm:
                p.op("qk_norm_rope_fwd", [ids[x], ids[f"{x}_norm"], ids["pos"]], [y, rstd[x]], attrs)
            else:
                p.op("rope_fwd", [ids[x], ids["pos"]], [y], rope)
        p.op("kv_cache_write", [k_rope, ids["v"], ids["slots"]], [ids["k_cache"], ids["v_cache"]])
    tensors = {name: _native.tensor(a).to(device) for name, a in arrays.items()}
    for name, t in tensors.items():
        p.bind(ids[name], t)
    return p, tensors


def time_program(p: _native.Program, tensors: dict, reps: int) -> float:
    """Median seconds of one run (a device-to-host copy of pos waits for the device)."""
    sync = tensors["pos"]
    for _ in range(3):  # eager, capture, first replay
        p.run()
    sync.to("cpu")
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        p.run()
        sync.to("cpu")
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--graphs", choices=("on", "off"), default="on")
    args = ap.parse_args()
    print(f"qkv_rope_cache vs rope x2 + kv_cache_write, bf16, {args.device}, {args.layers} layers a run, "
          f"CUDA graphs {args.graphs}")
    print(f"{'model':>12} {'N':>5} {'3 ops us/layer':>14} {'fused us/layer':>14} {'3 ops/fused':>11}")
    for model in MODELS:
        for n in (1, 8, 64, 512, 2048):
            us = []
            for fused in (False, True):
                p, tensors = build(args.device, fused, n, model, args.layers)
                p.set_graphs(args.graphs == "on")
                us.append(time_program(p, tensors, args.reps) / args.layers * 1e6)
            print(f"{model:>12} {n:>5} {us[0]:>14.2f} {us[1]:>14.2f} {us[0] / us[1]:>10.2f}x")


if __name__ == "__main__":
    main()
