"""Multi-node data parallel through Ray (surogate/train/ray_launch.py) on a local Ray cluster of
this machine (ray.init(num_cpus=2)): two actors stand for two nodes, each a trainer rank in its
own process, the collectives over TCP. A tiny random Llama under LoRA (f32, ZeRO-1, -2 and -3:
the layers' weights gathered over TCP per layer) trains to the same losses, adapter and
checkpoints (every rank's optimizer shard, ZeRO-3: every rank's adapter pieces), bit for bit,
as the same run with ``gpus: 2`` (two rank threads in one process): the TCP backend reduces in the
threads backend's order and every rank sees the same rows.

Slow: the cluster, and each actor importing surogate and building its Programs, take most of
a minute on two cores; CI runs it (``ray`` is in the test extra)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("transformers")

from safetensors.numpy import load_file  # noqa: E402
from sgtest.qa import sft_config, step_losses, step_records, write_qa  # noqa: E402
from sgtest.tiny_models import make_llama, make_qwen3  # noqa: E402

from surogate.errors import ConfigError  # noqa: E402
from surogate.train.checkpoint import latest_checkpoint, load_checkpoint  # noqa: E402
from surogate.train.ray_launch import init_ray, launch  # noqa: E402
from surogate.train.trainer import Trainer  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster():
    init_ray(num_cpus=2)  # the actors import surogate from where this test does
    try:
        yield
    finally:
        ray.shutdown()


def adapter(out: Path) -> dict[str, np.ndarray]:
    return load_file(str(out / "adapter" / "adapter_model.safetensors"))


@pytest.mark.parametrize("zero_level", [1, 2, 3])
def test_two_ray_actors_train_as_two_rank_threads(cluster, tmp_path, monkeypatch, zero_level):
    base = make_llama(tmp_path / "llama", seed=3)
    data = write_qa(tmp_path / "qa.jsonl")
    kw = dict(device="cpu", max_steps=3, sequence_len=160, save_steps=2, zero_level=zero_level)
    # (processes reduce during the backward through a second TCP channel, ZeRO-2/3 sharding the
    # accumulators, as the threads do)
    Trainer(sft_config(base, data, tmp_path / "threads", gpus=2, **kw)).train()

    stream = io.StringIO()
    result = launch(sft_config(base, data, tmp_path / "ray", **kw), "local", num_nodes=2, stream=stream)
    assert result.steps == 3 and result.output == tmp_path / "ray" / "adapter"
    threads, nodes = step_losses(tmp_path / "threads"), step_losses(tmp_path / "ray")
    assert len(nodes) == 3 and nodes == threads  # bit for bit
    a, b = adapter(tmp_path / "threads"), adapter(tmp_path / "ray")
    assert a.keys() == b.keys()
    for n in a:
        np.testing.assert_array_equal(a[n], b[n], err_msg=n)
    # rank 0's step lines reached the driver; the checkpoint (step 2) and outputs are rank 0's
    assert sum("step" in line and "loss" in line for line in stream.getvalue().splitlines()) >= 3, stream.getvalue()
    # the checkpoints (step 2 and the last) hold the full state: every rank's optimizer shard
    for step in (2, 3):
        ckpts = [latest_checkpoint(tmp_path / run / "checkpoints").parent / f"step_{step:08d}"
                 for run in ("threads", "ray")]
        (s1, w1, o1), (s2, w2, o2) = (load_checkpoint(c) for c in ckpts)
        assert s1.losses == s2.losses and w1.keys() == w2.keys() and o1.keys() == o2.keys() and o1
        for n in w1:
            np.testing.assert_array_equal(w1[n], w2[n], err_msg=n)
        for n in o1:
            np.testing.assert_array_equal(o1[n], o2[n], err_msg=n)


def test_delayed_fp8_scaling_on_two_ray_actors_is_the_threads_run(cluster, tmp_path):
    """fp8_hybrid with amax histories: the processes merge theirs through the TCP group after each
    step as the threads do, so the curve and the checkpointed histories are the threads run's."""
    base = make_qwen3(tmp_path / "qwen3", seed=11, initializer_range=0.2)
    data = write_qa(tmp_path / "qa.jsonl")
    kw = dict(device="cpu", max_steps=3, save_steps=3, recipe="fp8_hybrid", fp8_amax_history=4)
    Trainer(sft_config(base, data, tmp_path / "threads", gpus=2, **kw)).train()
    launch(sft_config(base, data, tmp_path / "ray", **kw), "local", num_nodes=2, stream=io.StringIO())
    assert step_losses(tmp_path / "ray") == step_losses(tmp_path / "threads")
    (_, _, o1), (_, _, o2) = (load_checkpoint(latest_checkpoint(tmp_path / run / "checkpoints"))
                              for run in ("threads", "ray"))
    hist = [n for n in o1 if n.startswith("fp8/")]
    assert hist and set(hist) == {n for n in o2 if n.startswith("fp8/")}
    for n in hist:
        np.testing.assert_array_equal(o1[n], o2[n], err_msg=n)
        assert (o1[n][1:4] > 0).all(), n  # 3 steps x 2 micro-batches: the last 3 runs' slots at least


