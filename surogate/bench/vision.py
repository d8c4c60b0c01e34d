"""`surogate bench serve --images N`: generation with images, ours and HF generate's, in one run.

C requests, each of ``prompt_len`` random text tokens and N images (fixed seeded random RGB
pictures, 640x480 by default, every request its own, so neither side's caches can skip one),
ask for ``output_len`` tokens (ignore_eos, greedy). The model is the architecture of a real
checkpoint's config.json (VISION_CONFIGS: the text model, the vision tower and the projector;
TINY_CONFIGS for the CPU tests) with random weights. The prompts are ids: random text tokens,
then each image's tokens as the family's own ImagePrompt writes them (its image text, the
placeholders expanded, read back as ids); a family is benched once it has Family.image_prompt.

Ours: the native engine through surogate.serve.LLM (token ids in and out, no detokenization, as
`bench serve`), each request's images turned into rows as a served request's are: the family's
image processor and Model.encode_images (serve.multimodal.ImageEncoder, in a worker thread per
request as the gateway does: the requests waiting at once share batched tower calls, its group
commit), then submitted; all C requests at once, each read by its own consumer. Time to first
token is from the start of the run (so it includes the request's own image encode and the batches
before it, as behind a server).

The peer: HF transformers' ``generate`` of the same architecture (its own random weights) on
the same token ids and images, through transformers' image processor: one batch of all C
requests (the prompts have equal lengths: no padding), so every request's first token comes
when the batch's does (TTFT: processor + generate(max_new_tokens=1)); output tok/s over
processor + generate(output_len).

Reported per side: output tok/s, TTFT p50 / p99, and the image-encode time per image
(preprocessing, and the tower + projector), and the ratio ours / HF. Ours' preprocessing runs in
the request threads at once, so its figure is their wall times summed (contended cores count
more than once); its note gives the tower calls the encoder's batches took.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass

import numpy as np

from surogate.errors import InvalidArgumentError, UnsupportedError

# The config.json of each named checkpoint (the keys the families read; the rest of each file is
# tokenizer ids and training settings that do not change the architecture).
VISION_CONFIGS: dict[str, dict] = {
    # google/gemma-3-4b-it's config.json: text_config over Gemma3TextConfig's defaults (vocab 262208,
    # heads 8 / 4 of 256, query scalar 256, rope 1e6 global / 1e4 local, 5 sliding : 1 global), a
    # 27-layer SigLIP So400m tower over 896-pixel images of 14-pixel patches, 256 tokens per image.
    "gemma-3-4b": {
        "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
        "boi_token_index": 255999, "eoi_token_index": 256000, "image_token_index": 262144,
        "eos_token_id": [1, 106], "initializer_range": 0.02, "mm_tokens_per_image": 256,
        "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                        "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                        "sliding_window": 1024},
        "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                          "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
                          "patch_size": 14, "vision_use_head": False},
    },
    # Qwen/Qwen3-VL-2B-Instruct's config.json.
    "qwen3-vl-2b": {
        "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
        "image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
        "vision_end_token_id": 151653, "tie_word_embeddings": True,
        "text_config": {"attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 151643,
                        "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048,
                        "initializer_range": 0.02, "intermediate_size": 6144, "max_position_embeddings": 262144,
                        "model_type": "qwen3_vl_text", "num_attention_heads": 16, "num_hidden_layers": 28,
                        "num_key_value_heads": 8, "rms_norm_eps": 1e-6,
                        "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20],
                                         "rope_type": "default"},
                        "rope_theta": 5000000, "tie_word_embeddings": True, "vocab_size": 151936},
        "vision_config": {"deepstack_visual_indexes": [5, 11, 17], "depth": 24, "hidden_act": "gelu_pytorch_tanh",
                          "hidden_size": 1024, "in_channels": 3, "initializer_range": 0.02,
                          "intermediate_size": 4096, "model_type": "qwen3_vl_vision", "num_heads": 16,
                          "num_position_embeddings": 2304, "out_hidden_size": 2048, "patch_size": 16,
                          "spatial_merge_size": 2, "temporal_patch_size": 2},
    },
}


def tiny_config() -> dict:
    """A tiny Gemma3ForConditionalGeneration for the CPU test: the gemma3 family's tiny text config
    and its TINY_VISION tower (56-pixel images, 4 tokens per image), a 512-token vocabulary whose
    last three ids are <start_of_image>, <end_of_image> and the image token."""
    from surogate.models import family_named
    from surogate.models.gemma3 import TINY_VISION

    text = {**family_named("gemma3").tiny.config, "vocab_size": 512, "bos_token_id": 2, "eos_token_id": 1,
            "pad_token_id": 0}
    return {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", **TINY_VISION,
            "text_config": text, "boi_token_index": 509, "eoi_token_index": 510, "image_token_index": 511}


def tiny_qwen3_vl_config() -> dict:
    """The qwen3_vl family's tiny Qwen3VLForConditionalGeneration (its TINY: 2 text layers of 64,
    a 3-layer tower of 8-pixel patches merged 2 x 2, vocabulary 96 with the image tokens at 90..93)."""
    from surogate.models.qwen3_vl import TINY

    return {"architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl", **TINY}


TINY_CONFIGS = {"tiny": tiny_config, "tiny-qwen3-vl": tiny_qwen3_vl_config}


def config_for(shape: str) -> dict:
    if shape in TINY_CONFIGS:
        return TINY_CONFIGS[shape]()
    if shape not in VISION_CONFIGS:
        raise InvalidArgumentError(f"--images: no vision shape {shape!r}",
                                   hint=f"known: {', '.join([*TINY_CONFIGS, *VISION_CONFIGS])}")
    return VISION_CONFIGS[shape]


BATCHED_ENCODE = 32  # images in ours' one-call encode figure


@dataclass
class VisionResult:
    name: str
    output_tokens_per_s: float
    ttft_p50: float
    ttft_p99: float
    preprocess_ms_per_image: float  # the image processor's time per image
    encode_ms_per_image: float  # the tower and projector's time per image
    note: str = ""


def images(n: int, size: tuple[int, int], seed: int) -> list:
    """``n`` random RGB pictures of ``size`` (width, height), the same for the same seed."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    w, h = size
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for _ in range(n)]


