"""`long_context: true` (the tiled MLP) from YAML: `surogate sft` trains with it, and the loss
curve is the one without it (up to the order of the weight gradients' sums over chunks)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

pytest.importorskip("torch")

from sgtest.qa import sft_config, step_losses, write_qa  # noqa: E402
from sgtest.tiny_models import make_model  # noqa: E402
from surogate.errors import ConfigError  # noqa: E402
from surogate.train.trainer import Trainer  # noqa: E402


def test_sft_yaml_with_long_context_trains_the_curve_without_it(tmp_path):
    base = make_model("qwen3", tmp_path / "base", hidden_size=32, head_dim=16)  # chunks of 32 rows over 2 x 64 tokens
    data = write_qa(tmp_path / "qa.jsonl")
    plain = Trainer(sft_config(base, data, tmp_path / "plain", max_steps=4))
    assert plain.mlp_chunk == 0
    plain.train()
    cfg = {"model": str(base), "output_dir": str(tmp_path / "tiled"),
           "datasets": [{"path": str(data), "type": "messages"}],
           "sequence_len": 64, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 2, "recipe": "fp32",
           "learning_rate": 2e-2, "lr_scheduler_type": "constant", "max_steps": 4, "lora_rank": 8, "lora_alpha": 16,
           "save_steps": 0, "eval_steps": 0, "seed": 7, "max_grad_norm": 1.0, "long_context": True}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([sys.executable, "-P", "-m", "surogate.cli.main", "sft", str(path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    tiled, ref = step_losses(tmp_path / "tiled"), step_losses(tmp_path / "plain")
    assert len(tiled) == len(ref) == 4
    assert tiled == pytest.approx(ref, rel=1e-5)


def test_long_context_sets_chunks_of_hidden_size_rows(tmp_path):
    base = make_model("qwen3", tmp_path / "base", hidden_size=32, head_dim=16)
    t = Trainer(sft_config(base, write_qa(tmp_path / "qa.jsonl"), tmp_path / "run", long_context=True))
    assert t.mlp_chunk == 32 and t.exe.lowered.tiled_mlps == t.model.spec.num_layers


def test_long_context_on_a_model_without_a_dense_mlp_is_a_config_error(tmp_path):
    base = make_model("qwen3_moe", tmp_path / "base", mlp_only_layers=[])
    with pytest.raises(ConfigError, match="long_context"):
        Trainer(sft_config(base, write_qa(tmp_path / "qa.jsonl"), tmp_path / "run", long_context=True))
