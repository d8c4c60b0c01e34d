"""Serving with some decoder layers' weights in host memory (--cpu-offload-gb / --offload-layers,
surogate/serve/offload.py): on the CPU the streamed layers are memcpy'd into the runner's two
staging buffers by the weight_fetch instructions of every serving Program, so the same kernels
read the same bytes: greedy tokens and logprobs equal the resident run's exactly, through
continuous batching with chunked prefill, the prefix cache, a LoRA adapter beside the base model
and sleep / wake. A fetch placed before the last reader of its buffer's previous layer would
hand that layer the wrong weights (the instruction-order test says where they are). Bad values
of the flags are refused naming the flag."""

from __future__ import annotations

import re

import numpy as np
import pytest

import surogate
from sgtest.engine import prompts
from sgtest.tiny_models import make_embedding_gemma, make_llama, make_model, make_qwen3, make_qwen3_vl
from surogate.dsl import ops
from surogate.dsl.graph import Graph
from surogate.errors import InvalidArgumentError, UnsupportedError
from surogate.models import REGISTRY
from surogate.serve.engine_client import EngineClient
from surogate.serve.launch import launch
from surogate.serve.model_runner import ProgramRunner
from surogate.serve.offload import GiB, WeightOffload
from surogate.serve.types import EngineConfig, SamplingParams

LAYERS = 5  # 3 streamed layers take turns in 2 buffers, with resident layers between them


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def path(request, tmp_path_factory):
    make = make_qwen3 if request.param == "qwen3" else make_llama
    return make(tmp_path_factory.mktemp(request.param), seed=5, initializer_range=0.2, num_hidden_layers=LAYERS)


def run(model, ps, offload=None, *, lora=None, fuse_qkv=None, logprobs=None, twice=False, **cfg):
    """Greedy tokens and (with ``logprobs``) the sampled tokens' logprobs of every prompt, all
    submitted at once (the engine held: the same steps every run); ``twice``: then once more (a
    warm prefix cache), returning both runs and the prefix cache hits of the second. ``lora``:
    (cfg, params) served as adapter 0, which the odd prompts ask for."""
    config = EngineConfig(num_blocks=96, block_size=4, **cfg)
    runner = ProgramRunner(model, 96, 4, fuse_qkv=fuse_qkv, max_num_seqs=config.max_num_seqs, offload=offload)
    if lora is not None:
        runner.add_adapter(0, *lora)
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=logprobs)

    def once(client):
        with client.held():  # one schedule for both runs: all requests reach the first step together
            ids = [client.submit(p, params, 0 if lora is not None and i % 2 else None) for i, p in enumerate(ps)]
        outs = [client.wait(i, timeout=120) for i in ids]
        return ([[t for o in out for t in o.new_token_ids] for out in outs],
                [[lp.logprob for o in out for lp in (o.logprobs or [])] for out in outs])

    with EngineClient(runner, config) as client:
        first = once(client)
        if not twice:
            return first
        hits = client.stats().prefix_cache_hits
        second = once(client)
        return first, second, client.stats().prefix_cache_hits - hits


@pytest.mark.parametrize("n, fuse", [(3, False), (3, True), (LAYERS, False)])
def test_greedy_tokens_and_logprobs_equal_the_resident_run(path, n, fuse):
    ps = prompts(surogate.load_model(path).spec.vocab_size, 12, seed=1)
    want = run(surogate.load_model(path), ps, fuse_qkv=fuse, logprobs=1, max_num_batched_tokens=24)
    model = surogate.load_model(path)
    plan = WeightOffload.plan(model, offload_layers=n, fuse_qkv=fuse)
    assert [layer.index for layer in plan.layers] == ([0, 2, 4] if n == 3 else list(range(LAYERS)))
    got = run(model, ps, plan, fuse_qkv=fuse, logprobs=1, max_num_batched_tokens=24)
    assert got[0] == want[0]
    assert got[1] == want[1]  # the same floats: the same kernels on the same bytes


@pytest.mark.parametrize("family", [f.name for f in REGISTRY] + ["qwen3_vl"])
def test_every_family_streams_all_its_layers_with_the_same_answers(family, tmp_path):
    """Each family's tiny model (dense, MoE, conv layers, shared KV, sinks, a vision model asked
    text) with every decoder layer streamed: the resident run's tokens and logprobs."""
    path = (make_qwen3_vl(tmp_path / family, seed=2) if family == "qwen3_vl" else
            make_model(family, tmp_path / family, seed=3, initializer_range=0.2))
    model = surogate.load_model(path)
    ps = prompts(model.spec.vocab_size, 4, seed=1)
    want = run(model, ps, logprobs=0)
    model = surogate.load_model(path)
    assert run(model, ps, WeightOffload.plan(model, offload_layers=model.spec.num_layers), logprobs=0) == want