def test_a_zero3_full_fine_tune_on_two_ray_actors_is_the_threads_run(cluster, tmp_path):
    """ZeRO-3 across processes with every layer weight trained: each process keeps its pieces
    (its model lets go of the others'), and the last checkpoint and the saved model, put
    together from both ranks' pieces, are the threads run's, bit for bit."""
    base = make_qwen3(tmp_path / "qwen3", seed=11, initializer_range=0.2)
    data = write_qa(tmp_path / "qa.jsonl")
    kw = dict(device="cpu", max_steps=2, save_steps=1, zero_level=3, lora=False, gradient_accumulation_steps=1)
    Trainer(sft_config(base, data, tmp_path / "threads", gpus=2, **kw)).train()
    launch(sft_config(base, data, tmp_path / "ray", **kw), "local", num_nodes=2, stream=io.StringIO())
    assert step_losses(tmp_path / "ray") == step_losses(tmp_path / "threads")
    a, b = (load_file(str(tmp_path / run / "model" / "model.safetensors")) for run in ("threads", "ray"))
    assert a.keys() == b.keys() and any(".layers.1." in n for n in a)
    for n in a:
        np.testing.assert_array_equal(a[n], b[n], err_msg=n)
    (_, w1, o1), (_, w2, o2) = (load_checkpoint(tmp_path / run / "checkpoints" / "step_00000001")
                                for run in ("threads", "ray"))
    assert w1.keys() == w2.keys() and o1.keys() == o2.keys()
    for n in w1:
        np.testing.assert_array_equal(w1[n], w2[n], err_msg=n)


@pytest.mark.parametrize("kind", ["dpo", "distill", "grpo"])
def test_the_other_trainers_on_two_ray_actors_train_as_two_rank_threads(cluster, tmp_path, kind):
    """DPO, distillation and GRPO (each actor's engine sampling its rank's prompts) through the
    same launcher, bit for bit as their ``gpus: 2`` threads (built-in rewards: the actors cannot
    import the tests' modules)."""
    from sgtest.distill import distill_config
    from sgtest.grpo import grpo_config, write_prompts
    from sgtest.preference import dpo_config, write_pairs

    from surogate.train.run import trainer_class

    base = make_qwen3(tmp_path / "qwen3", seed=11, initializer_range=0.2)
    kw = dict(device="cpu", max_steps=2, gradient_accumulation_steps=1, save_steps=2)
    pairs, qa, prompts = write_pairs(tmp_path / "pairs.jsonl"), write_qa(tmp_path / "qa.jsonl"), \
        write_prompts(tmp_path / "prompts.jsonl")
    teacher = make_qwen3(tmp_path / "teacher", seed=29, initializer_range=0.2) if kind == "distill" else None

    def config(out, **k):
        if kind == "dpo":
            return dpo_config(base, pairs, out, **kw, **k)
        if kind == "distill":
            return distill_config(base, teacher, qa, out, **kw, **k)
        return grpo_config(base, prompts, out, reward_functions=["length", "answer_format"], **kw, **k)

    trainer_class(kind)(config(tmp_path / "threads", gpus=2)).train()
    result = launch(config(tmp_path / "ray"), "local", num_nodes=2, stream=io.StringIO())
    assert result.steps == 2
    skip = {"time", "elapsed", "step_time", "tokens_per_second", "rollout_time", "rollout_tokens_per_second"}
    threads, nodes = (step_records(tmp_path / run) for run in ("threads", "ray"))
    assert [{k: v for k, v in r.items() if k not in skip} for r in nodes] == \
        [{k: v for k, v in r.items() if k not in skip} for r in threads]  # bit for bit, every metric
    a, b = adapter(tmp_path / "threads"), adapter(tmp_path / "ray")
    assert a.keys() == b.keys()
    for n in a:
        np.testing.assert_array_equal(a[n], b[n], err_msg=n)


