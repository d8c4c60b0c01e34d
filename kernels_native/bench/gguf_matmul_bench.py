"""gguf_matmul on this machine: y[N, M] = x[N, K] @ dequant(Wq)[M, K]^T with Wq in GGML blocks.

For each type and N it prints our time and the GB/s of weight bytes that time reads, and two
peers measured in the same run: decoding the whole weight to f32 (gguf_dequantize) then numpy's
sgemm, and numpy's sgemm on an f32 weight (an unquantized model). Ratios > 1: we are faster.
Each time is the best of repeated runs (the machine may be shared).

    PYTHONPATH=$PWD python3 kernels_native/bench/gguf_matmul_bench.py [--size 4096] [--ns 1,64]
        [--types Q4_K,Q8_0] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T

from surogate import _native

TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "F16",
         "BF16"]


def best_time(fn, min_time: float = 0.25, max_reps: int = 40) -> float:
    fn()  # warm up: allocator, page faults, OpenBLAS threads
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_reps and (time.perf_counter() - start < min_time or len(times) < 5):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def quantized_weight(t: T, w: np.ndarray, rng) -> np.ndarray:
    bs, ts = GGML_QUANT_SIZES[t]
    M, K = w.shape
    q = np.zeros((M, K // bs * ts), np.uint8)
    if t in (T.IQ4_NL, T.IQ4_XS):  # no quantizer for these: random codes, finite f16 scales
        q[:] = rng.integers(0, 256, q.shape, dtype=np.uint8)
        q.reshape(-1, ts)[:, 0:2] = np.array([1e-3], np.float16).view(np.uint8)
        return q
    _native.call_op("gguf_quantize", [w], [q], {"type": int(t)})
    return q


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=4096, help="M = K")
    ap.add_argument("--ns", default="1,64", help="token counts N")
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--threads", type=int, default=0, help="threads for us and for OpenBLAS (default: all)")
    args = ap.parse_args()
    if args.threads and os.environ.get("OPENBLAS_NUM_THREADS") != str(args.threads):
        # OpenBLAS reads its thread count at load: start again with it set.
        os.execve(sys.executable, [sys.executable, *sys.argv], dict(os.environ, OPENBLAS_NUM_THREADS=str(args.threads)))
    if args.threads:
        _native.set_num_threads(args.threads)

    M = K = args.size
    rng = np.random.default_rng(0)
    w = rng.standard_normal((M, K), dtype=np.float32) * 0.02
    print(f"gguf_matmul: M = K = {M}; {_native.num_threads()} threads (OPENBLAS_NUM_THREADS="
          f"{os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}); f32 weight {w.nbytes / 2**20:.0f} MiB")
    head = (f"{'type':7} {'N':>3} {'ours ms':>8} {'GB/s':>6} {'deq+sgemm ms':>13} {'f32 sgemm ms':>13} "
            f"{'vs deq+sgemm':>13} {'vs f32':>7}")
    print(head)
    print("-" * len(head))
    deq = np.empty((M, K), np.float32)
    for name in args.types.split(","):
        t = T[name]
        q = quantized_weight(t, w, rng)
        for n in (int(s) for s in args.ns.split(",")):
            x = rng.standard_normal((n, K), dtype=np.float32)
            y = np.empty((n, M), np.float32)
            ours = best_time(lambda: _native.call_op("gguf_matmul", [x, q], [y], {"type": int(t)}))

            def deq_then_sgemm():
                _native.call_op("gguf_dequantize", [q], [deq], {"type": int(t), "cols": K})
                np.matmul(x, deq.T, out=y)

            peer = best_time(deq_then_sgemm)
            f32 = best_time(lambda: np.matmul(x, w.T, out=y))
            print(f"{name:7} {n:3d} {ours * 1e3:8.3f} {q.nbytes / ours / 1e9:6.1f} {peer * 1e3:13.3f} "
                  f"{f32 * 1e3:13.3f} {peer / ours:12.1f}x {f32 / ours:6.1f}x", flush=True)


if __name__ == "__main__":
    main()
