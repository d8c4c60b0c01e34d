"""offload_optimizer: AdamW's step as a host Program of its own (HostAdamW) over the arrays the
training Program is bound to. On the CPU backend the trainer keeps AdamW (there is nothing to
offload); here HostAdamW is forced on the CPU, which runs its whole path except the copies
(pull / push are no-ops on the CPU: tests/train/test_cuda_offload.py checks them on a GPU):
the loss curve is the in-Program optimizer's bit for bit, for adamw and adamw_8bit, LoRA and
full fine-tuning, and across a resume."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("torch")

from sgtest.qa import interrupt_after, sft_config, step_losses, step_records, write_qa  # noqa: E402
from sgtest.tiny_models import make_qwen3  # noqa: E402
from surogate.train.offload import ZERO_PHASE, HostAdamW  # noqa: E402
from surogate.train.optimizer import PHASE, AdamW  # noqa: E402
from surogate.train.trainer import Trainer  # noqa: E402


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_qwen3(tmp_path_factory.mktemp("base"), seed=11, initializer_range=0.2)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_qa(tmp_path_factory.mktemp("data") / "qa.jsonl")


def host_trainer(cfg) -> Trainer:
    t = Trainer.__new__(Trainer)
    t._optimizer_class = lambda: HostAdamW
    Trainer.__init__(t, cfg)
    return t


@pytest.mark.parametrize("kw", [{}, {"optimizer": "adamw_8bit"}, {"lora": False, "learning_rate": 1e-3}])
def test_the_host_step_gives_the_in_program_curve_bit_for_bit(base, data, tmp_path, kw):
    ref = Trainer(sft_config(base, data, tmp_path / "ref", **kw))
    assert type(ref.opt) is AdamW and PHASE in ref.exe.phases
    ref.train()
    t = host_trainer(sft_config(base, data, tmp_path / "host", **kw))
    assert isinstance(t.opt, HostAdamW) and PHASE not in t.exe.phases and ZERO_PHASE in t.exe.phases
    assert t.opt.prog is not t.exe and t.opt.prog.device == "cpu"
    t.train()
    assert step_losses(tmp_path / "host") == step_losses(tmp_path / "ref")


def test_a_resumed_host_step_run_continues_the_curve(base, data, tmp_path):
    full = host_trainer(sft_config(base, data, tmp_path / "full", save_steps=3))
    full.train()
    cut = host_trainer(sft_config(base, data, tmp_path / "cut", save_steps=3))
    interrupt_after(cut, 4)
    with pytest.raises(KeyboardInterrupt):
        cut.train()
    host_trainer(sft_config(base, data, tmp_path / "cut", save_steps=3, resume_from_checkpoint=True)).train()
    by_step = {r["step"]: r["loss"] for r in step_records(tmp_path / "cut")}
    assert [by_step[s] for s in range(1, 7)] == step_losses(tmp_path / "full")


def test_offload_optimizer_on_the_cpu_backend_keeps_adamw_and_says_so(base, data, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="surogate.train.trainer"):
        t = Trainer(sft_config(base, data, tmp_path / "run", offload_optimizer=True, device="cpu"))
    assert type(t.opt) is AdamW
    assert "offload_optimizer" in caplog.text and "nothing to offload" in caplog.text