def test_the_prefix_cache_and_sleep_keep_the_answers(path):
    ps = prompts(surogate.load_model(path).spec.vocab_size, 6, seed=2)
    ps = [ps[0] + p for p in ps]  # a shared prefix of full blocks
    want = run(surogate.load_model(path), ps)
    model = surogate.load_model(path)
    plan = WeightOffload.plan(model, offload_layers=3)
    first, second, hits = run(model, ps, plan, twice=True)
    assert first == second == want and hits > 0
    config = EngineConfig(num_blocks=96, block_size=4)
    with EngineClient(ProgramRunner(model, 96, 4, offload=plan), config) as client:
        params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
        before = [[t for o in client.wait(client.submit(p, params), timeout=60) for t in o.new_token_ids] for p in ps]
        client.release()  # the staging buffers go with the Programs; the host packs stay
        client.restore()
        after = [[t for o in client.wait(client.submit(p, params), timeout=60) for t in o.new_token_ids] for p in ps]
    assert before == after == want[0]


def test_a_lora_adapter_beside_the_base_model_answers_as_resident(path):
    from surogate.dsl.nn import LoRAConfig
    from surogate.train.lora import ALL_TARGETS, init_lora

    model = surogate.load_model(path)
    cfg = LoRAConfig(rank=4, alpha=8.0, targets=ALL_TARGETS)
    rng = np.random.default_rng(3)
    params = {k: (v if k.endswith("lora_A") else rng.standard_normal(v.shape).astype(np.float32) * 0.3)
              for k, v in init_lora(model.arch.build(mode="logits", dtype="float32", lora=cfg), 7).items()}
    ps = prompts(model.spec.vocab_size, 8, seed=4)
    want = run(model, ps, lora=(cfg, params), logprobs=0)
    base = run(model, ps, logprobs=0)
    assert want[0][1::2] != base[0][1::2]  # the adapter matters
    model = surogate.load_model(path)
    got = run(model, ps, WeightOffload.plan(model, offload_layers=3), lora=(cfg, params), logprobs=0)
    assert got == want


def test_fetches_follow_the_last_reader_of_the_buffer_and_waits_precede_the_first(path):
    """What the device relies on: in every serving Program the fetch of the k-th streamed layer
    comes after the last instruction reading the weights of the streamed layer two before it (its
    staging buffer's previous tenant), and its wait before the first instruction reading its own."""
    model = surogate.load_model(path)
    plan = WeightOffload.plan(model, offload_layers=LAYERS)
    runner = ProgramRunner(model, 96, 4, offload=plan)
    exe = runner._compile(8, 2, 4, 2)
    lines = [exe.program.instr(i) for i in range(exe.program.num_instrs)]
    reads: dict[int, list[int]] = {}  # streamed layer -> the instructions reading its weights
    for at, line in enumerate(lines):
        for arg in line[line.index("(") + 1:line.index(")")].split(", "):
            if arg in plan.names:
                reads.setdefault(int(re.match(r"layers\.(\d+)\.", arg).group(1)), []).append(at)
    for k, layer in enumerate(plan.layers):
        fetch = lines.index(f"weight_fetch({layer.host_name}) -> ({layer.dst_name})")
        wait = lines.index(f"weight_wait({layer.dst_name}) -> ()")
        assert fetch < wait < min(reads[layer.index])
        if k >= 2:
            assert fetch > max(reads[plan.layers[k - 2].index])
    assert sum(line.startswith("weight_fetch") for line in lines) == LAYERS


def test_cpu_offload_gb_keeps_the_fewest_layers_that_hold_that_much(path):
    model = surogate.load_model(path)
    layer = WeightOffload.plan(surogate.load_model(path), offload_layers=1).nbytes
    plan = WeightOffload.plan(model, cpu_offload_gb=1.5 * layer / GiB)  # more than one layer, less than two
    assert len(plan.layers) == 2 and plan.nbytes >= 1.5 * layer
    assert [x.index for x in plan.layers] == [1, 3]  # spread over the depth
    # One host copy: the model's parameters are views of the packs.
    name = plan.layers[0].params[-1]
    assert np.shares_memory(model.params[name], plan.packs[plan.layers[0].index][1])
    assert WeightOffload.plan(model, cpu_offload_gb=0) is None


