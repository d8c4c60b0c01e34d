"""Data parallel DPO, distillation and GRPO on the CPU backend (``device: cpu``, ``gpus: 2``: two
rank threads) against one-rank runs with gradient accumulation over the same examples, on a tiny
random Qwen3 (f32). The step path they share with sft (Trainer._step_with_metrics) is tested for
sft in test_data_parallel.py; here, what each trainer adds to it.

What must hold, and how exactly (2 ranks x b = 1 rank x b x 2 accumulation steps):
- DPO under LoRA, bit for bit (losses, TRL's reward metrics, grad norms, the adapter): each
  rank's micro-batch is the one-rank run's (`PreferencePairs.split` cuts the pair slots), each
  one backward whose gradients add in the one-rank order, the pair losses reduced in that order.
- GRPO under LoRA at temperature 0.7 with two passes per step, bit for bit: each rank's engine
  samples its prompts with the seeds one rank gives them (their place in the step), the
  advantages come from all the step's rewards, and the ratio's denominator is the trainer's own
  first pass.
- GRPO at temperature 1: the same completions and rewards exactly; the ratio's denominator is
  then the sampler's log-probs, and an engine's f32 log-probs depend on which sequences share its
  steps (each rank's engine runs half of them), so the loss agrees within 2e-6 absolute (a sum of
  +-A r terms that nearly cancel), kl and grad_norm within rel 1e-4 (test_grpo's resume bounds),
  the adapter within 1e-4 (measured, 4 steps at lr 1e-2: loss 2e-7, kl rel 2e-6, adapter 1.2e-5).
- Distillation: a micro-batch is top_k + 1 forward + backward passes; one rank adds micro-batch
  1's passes one by one onto micro-batch 0's sum, two ranks add two sums: f32 order, so the
  losses agree within rel 1e-5 and the adapter within 1e-4 (measured over 6 steps: 1e-9, 6e-6).
- Full fine-tuning (sft's too): within the same bounds (the GEMMs accumulate full weight
  gradients in another order; DPO's weights: 3e-7 over 6 steps). GRPO's full fine-tune runs at
  temperature 0.7: at 1, the sampler's f32 noise in the ratio lets AdamW's first steps move a
  weight of near-zero gradient by about +-lr either way (one element in 16384 differed by 3.5e-4
  at lr 2e-3), a bound about nothing; temperature 1 is the LoRA case above.
- The ranks stay bit-identical; rank 0 writes one step line per step; a 2-rank checkpoint
  resumes on 2 ranks bit for bit and on 1 rank of 2b rows within the bounds above.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")

from sgtest.distill import distill_config  # noqa: E402
from sgtest.grpo import grpo_config, write_prompts  # noqa: E402
from sgtest.preference import dpo_config, write_pairs  # noqa: E402
from sgtest.qa import step_records, write_qa  # noqa: E402
from sgtest.tiny_models import make_qwen3  # noqa: E402
from surogate import _native  # noqa: E402
from surogate.config import load_config  # noqa: E402
from surogate.errors import ConfigError  # noqa: E402
from surogate.train.distill import DistillTrainer  # noqa: E402
from surogate.train.distill_capture import capture  # noqa: E402
from surogate.train.dpo import DPOTrainer  # noqa: E402
from surogate.train.grpo import GRPOTrainer  # noqa: E402

IGNORED = {"type", "time", "step_time", "tokens_per_second", "elapsed", "rollout_time",  # wall clock
           "rollout_tokens_per_second", "start_step"}  # (and where a resumed run started)
WEIGHT_ATOL = 1e-4
LOSS = {"rel": 1e-5, "abs": 1e-7}
GRPO_T1 = {"loss": {"abs": 2e-6}, "kl": {"rel": 1e-4, "abs": 1e-7}, "grad_norm": {"rel": 1e-4},
           "sampling/sampling_logp_difference/mean": {"abs": 1e-5},
           "sampling/sampling_logp_difference/max": {"abs": 1e-5}}  # (the rest exact: the same completions)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("dp")
    return {"base": make_qwen3(root / "base", seed=11, initializer_range=0.2),
            "teacher": make_qwen3(root / "teacher", seed=29, initializer_range=0.2),
            "pairs": write_pairs(root / "pairs.jsonl"), "qa": write_qa(root / "qa.jsonl"),
            "prompts": write_prompts(root / "prompts.jsonl"), "root": root}


def make(kind: str, files: dict, out: Path, **kw):
    """The kind's trainer on the tiny model; 2 micro-batches of b = 2 per step unless kw says."""
    kw = {"device": "cpu", "max_steps": 3, **kw}
    if kind == "dpo":
        return DPOTrainer(dpo_config(files["base"], files["pairs"], out, **kw))
    if kind == "distill":
        return DistillTrainer(distill_config(files["base"], files["teacher"], files["qa"], out, **kw))
    return GRPOTrainer(grpo_config(files["base"], files["prompts"], out, **kw))


