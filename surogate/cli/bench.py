"""`surogate bench train|serve`: measure this machine against the peer, as a table with ratios."""

from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(help="Benchmarks that print a table with the peer measured in the same run.",
                  no_args_is_help=True)


@app.command()
def train(
    model: Annotated[str, typer.Option(help="A named shape (tiny, smollm2-135m, qwen3-0.6b, qwen3-1.7b, "
                                            "llama-3.2-1b) or an HF config.json / model folder.")] = "tiny",
    batch: Annotated[int, typer.Option(help="Sequences per step.")] = 2,
    seq: Annotated[int, typer.Option(help="Tokens per sequence.")] = 256,
    lora_rank: Annotated[int, typer.Option(help="LoRA rank on all 7 projections; 0 = full fine-tune.")] = 16,
    dtype: Annotated[str, typer.Option(help="float32 or bfloat16.")] = "float32",
    steps: Annotated[int, typer.Option(help="Timed steps.")] = 3,
    warmup: Annotated[int, typer.Option(help="Untimed steps first.")] = 1,
    vs: Annotated[str | None, typer.Option(help="Peer to run in the same process: hf.")] = None,
    device: Annotated[str, typer.Option(help="cpu, cuda, cuda:N or auto (a GPU when there is one).")] = "auto",
    recompute: Annotated[bool, typer.Option(
        help="Recompute each block's activations in backward (the --vs hf peer: gradient checkpointing).")] = False,
    long_context: Annotated[bool, typer.Option(help="Tiled MLP: each dense MLP over chunks of hidden_size rows.")] = False,
    offload_optimizer: Annotated[bool, typer.Option(
        help="GPU: AdamW's state in host memory, its step on the CPU (the offload_optimizer key).")] = False,
    profile: Annotated[bool, typer.Option(help="Also print where one step's time goes, by op.")] = False,
    graphs: Annotated[bool, typer.Option(help="GPU: replay each step as CUDA graphs.")] = True,
    qlora: Annotated[str | None, typer.Option(help="QLoRA: our projections as GGML blocks of this type (Q8_0, "
                                                   "Q6_K, Q5_K_M, Q4_K_M) or NF4 (bitsandbytes'); the peer: "
                                                   "peft over bitsandbytes NF4 (QLoRA's recipe), when "
                                                   "bitsandbytes is installed.")] = None,
    fp8: Annotated[bool, typer.Option(help="Also ours under recipe fp8_hybrid (the block projections as FP8 "
                                           "GEMMs, current scaling), beside ours in --dtype.")] = False,
) -> None:
    """Training-step tokens/s: ours, and with --vs hf HF transformers (+ peft) on the same shape."""
    from surogate.bench.train import run

    run(model, batch=batch, seq=seq, lora_rank=lora_rank, dtype=dtype, steps=steps, warmup=warmup, vs=vs,
        device=device, recompute=recompute, profile=profile, graphs=graphs, qlora=qlora,
        long_context=long_context, offload_optimizer=offload_optimizer, fp8=fp8)


