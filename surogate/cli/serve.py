"""`surogate serve [MODEL...]`: the OpenAI / Anthropic compatible HTTP gateway.

The gateway (granian) is an extra: it is imported inside the command, never at module level.
"""

from __future__ import annotations

import json
import os
from typing import Annotated

import typer

from surogate.errors import InvalidArgumentError, NotFoundError


def serve(
    models: Annotated[
        list[str] | None,
        typer.Argument(metavar="MODEL", help="HF folders, cached hub ids or GGUF files; NAME=PATH names one.",
                       show_default=False),
    ] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    api_key: Annotated[
        list[str] | None,
        typer.Option(help="Accepted API key (repeatable); also SUROGATE_API_KEY. None: no auth.",
                     show_default=False),
    ] = None,
    device: Annotated[str, typer.Option(help="cpu, cuda, cuda:N, or auto (a GPU when there is one).")] = "auto",
    dtype: Annotated[str, typer.Option(help="Weights and KV cache dtype: float32, bfloat16, or auto "
                                            "(bfloat16 on a GPU, float32 on the CPU).")] = "auto",
    lora: Annotated[
        list[str] | None,
        typer.Option(help="NAME=PATH: serve a PEFT LoRA adapter on the (first) model under NAME; requests pick it "
                          "with model=NAME (repeatable).", show_default=False),
    ] = None,
    max_loras: Annotated[int, typer.Option(help="LoRA adapters loaded at once on a model (--lora and those loaded "
                                                "at run time by POST /v1/load_lora_adapter); one more evicts the "
                                                "least recently used.", min=1)] = 8,
    pooling: Annotated[str, typer.Option(help="/v1/embeddings: pool the final hidden states by the last token "
                                              "(last) or their mean (mean), then L2-normalise.")] = "last",
    quantized: Annotated[bool, typer.Option(help="GGUF models: keep the quantized weights as blocks and multiply "
                                                 "them as they are (less memory, faster decode); off: dequantize "
                                                 "to --dtype at load.")] = False,
    kv_cache_tokens: Annotated[int | None, typer.Option(
        help="KV cache capacity per model, in tokens. Default: 16384 on the CPU; on a GPU, what is left of "
             "--gpu-memory-utilization once a profile run measured the weights, the largest step and other "
             "processes' memory, split evenly between the models.",
        show_default=False)] = None,
    gpu_memory_utilization: Annotated[float, typer.Option(
        help="GPU: the fraction of its memory that other processes and ours (weights, KV caches, activations) "
             "may take together.")] = 0.9,
    cpu_offload_gb: Annotated[float, typer.Option(
        help="GiB of the (first) model's weights to keep in host memory (vLLM's flag): whole decoder layers, the "
             "fewest that hold this much, spread over the depth, copied to the GPU every step (pinned memory, "
             "overlapped with the other layers' work). Decode is then bound by the host link: about its GB/s over "
             "the streamed GB steps a second. 0: none.")] = 0.0,
    offload_layers: Annotated[int | None, typer.Option(
        help="Instead of --cpu-offload-gb: how many decoder layers of the (first) model keep their weights in "
             "host memory.", show_default=False)] = None,
    max_num_seqs: Annotated[int, typer.Option(help="Sequences running at once per model.")] = 128,
    shutdown_grace: Annotated[float, typer.Option(help="On SIGTERM / Ctrl-C: seconds requests in flight get to "
                                                       "finish before they are aborted.")] = 5.0,
    max_model_len: Annotated[int | None, typer.Option(help="Prompt + output limit per request.",
                                                       show_default=False)] = None,
    max_queued_requests: Annotated[int, typer.Option(help="Requests waiting per model before new ones get 429.",
                                                     min=1)] = 1024,
    speculative_method: Annotated[str | None, typer.Option(
        help="Speculative decoding: ngram (prompt lookup: drafts what followed an earlier occurrence of the "
             "last n-gram in the prompt + output) or draft (a smaller model of the same tokenizer, "
             "--speculative-model). Needs --num-speculative-tokens.", show_default=False)] = None,
    speculative_model: Annotated[str | None, typer.Option(
        help="draft: the draft model (a folder, GGUF or hub id; same tokenizer as the served model, loaded "
             "on its device in its dtype; its KV cache has as many blocks as the served model's).",
        show_default=False)] = None,
    num_speculative_tokens: Annotated[int | None, typer.Option(
        help="Draft tokens verified per sequence and step (1-32).", show_default=False)] = None,
    prompt_lookup_min: Annotated[int | None, typer.Option(
        help="ngram: the shortest suffix matched (default: --prompt-lookup-max, or 5).", show_default=False)] = None,
    prompt_lookup_max: Annotated[int | None, typer.Option(
        help="ngram: the longest suffix matched (default: --prompt-lookup-min, or 5).", show_default=False)] = None,
    speculative_disable_by_batch_size: Annotated[int | None, typer.Option(
        help="No drafts while more than this many sequences run (large batches are compute-bound).",
        show_default=False)] = None,
    allowed_local_media_path: Annotated[str | None, typer.Option(
        help="Image inputs: let requests name image files (file:// URLs, absolute paths) inside this folder. "
             "Default: none (data: URLs only).", show_default=False)] = None,
    allow_remote_media: Annotated[bool, typer.Option(
        "--allow-remote-media", help="Image inputs: fetch http(s) image URLs (at most 32 MiB, 10 s each). "
                                     "Default: off, no network fetch.")] = False,
    mmproj: Annotated[str | None, typer.Option(
        help="A GGUF model's vision tower: llama.cpp's mmproj file (convert_hf_to_gguf.py --mmproj, or the "
             "mmproj-*.gguf `surogate quantize` writes beside a vision model's GGUF); for the first model.",
        show_default=False)] = None,
    limit_mm_per_prompt: Annotated[str | None, typer.Option(
        help='Image and video inputs a prompt may hold, as JSON (vLLM\'s flag): \'{"image": 4, "video": 1}\'. '
             'Default: 8 images, 2 videos.',
        show_default=False)] = None,
) -> None:
    """Serve models over OpenAI- and Anthropic-compatible HTTP APIs."""
    try:
        from surogate.gateway.models import GatewayConfig, ServedModel
        from surogate.gateway.server import serve as run_server
    except ImportError as e:
        raise NotFoundError(f"the gateway's dependencies are missing ({e.name})",
                            hint='pip install "surogate[serve]"') from None
    from surogate.serve.embedder import POOLINGS
    from surogate.serve.launch import launch

    if pooling not in POOLINGS:
        raise InvalidArgumentError(f"--pooling {pooling!r} is not one of {', '.join(POOLINGS)}")
    media = media_options(allowed_local_media_path, allow_remote_media, limit_mm_per_prompt)

    sources = models or [_default_model()]
    keys = tuple(api_key or ([os.environ["SUROGATE_API_KEY"]] if os.environ.get("SUROGATE_API_KEY") else []))
    served = []
    loras = {}
    for item in lora or []:
        adapter_name, sep, adapter_path = item.partition("=")
        if not sep or not adapter_name or not adapter_path:
            raise InvalidArgumentError(f"--lora {item!r}: expected NAME=PATH", hint="e.g. --lora assistant=out/adapter")
        loras[adapter_name] = adapter_path
    for i, spec in enumerate(sources):
        name, _, path = spec.partition("=") if "=" in spec and not os.path.exists(spec) else (None, "", spec)
        typer.echo(f"loading {path} ...", err=True)
        m = launch(path, name=name or None, device=device, dtype=dtype, quantized=quantized,
                   loras=loras if i == 0 else None, kv_cache_tokens=kv_cache_tokens,
                   gpu_memory_utilization=gpu_memory_utilization, kv_share=1.0 / (len(sources) - i),
                   max_num_seqs=max_num_seqs, max_model_len=max_model_len, max_loras=max_loras,
                   speculative_method=speculative_method, num_speculative_tokens=num_speculative_tokens,
                   prompt_lookup_min=prompt_lookup_min, prompt_lookup_max=prompt_lookup_max,
                   speculative_disable_by_batch_size=speculative_disable_by_batch_size,
                   mmproj=mmproj if i == 0 else None, speculative_model=speculative_model,
                   cpu_offload_gb=(cpu_offload_gb or None) if i == 0 else None,
                   offload_layers=offload_layers if i == 0 else None)
        served.append(ServedModel(m.name, m.llm(), adapters=tuple(m.adapters), embedder=m.embedder(pooling),
                                  generates=m.generates))
        what = (f"KV cache {m.kv_cache_tokens:,} tokens" if m.generates else
                "an encoder: /v1/embeddings only")
        if m.offload is not None:
            typer.echo(f"{m.name}: {m.offload.describe()}", err=True)
        typer.echo(f"serving {m.name} (max_model_len {m.max_model_len}, {what}) on http://{host}:{port}/v1",
                   err=True)
    run_server(served, GatewayConfig(api_keys=keys, max_queued_requests=max_queued_requests, **media), host=host,
               port=port, grace=shutdown_grace)


