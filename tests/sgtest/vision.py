"""Tiny vision models to serve. Gemma 3: tiny_models.make_gemma3_vision's checkpoint with a
tokenizer that knows Gemma 3's image tokens (<start_of_image>, <end_of_image>,
<image_soft_token> at the config's boi / eoi / image ids), a Gemma-3-style chat template (one
<start_of_image> per image part) and processor_config.json, so that transformers' AutoProcessor
(Gemma3Processor) loads from the folder offline and gives the reference inputs. Qwen3-VL:
tiny_models.make_qwen3_vl's checkpoint over a ChatML tokenizer with Qwen's vision tokens, a
Qwen3-VL-style template (<|vision_start|><|image_pad|><|vision_end|> per image part) and a
preprocessor_config.json of the tower's patch sizes (`make_qwen3_vl_chat`, `qwen3_vl_reference`)."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np

from sgtest import tiny_models

# Modeled on google/gemma-3-4b-it's chat template: one <start_of_image> per image part.
GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- set role = "model" if message['role'] == 'assistant' else message['role'] -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{ '<start_of_turn>model\\n' }}
{%- endif -%}
"""

IMAGE_TOKENS = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}


def make_gemma3_vision_chat(path: str | Path, *, seed: int = 3, preprocessor: dict | None = None, **overrides) -> Path:
    """The served folder (``preprocessor``: preprocessor_config.json keys to change, e.g. pan-and-scan)."""
    from tokenizers import AddedToken

    path = tiny_models.make_gemma3_vision(path, seed=seed, **overrides)
    config = json.loads((path / "config.json").read_text())
    tok = tiny_models.build_tokenizer("gemma")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in IMAGE_TOKENS.values()])
    ids = [tok.token_to_id(t) for t in IMAGE_TOKENS.values()]
    assert ids == [config["boi_token_index"], config["eoi_token_index"], config["image_token_index"]], ids
    tok.save(str(path / "tokenizer.json"))
    tc = json.loads((path / "tokenizer_config.json").read_text())
    for t, i in zip(IMAGE_TOKENS.values(), ids):
        tc["added_tokens_decoder"][str(i)] = {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                              "single_word": False, "special": True}
    tc.pop("chat_template", None)
    (path / "tokenizer_config.json").write_text(json.dumps({**tc, **IMAGE_TOKENS}, indent=1))
    (path / "chat_template.jinja").write_text(GEMMA3_TEMPLATE)
    (path / "processor_config.json").write_text(json.dumps(
        {"processor_class": "Gemma3Processor", "image_seq_length": config["mm_tokens_per_image"]}))
    if preprocessor:
        pre = json.loads((path / "preprocessor_config.json").read_text())
        (path / "preprocessor_config.json").write_text(json.dumps({**pre, **preprocessor}, indent=1))
    return path


def image(seed: int, size: tuple[int, int] = (40, 30)):
    """A random RGB PIL image (width, height)."""
    from PIL import Image

    w, h = size
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


def b64(img, fmt: str = "PNG") -> str:
    """A PIL image's file bytes in ``fmt`` (PNG: lossless, the server decodes the test's pixels), base64."""
    buf = io.BytesIO()
    img.save(buf, fmt)
    return base64.b64encode(buf.getvalue()).decode()


def data_url(img, fmt: str = "PNG") -> str:
    return f"data:image/{fmt.lower()};base64,{b64(img, fmt)}"


def image_url_part(img) -> dict:
    """An OpenAI chat ``image_url`` part carrying the image as a data URL."""
    return {"type": "image_url", "image_url": {"url": data_url(img)}}


