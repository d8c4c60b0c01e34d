"""The README walkthrough on the real default model, on CPU, with small step counts: fine-tune
SmolLM2 (from its GGUF) with LoRA, merge, check the merged folder in transformers, quantize it
to GGUF and load that back. Each step runs the user's command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import surogate  # noqa: E402
from sgtest.smollm2 import smollm2_path  # noqa: E402

QA = [("How do I serve a model?", "Run surogate serve MODEL."),
      ("How do I fine-tune with LoRA?", "Run surogate sft config.yaml."),
      ("How do I merge an adapter?", "Run surogate merge --adapter DIR --output DIR."),
      ("How do I check my install?", "Run surogate doctor.")]


def surogate_cli(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-P", "-m", "surogate.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_finetune_merge_quantize_serve_the_default_model(tmp_path):
    gguf = smollm2_path()
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": q},
                                                     {"role": "assistant", "content": a}]}) + "\n" for q, a in QA))
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"""model: {gguf}
output_dir: {tmp_path / 'out'}
datasets:
  - path: {data}
    type: messages
sequence_len: 64
per_device_train_batch_size: 4
gradient_accumulation_steps: 1
max_steps: 4
learning_rate: 2e-3
lr_scheduler_type: constant
recipe: fp32
lora_rank: 8
lora_alpha: 16
save_steps: 0
eval_steps: 0
""")
    surogate_cli("sft", str(cfg))
    steps = [json.loads(x) for x in open(tmp_path / "out" / "metrics.jsonl") if '"step"' in x]
    losses = [s["loss"] for s in steps if s["type"] == "step"]
    assert len(losses) == 4 and losses[-1] < losses[0]
    adapter = tmp_path / "out" / "adapter"
    assert (adapter / "adapter_model.safetensors").is_file() and (adapter / "tokenizer.json").is_file()

    merged = tmp_path / "merged"
    surogate_cli("merge", "--adapter", str(adapter), "--output", str(merged))
    ours = surogate.load_model(merged)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(merged), dtype=torch.float32).eval()
    ids = np.array(ours.tokenizer.encode("How do I serve a model?"))
    with torch.no_grad():
        ref = hf(torch.tensor(ids)[None]).logits[0].numpy()
    np.testing.assert_allclose(ours.forward(ids), ref, atol=2e-3)

    q8 = tmp_path / "merged-q8_0.gguf"
    surogate_cli("quantize", str(merged), "--type", "Q8_0", "--output", str(q8))
    back = surogate.load_model(q8)
    a, b = ours.forward(ids), back.forward(ids)
    assert (a.argmax(-1) == b.argmax(-1)).mean() > 0.9
