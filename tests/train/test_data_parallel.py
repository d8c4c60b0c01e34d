"""Data parallel training on the CPU backend (``device: cpu``, ``gpus: 2``: two rank threads),
against one-rank runs on tiny random Qwen3 and Llama models (f32).

What must hold, and how exactly:
- 2 ranks x b rows = 1 rank x b rows x 2 accumulation steps, bit for bit under LoRA (a MoE
  model's router losses and expert loads included): the same micro-batches, gradients summed
  in the same order (rank 0's + rank 1's is micro-batch 0's + micro-batch 1's: each gradient
  GEMM writes its full sum, then one f32 add), the same steps.
- 2 ranks x b = 1 rank x 2b within f32 reduction order (rtol 1e-5 on the losses, atol 1e-4 on
  the weights after 3 steps at lr 2e-2; measured: 1e-6 and 1e-5): the one-rank run sums each
  weight gradient over 2b rows in one GEMM (and the embedding's scatter-add in one pass), the
  two-rank run as two sums of b rows added together, so gradients differ by a few ulps; AdamW
  divides by sqrt(v) ~ |g| and keeps that error relative.
- ZeRO-1 = plain DP bit for bit (every parameter stepped by one rank with the same numbers);
  ZeRO-2 within f32 reduction order (the bounds above; 8-bit moments 1e-3: a code flipped): it
  clips with a norm put together from the ranks' partial norms, each rounded to f32 once more
  than the one-pass norm, and its sharded gradients add the ranks' sums micro-batch by micro-batch
  (tests/train/test_grad_reduce.py).
- The ranks stay bit-identical, checkpoints hold the full state, and a 2-rank checkpoint
  resumes on 1 rank (and back) to the same next loss.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("transformers")

from sgtest.qa import interrupt_after, sft_config, step_losses, step_records, write_qa  # noqa: E402
from sgtest.tiny_models import make_llama, make_model, make_qwen3  # noqa: E402
from surogate import _native  # noqa: E402
from surogate.config import load_config  # noqa: E402
from surogate.errors import ConfigError  # noqa: E402
from surogate.train import data_parallel  # noqa: E402
from surogate.train.checkpoint import load_checkpoint  # noqa: E402
from surogate.train.data_parallel import buckets, resolve_ranks, shard_owners  # noqa: E402
from surogate.train.trainer import Trainer  # noqa: E402

LOSS_RTOL, WEIGHT_ATOL = 1e-5, 1e-4  # the module header says why


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return {"qwen3": make_qwen3(tmp_path_factory.mktemp("qwen3"), seed=11, initializer_range=0.2),
            "llama": make_llama(tmp_path_factory.mktemp("llama"), seed=3),
            "qwen3_moe": make_model("qwen3_moe", tmp_path_factory.mktemp("moe"), seed=3)}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_qa(tmp_path_factory.mktemp("data") / "qa.jsonl")


def run(base, data, out, **kw) -> tuple[list[float], Trainer]:
    # Llama's template (a dated system prompt) needs longer rows than ChatML's.
    kw = {"device": "cpu", "max_steps": 3, "sequence_len": 160 if "llama" in str(base) else 64, **kw}
    tr = Trainer(sft_config(base, data, out, **kw))
    tr.train()
    return step_losses(out), tr


def weights(tr: Trainer) -> dict[str, np.ndarray]:
    return {n: np.asarray(a, np.float64) for n, a in tr._trainable_state().items()}


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float(np.abs(a[n] - b[n]).max()) for n in a)


def assert_ranks_identical(tr: Trainer) -> None:
    for rep in tr.dp.ranks[1:]:
        for n, a in tr.trainable.items():
            np.testing.assert_array_equal(rep.trainable[n], a, err_msg=f"rank {rep.rank}: {n}")


MOE = dict(train_router=True, router_z_loss_coef=0.01, lora_rank=4, lora_alpha=8)


@pytest.mark.parametrize("family", ["qwen3", "qwen3_moe"])
def test_two_ranks_are_one_rank_accumulating_their_micro_batches_bit_for_bit(models, data, tmp_path, family):
    kw = MOE if family == "qwen3_moe" else {}
    _, t1 = run(models[family], data, tmp_path / "one", per_device_train_batch_size=2, gradient_accumulation_steps=2,
                **kw)
    _, t2 = run(models[family], data, tmp_path / "two", per_device_train_batch_size=2, gradient_accumulation_steps=1,
                gpus=2, **kw)
    assert t2.world == 2 and len(t2.dp.ranks) == 2 and t2.dp.ranks[1].exe is not t2.exe
    one, two = step_records(tmp_path / "one"), step_records(tmp_path / "two")
    for key in ("loss", "grad_norm", "target_tokens", "moe_tokens_per_expert", "moe_aux_loss", "moe_z_loss"):
        assert [r.get(key) for r in one] == [r.get(key) for r in two], key  # (MoE: both ranks' tallies)
    assert max_diff(weights(t1), weights(t2)) == 0.0
    assert_ranks_identical(t2)


@pytest.mark.parametrize("family", ["qwen3", "llama"])
@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_two_ranks_of_b_rows_match_one_rank_of_2b(models, data, tmp_path, family, lora):
    one, t1 = run(models[family], data, tmp_path / "one", per_device_train_batch_size=4,
                  gradient_accumulation_steps=1, lora=lora)
    two, t2 = run(models[family], data, tmp_path / "two", per_device_train_batch_size=2,
                  gradient_accumulation_steps=1, gpus=2, lora=lora)
    np.testing.assert_allclose(two, one, rtol=LOSS_RTOL)
    assert not lora or one[-1] < one[0]  # it trains (full fine-tuning at this lr: not monotonically)
    assert max_diff(weights(t1), weights(t2)) < WEIGHT_ATOL
    assert_ranks_identical(t2)
    if not lora:  # rank 0 trains the model's own weights, the others copies of them
        assert t2.trainable["embed_tokens.weight"] is t2.model.params["embed_tokens.weight"]
        assert t2.dp.ranks[1].trainable["embed_tokens.weight"] is not t2.model.params["embed_tokens.weight"]


@pytest.mark.parametrize("optimizer,recipe,lora", [("adamw", "fp32", True), ("adamw_8bit", "fp32", True),
                                                   ("normuon", "fp32", True), ("adamw", "bf16", False)])
def test_zero_1_is_plain_data_parallel_and_zero_2_within_a_rounding(models, data, tmp_path, optimizer, recipe, lora):
    kw = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, gpus=2, optimizer=optimizer,
              recipe=recipe, lora=lora)
    plain, t0 = run(models["qwen3"], data, tmp_path / "z0", zero_level=0, **kw)
    z1, t1 = run(models["qwen3"], data, tmp_path / "z1", zero_level=1, **kw)
    z2, t2 = run(models["qwen3"], data, tmp_path / "z2", zero_level=2, **kw)
    assert z1 == plain and max_diff(weights(t0), weights(t1)) == 0.0
    np.testing.assert_allclose(z2, plain, rtol=LOSS_RTOL)
    # (ZeRO-2's sharded gradients add over the micro-batches the ranks' sums: f32 reduction order;
    # 8-bit moments: a code flipped by it; bf16: a flipped ulp)
    bound = 1e-2 if recipe != "fp32" else 1e-3 if optimizer == "adamw_8bit" else WEIGHT_ATOL
    assert max_diff(weights(t0), weights(t2)) < bound
    for tr in (t1, t2):
        assert_ranks_identical(tr)
        # The optimizer state is sharded: each parameter's on one rank, about half of it on each.
        shards = [set(r.opt.names) for r in tr.dp.ranks]
        assert not shards[0] & shards[1] and shards[0] | shards[1] == set(t0.opt.names)
        whole = t0.opt.state_nbytes()
        assert all(r.opt.state_nbytes() < 0.75 * whole for r in tr.dp.ranks)
        # ... and the checkpoint holds all of it, under the one-rank names.
        _, _, state = load_checkpoint(tr.out / "checkpoints" / "step_00000003")
        _, _, ref = load_checkpoint(t0.out / "checkpoints" / "step_00000003")
        assert state.keys() == ref.keys() and any(k.startswith("m/") for k in ref)
        assert recipe == "fp32" or any(k.startswith("master/") for k in ref)


@pytest.mark.parametrize("first,then", [(dict(gpus=2, per_device_train_batch_size=2, zero_level=1),
                                         dict(gpus=1, per_device_train_batch_size=4)),
                                        (dict(gpus=1, per_device_train_batch_size=4),
                                         dict(gpus=2, per_device_train_batch_size=2, zero_level=2))],
                         ids=["2-ranks-to-1", "1-rank-to-2"])
def test_a_checkpoint_resumes_on_another_rank_count(models, data, tmp_path, first, then):
    kw = dict(max_steps=4, save_steps=2, gradient_accumulation_steps=1)
    whole, _ = run(models["qwen3"], data, tmp_path / "first", **kw, **first)
    ckpt = tmp_path / "first" / "checkpoints" / "step_00000002"
    resumed, tr = run(models["qwen3"], data, tmp_path / "then", resume_from_checkpoint=str(ckpt), **kw, **then)
    assert len(resumed) == 2  # steps 3 and 4
    np.testing.assert_allclose(resumed, whole[2:], rtol=LOSS_RTOL)


@pytest.mark.parametrize("zero_level", [1, 2])
def test_an_interrupted_two_rank_run_resumes_to_the_same_curve_bit_for_bit(models, data, tmp_path, zero_level):
    kw = dict(gpus=2, zero_level=zero_level, max_steps=5, save_steps=2, per_device_train_batch_size=2,
              gradient_accumulation_steps=1, lora_dropout=0.1)  # (dropout: each rank's masks resume too)
    whole, _ = run(models["qwen3"], data, tmp_path / "a", **kw)
    tr = Trainer(sft_config(models["qwen3"], data, tmp_path / "b", device="cpu", **kw))
    interrupt_after(tr, 3)  # rank 0 raises in its optimizer step; rank 1 is released from the weight gather
    with pytest.raises(KeyboardInterrupt):
        tr.train()
    run(models["qwen3"], data, tmp_path / "b", resume_from_checkpoint=True, **kw)
    by_step = {r["step"]: r["loss"] for r in step_records(tmp_path / "b")}  # steps 3.. rewritten
    assert [by_step[s] for s in range(1, 6)] == whole


def test_a_failing_rank_fails_the_step_instead_of_hanging(models, data, tmp_path):
    tr = Trainer(sft_config(models["qwen3"], data, tmp_path / "run", device="cpu", gpus=2))

    def broken(*args, **kw):
        raise RuntimeError("rank 1 lost its data")

    tr.dp.ranks[1]._micro_batches = broken
    it = tr.train_data.iterator(tr.B * tr.world)
    with pytest.raises(RuntimeError, match="rank 1 lost its data"):
        tr._step([next(it)], 0)  # rank 0 waited for rank 1 in the gradient all-reduce
    tr.dp.close()


def test_shards_and_buckets():
    owners = shard_owners({"a": 10, "b": 7, "c": 5, "d": 3, "e": 2}, 2)
    assert owners == {"a": 0, "b": 1, "c": 1, "d": 0, "e": 1}  # loads 13 and 14
    assert shard_owners({"x": 4}, 3) == {"x": 0}
    assert buckets(["a", "b", "c", "d"], {"a": 6, "b": 5, "c": 20, "d": 1}, cap=10) == [["a"], ["b"], ["c"], ["d"]]
    assert buckets(["a", "b", "c"], {"a": 3, "b": 3, "c": 3}, cap=10) == [["a", "b", "c"]]


def test_gpus_errors_name_the_key(monkeypatch, models, data, tmp_path):
    cfg = SimpleNamespace(gpus=2, device="cpu")
    assert resolve_ranks(cfg, "cpu") == 2  # CPU ranks: the CI path
    assert resolve_ranks(SimpleNamespace(gpus=0, device="cpu"), "cpu") == 1
    with pytest.raises(ConfigError, match="no CUDA device") as e:
        resolve_ranks(SimpleNamespace(gpus=2, device="auto"), "cpu")  # auto found no GPU
    assert e.value.where == "gpus" and "device: cpu" in e.value.hint

    monkeypatch.setattr(data_parallel, "_native", SimpleNamespace(cuda_devices=lambda: [{"index": 0}]))
    with pytest.raises(ConfigError, match="gpus: 4, but this machine has 1 CUDA device") as e:
        resolve_ranks(SimpleNamespace(gpus=4, device="cuda"), "cuda")
    assert e.value.where == "gpus" and "at most 1" in e.value.hint
    assert resolve_ranks(SimpleNamespace(gpus=0, device="cuda"), "cuda") == 1  # 0: every GPU

    monkeypatch.undo()
    if not (_native.build_info()["cuda"] and _native.cuda_devices()):  # through the trainer, on a machine without GPUs
        with pytest.raises(ConfigError, match="no CUDA device"):
            Trainer(sft_config(models["qwen3"], data, tmp_path / "run", gpus=2))

    base = {"model": "m", "datasets": [{"path": "d.jsonl"}]}
    for key, value, words in [("zero_level", 5, "must be 0, 1, 2 or 3"),
                              ("gpus", -1, "must not be negative")]:
        with pytest.raises(ConfigError, match=words) as e:
            load_config({**base, key: value})
        assert e.value.message.startswith(f"{key}: ")
    # (dpo, distill and grpo: test_data_parallel_trainers.py)


def test_the_example_yaml_runs_two_ranks_through_surogate_sft(models, data, tmp_path):
    from surogate.train.run import run as sft

    text = (Path(__file__).parents[2] / "configs" / "sft-lora-tiny-2ranks.yaml").read_text()
    text = text.replace("path/to/tiny-model-folder", str(models["qwen3"])).replace("path/to/chat.jsonl", str(data))
    text = text.replace("output/tiny-lora-2ranks", str(tmp_path / "out")).replace("max_steps: 20", "max_steps: 2")
    (tmp_path / "run.yaml").write_text(text.replace("sequence_len: 256", "sequence_len: 64"))
    result = sft(tmp_path / "run.yaml", "sft")
    assert result.steps == 2 and (result.output / "adapter_model.safetensors").is_file()
    start = [r for r in map(json.loads, open(tmp_path / "out" / "metrics.jsonl")) if r["type"] == "start"]
    assert start[0]["ranks"] == 2 and start[0]["zero_level"] == 1
