"""A tiny Gemma 3 vision model to serve: tiny_models.make_gemma3_vision's checkpoint with a
tokenizer that knows Gemma 3's image tokens (<start_of_image>, <end_of_image>,
<image_soft_token> at the config's boi / eoi / image ids), a Gemma-3-style chat template (one
<start_of_image> per image part) and processor_config.json, so that transformers' AutoProcessor
(Gemma3Processor) loads from the folder offline and gives the reference inputs."""

from __future__ import annotations

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
