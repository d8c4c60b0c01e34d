"""Training on images: a tiny Gemma 3 with images (sgtest.vision's folder, which transformers'
Gemma3Processor loads offline), pictures, a dataset of image chat rows in TRL's forms, and the
run's YAML as a user writes it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from sgtest.vision import data_url, image, make_gemma3_vision_chat


def make_folder(path: Path, seed: int = 3, text: dict | None = None) -> Path:
    """sgtest.vision's served folder (the tokenizer with Gemma 3's image tokens, the hub's chat
    template and processor_config.json), ``text``: text_config overrides."""
    return make_gemma3_vision_chat(path, seed=seed, **({"text": text} if text else {}))


def write_dataset(path: Path, n: int = 6) -> Path:
    """Rows of one or two images (files beside the data, data URLs, inline image parts) and a
    text-only row: the answer names the picture's brightest channel."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "img").mkdir(exist_ok=True)
    rows = []
    for i in range(n):
        img = image(10 + i, (30 + 4 * i, 40))
        img.save(path / "img" / f"{i}.png")
        channel = ["red", "green", "blue"][int(np.asarray(img).reshape(-1, 3).mean(0).argmax())]
        if i % 3 == 0:
            rows.append({"messages": [{"role": "user", "content": "Which channel is brightest?"},
                                      {"role": "assistant", "content": f"The {channel} one."}],
                         "images": [f"img/{i}.png"]})
        elif i % 3 == 1:
            other = image(100 + i)
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


def write_qwen3_vl_dataset(path: Path, n: int = 6) -> Path:
    """Qwen3-VL rows: of one image (a file beside the data), of two (a data URL in an image part and a
    file), and text-only rows; the answer names the picture's brightest channel."""
    path.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(n):
        img = image(10 + i, (24 + 8 * i, 32))
        img.save(path / f"{i}.png")
        channel = ["red", "green", "blue"][int(np.asarray(img).reshape(-1, 3).mean(0).argmax())]
        if i % 3 == 0:
            rows.append({"messages": [{"role": "user", "content": [{"type": "image"},
                                                                   {"type": "text", "text": "Brightest channel?"}]},
                                      {"role": "assistant", "content": f"The {channel} one."}],
                         "images": [f"{i}.png"]})
        elif i % 3 == 1:
            rows.append({"messages": [
                {"role": "user", "content": [{"type": "image", "image": data_url(image(100 + i, (40, 24)))},
                                             {"type": "text", "text": "and"}, {"type": "image"},
                                             {"type": "text", "text": "Which channel in the second?"}]},
                {"role": "assistant", "content": f"The {channel} one."}], "images": [f"{i}.png"]})
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


def check_sft_on_cuda(folder, data, tmp_path, **kw) -> None:
    """The GPU trainer against the CPU one on image rows: the first two rows' micro-batch (loss and
    every gradient), then a whole run's loss curve and adapter (``kw``: yaml_config's keys)."""
    from safetensors.numpy import load_file

    from sgtest.ops import rel_err
    from sgtest.qa import step_losses
    from surogate.config import load_config
    from surogate.train.trainer import Trainer

    def trainer(name, device):
        return Trainer(load_config(yaml_config(folder, data, tmp_path / name, device=device, **kw), kind="sft"))

    cpu, gpu = trainer("cpu", "cpu"), trainer("gpu", "cuda")
    assert gpu.exe.device.startswith("cuda") and gpu.images == cpu.images > 0
    b = cpu.train_data.batch([0, 1])
    assert len(b.images) > 1
    (lc, _), (lg, _) = cpu._step([b]), gpu._step([b])
    assert abs(lg - lc) < 1e-4 * abs(lc)
    for n in cpu.grads:
        gpu.exe.pull(n)
        assert rel_err(gpu.grads[n], cpu.grads[n]) < 1e-3, n
    cpu, gpu = trainer("cpu2", "cpu"), trainer("gpu2", "cuda")
    cpu.train()
    gpu.train()
    assert np.allclose(step_losses(tmp_path / "gpu2"), step_losses(tmp_path / "cpu2"), rtol=1e-4)
    a = load_file(tmp_path / "gpu2" / "adapter" / "adapter_model.safetensors")
    c = load_file(tmp_path / "cpu2" / "adapter" / "adapter_model.safetensors")
    assert set(a) == set(c) and max(rel_err(a[k], c[k]) for k in a) < 1e-2


def qwen3_vl_image_inputs(folder, pic) -> dict:
    """HF's inputs (torch tensors) for a Qwen3-VL chat folder's one user turn of ``pic`` and a question,
    with the generation prompt (Qwen3VLProcessor's text rule over the folder's template)."""
    import transformers
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    proc = Qwen2VLImageProcessorPil.from_dict(json.loads((Path(folder) / "preprocessor_config.json").read_text()))
    msgs = [{"role": "user", "content": [{"type": "image", "image": pic}, {"type": "text", "text": "Brightest?"}]}]
    text = tok.apply_chat_template(msgs, chat_template=(Path(folder) / "chat_template.jinja").read_text(),
                                   tokenize=False, add_generation_prompt=True)
    out = proc([pic], return_tensors="pt")
    text = text.replace("<|image_pad|>", "<|image_pad|>" * int(out["image_grid_thw"][0].prod() // 4))
    ids = tok(text, return_tensors="pt")["input_ids"]
    return {"input_ids": ids, "pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"],
            "mm_token_type_ids": (ids == tok.convert_tokens_to_ids("<|image_pad|>")).long()}


def sft_trains(config: Path, out: Path) -> tuple[Path, Path]:
    """`surogate sft CONFIG` in a subprocess: it exits 0 and its 8 steps' loss falls (the last two
    below the first two by 0.3); the run's adapter and merged folders."""
    import os
    import subprocess
    import sys

    from sgtest.qa import step_losses

    proc = subprocess.run([sys.executable, "-P", "-m", "surogate.cli.main", "sft", str(config)], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = step_losses(out)
    assert len(losses) == 8 and np.mean(losses[-2:]) < np.mean(losses[:2]) - 0.3, losses
    return out / "adapter", out / "merged"