def hf_generate(ref, processor, messages: list[dict], n: int, *, ignore_eos: bool = True
                ) -> tuple[list[int], list[int]]:
    """transformers' greedy answer (n tokens; up to n and the eos token kept when not
    ``ignore_eos``) and its prompt ids, the processor's inputs from the messages (images inline as
    {"type": "image", "image": PIL})."""
    import torch

    inputs = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True,
                                           return_tensors="pt")
    stop = {"min_new_tokens": n, "eos_token_id": None} if ignore_eos else {}
    with torch.no_grad():
        out = ref.generate(**inputs, do_sample=False, max_new_tokens=n, pad_token_id=0, **stop)
    prompt = inputs["input_ids"][0].tolist()
    return out[0, len(prompt):].tolist(), prompt


def template_messages(messages: list[dict]) -> list[dict]:
    """HF-style messages (image parts holding PIL images) as our template messages and the images."""
    out, images = [], []
    for m in messages:
        content = m["content"]
        if isinstance(content, list):
            parts = []
            for part in content:
                if part["type"] == "image":
                    images.append(part["image"])
                    parts.append({"type": "image"})
                else:
                    parts.append(part)
            content = parts
        out.append({**m, "content": content})
    return out, images


# Modeled on Qwen/Qwen3-VL-2B-Instruct's chat template (no tools): ChatML turns, one
# <|vision_start|><|image_pad|><|vision_end|> per image part, <|vision_start|><|video_pad|><|vision_end|>
# per video part.
QWEN3_VL_TEMPLATE = """{%- for message in messages -%}
{{- '<|im_start|>' + message['role'] + '\n' -}}
{%- if message['content'] is string -%}
{{- message['content'] -}}
{%- else -%}
{%- for item in message['content'] -%}
{%- if item['type'] == 'image' or 'image' in item -%}
{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}
{%- elif item['type'] == 'video' or 'video' in item -%}
{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}
{%- elif item['type'] == 'text' -%}
{{- item['text'] -}}
{%- endif -%}
{%- endfor -%}
{%- endif -%}
{{- '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n' -}}
{%- endif -%}
"""

QWEN3_VL_TOKENS = {"vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>",
                   "image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>"}
# Qwen3-VL's preprocessor_config.json keys (size as pixel bounds) at the tiny tower's 8-pixel
# patches: images of 16 x 16 .. 64 x 64 pixels after smart_resize (grids 2..8 patches a side).
QWEN3_VL_PREPROCESSOR = {"size": {"shortest_edge": 16 * 16, "longest_edge": 64 * 64}, "patch_size": 8,
                         "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
                         "image_std": [0.5, 0.5, 0.5], "processor_class": "Qwen3VLProcessor",
                         "image_processor_type": "Qwen2VLImageProcessor"}


# Qwen3-VL's video_preprocessor_config.json keys at the tiny tower's sizes: a clip's pixels (all
# frames) within 16 x 16 x 4 .. 32 x 32 x 8, 2 frames a second, at most 8 frames.
QWEN3_VL_VIDEO_PREPROCESSOR = {"size": {"shortest_edge": 16 * 16 * 4, "longest_edge": 32 * 32 * 8}, "patch_size": 8,
                               "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
                               "image_std": [0.5, 0.5, 0.5], "fps": 2, "min_frames": 2, "max_frames": 8,
                               "do_sample_frames": True, "video_processor_type": "Qwen3VLVideoProcessor"}


def user(*parts) -> list[dict]:
    """One user message in HF's form: str parts as text, the others (PIL images) as image parts."""
    content = [{"type": "text", "text": p} if isinstance(p, str) else {"type": "image", "image": p} for p in parts]
    return [{"role": "user", "content": content}]


def served_chat(llm, messages: list[dict], params):
    """``llm.chat`` of HF-style messages (template_messages): the answer's new token ids and output."""
    chat, images = template_messages(messages)
    out = llm.chat(chat, params, images=images).result(timeout=120)[0]
    return out.new_token_ids, out


