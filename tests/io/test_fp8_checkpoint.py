"""Checkpoints with a quantization_config: block-scaled FP8 (Qwen's / DeepSeek's `*-FP8` layout)
loads with its scales applied, equal to transformers over the same dequantized weights; merge and
export write plain weights; every other method is refused by name (its packed tensors would load as
wrong weights without an error)."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import surogate  # noqa: E402
from sgtest.tiny_models import make_model  # noqa: E402
from surogate.errors import FileFormatError, UnsupportedError  # noqa: E402
from surogate.io import ModelFolder, save_safetensors  # noqa: E402
from surogate.io.safetensors import SafetensorsFile  # noqa: E402

BLOCK = [32, 32]  # 128 x 128 in the real releases; 32 puts partial blocks in a tiny model's rows


def fp8_checkpoint(src, dst, block=BLOCK, skip=("lm_head",)):
    """``src`` re-saved as block FP8 the way the FP8 releases are made: per [bo, bi] block,
    scale = amax / 448 (e4m3's largest), W_q = e4m3(W / scale), ``W_scale_inv`` = scale. Returns the
    weights transformers should see: W_q * scale, decoded here with ml_dtypes."""
    dst.mkdir()
    for f in src.iterdir():
        if f.name != "model.safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": list(block), "modules_to_not_convert": list(skip)}
    (dst / "config.json").write_text(json.dumps(cfg))
    out, want = {}, {}
    with SafetensorsFile(src / "model.safetensors") as f:
        for name in f.keys():
            w = np.asarray(f.get(name), np.float32)
            if w.ndim != 2 or "norm" in name or "embed" in name or any(s in name for s in skip):
                out[name] = want[name] = w
                continue
            bo, bi = block
            rows, cols = w.shape
            pad = np.zeros((-(-rows // bo) * bo, -(-cols // bi) * bi), np.float32)
            pad[:rows, :cols] = w
            blocks = pad.reshape(pad.shape[0] // bo, bo, pad.shape[1] // bi, bi)
            scale = np.abs(blocks).max(axis=(1, 3)) / 448.0
            scale[scale == 0] = 1.0
            full = np.repeat(np.repeat(scale, bo, 0), bi, 1)[:rows, :cols]
            q = (w / full).astype(ml_dtypes.float8_e4m3fn)
            out[name], out[name + "_scale_inv"] = q, scale.astype(np.float32)
            want[name] = q.astype(np.float32) * full
    save_safetensors(dst / "model.safetensors", out, metadata={"format": "pt"})
    return want


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_block_fp8_loads_with_its_scales_equal_to_transformers(tmp_path, family):
    src = make_model(family, tmp_path / "src", seed=3, hidden_size=80, intermediate_size=144)
    want = fp8_checkpoint(src, tmp_path / "fp8")
    ours = surogate.load_model(tmp_path / "fp8")
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32)
    ref.load_state_dict({k: torch.from_numpy(v) for k, v in want.items()}, strict=False)
    ids = np.random.default_rng(1).integers(0, ours.spec.vocab_size, 21)
    with torch.no_grad():
        expect = ref(torch.tensor(ids)[None]).logits[0].numpy()
    np.testing.assert_allclose(ours.forward(ids), expect, atol=1e-4, rtol=0)


def test_unscaled_reading_would_be_wrong_and_merge_writes_plain_bf16(tmp_path):
    from surogate.dsl.nn import LoRAConfig
    from surogate.train.export import merge_adapter
    from surogate.train.lora import init_lora, save_peft_adapter

    src = make_model("qwen3", tmp_path / "src", seed=3, hidden_size=80, intermediate_size=144)
    fp8_checkpoint(src, tmp_path / "fp8")
    folder = ModelFolder(tmp_path / "fp8")
    w = folder.open_weights()
    name = "model.layers.0.self_attn.q_proj.weight"
    assert name + "_scale_inv" not in w.keys()  # scales are read, not listed as tensors
    with SafetensorsFile(tmp_path / "fp8" / "model.safetensors") as f:
        unscaled = f.get(name).astype(np.float32)
    assert not np.allclose(unscaled, w.get(name), atol=1e-2)  # the bug this replaces: scales ignored
    # An adapter over the FP8 base merges into plain bf16 weights without the quantization_config.
    model = surogate.load_model(tmp_path / "fp8")
    lora = LoRAConfig(rank=4, alpha=8, targets=("q_proj", "v_proj"))
    exe = model.executable("train", 8, 1, lora=lora, grads=True)
    adapter = save_peft_adapter(tmp_path / "adapter", {k: v + 0.01 for k, v in init_lora(exe.graph, 0).items()},
                                lora, base_model=str(tmp_path / "fp8"))
    out = merge_adapter(None, adapter, tmp_path / "merged")
    cfg = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["torch_dtype"] == "bfloat16"
    with SafetensorsFile(out / "model.safetensors") as f:
        assert all(f.get(k).dtype == ml_dtypes.bfloat16 for k in f.keys() if "proj" in k)
        assert not any(k.endswith("_scale_inv") for k in f.keys())


@pytest.mark.parametrize("qc, words", [
    ({"quant_method": "awq", "bits": 4}, "quant_method 'awq' is not read"),
    ({"quant_method": "gptq", "bits": 4}, "quant_method 'gptq' is not read"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "quant_method 'bitsandbytes' is not read"),
    ({"quant_method": "fp8", "activation_scheme": "static"}, "without weight_block_size"),
    ({"quant_method": "compressed-tensors"}, "quant_method 'compressed-tensors'"),
    ({"quant_method": "awq", "bits": 4}, "quant_method 'awq'"),  # (mxfp4 is read: tests/models/test_gpt_oss.py)
])
def test_quantization_methods_not_read_are_refused_by_name(tmp_path, qc, words):
    src = make_model("llama", tmp_path / "m", seed=3)
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = qc
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedError, match=words):
        surogate.load_model(src)


def test_damaged_block_fp8_files_name_the_tensor(tmp_path):
    src = make_model("llama", tmp_path / "src", seed=3)
    fp8_checkpoint(src, tmp_path / "fp8", block=[16, 16])
    cfg = json.loads((tmp_path / "fp8" / "config.json").read_text())
    cfg["quantization_config"]["weight_block_size"] = [32, 32]  # the file's scales are per 16
    (tmp_path / "fp8" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FileFormatError, match=r"q_proj.weight: scale of shape .* blocks of \[32, 32\]"):
        surogate.load_model(tmp_path / "fp8")
    cfg["quantization_config"]["weight_block_size"] = "128"
    (tmp_path / "fp8" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FileFormatError, match="weight_block_size '128' is not two positive integers"):
        surogate.load_model(tmp_path / "fp8")
