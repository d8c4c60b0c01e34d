"""nf4_dequantize on the GPU against the CPU backend (bit for bit, both absmax layouts, every
output dtype), and a QLoRA-NF4 training step on the GPU against the same step on the CPU.
Skipped on machines without a CUDA build and a GPU."""

import numpy as np
import pytest
from sgtest.ops import run_op

from surogate import _native
from surogate.io.nf4 import quantize_nf4

pytestmark = pytest.mark.cuda

HAS_CUDA = bool(_native.build_info()["cuda"]) and len(_native.cuda_devices()) > 0
if not HAS_CUDA:
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)

COVERS = ("nf4_dequantize",)


def run_cuda(name, inputs, out_specs, **attrs):
    ins = [_native.tensor(x).to("cuda") for x in inputs]
    outs = [_native.zeros(list(shape), dtype, "cuda") for shape, dtype in out_specs]
    _native.call_op(name, ins, outs, attrs)
    return [o.to("cpu").numpy() for o in outs]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("double_quant", [True, False])
@pytest.mark.parametrize("shape,blocksize", [((300, 256), 64), ((1024, 4096), 64), ((64, 384), 128)])
def test_nf4_dequantize_is_the_cpus_bits(shape, blocksize, double_quant, dtype):
    w = (np.random.default_rng(0).standard_normal(shape) * 0.02).astype(np.float32)
    t = quantize_nf4(w, blocksize, double_quant)
    ins = [t.q, t.absmax] + ([t.absmax_scale, t.offset] if double_quant else [])
    (cpu,) = run_op("nf4_dequantize", ins, [(shape, dtype)], blocksize=blocksize)
    (gpu,) = run_cuda("nf4_dequantize", ins, [(shape, dtype)], blocksize=blocksize)
    assert np.array_equal(cpu.view(np.uint8), gpu.view(np.uint8))


def test_qlora_nf4_grads_on_the_gpu_match_the_cpu(tmp_path):
    import surogate
    from sgtest.tiny_models import make_model
    from surogate.dsl.nn import LoRAConfig

    path = make_model("llama", tmp_path / "base", seed=3)
    lora = LoRAConfig(rank=4, alpha=8, targets=("q_proj", "v_proj", "down_proj"))
    ids = np.random.default_rng(1).integers(0, 256, 33)
    out = {}
    for device in ("cpu", "cuda"):
        m = surogate.load_model(path, device=device, quantize="NF4")
        rng = np.random.default_rng(4)
        g = m.arch.build(mode="train", dtype=m.dtype, lora=lora, quant=m.quant)
        params = {p.name: (rng.standard_normal(p.shape) * 0.05).astype(np.float32) for p in g.params()
                  if p.meta.get("lora")}
        out[device] = m.loss_and_grads(ids, lora=lora, lora_params=params)
    (lc, gc), (lg, gg) = out["cpu"], out["cuda"]
    assert lg == pytest.approx(lc, rel=1e-4)
    for name in gc:
        err = np.abs(gg[name] - gc[name]).max() / (np.abs(gc[name]).max() + 1e-12)
        assert err < 1e-3, f"{name}: {err:.2e}"
