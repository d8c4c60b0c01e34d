"""offload_optimizer on the GPU: the gradients come down, the CPU backend's AdamW steps the host
state, the weights go up. The loss curve is the in-Program (CUDA) optimizer's, the optimizer
state takes no device memory, and a resumed run continues the curve. Skipped without a CUDA
build and a GPU; run on the lent H200 before resolving."""

from __future__ import annotations

import pytest

from surogate import _native

pytestmark = pytest.mark.cuda
if not (_native.build_info()["cuda"] and _native.cuda_devices()):
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)

from sgtest.qa import interrupt_after, sft_config, step_losses, step_records, write_qa  # noqa: E402
from sgtest.tiny_models import make_qwen3  # noqa: E402
from surogate.train.offload import HostAdamW  # noqa: E402
from surogate.train.optimizer import AdamW  # noqa: E402
from surogate.train.trainer import Trainer  # noqa: E402


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_qwen3(tmp_path_factory.mktemp("base"), seed=11, initializer_range=0.2, head_dim=64)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_qa(tmp_path_factory.mktemp("data") / "qa.jsonl")


def device_bytes_of(make) -> tuple[Trainer, int]:
    before = _native.allocator_stats("cuda")["allocated_bytes"]
    t = make()
    return t, _native.allocator_stats("cuda")["allocated_bytes"] - before


@pytest.mark.parametrize("kw", [{}, {"optimizer": "adamw_8bit"}, {"lora": False, "learning_rate": 1e-3,
                                                                  "recipe": "bf16"}])
def test_offloaded_optimizer_follows_the_cuda_curve_and_holds_no_device_state(base, data, tmp_path, kw):
    ref, ref_bytes = device_bytes_of(lambda: Trainer(sft_config(base, data, tmp_path / "ref", device="cuda", **kw)))
    assert type(ref.opt) is AdamW
    ref.train()
    host, host_bytes = device_bytes_of(lambda: Trainer(sft_config(base, data, tmp_path / "host", device="cuda",
                                                                  offload_optimizer=True, **kw)))
    assert isinstance(host.opt, HostAdamW)
    state = sum(a.nbytes for _, a in host.opt._buffers())  # moments, scales, f32 masters
    assert ref_bytes - host_bytes >= 0.9 * state, (ref_bytes, host_bytes, state)
    host.train()
    # The CPU's adamw / adamw8 are bit-identical to the CUDA ones (tests/native): so are the curves.
    assert step_losses(tmp_path / "host") == pytest.approx(step_losses(tmp_path / "ref"), rel=1e-6)


def test_a_resumed_offloaded_run_continues_the_curve(base, data, tmp_path):
    cfg = dict(device="cuda", offload_optimizer=True, save_steps=3)
    Trainer(sft_config(base, data, tmp_path / "full", **cfg)).train()
    cut = Trainer(sft_config(base, data, tmp_path / "cut", **cfg))
    interrupt_after(cut, 4)
    with pytest.raises(KeyboardInterrupt):
        cut.train()
    Trainer(sft_config(base, data, tmp_path / "cut", resume_from_checkpoint=True, **cfg)).train()
    by_step = {r["step"]: r["loss"] for r in step_records(tmp_path / "cut")}
    assert [by_step[s] for s in range(1, 7)] == step_losses(tmp_path / "full")
