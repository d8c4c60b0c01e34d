"""Decode benchmark of the CPU paged_attention op (Qwen3-0.6B-like: Hq=16, Hkv=8, D=64, bf16).

For S sequences of context C, one decode step (one query row per sequence) reads S*C*Hkv*D
K and V values from a paged cache with shuffled blocks. Printed: the op's time (median and best
of --reps calls; on shared cores the best is the one that shows the kernel), the effective
bandwidth of its K/V reads (bf16 bytes / best time), and a numpy dense baseline: f32 K/V already
contiguous per sequence ([S, Hkv, C, D], batched matmul + softmax + matmul, the best case for
numpy, which has no bf16 math), with the ratio of the medians numpy / op.

    PYTHONPATH=. python3 kernels_native/bench/paged_attention_bench.py [--threads N] [--reps R]
"""

from __future__ import annotations

import argparse
import time

import ml_dtypes
import numpy as np

from surogate import _native

HQ, HKV, D, BS = 16, 8, 64, 16


def timeit(fn, reps: int) -> tuple[float, float]:
    """(median, best) seconds of reps calls after a warm-up call."""
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts)), float(np.min(ts))


def make_case(S: int, C: int, rng) -> dict:
    nblk = (C + BS - 1) // BS
    num_blocks = S * nblk
    bf16 = np.dtype(ml_dtypes.bfloat16)
    return {
        "S": S, "C": C, "nblk": nblk,
        "tables": rng.permutation(num_blocks).astype(np.int32).reshape(S, nblk),
        "k_cache": rng.standard_normal((num_blocks, BS, HKV, D), dtype=np.float32).astype(bf16),
        "v_cache": rng.standard_normal((num_blocks, BS, HKV, D), dtype=np.float32).astype(bf16),
        "q": rng.standard_normal((S, HQ, D), dtype=np.float32).astype(bf16),
        "out": np.empty((S, HQ, D), bf16),
        "lse": np.empty((S, HQ), np.float32),
    }


def time_op(c: dict, reps: int) -> tuple[float, float]:
    S, C = c["S"], c["C"]
    inputs = [c["q"], c["k_cache"], c["v_cache"], c["tables"], np.arange(S + 1, dtype=np.int32),
              np.full(S, C, np.int32)]
    return timeit(lambda: _native.call_op("paged_attention", inputs, [c["out"], c["lse"]], {}), reps)


def time_numpy(c: dict, reps: int) -> tuple[float, float]:
    """numpy dense baseline on contiguous f32 K/V per (sequence, kv head); also returns the
    largest difference of the op's output from it."""
    S, C, nblk = c["S"], c["C"], c["nblk"]
    kd = c["k_cache"][c["tables"]].reshape(S, nblk * BS, HKV, D)[:, :C].transpose(0, 2, 1, 3).astype(np.float32)
    vd = c["v_cache"][c["tables"]].reshape(S, nblk * BS, HKV, D)[:, :C].transpose(0, 2, 1, 3).astype(np.float32)
    qd = c["q"].astype(np.float32).reshape(S, HKV, HQ // HKV, D)
    scale = 1.0 / np.sqrt(D)

    def dense():
        sc = np.matmul(qd, kd.transpose(0, 1, 3, 2)) * scale  # [S, Hkv, g, C]
        m = sc.max(-1, keepdims=True)
        p = np.exp(sc - m)
        p /= p.sum(-1, keepdims=True)
        return np.matmul(p, vd)  # [S, Hkv, g, D]

    t_np, _ = timeit(dense, reps)
    err = float(np.abs(c["out"].astype(np.float32) - dense().reshape(S, HQ, D)).max())
    return t_np, err


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=0, help="pool size (0: default, every hardware thread)")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    if args.threads:
        _native.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    cases = [make_case(S, C, rng) for S in (1, 16, 64) for C in (512, 2048)]
    # All op timings first: numpy's BLAS threads spin for a while after each call and would
    # take the cores from the op.
    ops = [time_op(c, args.reps) for c in cases]
    print(f"paged_attention decode, Hq={HQ} Hkv={HKV} D={D} block_size={BS} bf16, "
          f"{_native.num_threads()} threads; numpy dense f32 baseline")
    print(f"{'S':>4} {'ctx':>6} {'op ms med':>10} {'op ms best':>10} {'GB/s best':>9} {'numpy ms med':>12} "
          f"{'np/op':>6} {'max err':>8}")
    for c, (t_op, t_best) in zip(cases, ops, strict=True):
        t_np, err = time_numpy(c, args.reps)
        gbs = 2 * c["S"] * c["C"] * HKV * D * 2 / t_best / 1e9  # K and V bytes (bf16) / best time
        print(f"{c['S']:>4} {c['C']:>6} {t_op * 1e3:>10.3f} {t_best * 1e3:>10.3f} {gbs:>9.2f} "
              f"{t_np * 1e3:>12.3f} {t_np / t_op:>5.1f}x {err:>8.1e}")


if __name__ == "__main__":
    main()
