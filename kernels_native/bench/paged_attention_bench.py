"""Decode benchmark of paged_attention with Qwen3-0.6B heads (Hq=16, Hkv=8, D=128, block_size=16, bf16)
or others (--heads: Gemma 4's global layers are 8,1,512 in gemma-4-e2b and 32,4,512 in gemma-4-31b).

One decode step: S sequences of context C, one query row each, reading S*C*Hkv*D K and V values
from a paged cache with shuffled blocks. Printed per (S, C): the time per call, the GB/s of its
K + V reads, the peer measured in the same run and the ratio, and the largest difference from
the CPU op on the same inputs.

  GPU (default when one is present): each case is a CUDA graph of back-to-back calls, replayed
  --reps times (best of), so the time per call includes the gap a decode step's graph pays
  between kernels. Peer: a device copy of as many bytes (the `copy` op, timed the same way), as
  (read + write) GB/s: what this GPU streams, so op / copy is the fraction of it the op reaches.
  CPU (--device cpu): the op per call (best of --reps); peer: numpy's dense f32 attention on K / V
  already contiguous per sequence, and the ratio numpy / op.

    PYTHONPATH=$PWD python3 kernels_native/bench/paged_attention_bench.py [--device cuda|cpu]
        [--batches 1,8,32,128] [--contexts 384,4096] [--heads 16,8,128] [--reps 10]
"""

from __future__ import annotations

import argparse
import time

import ml_dtypes
import numpy as np

from surogate import _native

HQ, HKV, D, BS = 16, 8, 128, 16
BF16 = np.dtype(ml_dtypes.bfloat16)


def random_bf16(rng, shape) -> np.ndarray:
    """Values of magnitude [2^-7, 1) with random signs, drawn as bit patterns (a 2 GB cache in
    seconds; normal samples cast from f32 take minutes)."""
    bits = rng.integers(0x3C00, 0x3F80, size=shape, dtype=np.uint16)
    bits |= rng.integers(0, 2, size=shape, dtype=np.uint16) << 15
    return bits.view(BF16)


def make_case(S: int, C: int, rng) -> dict:
    nblk = (C + BS - 1) // BS
    num_blocks = S * nblk
    return {
        "S": S, "C": C, "nblk": nblk,
        "inputs": [random_bf16(rng, (S, HQ, D)), random_bf16(rng, (num_blocks, BS, HKV, D)),
                   random_bf16(rng, (num_blocks, BS, HKV, D)),
                   rng.permutation(num_blocks).astype(np.int32).reshape(S, nblk),
                   np.arange(S + 1, dtype=np.int32), np.full(S, C, np.int32)],
    }


def kv_bytes(c: dict) -> int:
    return 2 * c["S"] * c["C"] * HKV * D * BF16.itemsize


def cpu_op(c: dict) -> tuple[np.ndarray, np.ndarray]:
    S = c["S"]
    outs = [np.empty((S, HQ, D), BF16), np.empty((S, HQ), np.float32)]
    _native.call_op("paged_attention", c["inputs"], outs, {})
    return outs[0], outs[1]


# ---- GPU: CUDA graphs of many calls -------------------------------------------------------------

def graph_seconds(op: str, inputs: list, outputs: list, reps: int) -> tuple[float, bool]:
    """Seconds per call of `op` on device tensors, as a graph of back-to-back calls (best of reps
    replays), and whether the graph was captured (else the calls ran eagerly)."""

    def build(calls: int):
        p = _native.Program("cuda")
        ids = [p.external(f"t{i}", list(t.shape), t.dtype) for i, t in enumerate(inputs + outputs)]
        for _ in range(calls):
            p.op(op, ids[:len(inputs)], ids[len(inputs):], {})
        for i, t in zip(ids, inputs + outputs, strict=True):
            p.bind(i, t)
        p.set_graphs(True)
        p.run()  # eager: warm-up
        p.run()  # captured and launched
        outputs[0].to("cpu")
        return p

    def best(p, calls: int, n: int) -> float:
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            p.run()
            outputs[0].to("cpu")  # a device-to-host copy waits for the graph (both on the legacy stream)
            ts.append(time.perf_counter() - t0)
        return min(ts) / calls

    est = best(build(10), 10, 3)
    calls = int(min(200, max(10, 5e-3 / est)))  # ~5 ms per replay: the final sync is noise
    p = build(calls)
    return best(p, calls, reps), p.graphs_active


