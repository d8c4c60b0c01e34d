"""`surogate bench serve`: offline generation throughput and latency, ours and HF generate's.

N requests of `prompt_len` random tokens each ask for `output_len` tokens (ignore_eos, greedy),
all submitted at once through the generation API (surogate.serve.LLM, token ids in and out: no
detokenization, so the figure is the engine's), each read by its own consumer as a client would.
Reported: output tokens/s over the whole run (prefill included), time to first token and
inter-token latency percentiles, and single-stream decode speed (first token to last, as
llama.cpp's tg figure: the prompt is the time to first token). The peer is HF transformers
`generate` on the same shape and device: one batched call for all N prompts (equal lengths, so
no padding) and one single-stream call.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import numpy as np

from surogate.bench.train import random_model
from surogate.errors import InvalidArgumentError
from surogate.serve import LLM, EngineClient, EngineConfig, SamplingParams
from surogate.serve.model_runner import ProgramRunner


@dataclass
class ServeResult:
    name: str
    output_tokens_per_s: float
    single_stream_tokens_per_s: float
    ttft_p50: float | None = None
    ttft_p99: float | None = None
    itl_p50: float | None = None
    itl_p99: float | None = None
    note: str = ""  # where a single-stream step's time goes (ours)
    decode_tokens_per_s: float | None = None  # all requests decoding (after the last first token)


def _prompts(vocab: int, n: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab, length).tolist() for _ in range(n)]


@dataclass
class Timed:
    """One timed load: every request's time to first token and inter-token latencies (s), the
    (time, tokens) of every output, the output tokens, the run's start and length."""
    t0: float
    elapsed: float
    tokens: int
    ttft: list[float]
    itl: list[float]
    arrivals: list[tuple[float, int]]


def timed_generation(llm: LLM, prompts: list, params: SamplingParams) -> Timed:
    """All ``prompts`` submitted at once, each read by its own consumer as a client would
    (timestamps as the outputs arrive). A prompt may be an awaitable that gives it (a request
    whose images are encoded first, in a worker thread, as the gateway does): its time to first
    token counts from the run's start."""
    ttft: list[float] = []
    itl: list[float] = []
    arrivals: list[tuple[float, int]] = []
    total = 0

    async def consume(prompt, t0: float) -> None:
        nonlocal total
        if asyncio.iscoroutine(prompt):
            prompt = await prompt
        last = None
        async for out in llm.submit(prompt, params):
            now = time.perf_counter()
            k = len(out.new_token_ids)
            if k == 0:
                continue
            if last is None:
                ttft.append(now - t0)
            else:
                itl.append((now - last) / k)
            last = now
            total += k
            arrivals.append((now, k))

    async def all_requests(t0: float) -> None:
        await asyncio.gather(*(consume(p, t0) for p in prompts))

    t0 = time.perf_counter()
    asyncio.run(all_requests(t0))
    return Timed(t0, time.perf_counter() - t0, total, ttft, itl, arrivals)


def warmup_prompts(vocab: int, n: int, length: int, seed: int = 0) -> list[list[list[int]]]:
    """The warm-up of both sides of a benchmark (the engine's here, HTTP's in bench.http): the
    load's ``n`` prompts, then one alone, none shared with the timed prompts (the prefix cache
    would skip their prefill). On a GPU a bucket's Program runs eagerly the first time it is met,
    is captured into a CUDA graph the second and replays after: warmed by both, the timed run of
    one request replays its prefill's graph instead of capturing it (a capture is several ms of
    time to first token that a server pays once per bucket)."""
    return [_prompts(vocab, n, length, seed + 1), _prompts(vocab, 1, length, seed + 3)]