def test_bad_values_are_refused_naming_the_flag(path, tmp_path):
    model = surogate.load_model(path)
    for kw, match in [({"cpu_offload_gb": -1.0}, "--cpu-offload-gb -1.0 is not a number >= 0"),
                      ({"cpu_offload_gb": float("nan")}, "--cpu-offload-gb nan"),
                      ({"cpu_offload_gb": 1000.0}, r"--cpu-offload-gb 1000.0 is more than the .* MiB of weights in "
                                                   f"the model's {LAYERS} decoder layers"),
                      ({"offload_layers": -2}, "--offload-layers -2 is not a whole number"),
                      ({"offload_layers": LAYERS + 1}, f"--offload-layers {LAYERS + 1} is more than the model's "
                                                       f"{LAYERS} decoder layers"),
                      ({"offload_layers": 1, "cpu_offload_gb": 1.0}, "--cpu-offload-gb and --offload-layers both")]:
        with pytest.raises(InvalidArgumentError, match=match):
            WeightOffload.plan(model, **kw)
    with pytest.raises(InvalidArgumentError, match="--cpu-offload-gb -3.0 is not a number"):
        launch(str(path), cpu_offload_gb=-3.0)
    with pytest.raises(InvalidArgumentError, match="--offload-layers 99 is more than"):
        launch(str(path), offload_layers=99)
    with pytest.raises(InvalidArgumentError, match="plan was made for another model"):
        ProgramRunner(surogate.load_model(path), 8, offload=WeightOffload.plan(model, offload_layers=1))
    with pytest.raises(InvalidArgumentError, match="packs q, k, v fused, the runner serves them apart"):
        ProgramRunner(model, 8, fuse_qkv=False, offload=WeightOffload.plan(model, offload_layers=1, fuse_qkv=True))
    trained = surogate.load_model(path)
    trained.stack_qkv()  # a trainer's live weights (GRPO's co-located engine): copied once, they would go stale
    with pytest.raises(UnsupportedError, match="--offload-layers: the model keeps its q, k, v weights stacked"):
        WeightOffload.plan(trained, offload_layers=1)


def test_an_encoder_is_refused_naming_the_flag(tmp_path):
    enc = make_embedding_gemma(tmp_path / "enc", seed=1)
    with pytest.raises(UnsupportedError, match="--cpu-offload-gb: .* is an encoder"):
        launch(str(enc), cpu_offload_gb=0.001)


def test_a_graph_whose_layers_read_each_others_weights_is_refused():
    """Layer 2's weights read before the last reader of layer 0's: the two cannot take turns in
    one staging buffer."""
    from surogate.compile.offload import StreamedLayer, stream_weights

    g = Graph("interleaved")
    x = g.input("x", (4, 8), "float32")
    w = {i: g.param(f"layers.{i}.norm.weight", (8,), "float32") for i in range(3)}
    late = g.param("layers.0.late.weight", (8,), "float32")
    for i in range(3):
        x = ops.rmsnorm(x, w[i], 1e-6, name=f"layers.{i}.norm")
    ops.rmsnorm(x, late, 1e-6, name="layers.0.late")  # layer 0 again, after layer 2
    layers = [StreamedLayer(0, (w[0].name, late.name), 512), StreamedLayer(1, (w[1].name,), 256),
              StreamedLayer(2, (w[2].name,), 256)]
    with pytest.raises(UnsupportedError, match="--cpu-offload-gb: in interleaved layer 2's weights are read"):
        stream_weights(g, layers, "--cpu-offload-gb")


def test_launch_streams_the_layers_it_is_asked_for_and_serves_the_same_tokens(path):
    ps = prompts(surogate.load_model(path).spec.vocab_size, 4, seed=6)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    outs = []
    for kw in ({}, {"offload_layers": 3}):
        m = launch(str(path), kv_cache_tokens=1024, **kw)
        try:
            assert (m.offload is None) == (not kw)
            ids = [m.client.submit(p, params) for p in ps]
            outs.append([[t for o in m.client.wait(i, timeout=60) for t in o.new_token_ids] for i in ids])
        finally:
            m.client.close()
    assert outs[0] == outs[1]
    assert [x.index for x in m.offload.layers] == [0, 2, 4]


def test_surogate_serve_refuses_a_negative_value_before_loading(path):
    import os
    import subprocess
    import sys

    # -P: the installed surogate (or PYTHONPATH's), as the other tests starting `surogate serve`
    argv = [sys.executable, "-P", "-m", "surogate.cli.main", "serve", str(path), "--cpu-offload-gb", "-1"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=os.environ)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "error: --cpu-offload-gb -1.0 is not a number >= 0" in proc.stderr, proc.stderr