def make_qwen3_vl_chat(path: str | Path, *, seed: int = 0, tie: bool = False, moe: bool = False,
                       text: dict | None = None) -> Path:
    """The served tiny Qwen3-VL: tokenizer (ChatML + the four vision tokens, their ids the config's),
    chat template, preprocessor_config.json; the text vocabulary the tokenizer's. ``moe``: Qwen3-VL-MoE's
    (tiny_models.make_qwen3_vl(moe=True)); ``text``: text_config keys over the tiny config's."""
    from tokenizers import AddedToken

    path = Path(path)
    tiny_models.make_tokenizer(path, "chatml")
    tok = tiny_models.build_tokenizer("chatml")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN3_VL_TOKENS.values()])
    ids = {k: tok.token_to_id(t) for k, t in QWEN3_VL_TOKENS.items()}
    tiny_models.make_qwen3_vl(path, seed=seed, tie=tie, moe=moe,
                              config={**ids, "text_config": {**(text or {}), "vocab_size": tok.get_vocab_size()}})
    tok.save(str(path / "tokenizer.json"))
    tc = json.loads((path / "tokenizer_config.json").read_text())
    for t, i in zip(QWEN3_VL_TOKENS.values(), ids.values()):
        tc["added_tokens_decoder"][str(i)] = {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                              "single_word": False, "special": True}
    tc.pop("chat_template", None)
    (path / "tokenizer_config.json").write_text(json.dumps(tc, indent=1))
    (path / "chat_template.jinja").write_text(QWEN3_VL_TEMPLATE)
    (path / "preprocessor_config.json").write_text(json.dumps(QWEN3_VL_PREPROCESSOR, indent=1))
    (path / "video_preprocessor_config.json").write_text(json.dumps(QWEN3_VL_VIDEO_PREPROCESSOR, indent=1))
    return path


def qwen3_vl_reference(path: str | Path, adapter: str | Path | None = None):
    """(transformers' Qwen3VLForConditionalGeneration, or its MoE's, a generate function) for the folder
    (``adapter``: under that peft adapter, sgtest/projector_lora.py): the
    function takes HF-style messages (image parts {"type": "image", "image": PIL}) and n, and
    returns (greedy answer of n tokens, prompt ids). The inputs are Qwen3VLProcessor's text rule
    (its replace_image_token: <|image_pad|> x grid_t grid_h grid_w / merge^2) over the template's
    text, its mm_token_type_ids, and Qwen2VLImageProcessorPil's pixels (Qwen3VLProcessor itself
    needs Qwen3VLVideoProcessor, which needs torchvision, not installed)."""
    import torch
    import transformers
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    arch = json.loads((Path(path) / "config.json").read_text())["architectures"][0]  # Qwen3-VL or its MoE
    ref = getattr(transformers, arch).from_pretrained(str(path)).eval()
    if adapter is not None:
        import peft

        ref = peft.PeftModel.from_pretrained(ref, str(adapter)).eval()
    config = getattr(ref, "config", None) or ref.base_model.config
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
    images_proc = Qwen2VLImageProcessorPil.from_dict(json.loads((Path(path) / "preprocessor_config.json").read_text()))
    template = (Path(path) / "chat_template.jinja").read_text()

    def generate(messages: list[dict], n: int) -> tuple[list[int], list[int]]:
        text = tokenizer.apply_chat_template(messages, chat_template=template, add_generation_prompt=True,
                                             tokenize=False)
        images = [p["image"] for m in messages if isinstance(m["content"], list) for p in m["content"]
                  if p["type"] == "image"]
        kw = {}
        if images:
            out = images_proc(images, return_tensors="pt")
            merge = images_proc.merge_size ** 2
            pieces = text.split("<|image_pad|>")
            assert len(pieces) == len(images) + 1
            text = pieces[0] + "".join("<|image_pad|>" * int(g.prod() // merge) + p
                                       for g, p in zip(out["image_grid_thw"], pieces[1:]))
            kw = {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}
        ids = tokenizer(text, return_tensors="pt")["input_ids"]
        if images:  # the processor's mm_token_type_ids (image tokens 1): what get_rope_index reads
            kw["mm_token_type_ids"] = (ids == config.image_token_id).long()
        with torch.no_grad():
            got = ref.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                               min_new_tokens=n, eos_token_id=None, pad_token_id=0, **kw)
        return got[0, ids.shape[1]:].tolist(), ids[0].tolist()

    return ref, generate


