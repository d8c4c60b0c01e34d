"""ZeRO-3 (``zero_level: 3``) on the CPU backend (``device: cpu``: rank threads), against ZeRO-2
and one-rank runs on tiny random Qwen3 models (f32).

What must hold, and how exactly:
- ZeRO-3 = ZeRO-2 within a rounding of the norm (rtol 1e-6 on the losses, 1e-5 on the weights;
  measured 1.8e-6 after 3 full fine-tuning steps at lr 2e-2, AdamW keeping the error relative):
  the gathered weights are bit copies of their owners', the gradients are ZeRO-2's (whole on every
  rank, reduced to their owners in rank order); only the split of the trained parameters differs
  (ZeRO-3 balances the layers' on their own), and with it the partial norms the clipping norm is
  put together from, each rounded to f32 once more than the one-pass norm.
- N ranks x b = 1 rank x N b within f32 reduction order (test_data_parallel.py's bounds: rtol
  1e-5 on the losses, 1e-4 on the weights), with gradient accumulation, LoRA and full
  fine-tuning; DPO and distillation as their ZeRO-2 runs.
- A rank's Programs reach its own pieces of the layers (about 1/R of their bytes), two staging
  buffers and the weights outside the layers, and nothing else of the model: measured on the
  memory bound into each rank's training Program, against ZeRO-2's whole model per rank.
- Checkpoints hold the full state under the one-rank names: a ZeRO-3 checkpoint resumes on one
  rank and a one-rank checkpoint on ZeRO-3, to the same next losses.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from numpy.lib.array_utils import byte_bounds

pytest.importorskip("transformers")

from sgtest.distill import distill_config  # noqa: E402
from sgtest.preference import dpo_config, write_pairs  # noqa: E402
from sgtest.qa import sft_config, step_losses, step_records, write_qa  # noqa: E402
from sgtest.tiny_models import make_model, make_qwen3  # noqa: E402
from surogate.compile.gather import HOME_NAME, SLOT_NAME  # noqa: E402
from surogate.config import load_config  # noqa: E402
from surogate.errors import ConfigError  # noqa: E402
from surogate.train.distill import DistillTrainer  # noqa: E402
from surogate.train.dpo import DPOTrainer  # noqa: E402
from surogate.train.trainer import Trainer  # noqa: E402

LOSS_RTOL, WEIGHT_ATOL = 1e-5, 1e-4  # one rank against N (the module header says why)
ZERO2, ZERO2_WEIGHTS = 1e-6, 1e-5  # ZeRO-3 against ZeRO-2


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("zero3")
    return {"qwen3": make_qwen3(root / "qwen3", seed=11, initializer_range=0.2),
            "deep": make_qwen3(root / "deep", seed=5, initializer_range=0.2, num_hidden_layers=8),
            "teacher": make_qwen3(root / "teacher", seed=29, initializer_range=0.2),
            "moe": make_model("qwen3_moe", root / "moe", seed=3),
            "qa": write_qa(root / "qa.jsonl"), "pairs": write_pairs(root / "pairs.jsonl")}


def train(kind: str, files, out, **kw):
    kw = {"device": "cpu", "max_steps": 3, **kw}
    if kind == "dpo":
        tr = DPOTrainer(dpo_config(files["qwen3"], files["pairs"], out, **kw))
    elif kind == "distill":
        tr = DistillTrainer(distill_config(files["qwen3"], files["teacher"], files["qa"], out, **kw))
    else:
        tr = Trainer(sft_config(files[kw.pop("model", "qwen3")], files["qa"], out, **kw))
    tr.train()
    return step_records(out), tr


def weights(tr) -> dict[str, np.ndarray]:
    return {n: np.asarray(a, np.float64) for n, a in tr._trainable_state().items()}


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float(np.abs(a[n] - b[n]).max()) for n in a)


def values(records, key="loss") -> list[float]:
    return [r[key] for r in records]


def assert_layers_split(tr) -> None:
    """Each sharded layer weight is kept by exactly one rank (its pieces), the others by all."""
    z = tr.zero3
    kept = [set(r._homes()) for r in tr.dp.ranks]
    assert set().union(*kept) == set(z.owner) and sum(map(len, kept)) == len(z.owner)
    for r in tr.dp.ranks:
        assert all(z.owner[n] == r.rank for n in kept[r.rank])
        assert not any(z.sharded(n) and z.owner[n] != r.rank for n in r.trainable)


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_zero3_trains_as_zero2_and_as_one_rank_of_the_whole_batch(files, tmp_path, lora):
    # gradient accumulation in all three; full fine-tuning also recomputes its blocks in backward
    kw = dict(lora=lora, gradient_accumulation_steps=2, validation_split_ratio=0.25, eval_steps=2,
              **({} if lora else {"recompute": True}))
    one, t1 = train("sft", files, tmp_path / "one", per_device_train_batch_size=4, **kw)
    z2, t2 = train("sft", files, tmp_path / "z2", per_device_train_batch_size=2, gpus=2, zero_level=2, **kw)
    z3, t3 = train("sft", files, tmp_path / "z3", per_device_train_batch_size=2, gpus=2, zero_level=3, **kw)
    np.testing.assert_allclose(values(z3), values(one), rtol=LOSS_RTOL)
    assert max_diff(weights(t1), weights(t3)) < WEIGHT_ATOL
    np.testing.assert_allclose(values(z3), values(z2), rtol=ZERO2)
    np.testing.assert_allclose(values(z3, "grad_norm"), values(z2, "grad_norm"), rtol=ZERO2)
    assert max_diff(weights(t2), weights(t3)) < ZERO2_WEIGHTS
    evals = [[r["eval_loss"] for r in map(json.loads, open(tmp_path / run / "metrics.jsonl")) if r["type"] == "eval"]
             for run in ("z2", "z3")]
    assert len(evals[1]) == 2  # every rank evaluated (the gathers are collectives); rank 0 reported
    np.testing.assert_allclose(evals[1], evals[0], rtol=ZERO2)
    assert_layers_split(t3)
    start = next(r for r in map(json.loads, open(tmp_path / "z3" / "metrics.jsonl")) if r["type"] == "start")
    assert start["zero_level"] == 3
    z = start["zero3"]  # rank 0's account: its pieces, two staging buffers of one layer each
    assert z["layers"] == 2 and z["staging_bytes"] == 2 * t3.zero3.slot_bytes
    assert z["kept_bytes"] == sum(a.nbytes for a in t3._homes().values()) < 0.75 * z["layer_bytes"]


@pytest.mark.parametrize("kind,kw", [("dpo", {}), ("dpo", {"lora": False, "learning_rate": 1e-3}), ("distill", {})],
                         ids=["dpo-lora", "dpo-full", "distill-lora"])
def test_the_other_trainers_under_zero3_train_as_under_zero2(files, tmp_path, kind, kw):
    """DPO's reference (LoRA: the base, gathered as the policy's; full: a frozen copy, sharded
    likewise) and distillation's passes through the same step path."""
    kw = dict(gpus=2, gradient_accumulation_steps=1, **kw)
    z2, t2 = train(kind, files, tmp_path / "z2", zero_level=2, **kw)
    z3, t3 = train(kind, files, tmp_path / "z3", zero_level=3, **kw)
    for key in z2[0]:
        if isinstance(z2[0][key], float) and key not in ("time", "elapsed", "step_time", "tokens_per_second"):
            np.testing.assert_allclose(values(z3, key), values(z2, key), rtol=ZERO2, atol=1e-9, err_msg=key)
    assert max_diff(weights(t2), weights(t3)) < ZERO2_WEIGHTS
    assert_layers_split(t3)
    if kind == "dpo":  # the reference Program gathers too
        assert any(i.op == "weight_gather" for i in t3.dp.ranks[1].ref_exe.lowered.instrs)