@app.command()
def serve(
    model: Annotated[str, typer.Option(help="A named shape: tiny, smollm2-135m, qwen3-0.6b, llama-3.2-1b "
                                            "(random weights); with --http also an HF model folder.")] = "tiny",
    requests: Annotated[int, typer.Option(help="Concurrent requests (--http: streams).")] = 16,
    prompt_len: Annotated[int, typer.Option(help="Prompt tokens per request.")] = 64,
    output_len: Annotated[int | None, typer.Option(
        help="Output tokens per request (ignore_eos); default 32, with --structured 256 (a cap: the grammar "
             "ends its answers).", show_default=False)] = None,
    dtype: Annotated[str, typer.Option(help="float32 or bfloat16.")] = "float32",
    vs: Annotated[str | None, typer.Option(help="Peer to run in the same process: hf.")] = None,
    device: Annotated[str, typer.Option(help="cpu, cuda, cuda:N or auto (a GPU when there is one).")] = "auto",
    profile: Annotated[bool, typer.Option(help="Also print where a decode step's time goes.")] = False,
    temperature: Annotated[float, typer.Option(help="Sampling temperature of every request (0: greedy; > 0: "
                                                    "sampled, ours on the device, HF generate's do_sample).")] = 0.0,
    http: Annotated[bool, typer.Option(help="Through HTTP: a real `surogate serve` (or --url), streaming "
                                            "/v1/completions clients, `vllm bench serve`'s table beside the "
                                            "engine's offline figure.")] = False,
    url: Annotated[str | None, typer.Option(help="--http: the base URL of a running OpenAI-compatible server "
                                                 "(llama.cpp, vLLM, ours) instead of starting one.",
                                            show_default=False)] = None,
    request_rate: Annotated[float, typer.Option(help="--http: requests a second, Poisson arrivals; inf: all at "
                                                     "once.")] = float("inf"),
    dataset: Annotated[str, typer.Option(help="--http: 'random' token prompts, or a chat set (JSON / JSONL of "
                                              "ShareGPT conversations or OpenAI messages).")] = "random",
    max_num_seqs: Annotated[int, typer.Option(help="--http: the server's (and the engine figure's) "
                                                   "--max-num-seqs.")] = 128,
    engine: Annotated[bool, typer.Option(help="--http: also the engine's offline figure and the ratio.")] = True,
    api_key: Annotated[str | None, typer.Option(help="--http with --url: the server's API key.",
                                                show_default=False)] = None,
    speculative_method: Annotated[str | None, typer.Option(
        help="Plain vs speculative decoding (ngram) on a repetitive prompt set (copying, lists, code edits) with "
             "a real model: --model a model folder / GGUF (default: SmolLM2), --output-len tokens each; prints the "
             "acceptance rate, accepted tokens per draft and the ratio.", show_default=False)] = None,
    num_speculative_tokens: Annotated[int, typer.Option(help="--speculative-method: draft tokens per step.")] = 4,
    speculative_model: Annotated[str | None, typer.Option(
        help="--speculative-method draft: the draft model (same tokenizer as --model).", show_default=False)] = None,
    prompt_lookup_min: Annotated[int | None, typer.Option(help="--speculative-method ngram: shortest suffix.",
                                                          show_default=False)] = None,
    prompt_lookup_max: Annotated[int | None, typer.Option(help="--speculative-method ngram: longest suffix.",
                                                          show_default=False)] = None,
    images: Annotated[int, typer.Option(help="Images per request: generation with images on a vision checkpoint's "
                                             "architecture (--model gemma-3-4b, qwen3-vl-2b or tiny; random weights), "
                                             "with --vs hf against transformers' generate on the same images; "
                                             "prints TTFT and the image-encode time per image too.")] = 0,
    image_size: Annotated[str, typer.Option(help="--images: each random picture's WIDTHxHEIGHT (the model's "
                                                 "image processor resizes it).")] = "640x480",
    structured: Annotated[str | None, typer.Option(
        help="Structured outputs vs unconstrained sampling on the same load: json_schema, json_object, regex or "
             "choice; prints out tok/s, requests/s, mean output length, the answers that validate, the grammar "
             "engine's mask time per token and the ratio.", show_default=False)] = None,
    constraint: Annotated[str | None, typer.Option(
        help="--structured: the schema (JSON), regex or choices (a JSON list), as text or a file's name; "
             "default: a built-in one (an order: nested fields, an enum, an array of objects, bounded numbers).",
        show_default=False)] = None,
    tokenizer: Annotated[str | None, typer.Option(
        help="--structured: the model's tokenizer (tokenizer.json, HF folder or GGUF); default: SmolLM2's fit "
             "to the shape's vocabulary.", show_default=False)] = None,
    cpu_offload_gb: Annotated[float, typer.Option(
        help="Also serve with this many GiB of decoder layers' weights in host memory (surogate serve's flag): "
             "tok/s resident and streamed, beside the host-link ceiling (measured link GB/s over the streamed GB "
             "per step).")] = 0.0) -> None:
    """Offline generation throughput and latency: ours, and with --vs hf HF generate; with --http as
    streaming HTTP clients see it, beside the engine's own figure; with --speculative-method plain vs
    speculative decoding; with --structured constrained vs unconstrained decoding."""
    from surogate.errors import InvalidArgumentError

    if cpu_offload_gb:
        others = {"--structured": structured is not None, "--images": bool(images), "--http": http,
                  "--url": url is not None, "--speculative-method": speculative_method is not None,
                  "--vs": vs is not None, "--profile": profile}
        given = [k for k, on in others.items() if on]
        if given:
            raise InvalidArgumentError(f"--cpu-offload-gb compares resident and streamed weights offline; it does not "
                                       f"take {', '.join(given)}", hint=f"leave out {', '.join(given)}")
    if structured is None and (constraint is not None or tokenizer is not None):
        raise InvalidArgumentError(f"{'--constraint' if constraint is not None else '--tokenizer'} goes with "
                                   "--structured", hint="add --structured json_schema|json_object|regex|choice")
    if structured is not None:
        from surogate.bench.structured import run as run_structured

        others = {"--http": http, "--url": url is not None, "--speculative-method": speculative_method is not None,
                  "--images": bool(images), "--profile": profile, "--vs": vs is not None}
        given = [k for k, on in others.items() if on]
        if given:
            raise InvalidArgumentError(f"--structured runs the engine offline, constrained vs unconstrained; it does "
                                       f"not take {', '.join(given)}", hint=f"leave out {', '.join(given)}")
        run_structured(model, n=requests, prompt_len=prompt_len, output_len=256 if output_len is None else output_len,
                       dtype=dtype, device=device, structured=structured, constraint=constraint, tokenizer=tokenizer)
        return
    output_len = 32 if output_len is None else output_len
    if images:
        from surogate.bench.vision import run as run_vision

        if http or url is not None or speculative_method is not None or profile:
            raise InvalidArgumentError("--images runs the engine offline against HF generate",
                                       hint="leave out --http / --url / --speculative-method / --profile with --images")
        try:
            width, height = (int(x) for x in image_size.lower().split("x"))
        except ValueError:
            raise InvalidArgumentError(f"--image-size {image_size!r} is not WIDTHxHEIGHT",
                                       hint="e.g. 640x480") from None
        run_vision(model, n_images=images, n=requests, prompt_len=prompt_len, output_len=output_len, dtype=dtype,
                   vs=vs, device=device, image_size=(width, height))
        return
    if speculative_method is not None:
        from surogate.bench.serve import run_speculative

        run_speculative(None if model == "tiny" else model, method=speculative_method, k=num_speculative_tokens,
                        lookup_min=prompt_lookup_min, lookup_max=prompt_lookup_max, output_len=output_len,
                        dtype=dtype, device=device, draft_source=speculative_model)
        return
    if http or url is not None:
        from surogate.bench.http import run as run_http

        run_http(model, n=requests, prompt_len=prompt_len, output_len=output_len, dtype=dtype, device=device,
                 url=url, request_rate=request_rate, dataset=dataset, max_num_seqs=max_num_seqs, engine=engine,
                 api_key=api_key)
        return
    from surogate.bench.serve import run

    run(model, n=requests, prompt_len=prompt_len, output_len=output_len, dtype=dtype, vs=vs, device=device,
        profile=profile, temperature=temperature, cpu_offload_gb=cpu_offload_gb or None)