def media_options(allowed_local_media_path: str | None, allow_remote_media: bool,
                  limit_mm_per_prompt: str | None) -> dict:
    """The image-input flags as GatewayConfig fields, checked."""
    out: dict = {"allow_remote_media": allow_remote_media}
    if allowed_local_media_path is not None:
        if not os.path.isdir(allowed_local_media_path):
            raise InvalidArgumentError(f"--allowed-local-media-path {allowed_local_media_path!r} is not a folder",
                                       hint="name an existing folder whose images requests may read")
        out["allowed_local_media_path"] = os.path.abspath(allowed_local_media_path)
    if limit_mm_per_prompt is not None:
        try:
            limits = json.loads(limit_mm_per_prompt)
        except ValueError:
            limits = None
        if not isinstance(limits, dict) or any(not isinstance(v, int) or isinstance(v, bool) or v < 0
                                               for v in limits.values()):
            raise InvalidArgumentError(f"--limit-mm-per-prompt {limit_mm_per_prompt!r} is not a JSON object of counts",
                                       hint='e.g. --limit-mm-per-prompt \'{"image": 4}\'')
        other = sorted(set(limits) - {"image", "video"})
        if other:
            raise InvalidArgumentError(f"--limit-mm-per-prompt names {', '.join(other)}: this server takes images "
                                       "and videos only", hint='e.g. --limit-mm-per-prompt \'{"image": 4}\'')
        if "image" in limits:
            out["max_images_per_prompt"] = limits["image"]
        if "video" in limits:
            out["max_videos_per_prompt"] = limits["video"]
    return out


def _default_model() -> str:
    """SmolLM2-135M-Instruct, served under that name."""
    from surogate.io.default_model import INSTALL_HINT, NAME, default_model_path

    path = default_model_path()
    if path is None:
        raise NotFoundError(f"no model given, and the default model ({NAME}) is not installed",
                            hint=f"{INSTALL_HINT}, or name a model: surogate serve path/to/model")
    return f"{NAME}={path}"