@pytest.mark.parametrize("kw", [dict(optimizer="normuon"), dict(optimizer="adamw_8bit"),
                                dict(recipe="bf16", lora=False), dict(lora=False, long_context=True),
                                dict(model="moe", train_router=True, router_z_loss_coef=0.01, lora_rank=4,
                                     lora_alpha=8), dict(qlora_gguf="q8_0"), dict(recipe="fp8_hybrid")],
                         ids=["normuon", "adamw_8bit", "bf16-full", "long_context", "moe", "qlora-q8_0", "fp8"])
def test_zero3_with_the_other_optimizers_recipes_and_models(files, tmp_path, kw):
    """The optimizer's own Program (Muon's matmuls, 8-bit moments, f32 masters of bf16 weights),
    tiled MLPs, a MoE's experts and router, and GGML blocks (a frozen base of uint8 pieces) under
    the gathers, and FP8 projections: ZeRO-2's numbers (measured equal, bf16 within one ulp)."""
    kw = dict(gpus=2, gradient_accumulation_steps=1, **kw)
    z2, t2 = train("sft", files, tmp_path / "z2", zero_level=2, **kw)
    z3, t3 = train("sft", files, tmp_path / "z3", zero_level=3, **kw)
    np.testing.assert_allclose(values(z3), values(z2), rtol=ZERO2)
    assert max_diff(weights(t2), weights(t3)) < (1e-2 if kw.get("recipe") == "bf16" else ZERO2_WEIGHTS)
    assert_layers_split(t3)


