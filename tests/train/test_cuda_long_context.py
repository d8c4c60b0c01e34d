"""The tiled MLP (long_context) on the GPU: the same loss and gradients as the untiled GPU run
and the CPU, LoRA dropout's masks continued across chunks, a lower allocator peak, and the
trainer's loss curve with CUDA graphs. Skipped without a CUDA build and a GPU; run on the lent
H200 before resolving."""

from __future__ import annotations

import numpy as np
import pytest

from surogate import _native

pytestmark = pytest.mark.cuda
if not (_native.build_info()["cuda"] and _native.cuda_devices()):
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)

import surogate  # noqa: E402
from sgtest.ops import rel_err  # noqa: E402
from sgtest.qa import sft_config, step_losses, write_qa  # noqa: E402
from sgtest.tiny_models import make_model  # noqa: E402
from surogate.dsl.nn import LORA_RNG, LoRAConfig  # noqa: E402
from surogate.train.lora import init_lora  # noqa: E402
from surogate.train.trainer import Trainer  # noqa: E402

CHUNK = 48


def run(model, ids, lora, params, chunk, recompute=False):
    exe = model.executable("train", len(ids), 1, lora=lora, grads=True, recompute=recompute, mlp_chunk=chunk)
    if LORA_RNG in exe.lowered.by_value:
        exe.bind(LORA_RNG, np.array([3, 4], np.int32))
    return model.loss_and_grads(ids, lora=lora, lora_params=params, recompute=recompute, mlp_chunk=chunk)


@pytest.mark.parametrize("family", ["llama", "gemma3", "lfm2", "qwen3_moe"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tiled_mlp_on_the_gpu_matches_untiled_and_the_cpu(tmp_path, family, dtype):
    path = make_model(family, tmp_path / family, seed=5, initializer_range=0.2, head_dim=64)
    cpu = surogate.load_model(path, dtype=dtype)
    gpu = surogate.load_model(path, device="cuda", dtype=dtype)
    ids = np.random.default_rng(0).integers(0, cpu.spec.vocab_size, 200)
    # peft has no dropout on stacked expert weights (the MoE family refuses it): dropout only where it exists
    lora = LoRAConfig(rank=8, alpha=16, dropout=0.0 if family == "qwen3_moe" else 0.1)
    params = {k: v + 0.01 for k, v in init_lora(cpu.arch.build(mode="train", lora=lora), 0).items()}
    # bf16: tiled against untiled on the GPU (the CPU's bf16 rounds elsewhere: its drift is
    # test_cuda_training's business); f32: against the CPU too.
    tol = 1e-3 if dtype == "float32" else 3e-2
    (lc, gc), (lg, gg), (lt, gt) = (run(cpu, ids, lora, params, 0), run(gpu, ids, lora, params, 0),
                                    run(gpu, ids, lora, params, CHUNK, recompute=True))
    assert gpu.executable("train", len(ids), 1, lora=lora, grads=True, recompute=True,
                          mlp_chunk=CHUNK).lowered.tiled_mlps > 0
    assert abs(lt - lg) < tol * abs(lg)
    for name in gc:
        assert rel_err(gt[name], gg[name]) < tol, name
    if dtype == "float32":
        assert abs(lt - lc) < tol * abs(lc)
        for name in gc:
            assert rel_err(gt[name], gc[name]) < tol, name


def test_tiled_mlp_lowers_the_gpu_allocator_peak(tmp_path):
    path = make_model("llama", tmp_path / "m", seed=5, head_dim=64, intermediate_size=1024)
    gpu = surogate.load_model(path, device="cuda", dtype="bfloat16")
    ids = np.random.default_rng(0).integers(0, gpu.spec.vocab_size, 8192)
    peaks = {}
    for chunk in (0, 256):
        _native.empty_cache("cuda")
        _native.reset_peak_stats("cuda")
        base = _native.allocator_stats("cuda")["allocated_bytes"]
        gpu.loss_and_grads(ids, recompute=True, mlp_chunk=chunk)
        peaks[chunk] = _native.allocator_stats("cuda")["peak_allocated_bytes"] - base
        gpu._cache.clear()
    assert peaks[256] < 0.8 * peaks[0], peaks


def test_trainer_with_long_context_on_cuda_follows_the_cpu_curve(tmp_path):
    base = make_model("qwen3", tmp_path / "base", seed=11, initializer_range=0.2, hidden_size=64, head_dim=64)
    data = write_qa(tmp_path / "qa.jsonl")
    Trainer(sft_config(base, data, tmp_path / "cpu", device="cpu")).train()
    Trainer(sft_config(base, data, tmp_path / "gpu", device="cuda", long_context=True)).train()
    cpu, gpu = step_losses(tmp_path / "cpu"), step_losses(tmp_path / "gpu")
    assert len(cpu) == len(gpu) and gpu == pytest.approx(cpu, rel=2e-3)
