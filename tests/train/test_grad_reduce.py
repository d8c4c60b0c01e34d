"""Gradients reduced during the backward (each rank's grad_reduce ops hand a layer's finished
accumulators to its reducer thread, surogate/compile/grad_reduce.py) against the bucketed
reduction after the backward (what ranks in processes still run), on tiny random Qwen3 models
(f32, CPU rank threads).

What must hold, and how exactly:
- Bit for bit, at every ZeRO level, LoRA and full fine-tuning, with gradient accumulation and
  recompute, for sft, dpo and distill, with whole accumulators on every rank (plain DP, ZeRO-1,
  ZeRO-2/3 without sharding): the threads backend sums each element over the ranks in rank order
  in f32 whatever the bucket it travels in, and each accumulator is reduced once per step, in the
  rank's last backward, when it holds every micro-batch: the bucketed path's numbers.
- ZeRO-2/3 with sharded gradients (a rank keeps its own layers' accumulators, the others staged
  and reduced to their owners every backward): bit for bit without accumulation (the owner's
  accumulator holds its own micro-batch exactly, then the ranks' sum in rank order); with it
  within f32 reduction order (test_data_parallel.py's bounds, rtol 1e-5 on losses and norms,
  atol 1e-4 on the weights after 3 full fine-tuning steps at lr 2e-2; measured 3e-5, AdamW
  keeping a near-zero gradient's error relative): the owner adds sum_r(g_rm) per micro-batch
  where the bucketed path adds sum_r(sum_m g_rm).
- Each rank's gradient memory is its own layers' accumulators, the ones outside the layers and
  two staging buffers (of one layer each), against every accumulator whole.
- The reductions overlap the backward: the last layer's has begun before the first layer's
  backward is done.
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

# Gradient sharding with accumulation against whole accumulators (the module header says why).
SHARDED_RTOL, SHARDED_ATOL = 1e-5, 1e-4  # (test_data_parallel.py's f32 reduction-order bounds)


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


def assert_same(a, b, exact: bool = True) -> None:
    (ra, ta), (rb, tb) = a, b
    wa, wb = weights(ta), weights(tb)
    assert wa.keys() == wb.keys()
    for key in ("loss", "grad_norm"):
        if exact:
            assert [r[key] for r in ra] == [r[key] for r in rb]
        else:
            np.testing.assert_allclose([r[key] for r in ra], [r[key] for r in rb], rtol=SHARDED_RTOL)
    for n in wa:
        if exact:
            np.testing.assert_array_equal(wa[n], wb[n], err_msg=n)
        else:
            np.testing.assert_allclose(wa[n], wb[n], rtol=0, atol=SHARDED_ATOL, err_msg=n)


@pytest.fixture
def whole(monkeypatch):
    """ZeRO-2/3 with whole accumulators on every rank (as GRPO runs): reduced once, in the last backward."""
    monkeypatch.setattr(Trainer, "SHARD_GRADS", False)


@pytest.mark.parametrize("zero_level,lora,gpus,accumulate,shard", [
    (0, True, 2, 2, False), (1, False, 2, 2, False), (2, True, 3, 2, False), (3, False, 2, 2, False),
    (2, True, 3, 1, True), (2, False, 2, 1, True), (3, True, 2, 1, True), (3, False, 3, 1, True)])
def test_reduced_during_the_backward_is_the_bucketed_path_bit_for_bit(files, tmp_path, monkeypatch, zero_level,
                                                                      lora, gpus, accumulate, shard):
    kw = dict(zero_level=zero_level, lora=lora, gpus=gpus, gradient_accumulation_steps=accumulate, recompute=True,
              per_device_train_batch_size=1)
    with monkeypatch.context() as m:
        m.setattr(Trainer, "SHARD_GRADS", shard)
        overlap = train("sft", files, tmp_path / "overlap", **kw)
    tr = overlap[1]
    assert len(tr.dp.reducers) == gpus and tr.exe.listing().count("grad_reduce") == len(tr.grad_groups)
    assert bool(tr.grad_staging) == shard
    assert_same(overlap, bucketed(monkeypatch, "sft", files, tmp_path / "bucketed", **kw))


@pytest.mark.parametrize("zero_level,lora,gpus", [(2, True, 3), (2, False, 2), (3, False, 3)])
def test_sharded_gradients_accumulate_within_a_rounding(files, tmp_path, monkeypatch, zero_level, lora, gpus):
    kw = dict(zero_level=zero_level, lora=lora, gpus=gpus, gradient_accumulation_steps=3, recompute=True,
              per_device_train_batch_size=1)
    assert_same(train("sft", files, tmp_path / "sharded", **kw),
                bucketed(monkeypatch, "sft", files, tmp_path / "bucketed", **kw), exact=False)


@pytest.mark.parametrize("kind,zero_level", [("dpo", 2), ("distill", 1), ("distill", 3)])
def test_dpo_and_distill_too(files, tmp_path, monkeypatch, kind, zero_level):
    kw = dict(zero_level=zero_level, max_steps=2)
    assert_same(train(kind, files, tmp_path / "overlap", **kw),
                bucketed(monkeypatch, kind, files, tmp_path / "bucketed", **kw), exact=zero_level < 2)


def test_the_rank_keeps_the_accumulators_it_owns_and_two_staging_buffers(files, tmp_path, monkeypatch):
    kw = dict(model="deep", zero_level=2, lora=False, gpus=4, max_steps=1)
    tr = build("sft", files, tmp_path / "sharded", **kw)
    whole = sum(a.nbytes for a in tr.grads.values())  # every accumulator at its size
    layers = sum(a.nbytes for n, a in tr.grads.items() if n.startswith("grad.layers."))
    for t in tr.dp.ranks:
        got = t.grad_bytes()
        owned = sum(a.nbytes for n, a in t.grads.items() if n.startswith("grad.layers.") and tr.owners[n[5:]] == t.rank)
        assert got["accumulators"] == whole - layers + owned  # (outside the layers: whole on every rank)
        assert owned < 0.4 * layers and got["staging"] <= 2 * max(
            sum(a.nbytes for n, a in t.grads.items() if n.startswith(f"grad.layers.{i}.")) for i in range(8)) + 4096
        assert got["accumulators"] + got["staging"] < whole - 0.4 * layers
    with monkeypatch.context() as m:
        m.setattr(Trainer, "SHARD_GRADS", False)
        w = build("sft", files, tmp_path / "whole", **kw)
    assert all(t.grad_bytes() == {"accumulators": whole, "staging": 0} for t in w.dp.ranks)


def test_a_rank_that_arms_no_backward_reduces_after_it(files, tmp_path, monkeypatch, whole):
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