class _IdNames:
    """The tokenizer a random-weight model does not have, as far as its family's image_prompt asks
    (the image tokens' names): each id named by itself, so that the image text reads back as ids."""

    def id_to_token(self, i: int) -> str:
        return f"<id{i}>"


def image_ids(image_prompt, image) -> list[int]:
    """The ids the family's processor writes for ``image`` (its ``text_of`` / ``image_text``, in
    _IdNames' names; the plain text between them, Gemma's "\\n\\n", left out)."""
    import re

    text = image_prompt.text_of(image) if getattr(image_prompt, "text_of", None) is not None else \
        image_prompt.image_text(image_prompt.num_crops(image))
    return [int(i) for i in re.findall(r"<id(\d+)>", text)]


def write_prompts(image_prompt, pictures: list[list], prompt_len: int, seed: int) -> list[list[int]]:
    """One prompt per request: ``prompt_len`` random text tokens (below every image token's id),
    then each of its images' ids."""
    rng = np.random.default_rng(seed)
    per_request = [[i for img in imgs for i in image_ids(image_prompt, img)] for imgs in pictures]
    low = min(min(ids) for ids in per_request)
    return [[*rng.integers(3, low, prompt_len).tolist(), *ids] for ids in per_request]


def random_vision_model(config: dict, dtype: str, device: str, seed: int = 0):
    """The model of an HF config.json (dict) with random weights (train.random_model's), every
    graph's parameters (the text model's and the vision tower's) included."""
    from surogate.bench.train import random_model
    from surogate.models.registry import family_for

    family = family_for(config, source="the bench's config")
    spec = family.spec_from_config(config)
    if spec.vision is None:
        raise InvalidArgumentError(f"{config['architectures'][0]}: the config has no vision tower")
    return random_model(spec, dtype, seed=seed, device=device)