def run_cuda(shapes: list[tuple[int, int]], rng, reps: int) -> None:
    print(f"paged_attention decode on {_native.cuda_devices()[0]['name']}: Hq={HQ} Hkv={HKV} D={D} block_size={BS} "
          "bf16, CUDA graphs; peer: device copy of the K+V bytes (read + write GB/s)")
    print(f"{'S':>4} {'ctx':>6} {'us/call':>9} {'GB/s':>8} {'copy GB/s':>10} {'op/copy':>8} {'graph':>6} "
          f"{'max err':>8}")
    for S, C in shapes:  # one case at a time: S=128 at 4k holds 2 GB of cache
        c = make_case(S, C, rng)
        dev = [_native.tensor(x).to("cuda") for x in c["inputs"]]
        outs = [_native.zeros([c["S"], HQ, D], "bfloat16", "cuda"), _native.zeros([c["S"], HQ], "float32", "cuda")]
        t_op, graphed = graph_seconds("paged_attention", dev, outs, reps)
        got = outs[0].to("cpu").numpy().astype(np.float32)
        want = cpu_op(c)[0].astype(np.float32)
        err = float(np.abs(got - want).max())
        n = kv_bytes(c) // BF16.itemsize
        src = _native.zeros([n], "bfloat16", "cuda")
        t_copy, _ = graph_seconds("copy", [src], [_native.zeros([n], "bfloat16", "cuda")], reps)
        gbs, copy_gbs = kv_bytes(c) / t_op / 1e9, 2 * kv_bytes(c) / t_copy / 1e9
        print(f"{c['S']:>4} {c['C']:>6} {t_op * 1e6:>9.2f} {gbs:>8.0f} {copy_gbs:>10.0f} {gbs / copy_gbs:>8.2f} "
              f"{'yes' if graphed else 'NO':>6} {err:>8.1e}")
        del c, dev, src


# ---- CPU: the op against numpy ------------------------------------------------------------------

def best_seconds(fn, reps: int) -> float:
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts)


def numpy_dense(c: dict):
    """Dense f32 attention on K / V contiguous per (sequence, kv head): numpy's best case."""
    q, kc, vc, tables = c["inputs"][:4]
    S, C, nblk = c["S"], c["C"], c["nblk"]
    kd = kc[tables].reshape(S, nblk * BS, HKV, D)[:, :C].transpose(0, 2, 1, 3).astype(np.float32)
    vd = vc[tables].reshape(S, nblk * BS, HKV, D)[:, :C].transpose(0, 2, 1, 3).astype(np.float32)
    qd = q.astype(np.float32).reshape(S, HKV, HQ // HKV, D) / np.sqrt(D)

    def dense():
        sc = np.matmul(qd, kd.transpose(0, 1, 3, 2))  # [S, Hkv, G, C]
        p = np.exp(sc - sc.max(-1, keepdims=True))
        return np.matmul(p / p.sum(-1, keepdims=True), vd).reshape(S, HQ, D)

    return dense


def run_cpu(shapes: list[tuple[int, int]], rng, reps: int) -> None:
    cases = [make_case(S, C, rng) for S, C in shapes]
    # All op timings first: numpy's BLAS threads spin for a while after each call and would take
    # the cores from the op.
    t_ops = [best_seconds(lambda c=c: cpu_op(c), reps) for c in cases]
    print(f"paged_attention decode on the CPU ({_native.num_threads()} threads): Hq={HQ} Hkv={HKV} D={D} "
          f"block_size={BS} bf16; peer: numpy dense f32")
    print(f"{'S':>4} {'ctx':>6} {'us/call':>9} {'GB/s':>8} {'numpy us':>10} {'np/op':>8} {'max err':>8}")
    for c, t_op in zip(cases, t_ops, strict=True):
        dense = numpy_dense(c)
        t_np = best_seconds(dense, reps)
        err = float(np.abs(cpu_op(c)[0].astype(np.float32) - dense()).max())
        print(f"{c['S']:>4} {c['C']:>6} {t_op * 1e6:>9.1f} {kv_bytes(c) / t_op / 1e9:>8.1f} {t_np * 1e6:>10.1f} "
              f"{t_np / t_op:>7.1f}x {err:>8.1e}")


def main() -> None:
    global HQ, HKV, D  # --heads: the cases and the printouts read them
    has_gpu = bool(_native.build_info()["cuda"]) and len(_native.cuda_devices()) > 0
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if has_gpu else "cpu")
    ap.add_argument("--batches", default="1,8,32,128", help="sequences S (one query row each)")
    ap.add_argument("--contexts", default="384,4096", help="context lengths C")
    ap.add_argument("--heads", default=f"{HQ},{HKV},{D}", help="Hq,Hkv,D")
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    HQ, HKV, D = (int(x) for x in args.heads.split(","))
    rng = np.random.default_rng(0)
    shapes = [(int(s), int(c)) for s in args.batches.split(",") for c in args.contexts.split(",")]
    (run_cuda if args.device == "cuda" else run_cpu)(shapes, rng, args.reps)


if __name__ == "__main__":
    main()