def test_one_node_is_the_one_process_run(cluster, tmp_path):
    base = make_llama(tmp_path / "llama", seed=3)
    data = write_qa(tmp_path / "qa.jsonl")
    kw = dict(device="cpu", max_steps=2, sequence_len=160)
    Trainer(sft_config(base, data, tmp_path / "here", **kw)).train()
    launch(sft_config(base, data, tmp_path / "ray", **kw), "local", num_nodes=1, stream=io.StringIO())
    assert step_losses(tmp_path / "ray") == step_losses(tmp_path / "here")


def test_a_failing_rank_fails_the_run_with_its_error(cluster, tmp_path):
    base = make_llama(tmp_path / "llama", seed=3)
    cfg = sft_config(base, tmp_path / "missing.jsonl", tmp_path / "out", device="cpu", max_steps=1,
                     sequence_len=160)
    with pytest.raises(Exception, match="missing.jsonl"):
        launch(cfg, "local", num_nodes=2, stream=io.StringIO())


def test_more_ranks_than_gpus_one_per_node(tmp_path):
    from surogate.config import load_config

    with pytest.raises(ConfigError, match="several ranks per node"):
        load_config({"model": "x", "datasets": [{"path": "d.jsonl"}], "gpus": 2,
                     "distributed": {"ray_address": "auto", "num_nodes": 2}})


def test_a_distributed_block_runs_on_ray(cluster, tmp_path, capsys):
    """`surogate sft CONFIG` with ``distributed: {num_nodes: 2}`` (ray_address: auto, the
    cluster this process joined) trains on two actors and prints rank 0's step lines."""
    import yaml

    from surogate.train.run import run

    base = make_llama(tmp_path / "llama", seed=3)
    data = write_qa(tmp_path / "qa.jsonl")
    cfg = {"model": str(base), "output_dir": str(tmp_path / "out"), "device": "cpu", "recipe": "fp32",
           "datasets": [{"path": str(data), "type": "messages"}], "sequence_len": 160, "max_steps": 2,
           "per_device_train_batch_size": 1, "gradient_accumulation_steps": 1, "save_steps": 0, "eval_steps": 0,
           "distributed": {"num_nodes": 2}}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    result = run(path, "sft")
    assert result.steps == 2 and (tmp_path / "out" / "adapter" / "adapter_model.safetensors").is_file()
    assert len(step_losses(tmp_path / "out")) == 2
    assert "step 2/2" in capsys.readouterr().err


def test_distributed_keys_are_checked():
    from surogate.config import load_config

    with pytest.raises(ConfigError, match="num_nodes"):
        load_config({"model": "x", "datasets": [{"path": "d.jsonl"}], "distributed": {"num_nodes": -1}})
    cfg = load_config({"model": "x", "datasets": [{"path": "d.jsonl", "type": "preference"}],
                       "distributed": {"num_nodes": 2}}, kind="dpo")  # every trainer runs on Ray
    assert cfg.distributed.num_nodes == 2


def test_more_ranks_than_the_cluster_holds_are_refused(cluster, tmp_path):
    cfg = sft_config(tmp_path / "llama", tmp_path / "qa.jsonl", tmp_path / "out", device="cpu")
    with pytest.raises(ConfigError, match="3 ranks need 3 CPUs"):
        launch(cfg, "local", num_nodes=3)
