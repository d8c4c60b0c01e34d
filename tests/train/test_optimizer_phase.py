"""The optimizer step is a phase the compiler places: its ops come after the last gradient
write, its buffers are the compiler's (state bound to the optimizer's own arrays, the grad norm
planned in the arena), and the trainer runs phases by name, never instruction indices."""

from __future__ import annotations

import inspect
import re

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import surogate.train.trainer as trainer_module  # noqa: E402
from surogate.compile import Executable  # noqa: E402
from surogate.compile.planner import ALIGN  # noqa: E402
from surogate.errors import InvalidArgumentError  # noqa: E402
from surogate.train.optimizer import AdamW, AdamWParams  # noqa: E402
from surogate.train.trainer import MICRO_BATCH, Trainer  # noqa: E402
from tests.train import test_trainer as tt  # noqa: E402

base, data, config = tt.base, tt.data, tt.config


def writes(ins) -> list[str]:
    """Buffers an instruction writes: its outputs, and for the in-place optimizer ops every input
    but hp and the norm (kernels_native/cpu/optimizer.cpp)."""
    out = [b.root().name for b in ins.outputs if b is not None]
    if ins.op in ("adamw", "adamw8"):
        out += [b.root().name for b in ins.inputs[2:] if b is not None]
    return out


@pytest.mark.parametrize("optimizer", ["adamw", "adamw_8bit"])
def test_the_optimizer_section_is_placed_by_the_compiler(base, data, tmp_path, optimizer):
    tr = Trainer(config(base, data, tmp_path, optimizer=optimizer, max_steps=1))
    exe, opt = tr.exe, tr.opt
    lo = exe.lowered
    assert list(exe.phases) == ["forward", "backward", "optimizer"]
    (f0, f1), (b0, b1), (o0, o1) = exe.phases.values()
    assert f0 == 0 and f1 == b0 and b1 == o0 and o1 == len(lo.instrs) == exe.program.num_instrs
    ops = [i.op for i in lo.instrs[o0:o1]]
    op = "adamw" if optimizer == "adamw" else "adamw8"
    assert ops == ["global_norm", op] + ["fill"] * len(opt.names)
    # After the last gradient write of the micro-batch; the fills zero every accumulator.
    grads = {"grad." + n for n in opt.names}
    last_grad_write = max(i for i, ins in enumerate(lo.instrs[:o0]) if grads & set(writes(ins)))
    assert last_grad_write < o0
    assert {w for ins in lo.instrs[o0 + 2:] for w in writes(ins)} == grads
    assert not any(set(writes(ins)) & set(opt.names) for ins in lo.instrs[:o0])  # params change only here
    # Its buffers are the compiler's: state external and bound to the optimizer's own arrays ...
    for key, arr in opt._buffers():
        assert lo.by_value[key].kind == "external" and exe.bound(key) is arr
    assert exe.bound("optimizer.hp") is opt.hp_buf
    # ... and the grad norm an internal buffer planned in the arena, kept apart from the loss.
    norm, loss = exe.buf("optimizer.grad_norm"), exe.buf("loss").root()
    assert norm.kind == "internal" and norm.pinned and 0 <= norm.arena_offset < lo.arena_bytes
    assert not (norm.arena_offset < loss.arena_offset + loss.nbytes and loss.arena_offset < norm.arena_offset + ALIGN)
    tr.train()
    assert exe.program.arena_bytes == lo.arena_bytes  # the native arena is the compiler's plan
    assert float(exe.read("optimizer.grad_norm")[0]) > 0  # kept: the fills after it did not reuse its bytes


def test_the_trainer_runs_phases_by_name_and_never_instruction_indices(base, data, tmp_path, monkeypatch):
    tr = Trainer(config(base, data, tmp_path, max_steps=2))
    calls = []
    run = Executable.run

    def record(exe, *phases):
        if exe is tr.exe:
            calls.append(phases)
        return run(exe, *phases)

    monkeypatch.setattr(Executable, "run", record)
    tr.train()
    assert MICRO_BATCH == ("forward", "backward")
    assert calls == [MICRO_BATCH, MICRO_BATCH, ("optimizer",)] * 2  # gradient_accumulation_steps 2
    # The trainer reaches the Program only through named phases.
    source = inspect.getsource(trainer_module)
    assert not re.search(r"\.program\b|\.begin\b|\.end\b|num_instrs", source)


def test_a_second_optimizer_over_the_same_executable_reuses_the_phase(base, data, tmp_path):
    tr = Trainer(config(base, data, tmp_path, max_steps=1))
    exe = tr.exe
    n = exe.program.num_instrs
    again = AdamW(exe, tr.trainable, AdamWParams(lr=1e-3))
    assert exe.program.num_instrs == n
    name = again.names[0]
    assert exe.bound(f"optimizer.m.{name}") is again.m[name]  # the new owner's state is what runs
    g0 = tr.grads["grad." + name]
    g0[...] = 1.0
    before = tr.trainable[name].copy()
    again.apply(1e-3)
    assert again.m[name].any() and not tr.opt.m[name].any()
    assert not np.array_equal(tr.trainable[name], before) and not g0.any()  # updated, accumulators zeroed
    with pytest.raises(InvalidArgumentError, match="built differently"):
        AdamW(exe, tr.trainable, AdamWParams(), bits=8)
