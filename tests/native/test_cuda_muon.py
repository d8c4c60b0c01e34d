"""muon_momentum and muon_update on the GPU against the CPU backend (NorMuon and Muon, both
orientations, a row part of a fused matrix, bf16 params with f32 masters), and a NorMuon
training run on the GPU against the same run on the CPU. Skipped without a CUDA build and a GPU."""

import ml_dtypes
import numpy as np
import pytest

from surogate import _native

pytestmark = pytest.mark.cuda

HAS_CUDA = bool(_native.build_info()["cuda"]) and len(_native.cuda_devices()) > 0
if not HAS_CUDA:
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)

COVERS = ("muon_momentum", "muon_update")
HP = np.array([0.02, 0.95, 0.9, 1e-8, 0.1, 3, 0.5, 0], np.float32)


def call(device, name, ins, outs, attrs):
    """Run op on device over copies of the arrays; inputs updated in place come back too (as numpy)."""
    ti = [None if x is None else _native.tensor(np.array(x, copy=True)).to(device) for x in ins]
    to = [_native.tensor(np.array(x, copy=True)).to(device) for x in outs]
    _native.call_op(name, ti, to, attrs)
    return [None if t is None else t.to("cpu").numpy() for t in ti], [t.to("cpu").numpy() for t in to]


@pytest.mark.parametrize("shape,row0,rows", [((96, 64), 0, 96), ((64, 160), 0, 64), ((256, 64), 128, 128)])
@pytest.mark.parametrize("nesterov", [False, True])
def test_muon_momentum_matches_the_cpu(shape, row0, rows, nesterov):
    rng = np.random.default_rng(0)
    g = rng.standard_normal(shape).astype(np.float32)
    m = rng.standard_normal(shape).astype(np.float32) * 0.1
    t = rows > shape[1]
    x = np.zeros((shape[1], rows) if t else (rows, shape[1]), np.float32)
    attrs = {"nesterov": nesterov, "transpose": t, "row0": row0, "rows": rows}
    norm = np.array([3.0], np.float32)
    (_, _, _, mc), (xc,) = call("cpu", "muon_momentum", [HP, norm, g, m], [x], attrs)
    (_, _, _, mg), (xg,) = call("cuda", "muon_momentum", [HP, norm, g, m], [x], attrs)
    assert np.array_equal(mc, mg)  # elementwise, _rn intrinsics: the same bits
    np.testing.assert_allclose(xg, xc, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("normuon", [True, False])
@pytest.mark.parametrize("cautious", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_muon_update_matches_the_cpu(normuon, cautious, dtype):
    rng = np.random.default_rng(1)
    R, C, row0, rows = 256, 64, 128, 128  # the second part of a fused [256, 64] matrix, transposed o
    w = (rng.standard_normal((R, C)) * 0.05).astype(np.float32)
    o = (rng.standard_normal((C, rows)) * 0.1).astype(np.float32)
    v = np.abs(rng.standard_normal(R)).astype(np.float32) * 0.01
    master = w.copy() if dtype == "bfloat16" else None
    p = w.astype(ml_dtypes.bfloat16) if dtype == "bfloat16" else w.copy()
    attrs = {"transpose": True, "cautious": cautious, "scale": 1.0, "row0": row0, "rows": rows}
    ins = [HP, o, p, master, v if normuon else None]
    (_, _, pc, mc, vc), _ = call("cpu", "muon_update", ins, [], attrs)
    (_, _, pg, mg, vg), _ = call("cuda", "muon_update", ins, [], attrs)
    if normuon:
        np.testing.assert_allclose(vg, vc, rtol=1e-6)
    ref, got = (mc, mg) if master is not None else (pc, pg)
    np.testing.assert_allclose(got.astype(np.float32), ref.astype(np.float32), rtol=1e-5, atol=1e-7)


def test_normuon_training_on_the_gpu_tracks_the_cpu(tmp_path):
    from sgtest.qa import sft_config, step_losses, write_qa
    from sgtest.tiny_models import make_model

    from surogate.train.trainer import Trainer

    data = write_qa(tmp_path / "qa.jsonl")
    base = make_model("llama", tmp_path / "base", seed=5)
    for device in ("cpu", "cuda"):
        Trainer(sft_config(base, data, tmp_path / device, optimizer="normuon", device=device, sequence_len=128,
                           lora=False, learning_rate=5e-3)).train()
    cpu, gpu = step_losses(tmp_path / "cpu"), step_losses(tmp_path / "cuda")
    np.testing.assert_allclose(gpu, cpu, rtol=2e-3)
    assert gpu[-1] < gpu[0]