@app.command()
def grpo(
    model: Annotated[str, typer.Option(help="A named shape: tiny, smollm2-135m, qwen3-0.6b, llama-3.2-1b "
                                            "(random weights).")] = "tiny",
    prompts: Annotated[int, typer.Option(help="Prompts per step.")] = 8,
    generations: Annotated[int, typer.Option(help="Completions per prompt.")] = 8,
    prompt_len: Annotated[int, typer.Option(help="Prompt tokens.")] = 128,
    completion_len: Annotated[int, typer.Option(help="Completion tokens (at most).")] = 256,
    dtype: Annotated[str, typer.Option(help="float32 or bfloat16.")] = "float32",
    device: Annotated[str, typer.Option(help="cpu, cuda, cuda:N or auto (a GPU when there is one).")] = "auto",
    steps: Annotated[int, typer.Option(help="Timed steps.")] = 3,
    warmup: Annotated[int, typer.Option(help="Untimed steps first.")] = 1,
    lora_rank: Annotated[int, typer.Option(help="LoRA rank on all 7 projections.")] = 16,
) -> None:
    """GRPO steps: rollouts from the co-located engine vs an engine over a separate weight copy."""
    from surogate.bench.grpo import run

    run(model, prompts=prompts, generations=generations, prompt_len=prompt_len, completion_len=completion_len,
        dtype=dtype, device=device, steps=steps, warmup=warmup, lora_rank=lora_rank)


@app.command()
def gguf(
    path: Annotated[str, typer.Argument(help="A GGUF file (e.g. from surogate quantize).")],
    requests: Annotated[int, typer.Option(help="Concurrent requests.")] = 16,
    prompt_len: Annotated[int, typer.Option(help="Prompt tokens per request.")] = 64,
    output_len: Annotated[int, typer.Option(help="Output tokens per request (ignore_eos).")] = 64,
    dtype: Annotated[str, typer.Option(help="The dequantized side's dtype: float32, bfloat16 or auto.")] = "auto",
    device: Annotated[str, typer.Option(help="cpu, cuda, cuda:N or auto (a GPU when there is one).")] = "auto",
) -> None:
    """A GGUF model dequantized vs kept as blocks: decode speed and weight memory, same run."""
    from surogate.bench.gguf import run

    run(path, n=requests, prompt_len=prompt_len, output_len=output_len, device=device, dtype=dtype)