def bench_ours(model, n: int, prompt_len: int, output_len: int, block_size: int = 16,
               max_num_seqs: int | None = None, temperature: float = 0.0, offload=None,
               name: str = "surogate") -> ServeResult:
    """``max_num_seqs`` None: all ``n`` run at once (else the rest wait, as behind a server).
    ``temperature`` > 0: sampled requests (seeded; drawn on the device, as greedy ones are picked).
    ``offload``: the decoder layers whose weights stream from host memory (a WeightOffload)."""
    tokens = n * (prompt_len + output_len) + block_size * n
    num_blocks = -(-tokens // block_size)
    runner = ProgramRunner(model, num_blocks=num_blocks, block_size=block_size, offload=offload)
    cfg = EngineConfig(num_blocks=num_blocks, block_size=block_size, max_num_seqs=max_num_seqs or max(n, 1),
                       max_num_batched_tokens=max(2048, prompt_len), enable_prefix_caching=False, seed=0)
    params = SamplingParams(temperature=temperature, max_tokens=output_len, ignore_eos=True, detokenize=False,
                            seed=0 if temperature > 0 else None)
    with EngineClient(runner, cfg) as client:
        llm = LLM(client, None)  # no tokenizer: token ids only
        # Warm-up: compiles (and on a GPU captures) the Programs of the shapes this run will use,
        # as a server does once for its shapes.
        for prompts in warmup_prompts(model.spec.vocab_size, n, prompt_len):
            llm.generate(prompts, params)
        timed = timed_generation(llm, _prompts(model.spec.vocab_size, n, prompt_len), params)
        t0, elapsed, total, ttft, itl, arrivals = (timed.t0, timed.elapsed, timed.tokens, timed.ttft, timed.itl,
                                                   timed.arrivals)
        # Decode only (llama-batched-bench's S_TG): the tokens after every request's first, over
        # the time from the last first token to the end.
        all_started = t0 + max(ttft)
        end = max(t for t, _ in arrivals)
        decode_tokens = sum(k for t, k in arrivals if t > all_started)
        decode_rate = decode_tokens / (end - all_started) if end > all_started else 0.0
        # Single stream: decode speed from the first token to the last (as llama.cpp's tg; the
        # prompt's prefill is the time to first token).
        stamps: list[float] = []

        async def single_stream() -> None:
            async with llm.submit(_prompts(model.spec.vocab_size, 1, prompt_len, seed=2)[0], params) as gen:
                async for out in gen:
                    stamps.extend([time.perf_counter()] * len(out.new_token_ids))

        before = client.stats()
        asyncio.run(single_stream())
        after = client.stats()
        steps = max(after.num_steps - before.num_steps, 1)
        note = (f"single stream, per engine step: {1e3 * (after.model_seconds - before.model_seconds) / steps:.3f} ms "
                f"in the model runner, {1e3 * (after.step_seconds - before.step_seconds) / steps:.3f} ms in the step "
                f"({steps} steps)")
    pct = lambda xs, q: float(np.percentile(xs, q)) if xs else None  # noqa: E731
    decode = (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0
    return ServeResult(name, total / elapsed, decode, pct(ttft, 50), pct(ttft, 99), pct(itl, 50), pct(itl, 99),
                       note, decode_rate)


def bench_hf(model, n: int, prompt_len: int, output_len: int, device: str, temperature: float = 0.0) -> ServeResult:
    import torch

    from surogate.bench.train import hf_peer

    spec = model.spec
    dtype = torch.bfloat16 if model.dtype == "bfloat16" else torch.float32
    if device != "cpu":
        from surogate import _native

        model.release_device_memory()  # ours is done: its weights' device copies make room for the peer's
        _native.empty_cache(device)
    m = hf_peer(model, device, dtype).eval()  # built on the device, our weights

    def run(batch, new: int = output_len):
        ids = torch.tensor(batch, device=device)
        with torch.no_grad():
            sampling = dict(do_sample=True, temperature=temperature, top_k=0) if temperature else dict(do_sample=False)
            m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new, pad_token_id=0,
                       cache_implementation="static", **sampling)
        if device != "cpu":
            torch.cuda.synchronize()

    run(_prompts(spec.vocab_size, n, prompt_len, seed=1))  # warm-up (a static cache compiles per batch shape)
    run(_prompts(spec.vocab_size, 1, prompt_len, seed=3))
    t0 = time.perf_counter()
    run(_prompts(spec.vocab_size, n, prompt_len))
    batched = time.perf_counter() - t0
    one = _prompts(spec.vocab_size, 1, prompt_len, seed=2)
    run(one, 1)
    t1 = time.perf_counter()
    run(one, 1)  # the prompt and first token: taken out of the single-stream decode time below
    first = time.perf_counter() - t1
    t1 = time.perf_counter()
    run(one)
    single = time.perf_counter() - t1
    return ServeResult("HF generate (static cache)", n * output_len / batched, (output_len - 1) / (single - first))


def copy_bandwidth(device: str, nbytes: int = 1 << 30, repeats: int = 5) -> float:
    """Measured copy bandwidth of the device in bytes/s (bytes read plus bytes written): the
    ceiling a decode step that streams every weight once cannot beat."""
    from surogate import _native

    if device == "cpu":
        src = np.ones(nbytes // 2, np.uint8)
        dst = np.empty_like(src)
        np.copyto(dst, src)
        t0 = time.perf_counter()
        for _ in range(repeats):
            np.copyto(dst, src)
        return 2 * src.nbytes * repeats / (time.perf_counter() - t0)
    src = _native.zeros([nbytes // 2], "uint8", device)
    dst = _native.zeros([nbytes // 2], "uint8", device)
    probe = _native.zeros([1], "uint8", device)
    dst.copy_from(src)
    probe.to("cpu")  # a host read: waits for the queued copies
    t0 = time.perf_counter()
    for _ in range(repeats):
        dst.copy_from(src)
    probe.to("cpu")
    return 2 * (nbytes // 2) * repeats / (time.perf_counter() - t0)


def host_link_bandwidth(device: str, nbytes: int = 256 << 20, repeats: int = 5) -> float:
    """Measured host -> device copy bandwidth in bytes/s, from pinned host memory (what the
    streamed layers of --cpu-offload-gb cross every step: PCIe or NVLink-C2C on a GPU; on the CPU
    a memcpy between host buffers)."""
    from surogate import _native

    src = _native.host_empty([nbytes], "uint8", pinned=device != "cpu")
    src.numpy()[:] = 1
    if device == "cpu":
        dst = np.empty(nbytes, np.uint8)
        copy = lambda: np.copyto(dst, src.numpy())  # noqa: E731
    else:
        dst = _native.empty([nbytes], "uint8", device)
        copy = lambda: dst.copy_from(src)  # noqa: E731  (a synchronous cudaMemcpy from pinned memory)
    copy()
    t0 = time.perf_counter()
    for _ in range(repeats):
        copy()
    return nbytes * repeats / (time.perf_counter() - t0)


def active_weight_bytes(model) -> float:
    """The weight bytes one decode token reads: every tensor, but of a MoE layer's stacked expert
    tensors ([num_experts, ...]) only top_k experts' share (the router picks that many)."""
    moe = model.spec.moe
    total = 0.0
    for a in model.params.values():
        stacked = moe is not None and a.ndim == 3 and a.shape[0] == moe.num_experts
        total += a.nbytes * (moe.top_k / moe.num_experts if stacked else 1.0)
    return total


def roofline(model, device: str) -> tuple[float, float]:
    """(weight bytes read per token, the single-stream decode ceiling in tokens/s: bandwidth over
    those bytes; a MoE model's counts only the active experts)."""
    weights = active_weight_bytes(model)
    return weights, copy_bandwidth(device) / weights


def step_profile(model, batches: tuple[int, ...], context: int, block_size: int = 16, iters: int = 50) -> str:
    """Where a decode step's time goes: for each batch size, the step Program's device time (the
    Program alone, replayed back to back), the runner's whole step (inputs up, run, tokens back),
    and with PyTorch installed the kernels of one step as its profiler (CUPTI) sees them."""
    from surogate import _native

    n = max(batches)
    blocks_per_seq = -(-(context + 1) // block_size)
    runner = ProgramRunner(model, num_blocks=n * blocks_per_seq, block_size=block_size)
    lines = [f"\ndecode step, context {context}: device time of the Program, and the runner's whole step"]
    on_gpu = model.device != "cpu"
    probe = _native.zeros([1], "uint8", model.device) if on_gpu else None

    def sync():
        if probe is not None:
            probe.to("cpu")

    for b in batches:
        tables = np.arange(b * blocks_per_seq, dtype=np.int32).reshape(b, blocks_per_seq)
        slots = tables[:, context // block_size] * block_size + context % block_size
        step = _native.serve.StepInput.make(np.ones(b, np.int32), np.full(b, context, np.int32), slots,
                                            np.arange(b + 1), np.full(b, context + 1), tables.ravel(), np.arange(b),
                                            need_logits=np.zeros(b), block_size=block_size)
        for _ in range(3):  # compile, eager run, graph capture
            runner.run(step)
        exe = runner._compile(*runner.native.bucket_key(step))
        sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            exe.run()
        sync()
        dev = (time.perf_counter() - t0) / iters
        t0 = time.perf_counter()
        for _ in range(iters):
            runner.run(step, logits=False)
        whole = (time.perf_counter() - t0) / iters
        lines.append(f"  batch {b:4}: program {dev * 1e3:7.3f} ms, whole step {whole * 1e3:7.3f} ms, "
                     f"{exe.program.num_instrs} instructions, graphs {exe.program.num_graphs}")
        if on_gpu:
            try:
                import torch  # noqa: F401
                from torch.profiler import ProfilerActivity, profile
            except ImportError:
                continue
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    exe.run()
                sync()
            lines.append(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70))
    return "\n".join(lines)


def run(shape: str, *, n: int, prompt_len: int, output_len: int, dtype: str, vs: str | None,
        device: str, profile: bool = False, temperature: float = 0.0,
        cpu_offload_gb: float | None = None) -> list[ServeResult]:
    from surogate.model import resolve_device

    device = resolve_device(device)
    model = random_model(shape, dtype, device=device)
    if cpu_offload_gb:
        return run_offload(model, shape, cpu_offload_gb, n=n, prompt_len=prompt_len, output_len=output_len,
                           temperature=temperature)
    if profile:
        print(step_profile(model, tuple(sorted({1, 8, 32, n})), prompt_len + output_len // 2))
    results = [bench_ours(model, n, prompt_len, output_len, temperature=temperature)]
    if vs == "hf":
        results.append(bench_hf(model, n, prompt_len, output_len, device, temperature))
    how = f"sampled at temperature {temperature:g}" if temperature > 0 else "greedy"
    print(f"\n{shape}, {dtype}, {n} requests x ({prompt_len} prompt + {output_len} output tokens), {how}, {device}")
    print(f"{'':28} {'out tok/s':>10} {'1-stream tok/s':>15} {'TTFT p50/p99 (s)':>18} {'ITL p50/p99 (ms)':>18}")
    base = results[-1]
    for r in results:
        ttft = f"{r.ttft_p50:.3f}/{r.ttft_p99:.3f}" if r.ttft_p50 is not None else "-"
        itl = f"{r.itl_p50 * 1e3:.1f}/{r.itl_p99 * 1e3:.1f}" if r.itl_p50 is not None else "-"
        print(f"{r.name:28} {r.output_tokens_per_s:10,.1f} {r.single_stream_tokens_per_s:15,.1f} {ttft:>18} {itl:>18}")
    if len(results) > 1:
        print(f"{'ratio (ours / peer)':28} {results[0].output_tokens_per_s / base.output_tokens_per_s:9.2f}x "
              f"{results[0].single_stream_tokens_per_s / base.single_stream_tokens_per_s:14.2f}x")
    if results[0].decode_tokens_per_s:
        print(f"decode only, all {n} requests generating: {results[0].decode_tokens_per_s:,.1f} output tok/s")
    if results[0].note:
        print(results[0].note)
    weights, ceiling = roofline(model, device)
    print(f"single stream: {results[0].single_stream_tokens_per_s:,.1f} tok/s = "
          f"{100 * results[0].single_stream_tokens_per_s / ceiling:.1f}% of the memory-bandwidth roofline "
          f"({weights / 2**20:,.0f} MiB of weights per token at the measured copy bandwidth: {ceiling:,.0f} tok/s)")
    return results


# ---- weights in host memory ----------------------------------------------------------------

def run_offload(model, shape: str, cpu_offload_gb: float, *, n: int, prompt_len: int, output_len: int,
                temperature: float = 0.0) -> list[ServeResult]:
    """The same load with every weight resident and with ``cpu_offload_gb`` GiB of decoder layers
    streamed from host memory (surogate/serve/offload.py), beside the host link's ceiling: each
    step copies the streamed bytes once, so a step takes at least streamed bytes / link bandwidth
    and every running sequence gets one token from it (single stream: link GB/s / streamed GB
    tokens a second; n sequences decoding: n times that)."""
    from surogate.serve.offload import WeightOffload, size_str

    device = model.device
    resident = bench_ours(model, n, prompt_len, output_len, temperature=temperature, name="resident")
    model.release_device_memory()  # the streamed layers' device copies go; the resident ones come back
    plan = WeightOffload.plan(model, cpu_offload_gb=cpu_offload_gb)
    streamed = bench_ours(model, n, prompt_len, output_len, temperature=temperature, offload=plan,
                          name=f"--cpu-offload-gb {cpu_offload_gb:g}")
    link = host_link_bandwidth(device)
    steps = link / plan.nbytes  # the most steps a second the link allows
    how = f"sampled at temperature {temperature:g}" if temperature > 0 else "greedy"
    print(f"\n{shape}, {model.dtype}, {n} requests x ({prompt_len} prompt + {output_len} output tokens), {how}, "
          f"{device}")
    what = "a memcpy between host buffers" if device == "cpu" else f"pinned host -> {device}"
    print(f"streamed: {plan.describe()}; {size_str(plan.nbytes)} a step over the host link, measured "
          f"{link / 1e9:.1f} GB/s ({what})")
    print(f"{'':28} {'out tok/s':>10} {'1-stream tok/s':>15} {'decode tok/s':>13} {'TTFT p50 (s)':>13} "
          f"{'ITL p50 (ms)':>13}")
    for r in (resident, streamed):
        print(f"{r.name:28} {r.output_tokens_per_s:10,.1f} {r.single_stream_tokens_per_s:15,.1f} "
              f"{r.decode_tokens_per_s or 0:13,.1f} {r.ttft_p50 or 0:13.3f} {(r.itl_p50 or 0) * 1e3:13.1f}")
    print(f"{'host-link ceiling':28} {'':10} {steps:15,.1f} {n * steps:13,.1f}   (link GB/s / streamed GB per "
          f"step, x {n} sequences decoding)")
    print(f"single stream with offload: {streamed.single_stream_tokens_per_s:,.1f} tok/s = "
          f"{100 * streamed.single_stream_tokens_per_s / steps:.1f}% of the host-link ceiling ({steps:,.1f} tok/s); "
          f"{streamed.single_stream_tokens_per_s / resident.single_stream_tokens_per_s:.2f}x the resident run")
    if streamed.note:
        print(streamed.note)
    return [resident, streamed]


# ---- speculative decoding ------------------------------------------------------------------

# Text the model copies or continues: where prompt lookup finds its drafts (copying, lists, code
# edits), as `bench serve --speculative-method` runs it, chat-templated when the model has one.
REPETITIVE_PROMPTS = (
    "Copy the following text exactly, word for word:\n\nThe quick brown fox jumps over the lazy dog. "
    "Pack my box with five dozen liquor jugs. How vexingly quick daft zebras jump. The five boxing "
    "wizards jump quickly. Sphinx of black quartz, judge my vow.",
    "Repeat this list twice:\napple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon, mango",
    "Rename the function `add` to `plus` in this code and print the whole file:\n\n```python\n"
    "def add(a, b):\n    return a + b\n\n\ndef twice(x):\n    return add(x, x)\n\n\n"
    "def total(xs):\n    s = 0\n    for x in xs:\n        s = add(s, x)\n    return s\n```",
    "Write the numbers from 1 to 40, separated by commas.",
    "Convert to a JSON list of objects with name and age fields: Alice 31, Bob 27, Carol 45, Dave 38, "
    "Erin 29, Frank 52",
    "Copy this HTML exactly:\n<ul>\n  <li>one</li>\n  <li>two</li>\n  <li>three</li>\n  <li>four</li>\n"
    "  <li>five</li>\n</ul>",
)


@dataclass
class SpecResult:
    name: str
    single_stream_tokens_per_s: float  # prompts one at a time, first token to last
    batched_tokens_per_s: float  # all prompts at once, whole run
    acceptance: float | None = None  # accepted / draft tokens
    accepted_per_draft: float | None = None
    tokens: list[list[int]] | None = None


def bench_speculative_one(model, prompts: list[list[int]], output_len: int, spec: dict | None,
                          draft=None) -> SpecResult:
    """``draft``: the draft Model of spec's method "draft"."""
    num_blocks = -(-len(prompts) * (max(map(len, prompts)) + output_len + 64) // 16)
    runner = ProgramRunner(model, num_blocks=num_blocks, block_size=16)
    draft_runner = None if draft is None else ProgramRunner(draft, num_blocks=num_blocks, block_size=16)
    cfg = EngineConfig(num_blocks=num_blocks, block_size=16, max_num_seqs=len(prompts), enable_prefix_caching=False,
                       seed=0, **(spec or {}))
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True, detokenize=False)
    with EngineClient(runner, cfg, draft=draft_runner) as client:
        llm = LLM(client, None)
        # Warm-up: the buckets both passes meet are compiled (verification spans of 2..1+k tokens
        # meet several per batch size), as a server compiles its shapes once.
        llm.generate(prompts, params)
        for p in prompts:
            llm.generate([p], params)
        before = client.stats()
        tokens, decode_s, decoded = [], 0.0, 0

        async def one(p: list[int]) -> None:
            nonlocal decode_s, decoded
            stamps, out = [], []
            async with llm.submit(p, params) as gen:
                async for o in gen:
                    stamps.append(time.perf_counter())
                    out.extend(o.new_token_ids)
            tokens.append(out)
            decode_s += stamps[-1] - stamps[0]
            decoded += len(out) - 1  # first token to last: the prompt's prefill is left out

        for p in prompts:
            asyncio.run(one(p))
        after = client.stats()
        t0 = time.perf_counter()
        llm.generate(prompts, params)
        batched = len(prompts) * output_len / (time.perf_counter() - t0)
    drafts = after.spec_num_drafts - before.spec_num_drafts
    draft_tokens = after.spec_num_draft_tokens - before.spec_num_draft_tokens
    accepted = after.spec_num_accepted_tokens - before.spec_num_accepted_tokens
    name = "plain" if spec is None else f"{spec['speculative_method']} k={spec['num_speculative_tokens']}"
    return SpecResult(name, decoded / decode_s, batched, accepted / draft_tokens if draft_tokens else None,
                      accepted / drafts if drafts else None, tokens)


def run_speculative(source: str | None, *, method: str, k: int, lookup_min: int | None, lookup_max: int | None,
                    output_len: int, dtype: str, device: str, draft_source: str | None = None) -> list[SpecResult]:
    """Plain decoding vs speculative on REPETITIVE_PROMPTS with a real model (default: SmolLM2),
    greedy: single stream and all at once, the acceptance rate and the ratio. ``draft_source``:
    the draft model of method "draft" (launch.load_draft's checks)."""
    from surogate.io.default_model import INSTALL_HINT, default_model_path
    from surogate.model import load_model, resolve_device

    if source is None:
        source = default_model_path()
        if source is None:
            raise InvalidArgumentError(f"no --model and the default model is not installed ({INSTALL_HINT})")
    device = resolve_device(device)
    model = load_model(str(source), device=device, dtype=dtype)
    tok = model.tokenizer
    if tok is None:
        raise InvalidArgumentError(f"{source} has no tokenizer: the repetitive prompt set is text")
    prompts = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True)
               if tok.chat_template else tok.encode(t) for t in REPETITIVE_PROMPTS]
    spec = {"speculative_method": method, "num_speculative_tokens": k, "prompt_lookup_min": lookup_min,
            "prompt_lookup_max": lookup_max}
    if (method == "draft") != (draft_source is not None):
        raise InvalidArgumentError("--speculative-method draft and --speculative-model go together",
                                   hint="e.g. --speculative-method draft --speculative-model qwen3-0.6b-folder")
    draft = None
    if draft_source is not None:
        from surogate.serve.launch import load_draft

        draft = load_draft(str(draft_source), model, dtype=model.dtype)
    plain, fast = bench_speculative_one(model, prompts, output_len, None), bench_speculative_one(
        model, prompts, output_len, spec, draft)
    drafter = f", drafted by {draft_source}" if draft_source is not None else ""
    print(f"\n{source}{drafter}, {model.dtype}, {device}: {len(prompts)} repetitive prompts (copying, lists, "
          f"code edits) x {output_len} greedy tokens")
    print(f"{'':20} {'1-stream tok/s':>15} {'batched tok/s':>14} {'acceptance':>11} {'accepted/draft':>15}")
    for r in (plain, fast):
        acc = f"{r.acceptance:.3f}" if r.acceptance is not None else "-"
        per = f"{r.accepted_per_draft:.2f}" if r.accepted_per_draft is not None else "-"
        print(f"{r.name:20} {r.single_stream_tokens_per_s:15,.1f} {r.batched_tokens_per_s:14,.1f} {acc:>11} {per:>15}")
    print(f"{'ratio (spec / plain)':20} {fast.single_stream_tokens_per_s / plain.single_stream_tokens_per_s:14.2f}x "
          f"{fast.batched_tokens_per_s / plain.batched_tokens_per_s:13.2f}x")
    same = sum(a == b for a, b in zip(plain.tokens, fast.tokens))
    print(f"greedy outputs identical to plain decoding: {same} of {len(prompts)}")
    return [plain, fast]
