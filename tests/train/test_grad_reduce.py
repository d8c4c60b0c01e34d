"""Gradients reduced during the backward (each rank's grad_reduce ops hand a layer's finished
accumulators to its reducer thread, surogate/compile/grad_reduce.py) against the bucketed
reduction after the backward (what ranks in processes still run), on tiny random Qwen3 models
(f32, CPU rank threads).

What must hold, and how exactly: bit for bit, at every ZeRO level, LoRA and full fine-tuning,
with gradient accumulation and recompute, for sft, dpo and distill. The threads backend sums
each element over the ranks in rank order in f32 whatever the bucket it travels in, and each
accumulator is reduced once per step, in the rank's last backward, when it holds every
micro-batch: the bucketed path's numbers. And the reductions do overlap the backward: the last
layer's has begun before the first layer's backward is done.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")

from sgtest.distill import distill_config  # noqa: E402
from sgtest.preference import dpo_config, write_pairs  # noqa: E402
from sgtest.qa import sft_config, step_records, write_qa  # noqa: E402
from sgtest.tiny_models import make_qwen3  # noqa: E402
from surogate.train.distill import DistillTrainer  # noqa: E402
from surogate.train.dpo import DPOTrainer  # noqa: E402
from surogate.train.trainer import Trainer  # noqa: E402


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("gradrs")
    return {"qwen3": make_qwen3(root / "qwen3", seed=11, initializer_range=0.2),
            "deep": make_qwen3(root / "deep", seed=5, initializer_range=0.2, num_hidden_layers=8),
            "teacher": make_qwen3(root / "teacher", seed=29, initializer_range=0.2),
            "qa": write_qa(root / "qa.jsonl"), "pairs": write_pairs(root / "pairs.jsonl")}


def build(kind: str, files, out, **kw):
    kw = {"device": "cpu", "max_steps": 3, "gpus": 2, **kw}
    if kind == "dpo":
        return DPOTrainer(dpo_config(files["qwen3"], files["pairs"], out, **kw))
    if kind == "distill":
        return DistillTrainer(distill_config(files["qwen3"], files["teacher"], files["qa"], out, **kw))
    return Trainer(sft_config(files[kw.pop("model", "qwen3")], files["qa"], out, **kw))


def train(kind: str, files, out, after: int = 0, **kw):
    """``after``: how many times a rank reduces its gradients after its backward (no backward armed)."""
    tr = build(kind, files, out, **kw)
    late = []
    fallback = tr.dp._reduce_groups if tr.dp.reducers else None
    tr.dp._reduce_groups = lambda r: (late.append(r), fallback(r))
    tr.train()
    assert len(late) == after, late
    return step_records(out), tr


def bucketed(monkeypatch, kind, files, out, **kw):
    """The run with the reductions after the backward, in buckets (no grad_reduce pass)."""
    with monkeypatch.context() as m:
        def rewrite(self, z):
            self.grad_groups, self.reducer = None, None
            return z.rewrite if z else None

        m.setattr(Trainer, "_rewrite", rewrite)
        records, tr = train(kind, files, out, **kw)
    assert not tr.dp.reducers and "grad_reduce" not in tr.exe.listing()
    return records, tr


def weights(tr) -> dict[str, np.ndarray]:
    return {n: np.asarray(a) for n, a in tr._trainable_state().items()}


def assert_same(a, b) -> None:
    (ra, ta), (rb, tb) = a, b
    assert [r["loss"] for r in ra] == [r["loss"] for r in rb]
    assert [r["grad_norm"] for r in ra] == [r["grad_norm"] for r in rb]
    wa, wb = weights(ta), weights(tb)
    assert wa.keys() == wb.keys()
    for n in wa:
        np.testing.assert_array_equal(wa[n], wb[n], err_msg=n)


@pytest.mark.parametrize("zero_level,lora,gpus", [(0, True, 2), (1, False, 2), (2, True, 3), (2, False, 2),
                                                  (3, True, 2), (3, False, 3)])
def test_reduced_during_the_backward_is_the_bucketed_path_bit_for_bit(files, tmp_path, monkeypatch, zero_level,
                                                                      lora, gpus):
    kw = dict(zero_level=zero_level, lora=lora, gpus=gpus, gradient_accumulation_steps=2, recompute=True,
              per_device_train_batch_size=1)
    overlap = train("sft", files, tmp_path / "overlap", **kw)
    tr = overlap[1]
    assert len(tr.dp.reducers) == gpus and tr.exe.listing().count("grad_reduce") == len(tr.grad_groups)
    assert_same(overlap, bucketed(monkeypatch, "sft", files, tmp_path / "bucketed", **kw))


@pytest.mark.parametrize("kind,zero_level", [("dpo", 2), ("distill", 1), ("distill", 3)])
def test_dpo_and_distill_too(files, tmp_path, monkeypatch, kind, zero_level):
    kw = dict(zero_level=zero_level, max_steps=2)
    assert_same(train(kind, files, tmp_path / "overlap", **kw),
                bucketed(monkeypatch, kind, files, tmp_path / "bucketed", **kw))


def test_a_rank_that_arms_no_backward_reduces_after_it(files, tmp_path, monkeypatch):
    """(GRPO's rank without prompts): its reductions meet the others' from their backward."""
    kw = dict(zero_level=2, lora=False, gradient_accumulation_steps=2)
    with monkeypatch.context() as m:
        arm = Trainer._last_backward
        m.setattr(Trainer, "_last_backward", lambda self, last: arm(self, last and self.rank == 0))
        mixed = train("sft", files, tmp_path / "mixed", after=3, **kw)  # (rank 1, each of 3 steps)
    assert_same(mixed, bucketed(monkeypatch, "sft", files, tmp_path / "bucketed", **kw))


def test_the_last_layer_is_reducing_before_the_first_layer_is_done(files, tmp_path):
    L = 8
    tr = build("sft", files, tmp_path / "run", model="deep", max_steps=1, gradient_accumulation_steps=1,
               per_device_train_batch_size=2, lora=False)
    for red in tr.dp.reducers:
        red.record()
    tr.train()
    for r, red in enumerate(tr.dp.reducers):
        ev = red.events()
        starts = [t for k, t, _ in ev if k == "start"]
        layers = [t for t in starts if t >= 0]
        assert layers == list(range(L - 1, -1, -1)), (r, starts)  # from the last layer down, as backward goes
        at = {(k, t): ns for k, t, ns in ev}
        # layer L-1's sum had begun (every rank had handed it over) before this rank handed over
        # layer 0's: it ran while layers L-2 .. 0 computed their backward
        assert at[("begin", L - 1)] < at[("start", 0)], (r, ev)
        assert at[("end", L - 1)] < at[("wait", -1)]
