"""`surogate bench serve --http`: serving throughput and latency as a user's clients see them,
beside the engine's own figure for the same load.

A real `surogate serve` process serves the model (or ``--url`` names any OpenAI-compatible
server: llama.cpp's, vLLM's), N streaming clients POST /v1/completions (ignore_eos, max_tokens,
greedy) all at once or at a Poisson ``--request-rate``, and the table follows `vllm bench serve`:
request and token throughput, TTFT, TPOT, ITL and end-to-end latency (mean, p50, p90, p99),
failed requests. The engine column is `surogate bench serve`'s offline run (serve.bench_ours) of
the same model, N requests of the same lengths all at once, under the same --max-num-seqs,
measured in this process after the server has stopped; the ratio is HTTP / engine.

A named shape is served as a random-weight HF folder written for the run, with a word-level
tokenizer of the shape's vocabulary ("t2 t3 ..."; every token decodes to text of its own, as
most of a real BPE's do). Prompts are random token ids, or the first user turn of each
conversation of a chat set (``--dataset`` a JSON / JSONL file: ShareGPT ``conversations`` or
OpenAI ``messages``), sent as text.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np

from surogate.bench.sse_client import StreamResult, post_request, stream
from surogate.errors import InvalidArgumentError, NotFoundError, SurogateError

PERCENTILES = (50, 90, 99)


@dataclass
class HttpResult:
    results: list[StreamResult]
    duration: float  # seconds from the first request sent to the last stream's end
    client_cpu: float  # the client's CPU seconds over the run
    request_rate: float

    @property
    def ok(self) -> list[StreamResult]:
        return [r for r in self.results if r.ok]

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens if r.output_tokens is not None else r.chunks for r in self.ok)

    @property
    def input_tokens(self) -> int:
        return sum(r.prompt_tokens or 0 for r in self.ok)


# ---- the load -----------------------------------------------------------------------------

async def _load(url: str, bodies: list[bytes], rate: float, api_key: str | None, seed: int) -> HttpResult:
    rng = np.random.default_rng(seed)
    reqs = [post_request(f"{url}/v1/completions", b, api_key) for b in bodies]
    cpu0, t0 = time.process_time(), time.perf_counter()
    tasks = []
    for i, (host, port, req) in enumerate(reqs):
        if i and math.isfinite(rate):
            await asyncio.sleep(rng.exponential(1.0 / rate))
        tasks.append(asyncio.ensure_future(stream(host, port, req)))
    results = await asyncio.gather(*tasks)
    return HttpResult(list(results), time.perf_counter() - t0, time.process_time() - cpu0, rate)


def run_load(url: str, model: str, prompts: list, output_len: int, rate: float = math.inf,
             api_key: str | None = None, seed: int = 0) -> HttpResult:
    """Stream one completion per prompt (token ids or text) from ``url``, greedy, ``output_len``
    tokens each (ignore_eos), sent all at once or at a Poisson ``rate`` a second."""
    enc = msgspec.json.Encoder().encode
    bodies = [enc({"model": model, "prompt": p, "max_tokens": output_len, "temperature": 0.0, "ignore_eos": True,
                   "stream": True, "stream_options": {"include_usage": True}}) for p in prompts]
    return asyncio.run(_load(url.rstrip("/"), bodies, rate, api_key, seed))


def served_model_name(url: str, api_key: str | None = None) -> str:
    """The first model GET /v1/models lists."""
    req = urllib.request.Request(f"{url.rstrip('/')}/v1/models",
                                 headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            data = json.loads(r.read())["data"]
    except (OSError, ValueError, KeyError) as e:
        raise NotFoundError(f"{url}/v1/models did not list the served models ({e})",
                            hint="check --url: an OpenAI-compatible server's base URL, e.g. http://127.0.0.1:8080")
    if not data:
        raise NotFoundError(f"{url} serves no model", hint="start the server with a model")
    return data[0]["id"]


# ---- the prompts --------------------------------------------------------------------------

def random_prompts(vocab_size: int, n: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab_size, length).tolist() for _ in range(n)]


def chat_prompts(path: str | Path, n: int) -> list[str]:
    """The first user turn of the first ``n`` conversations of a chat set (repeated when it has fewer)."""
    path = Path(path)
    if not path.is_file():
        raise NotFoundError(f"--dataset {path}: no such file", hint="'random', or a JSON / JSONL chat set")
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        rows = json.loads(text)
    else:  # JSONL
        rows = [json.loads(x) for x in text.splitlines() if x.strip()]
    prompts = []
    for row in rows:
        turns = row.get("conversations") or row.get("messages") or []
        first = next((t for t in turns if (t.get("from") or t.get("role")) in ("human", "user")), None)
        content = first and (first.get("value") or first.get("content"))
        if isinstance(content, str) and content.strip():
            prompts.append(content)
    if not prompts:
        raise InvalidArgumentError(f"--dataset {path}: no conversation with a user turn",
                                   hint='rows like {"conversations": [{"from": "human", "value": ...}]} or '
                                        '{"messages": [{"role": "user", "content": ...}]}')
    return [prompts[i % len(prompts)] for i in range(n)]


# ---- the server ---------------------------------------------------------------------------

def write_random_model(model, folder: Path) -> Path:
    """An HF folder of a random-weight Model (random_model): config.json, the weights, and a
    word-level tokenizer over its vocabulary (id 0 the end of text, 1 unknown, then t2, t3, ...)."""
    import tokenizers
    from tokenizers import AddedToken, models, pre_tokenizers

    from surogate.bench.shapes import hf_config
    from surogate.train.export import save_hf_folder

    s = model.spec
    arch = "Qwen3ForCausalLM" if s.family == "qwen3" else "LlamaForCausalLM"
    cfg = {**hf_config(s), "architectures": [arch], "model_type": s.family, "bos_token_id": 0, "eos_token_id": 0}
    save_hf_folder(folder, model.to_hf(model.params), cfg, dtype=model.dtype)
    vocab = {"<|endoftext|>": 0, "<unk>": 1, **{f"t{i}": i for i in range(2, s.vocab_size)}}
    tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "unk_token": "<unk>",
        "added_tokens_decoder": {"0": {"content": "<|endoftext|>", "special": True}}}) + "\n")
    return folder


SERVE_CODE = "import sys; sys.argv = ['surogate'] + sys.argv[1:]; from surogate.cli.main import main; main()"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def surogate_serve(*args: str, timeout: float = 900, show_log: Callable[[str], None] | None = None
                   ) -> Iterator[str]:
    """`surogate serve ARGS --port P` on a free loopback port; yields its URL once /health
    answers 200, stops it after. ``show_log`` gets its output once it has stopped."""
    port = free_port()
    # -P: the installed surogate (or PYTHONPATH's), never a source folder that happens to be the cwd
    argv = [sys.executable, "-P", "-c", SERVE_CODE, "serve", *args, "--port", str(port)]
    with tempfile.TemporaryFile(mode="w+") as log:  # a file: a full pipe would block the server
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True, env=dict(os.environ))
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.time() + timeout
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    raise SurogateError(f"surogate serve {' '.join(args)} exited with {proc.returncode}",
                                        hint="its output ends:\n" + log.read()[-3000:])
                try:
                    with urllib.request.urlopen(f"{url}/health", timeout=1) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if time.time() > deadline:
                    raise SurogateError(f"surogate serve {' '.join(args)} did not answer /health in {timeout:.0f} s")
                time.sleep(0.3)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if show_log is not None:
                log.seek(0)
                show_log(log.read())


# ---- the report ---------------------------------------------------------------------------

def _stats(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"Mean": None, **{f"P{q}": None for q in PERCENTILES}}
    return {"Mean": float(np.mean(xs)), **{f"P{q}": float(np.percentile(xs, q)) for q in PERCENTILES}}


def report(h: HttpResult, engine=None, title: str = "") -> str:
    """`vllm bench serve`'s layout, with the engine's figure where it has one and the ratio when
    the requests came all at once (as the engine's did)."""
    ok = h.ok
    out_rate = h.output_tokens / h.duration
    req_rate = len(ok) / h.duration
    ttft = [r.ttft for r in ok if r.ttft is not None]
    tpot = [(r.latency - r.ttft) / (n - 1) for r in ok
            if r.ttft is not None and (n := r.output_tokens or r.chunks) > 1]
    itl = [x for r in ok for x in r.itl]
    e2el = [r.latency for r in ok]
    eng: dict[str, float | None] = {}
    if engine is not None:
        eng = {"Output token throughput (tok/s):": engine.output_tokens_per_s,
               "P50 TTFT (ms):": engine.ttft_p50 and engine.ttft_p50 * 1e3,
               "P99 TTFT (ms):": engine.ttft_p99 and engine.ttft_p99 * 1e3,
               "P50 ITL (ms):": engine.itl_p50 and engine.itl_p50 * 1e3,
               "P99 ITL (ms):": engine.itl_p99 and engine.itl_p99 * 1e3}
        if ok:
            per_request = h.output_tokens / len(ok)
            eng["Request throughput (req/s):"] = engine.output_tokens_per_s / per_request

    def row(label: str, value, fmt: str = ".2f") -> str:
        text = "-" if value is None else format(value, fmt)
        line = f"{label:<40}{text:>12}"
        if label in eng and eng[label] is not None:
            line += f"{format(eng[label], fmt):>12}"
            if value is not None and eng[label] and not math.isfinite(h.request_rate):  # else the rate sets it
                line += f"{value / eng[label]:>10.2f}"
        return line

    lines = [title] if title else []
    lines += [f"{' Serving Benchmark Result ':=^50}", f"{'':<40}{'HTTP':>12}" + (
        f"{'engine':>12}{'ratio':>10}" if engine is not None else ""),
              row("Successful requests:", len(ok), "d"), row("Failed requests:", len(h.results) - len(ok), "d"),
              row("Request rate configured (RPS):", h.request_rate, ".2f"),
              row("Benchmark duration (s):", h.duration), row("Total input tokens:", h.input_tokens, "d"),
              row("Total generated tokens:", h.output_tokens, "d"), row("Request throughput (req/s):", req_rate),
              row("Output token throughput (tok/s):", out_rate),
              row("Total Token throughput (tok/s):", (h.input_tokens + h.output_tokens) / h.duration)]
    for name, head, xs in (("TTFT", "Time to First Token", ttft), ("TPOT", "Time per Output Token (excl. 1st token)",
                           tpot), ("ITL", "Inter-token Latency", itl), ("E2EL", "End-to-end Latency", e2el)):
        lines.append(f"{head:-^50}")
        for k, v in _stats(xs).items():
            lines.append(row(f"{k} {name} (ms):", v if v is None else v * 1e3))
    lines.append("=" * 50)
    errors = sorted({r.error for r in h.results if not r.ok})
    if errors:
        lines.append(f"errors ({len(errors)} kinds): " + "; ".join(e[:200] for e in errors[:3]))
    lines.append(f"client: {h.client_cpu:.2f} CPU s over {h.duration:.2f} s ({100 * h.client_cpu / h.duration:.0f}% "
                 "of one core; near 100% the client, not the server, sets the pace)")
    return "\n".join(lines)


# ---- the command --------------------------------------------------------------------------

def run(model_name: str, *, n: int, prompt_len: int, output_len: int, dtype: str, device: str,
        url: str | None = None, request_rate: float = math.inf, dataset: str = "random", max_num_seqs: int = 128,
        engine: bool = True, warmup: bool = True, api_key: str | None = None, seed: int = 0) -> HttpResult:
    """The HTTP load against ``url`` or a `surogate serve` started for ``model_name`` (a named
    shape, or an HF folder served as it is), then the engine's offline figure. Prints the table."""
    from surogate.bench.serve import bench_ours, warmup_prompts
    from surogate.bench.train import random_model
    from surogate.model import resolve_device

    device = resolve_device(device)
    with tempfile.TemporaryDirectory(prefix="surogate-bench-http-") as tmp:
        folder = Path(model_name)
        if folder.is_dir():
            import surogate

            model = surogate.load_model(folder, device=device, dtype=dtype)
        else:
            model = random_model(model_name, dtype, seed=seed, device=device)
            if url is None:
                folder = write_random_model(model, Path(tmp) / model_name)
        # The engine figure's warm-up (serve.warmup_prompts: the load, then one request alone, of
        # the same shapes and no prefix shared with the timed prompts): warmed once, a single
        # stream captured its prefill's CUDA graph in the timed request, the engine's did not.
        if dataset == "random":
            prompts: list = random_prompts(model.spec.vocab_size, n, prompt_len, seed)
            warm = warmup_prompts(model.spec.vocab_size, n, prompt_len, seed)
        else:
            prompts = chat_prompts(dataset, n)
            warm = [[f"(warm-up {i}) {p}" for i, p in enumerate(prompts)], [f"(warm-up alone) {prompts[0]}"]]

        def load(base: str) -> HttpResult:
            name = served_model_name(base, api_key)
            if warmup:
                for loads in warm:
                    run_load(base, name, loads, output_len, api_key=api_key, seed=seed)
            return run_load(base, name, prompts, output_len, request_rate, api_key, seed)

        if url is not None:
            h = load(url)
        else:
            with surogate_serve(str(folder), "--device", device, "--dtype", dtype, "--max-num-seqs",
                                str(max_num_seqs), "--max-queued-requests", str(max(1024, n))) as base:
                h = load(base)
        eng = None
        if engine:
            mean_prompt = round(h.input_tokens / len(h.ok)) if h.ok and h.input_tokens else prompt_len
            eng = bench_ours(model, n, mean_prompt, output_len, max_num_seqs=max_num_seqs)
    rate = "all at once" if not math.isfinite(request_rate) else f"Poisson {request_rate:g}/s"
    where = url or f"surogate serve (--max-num-seqs {max_num_seqs})"
    prompts_are = "random token prompts" if dataset == "random" else f"prompts from {dataset}"
    title = (f"\n{model_name}, {dtype}, {device}: {n} streams x ({prompt_len if dataset == 'random' else 'chat'} "
             f"prompt + {output_len} output tokens), {prompts_are}, {rate}, against {where}")
    if eng is not None:
        same = "model" if url is None or Path(model_name).is_dir() else "shape (random weights)"
        title += f"\nengine: the same {same} in this process, all requests at once, the same --max-num-seqs"
    print(report(h, eng, title))
    return h