def weight_memory(exe) -> int:
    """The bytes of distinct memory bound to the weights a Program reads: its parameters and
    ZeRO-3's staging buffers and homes (overlapping bindings counted once)."""
    names = [n for n in exe.external_names("param")]
    names += [n for n in exe.lowered.by_value if n.startswith(("zero3.slot.", "zero3.home."))]
    spans = sorted(byte_bounds(np.asarray(exe.bound(n))) for n in names)
    total, end = 0, 0
    for lo, hi in spans:
        lo = max(lo, end)
        if hi > lo:
            total += hi - lo
            end = hi
    return total


def test_each_rank_keeps_its_share_of_the_layer_weights(files, tmp_path):
    """8 layers on 4 ranks, full fine-tuning: a rank's training Program reaches 2 of the layers
    (its pieces), 2 staging buffers and the embedding / final norm, where ZeRO-2's reaches them all."""
    kw = dict(model="deep", lora=False, gpus=4, max_steps=1, per_device_train_batch_size=1)
    _, t2 = train("sft", files, tmp_path / "z2", zero_level=2, **kw)
    _, t3 = train("sft", files, tmp_path / "z3", zero_level=3, **kw)
    params = t3.model.params
    layers = sum(a.nbytes for n, a in params.items() if t3.zero3.sharded(n))
    outside = sum(a.nbytes for n, a in params.items() if not t3.zero3.sharded(n))
    slot = t3.zero3.slot_bytes
    assert layers > 6 * outside and slot < 1.01 * layers / 8  # (the test model: the layers dominate)
    for r2, r3 in zip(t2.dp.ranks, t3.dp.ranks):
        whole, mine = weight_memory(r2.exe), weight_memory(r3.exe)
        assert whole >= layers + outside
        homes = sum(a.nbytes for a in r3._homes().values())
        assert layers / 4 * 0.85 < homes < layers / 4 * 1.15  # whole tensors: about a quarter each
        assert mine == homes + 2 * slot + outside, (r3.rank, mine, homes, slot, outside)
        assert mine < 0.6 * whole
        # every layer parameter the Program reads lies in a staging buffer
        slots = [r3.exe.bound(SLOT_NAME.format(s)) for s in range(2)]
        for n in r3.exe.external_names("param"):
            if t3.zero3.sharded(n):
                assert any(np.shares_memory(r3.exe.bound(n), s) for s in slots), n
        for n, a in r3._homes().items():
            assert r3.exe.bound(HOME_NAME.format(n)) is a and a is params[n]  # (threads: the model's arrays)
    assert_layers_split(t3)


@pytest.mark.parametrize("first,then,lora", [
    (dict(gpus=2, per_device_train_batch_size=2, zero_level=3), dict(gpus=1, per_device_train_batch_size=4), False),
    (dict(gpus=1, per_device_train_batch_size=4), dict(gpus=2, per_device_train_batch_size=2, zero_level=3), False),
    (dict(gpus=2, per_device_train_batch_size=2, zero_level=3), dict(gpus=1, per_device_train_batch_size=4), True)],
    ids=["zero3-to-1-full", "1-to-zero3-full", "zero3-to-1-lora"])
def test_a_checkpoint_resumes_across_zero3_and_one_rank(files, tmp_path, first, then, lora):
    kw = dict(max_steps=4, save_steps=2, gradient_accumulation_steps=1, lora=lora)
    whole, _ = train("sft", files, tmp_path / "first", **kw, **first)
    ckpt = tmp_path / "first" / "checkpoints" / "step_00000002"
    resumed, _ = train("sft", files, tmp_path / "then", resume_from_checkpoint=str(ckpt), **kw, **then)
    assert len(resumed) == 2  # steps 3 and 4
    np.testing.assert_allclose(values(resumed), values(whole)[2:], rtol=LOSS_RTOL)


def test_a_zero3_run_resumes_on_zero3_bit_for_bit(files, tmp_path):
    kw = dict(gpus=2, zero_level=3, lora=False, max_steps=4, save_steps=2, gradient_accumulation_steps=1)
    train("sft", files, tmp_path / "a", **kw)
    run = tmp_path / "a" / "checkpoints" / "step_00000002"
    train("sft", files, tmp_path / "b", resume_from_checkpoint=str(run), **kw)
    assert step_losses(tmp_path / "b") == step_losses(tmp_path / "a")[2:]
    # the outputs are the full model (each rank's pieces), as the last checkpoint holds it
    from safetensors.numpy import load_file

    saved = load_file(str(tmp_path / "b" / "model" / "model.safetensors"))
    assert any(k.startswith("model.layers.1.") for k in saved)


def test_zero_level_3_is_refused_where_it_cannot_run():
    base = {"model": "m", "datasets": [{"path": "d.jsonl", "type": "prompt"}], "zero_level": 3,
            "reward_functions": ["length"]}
    with pytest.raises(ConfigError, match="rollout engine reads them whole") as e:
        load_config(base, kind="grpo")
    assert e.value.message.startswith("zero_level: ") and "zero_level: 2" in e.value.hint
