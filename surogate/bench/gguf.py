"""`surogate bench gguf FILE`: one GGUF file served two ways, in the same run: dequantized at
load (bf16 on a GPU, f32 on the CPU) and kept as GGML blocks (`quantized=True`, the projections
multiplied by gguf_matmul as they are). Same engine, same requests (greedy, ignore_eos):
output tokens/s for N concurrent requests, single-stream decode tokens/s and the weights' size.
"""

from __future__ import annotations

import gc

from surogate.bench.serve import ServeResult, bench_ours


def run(path: str, *, n: int, prompt_len: int, output_len: int, device: str, dtype: str) -> list[tuple]:
    from surogate.model import load_model, resolve_device

    device = resolve_device(device)
    if dtype == "auto":
        dtype = "float32" if device == "cpu" else "bfloat16"
    rows: list[tuple[ServeResult, int]] = []
    for label, quantized in ((f"dequantized ({dtype})", False), ("GGUF blocks", True)):
        model = load_model(path, device=device, dtype=dtype, quantized=quantized)
        size = sum(a.nbytes for a in model.params.values())
        r = bench_ours(model, n, prompt_len, output_len)
        r.name = label
        rows.append((r, size))
        del model
        gc.collect()
        if device != "cpu":
            from surogate import _native

            _native.empty_cache(device)
    print(table(path, device, n, prompt_len, output_len, rows))
    return rows


def table(path, device, n, prompt_len, output_len, rows) -> str:
    lines = [f"\n{path}, {device}, {n} requests x ({prompt_len} prompt + {output_len} output tokens)",
             f"{'':22} {'weights':>10} {'out tok/s':>10} {'1-stream tok/s':>15} {'ratio':>7}"]
    base = rows[0][0]
    for r, size in rows:
        lines.append(f"{r.name:22} {size / 2**20:7.0f} MiB {r.output_tokens_per_s:10,.1f} "
                     f"{r.single_stream_tokens_per_s:15,.1f} "
                     f"{r.single_stream_tokens_per_s / base.single_stream_tokens_per_s:6.2f}x")
    return "\n".join(lines)