def bench_ours(model, image_prompt, prompts: list[list[int]], pictures: list[list], output_len: int,
               warmup: list[tuple[list[list[int]], list[list]]], block_size: int = 16) -> VisionResult:
    """``warmup``: two loads like the timed one (prompts, images), untimed."""
    from surogate.bench.serve import timed_generation
    from surogate.serve import LLM, EngineClient, EngineConfig, SamplingParams
    from surogate.serve.frontend import Prompt
    from surogate.serve.model_runner import ProgramRunner
    from surogate.serve.multimodal import ImageEncoder

    n, length = len(prompts), len(prompts[0])
    num_blocks = -(-n * (length + output_len + block_size) // block_size)
    runner = ProgramRunner(model, num_blocks=num_blocks, block_size=block_size)
    cfg = EngineConfig(num_blocks=num_blocks, block_size=block_size, max_num_seqs=n,
                       max_num_batched_tokens=max(2048, length), enable_prefix_caching=False, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True, detokenize=False)
    timing = {"pre": 0.0, "enc": 0.0, "images": 0}

    def preprocess(imgs):
        t = time.perf_counter()
        out = image_prompt.processor(imgs)
        timing["pre"] += time.perf_counter() - t
        return out

    def encode(*args):  # the waiting requests' images not yet encoded, in one call (ImageEncoder's batch)
        t = time.perf_counter()
        rows = model.encode_images(*args)  # read back to the host: the device's work is done
        timing["enc"] += time.perf_counter() - t
        return rows

    encoder = ImageEncoder(dataclasses.replace(image_prompt, processor=preprocess), encode)
    with EngineClient(runner, cfg) as client:
        llm = LLM(client, None, images=encoder)

        def embedded(prompt: list[int], imgs: list):  # in a worker thread, as the gateway encodes
            return asyncio.to_thread(llm.embed, Prompt(prompt, None, imgs))

        # Warm-up, twice (other images: the encoder's cache would skip the timed ones), on the timed
        # run's path: compiles the Programs of the shapes the run meets (the tower's of a request's images
        # too); on a GPU the first pass runs them eagerly, the second captures their graphs.
        for seed in (0, 1):
            timed_generation(llm, [embedded(p, imgs) for p, imgs in zip(*warmup[seed])], params)
        timing.update(pre=0.0, enc=0.0)
        before, calls = encoder.encodes, encoder.calls
        timed = timed_generation(llm, [embedded(p, imgs) for p, imgs in zip(prompts, pictures)], params)
    pct = lambda q: float(np.percentile(timed.ttft, q))  # noqa: E731
    k = max(encoder.encodes - before, 1)  # the images encoded
    # The tower alone over many images in one call (what a batched encoder would pay per image).
    flat = [x for row in pictures for x in row][:BATCHED_ENCODE]
    batch = image_prompt.processor(flat)
    args = (batch.pixel_values, batch.image_grid_thw) if hasattr(batch, "image_grid_thw") else (batch.pixel_values,)
    model.encode_images(*args)  # compiles the batch's shape
    t0 = time.perf_counter()
    model.encode_images(*args)
    batched = 1e3 * (time.perf_counter() - t0) / len(flat)
    return VisionResult("surogate", timed.tokens / timed.elapsed, pct(50), pct(99), 1e3 * timing["pre"] / k,
                        1e3 * timing["enc"] / k, f"{encoder.calls - calls} tower calls for {k} images (waiting "
                        f"requests batched); the tower over {len(flat)} images in one call: {batched:.2f} ms per image")


# transformers' image processor class of each family, and the input that marks the image tokens.
HF_IMAGES = {"gemma3": ("Gemma3ImageProcessor", "token_type_ids"),
             "qwen3_vl": ("Qwen2VLImageProcessor", "mm_token_type_ids")}


def hf_processor(family: str, ours):
    """transformers' image processor of the family, set as ours is (``ours``: the family's
    processor, surogate.io.image_processing), so that both sides see the same pixels."""
    import transformers

    if family not in HF_IMAGES:
        raise UnsupportedError(f"{family}: the vision bench has no transformers image processor for this family",
                               hint=f"add it to surogate/bench/vision.py HF_IMAGES (known: {', '.join(HF_IMAGES)})")
    name = HF_IMAGES[family][0]
    cls = getattr(transformers, name + "Pil", None) or getattr(transformers, name)  # the PIL path, as ours
    spec = ours.spec
    common = dict(do_rescale=spec.do_rescale, rescale_factor=spec.rescale_factor, do_normalize=spec.do_normalize,
                  image_mean=list(spec.image_mean), image_std=list(spec.image_std), resample=int(spec.resample))
    if family == "gemma3":
        return cls(size={"height": ours.height, "width": ours.width}, do_pan_and_scan=ours.do_pan_and_scan, **common)
    return cls(min_pixels=ours.min_pixels, max_pixels=ours.max_pixels, patch_size=ours.patch_size,
               temporal_patch_size=ours.temporal_patch_size, merge_size=ours.merge_size, **common)


def bench_hf(model, config: dict, image_prompt, prompts: list[list[int]], pictures: list[list], output_len: int,
             warmup: list[tuple[list[list[int]], list[list]]], device: str) -> VisionResult:
    import torch
    import transformers

    dtype = torch.bfloat16 if model.dtype == "bfloat16" else torch.float32
    cls = getattr(transformers, config["architectures"][0])
    rest = {k: v for k, v in config.items() if k not in ("architectures", "model_type")}
    hf_cfg = transformers.AutoConfig.for_model(config["model_type"], **rest)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built in its dtype on the device: no float32 copy of a 4B model first
    try:
        with torch.device(device):
            m = cls(hf_cfg).eval()
    finally:
        torch.set_default_dtype(default)
    if device != "cpu":
        from surogate import _native

        _native.empty_cache(device)
    processor = hf_processor(model.spec.family, image_prompt.processor)
    image_id, marks = image_prompt.image_token_id, HF_IMAGES[model.spec.family][1]

    def pixels(flat) -> dict:  # the processor's tensors (pixel_values; Qwen: image_grid_thw), on the device
        out = processor(images=flat, return_tensors="pt")  # (Gemma's num_crops too: not a model input)
        return {k: out[k].to(device=device, dtype=dtype if k == "pixel_values" else out[k].dtype)
                for k in ("pixel_values", "image_grid_thw") if k in out}

    def inputs(batch, imgs):
        ids = torch.tensor(batch, device=device)
        return dict(input_ids=ids, attention_mask=torch.ones_like(ids), **{marks: (ids == image_id).long()},
                    **pixels([x for row in imgs for x in row]))

    def sync():
        if device != "cpu":
            torch.cuda.synchronize()

    def generate(batch, imgs, new: int) -> float:
        sync()
        t0 = time.perf_counter()
        with torch.no_grad():
            m.generate(**inputs(batch, imgs), do_sample=False, max_new_tokens=new, min_new_tokens=new, pad_token_id=0)
        sync()
        return time.perf_counter() - t0

    for batch, imgs in warmup:
        generate(batch, imgs, output_len)
    first = generate(prompts, pictures, 1)  # every request's first token: the batch's
    whole = generate(prompts, pictures, output_len)
    flat = [x for row in pictures for x in row]
    t0 = time.perf_counter()
    px = pixels(flat)
    pre = time.perf_counter() - t0
    with torch.no_grad():
        m.model.get_image_features(**px)  # warm
        sync()
        t0 = time.perf_counter()
        m.model.get_image_features(**px)
        sync()
    enc = time.perf_counter() - t0
    n = len(prompts)
    return VisionResult("HF generate (one batch)", n * output_len / whole, first, first, 1e3 * pre / len(flat),
                        1e3 * enc / len(flat), f"all {n} requests in one generate call, the images' tower batched")


def run(shape: str, *, n_images: int, n: int, prompt_len: int, output_len: int, dtype: str, vs: str | None,
        device: str, image_size: tuple[int, int] = (640, 480)) -> list[VisionResult]:
    """``n`` concurrent requests of ``prompt_len`` text tokens and ``n_images`` images each."""
    from surogate.model import resolve_device
    from surogate.models.registry import family_for

    if n_images < 1:
        raise InvalidArgumentError(f"--images {n_images}: give at least one image per request")
    config = config_for(shape)
    family = family_for(config, source=shape)
    if family.image_prompt is None:
        raise UnsupportedError(
            f"{shape}: {config['architectures'][0]} is not served with images on this branch (the {family.name} "
            "family has no Family.image_prompt)",
            hint="Qwen3-VL's serving with images came with branch h8/qwen3vl-serve: bench it on a tree that has "
                 "it, or bench images with --model gemma-3-4b (or tiny)")
    device = resolve_device(device)
    model = random_vision_model(config, dtype, device)
    image_prompt = family.image_prompt(model.spec, _IdNames(), None)  # the processor of the hub's files
    pictures = [images(n_images, image_size, seed=100 + i) for i in range(n)]
    prompts = write_prompts(image_prompt, pictures, prompt_len, seed=0)
    warmup = []
    for w in (1, 2):
        pics = [images(n_images, image_size, seed=10_000 * w + i) for i in range(n)]
        warmup.append((write_prompts(image_prompt, pics, prompt_len, seed=w), pics))
    results = [bench_ours(model, image_prompt, prompts, pictures, output_len, warmup)]
    if vs == "hf":
        results.append(bench_hf(model, config, image_prompt, prompts, pictures, output_len, warmup, device))
    elif vs is not None:
        raise InvalidArgumentError(f"--vs {vs!r}: the vision bench's peer is hf")
    print(f"\n{shape} (random weights), {dtype}, {n} requests x ({prompt_len} text tokens + {n_images} images "
          f"{image_size[0]}x{image_size[1]} = {len(prompts[0])} prompt tokens, {output_len} output tokens), {device}")
    print(f"{'':26} {'out tok/s':>10} {'TTFT p50/p99 (s)':>18} {'preprocess ms/img':>18} {'encode ms/img':>14}")
    for r in results:
        print(f"{r.name:26} {r.output_tokens_per_s:10,.1f} {f'{r.ttft_p50:.3f}/{r.ttft_p99:.3f}':>18} "
              f"{r.preprocess_ms_per_image:18.2f} {r.encode_ms_per_image:14.2f}")
    if len(results) > 1:  # each column as ours' speed-up: tok/s ours / peer, times peer / ours
        ours, hf = results
        print(f"{'speed-up (ours vs peer)':26} {ours.output_tokens_per_s / hf.output_tokens_per_s:9.2f}x "
              f"{f'{hf.ttft_p50 / ours.ttft_p50:.2f}x/{hf.ttft_p99 / ours.ttft_p99:.2f}x':>18} "
              f"{hf.preprocess_ms_per_image / ours.preprocess_ms_per_image:17.2f}x "
              f"{hf.encode_ms_per_image / ours.encode_ms_per_image:13.2f}x")
    for r in results:
        print(f"{r.name}: {r.note}")
    return results
