"""A tiny Gemma 3 with images to train on (tiny_models.make_gemma3_vision's checkpoint with a
tokenizer that has Gemma 3's image tokens at the config's ids, the hub's chat template and
processor_config.json, so transformers' Gemma3Processor loads from the folder offline), pictures,
a dataset of image chat rows in TRL's forms, and the run's YAML as a user writes it."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
from PIL import Image

from sgtest.tiny_models import build_tokenizer, make_gemma3_vision

IMAGE_TOKENS = ("<start_of_image>", "<end_of_image>", "<image_soft_token>")  # ids v, v + 1, v + 2: the config's

# google/gemma-3-4b-it's chat template (one <start_of_image> per image part).
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
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
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
    {{'<start_of_turn>model\\n'}}
{%- endif -%}
"""


def make_folder(path: Path, seed: int = 3, text: dict | None = None) -> Path:
    """The tiny Gemma 3 with images, its tokenizer given <start_of_image>, <end_of_image> and
    <image_soft_token> at the ids its config names, and the hub's template and processor config."""
    from tokenizers import AddedToken

    path = make_gemma3_vision(path, seed=seed, text=text)
    cfg = json.loads((path / "config.json").read_text())
    tok = build_tokenizer("gemma")
    v = tok.get_vocab_size()
    assert (cfg["boi_token_index"], cfg["eoi_token_index"], cfg["image_token_index"]) == (v, v + 1, v + 2)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in IMAGE_TOKENS])
    tok.save(str(path / "tokenizer.json"))
    tc = json.loads((path / "tokenizer_config.json").read_text())
    tc.update(chat_template=GEMMA3_TEMPLATE, boi_token=IMAGE_TOKENS[0], eoi_token=IMAGE_TOKENS[1],
              image_token=IMAGE_TOKENS[2],
              extra_special_tokens=dict(zip(("boi_token", "eoi_token", "image_token"), IMAGE_TOKENS)))
    (path / "tokenizer_config.json").write_text(json.dumps(tc))
    (path / "chat_template.jinja").write_text(GEMMA3_TEMPLATE)  # the processor's, as the hub ships it
    (path / "processor_config.json").write_text(json.dumps(
        {"processor_class": "Gemma3Processor", "image_seq_length": cfg["mm_tokens_per_image"]}))
    return path


def picture(seed: int, w: int = 40, h: int = 30):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


def data_url(img) -> str:
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def write_dataset(path: Path, n: int = 6) -> Path:
    """Rows of one or two images (files beside the data, data URLs, inline image parts) and a
    text-only row: the answer names the picture's brightest channel."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "img").mkdir(exist_ok=True)
    rows = []
    for i in range(n):
        img = picture(10 + i, 30 + 4 * i, 40)
        img.save(path / "img" / f"{i}.png")
        channel = ["red", "green", "blue"][int(np.asarray(img).reshape(-1, 3).mean(0).argmax())]
        if i % 3 == 0:
            rows.append({"messages": [{"role": "user", "content": "Which channel is brightest?"},
                                      {"role": "assistant", "content": f"The {channel} one."}],
                         "images": [f"img/{i}.png"]})
        elif i % 3 == 1:
            other = picture(100 + i)
            rows.append({"messages": [
                {"role": "user", "content": [{"type": "image", "image": data_url(other)},
                                             {"type": "text", "text": "and"}, {"type": "image"},
                                             {"type": "text", "text": "Which channel in the second?"}]},
                {"role": "assistant", "content": f"The {channel} one."}], "images": [str(path / "img" / f"{i}.png")]})
        else:
            rows.append({"messages": [{"role": "user", "content": "Say hello."},
                                      {"role": "assistant", "content": "Hello."}]})
    data = path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return data


def yaml_config(folder, data, out, **kw) -> Path:
    """The run's YAML, as a user writes it (``kw``: keys changed or added, as YAML text)."""
    keys = {"sequence_len": 128, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 1,
            "max_steps": 8, "learning_rate": 0.01, "lr_scheduler_type": "constant", "warmup_ratio": 0.0,
            "recipe": "fp32", "lora_rank": 8, "lora_alpha": 16, "save_steps": 3, "eval_steps": 0,
            "merge_adapter": "true", "seed": 5, **kw}
    text = f"""model: {folder}
output_dir: {out}
datasets:
  - path: {data}
    type: messages
""" + "".join(f"{k}: {v}\n" for k, v in keys.items())
    path = Path(out).parent / f"{Path(out).name}.yaml"
    path.write_text(text)
    return path