def qwen3_vl_token_prompts(tmp_path, device: str, chunk: int | None, n: int) -> list:
    """tiny_models.qwen3_vl_prompts' image prompt and video prompt served on ``device`` through the
    engine with surogate.models.qwen3_vl_prompt.serve_spans (``chunk``: a token budget, blocks of 4), and
    transformers' greedy answers on the same ids and pixels: [(what, spans, ours, HF's)]."""
    import torch
    import transformers

    import surogate
    from sgtest.embeds import greedy
    from surogate.models.qwen3_vl import encode_visual
    from surogate.models.qwen3_vl_prompt import serve_spans
    from surogate.serve.engine_client import EngineClient
    from surogate.serve.model_runner import ProgramRunner
    from surogate.serve.types import EngineConfig

    path = tiny_models.make_qwen3_vl(Path(tmp_path) / "q3vl-tokens", seed=2)
    ref = transformers.Qwen3VLForConditionalGeneration.from_pretrained(str(path)).eval()
    ours = surogate.load_model(str(path), device=device)
    vs = ours.spec.vision
    kw = {} if chunk is None else {"max_num_batched_tokens": chunk, "block_size": 4}
    config = EngineConfig(num_blocks=64, **kw)
    out = []
    with EngineClient(ProgramRunner(ours, num_blocks=64, block_size=config.block_size), config) as client:
        for (ids, (px, grid)), what in zip(tiny_models.qwen3_vl_prompts(), ("image", "video")):
            merged, deep = encode_visual(ours, px, grid)
            rows, at = [], 0
            for t, h, w in grid.tolist():
                k = t * h * w // vs.tower.merge_unit
                rows.append(np.concatenate([merged[at:at + k], *[d[at:at + k] for d in deep]], axis=1))
                at += k
            keys = [bytes([i]) * 32 for i in range(len(rows))]
            spans = serve_spans(ids, ours.spec, **{f"{what}s": (grid, rows, keys)})
            got, _ = greedy(client, ids, n, spans)
            token = vs.image_token_id if what == "image" else vs.video_token_id
            t = torch.tensor([ids])
            hf = {"pixel_values" if what == "image" else "pixel_values_videos": torch.tensor(px),
                  f"{what}_grid_thw": torch.tensor(grid),
                  "mm_token_type_ids": (t == token).long() * (1 if what == "image" else 2)}
            with torch.no_grad():
                want = ref.generate(input_ids=t, attention_mask=torch.ones_like(t), do_sample=False, max_new_tokens=n,
                                    min_new_tokens=n, eos_token_id=None, pad_token_id=0, **hf)[0, len(ids):].tolist()
            out.append((what, len(spans), got, want))
    return out


def qwen3_vl_hf_logits(model, ids: list[int], images=None, videos=None):
    """transformers' Qwen3-VL logits [len(ids), V] of a token-id prompt with (pixels, grid)
    ``images`` / ``videos`` as our preprocessing gives them (mm_token_type_ids from the config's
    image and video token ids)."""
    import torch

    cfg = model.config
    kw = {}
    if images is not None or videos is not None:
        kw["mm_token_type_ids"] = torch.tensor([[1 if i == cfg.image_token_id else 2 if i == cfg.video_token_id else 0
                                                 for i in ids]])
    if images is not None:
        kw.update(pixel_values=torch.tensor(images[0]), image_grid_thw=torch.tensor(images[1]))
    if videos is not None:
        kw.update(pixel_values_videos=torch.tensor(videos[0]), video_grid_thw=torch.tensor(videos[1]))
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), **kw).logits[0].numpy()