def weights(tr) -> dict[str, np.ndarray]:
    return {n: np.asarray(a, np.float64) for n, a in tr._trainable_state().items()}


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float(np.abs(a[n] - b[n]).max()) for n in a)


def assert_ranks_identical(tr) -> None:
    for rep in tr.dp.ranks[1:]:
        for n, a in tr.trainable.items():
            np.testing.assert_array_equal(rep.trainable[n], a, err_msg=f"rank {rep.rank}: {n}")


def assert_steps_match(one: list[dict], two: list[dict], tol) -> None:
    """The step lines' values equal, or within ``tol`` (None: exact for every key; a dict:
    approx keywords for every float key; a dict of keys: those keys only)."""
    assert [r["step"] for r in one] == [r["step"] for r in two]
    for a, b in zip(one, two):
        assert set(a) == set(b)
        for k in set(a) - IGNORED:
            bound = tol if tol is None or "rel" in tol or "abs" in tol else tol.get(k)
            if bound is None or not isinstance(a[k], float):
                assert a[k] == b[k], (a["step"], k)
            else:
                assert b[k] == pytest.approx(a[k], **bound), (a["step"], k)


CASES = {  # id: (kind, keys of both runs, the step lines' bound (None: bit for bit), weights exact)
    "dpo-lora": ("dpo", {}, None, True),
    "dpo-full": ("dpo", {"lora": False, "learning_rate": 1e-3}, LOSS, False),
    "distill-lora": ("distill", {}, LOSS, False),
    "grpo-lora-t0.7": ("grpo", {"temperature": 0.7, "num_iterations": 2}, None, True),
    "grpo-lora-t1": ("grpo", {}, GRPO_T1, False),
    "grpo-full-t0.7": ("grpo", {"lora": False, "learning_rate": 2e-3, "temperature": 0.7}, GRPO_T1, False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_two_ranks_are_one_rank_accumulating_the_same_examples(files, tmp_path, case):
    kind, kw, tol, exact = CASES[case]
    one = make(kind, files, tmp_path / "one", gradient_accumulation_steps=2, **kw)
    one.train()
    two = make(kind, files, tmp_path / "two", gradient_accumulation_steps=1, gpus=2, **kw)
    two.train()
    assert two.world == 2 and two.dp.ranks[1].exe is not two.exe
    assert_steps_match(step_records(tmp_path / "one"), step_records(tmp_path / "two"), tol)
    diff = max_diff(weights(one), weights(two))
    assert diff == 0.0 if exact else diff < WEIGHT_ATOL, diff
    assert_ranks_identical(two)
    records = [json.loads(x) for x in open(tmp_path / "two" / "metrics.jsonl")]
    assert [r["step"] for r in records if r["type"] == "step"] == [1, 2, 3]  # rank 0's lines only
    assert next(r for r in records if r["type"] == "start")["ranks"] == 2
    if kind == "grpo":  # each rank sampled its own prompts with its own engine, from its own adapter
        r1 = two.dp.ranks[1]
        assert r1.runner is not two.runner and r1.client is None and two.client is None  # (closed at the end)
        if kw.get("lora", True):
            _, host, _ = r1.runner.adapters[0]
            assert all(host[n] is r1.trainable[n] for n in r1.trainable)
        last = next(two.train_data.iterator(4, position=(1, 0)))  # step 3's prompts (8 an epoch, 4 a step)
        assert [u.sample for u in r1._units[0][::4]] == last[2:]


def test_a_grpo_rank_left_without_prompts_still_joins_the_step(files, tmp_path):
    """5 prompts, 4 a step: the epoch's second step has one, rank 0's; rank 1 samples nothing and
    adds no gradient, and the step is the one-rank step over the same prompts."""
    data = write_prompts(tmp_path / "five.jsonl")
    data.write_text("".join(data.read_text().splitlines(keepends=True)[:5]))
    kw = {"max_steps": 2, "gradient_accumulation_steps": 1, "temperature": 0.7}
    GRPOTrainer(grpo_config(files["base"], data, tmp_path / "one", device="cpu", per_device_train_batch_size=4,
                            **kw)).train()
    two = GRPOTrainer(grpo_config(files["base"], data, tmp_path / "two", device="cpu", gpus=2, **kw))
    two.train()
    assert two.dp.ranks[1]._units == [[]] and len(two._units[0]) == 4  # step 2: one prompt's group, on rank 0
    one, two = step_records(tmp_path / "one"), step_records(tmp_path / "two")
    assert_steps_match(one, two, GRPO_T1)  # (1 rank of 4 prompts vs 2 of 2: another reduction order)


def test_distillation_from_a_capture_splits_by_rows(files, tmp_path):
    """The captured teacher's top-k is found by row content, so each rank's rows find theirs."""
    folder = tmp_path / "capture"
    capture(distill_config(files["base"], files["teacher"], files["qa"], tmp_path / "c", max_steps=3,
                           distillation={"teacher_logprobs": str(folder)}), log=lambda *_: None)
    kw = {"distillation": {"teacher_logprobs": str(folder)}}
    make("distill", files, tmp_path / "live", gradient_accumulation_steps=1, gpus=2).train()
    tr = make("distill", files, tmp_path / "stored", gradient_accumulation_steps=1, gpus=2, **kw)
    tr.train()
    assert tr.dp.ranks[1].teacher_exe is None and tr.dp.ranks[1].captured is tr.captured
    live, stored = step_records(tmp_path / "live"), step_records(tmp_path / "stored")
    for a, b in zip(live, stored):  # (the capture holds f32 log-probs: the loss within their rounding)
        for k in ("loss", "kl", "ce"):
            assert b[k] == pytest.approx(a[k], rel=1e-5), (a["step"], k)


@pytest.mark.parametrize("kind", ["dpo", "distill", "grpo"])
def test_a_two_rank_checkpoint_resumes_on_two_ranks_and_on_one(files, tmp_path, kind):
    kw = {"max_steps": 4, "save_steps": 2, "gradient_accumulation_steps": 1}
    make(kind, files, tmp_path / "whole", gpus=2, **kw).train()
    whole = step_records(tmp_path / "whole")
    ckpt = str(tmp_path / "whole" / "checkpoints" / "step_00000002")
    make(kind, files, tmp_path / "two", gpus=2, resume_from_checkpoint=ckpt, **kw).train()
    assert_steps_match(whole[2:], step_records(tmp_path / "two"), None)  # bit for bit
    # the same global batch on one rank: 2b rows per micro-batch (another reduction order; GRPO:
    # one engine samples all the step's prompts)
    make(kind, files, tmp_path / "one", per_device_train_batch_size=4, resume_from_checkpoint=ckpt, **kw).train()
    assert_steps_match(whole[2:], step_records(tmp_path / "one"), GRPO_T1 if kind == "grpo" else LOSS)


@pytest.mark.parametrize("kind", ["dpo", "distill", "grpo"])
def test_data_parallel_config_errors_name_the_key(files, tmp_path, kind):
    raw = {"model": "m", "output_dir": str(tmp_path / "out"), "gpus": 2, "zero_level": 1}
    raw |= {"dpo": {"datasets": [{"path": "d.jsonl", "type": "preference"}]},
            "distill": {"datasets": [{"path": "d.jsonl"}], "distillation": {"teacher_model": "t"}},
            "grpo": {"datasets": [{"path": "d.jsonl"}], "reward_functions": ["length"]}}[kind]
    assert load_config(raw, kind=kind).gpus == 2  # data parallel itself is a valid config now
    refused = [({"distributed": {"num_nodes": 2}}, "gpus", "several ranks per node")]
    if kind == "grpo":  # (each rank's rollout engine reads the weights whole; the others train under ZeRO-3)
        refused.append(({"zero_level": 3}, "zero_level", "ZeRO-3"))
    else:
        assert load_config({**raw, "zero_level": 3}, kind=kind).zero_level == 3
    for extra, key, words in refused:
        with pytest.raises(ConfigError, match=words) as e:
            load_config({**raw, **extra}, kind=kind)
        assert e.value.message.startswith(f"{key}: ")
    if not (_native.build_info()["cuda"] and _native.cuda_devices()):  # gpus: 2 with no GPU and no device: cpu
        with pytest.raises(ConfigError, match="no CUDA device") as e:
            make(kind, files, tmp_path / "run", device="auto", gpus=2, gradient_accumulation_steps=1)
        assert e.value.where == "gpus" and "device: cpu" in e.value.hint


def test_pair_slots_split_as_the_dataset_batches_them(files, tmp_path):
    """A global micro-batch of 4 pair slots (3 pairs and padding) cut in two: each part is the
    micro-batch of its 2 slots, array for array."""
    tr = make("dpo", files, tmp_path / "run")
    data = tr.train_data
    for slots in ([0, 1, 2, -1], [3, 0, 1, 2], [4, -1, -1, -1]):
        parts = data.split(data.batch(slots), 2)
        for part, want in zip(parts, (data.batch(slots[:2]), data.batch(slots[2:]))):
            assert part.pairs == want.pairs and part.rows == want.rows and part.sequence_len == want.sequence_len
            assert (part.num_target_tokens, part.max_seqlen) == (want.num_target_tokens, want.max_seqlen)
            for f in ("input_ids", "position_ids", "cu_seqlens", "targets"):
                np.testing.assert_array_equal(getattr(part, f), getattr(want, f), err_msg=f"{slots} {f}")
    with pytest.raises(ValueError, match="do not split"):
        data.split(data.batch([0, 1, 2]), 2)
