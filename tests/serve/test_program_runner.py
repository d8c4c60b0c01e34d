"""The native ProgramRunner: buckets, the argmax that stands in for a greedy row's logits, and
what the engine does with it (the same tokens as sampling from full logits; NaN logits are
still an error that names the cause)."""

from __future__ import annotations

import numpy as np
import pytest

import surogate
from sgtest.engine import engine
from sgtest.tiny_models import make_qwen3
from surogate import _native
from surogate.errors import InvalidArgumentError
from surogate.serve.model_runner import ProgramRunner, bucket_tokens
from surogate.serve.types import SamplingParams

StepInput = _native.serve.StepInput


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return surogate.load_model(make_qwen3(tmp_path_factory.mktemp("q"), seed=5, initializer_range=0.2))


def prefill_step(lens: list[int], need: list[int] | None = None, block_size: int = 16) -> StepInput:
    """One prefill step of fresh sequences of these lengths, blocks laid out one after another;
    a logits row for each sequence's last token."""
    ids, pos, slots, cu, tables, rows = [], [], [], [0], [], []
    width = max(-(-n // block_size) for n in lens)
    first_block = 0
    for n in lens:
        blocks = list(range(first_block, first_block + -(-n // block_size)))
        first_block += len(blocks)
        ids += [(7 * i + n) % 200 + 3 for i in range(n)]
        pos += list(range(n))
        slots += [blocks[p // block_size] * block_size + p % block_size for p in range(n)]
        cu.append(cu[-1] + n)
        tables += blocks + [-1] * (width - len(blocks))
        rows.append(cu[-1] - 1)
    return StepInput.make(ids, pos, slots, cu, lens, tables, rows, need_logits=need, block_size=block_size)


def test_bucket_tokens():
    assert [bucket_tokens(t) for t in (1, 7, 16, 17, 100, 256, 257, 600)] == [1, 7, 16, 32, 112, 256, 512, 768]


def test_argmax_rows_equal_the_logits_argmax_and_unneeded_rows_may_stay_empty(model):
    runner = ProgramRunner(model, num_blocks=32)
    logits, argmax = runner.run(prefill_step([5, 21, 40], need=[1, 1, 1]))
    assert logits.shape == (3, model.spec.vocab_size)
    np.testing.assert_array_equal(argmax, logits.argmax(axis=1))
    # Only row 1's logits asked for: its row is the same, the argmax of all three is given.
    runner2 = ProgramRunner(model, num_blocks=32)
    l2, a2 = runner2.run(prefill_step([5, 21, 40], need=[0, 1, 0]))
    np.testing.assert_array_equal(a2, argmax)
    np.testing.assert_allclose(l2[1], logits[1], rtol=1e-6, atol=1e-6)
    assert runner2.native.num_programs == 1


def test_a_step_with_many_tokens_is_padded_into_its_bucket(model):
    runner = ProgramRunner(model, num_blocks=64)
    odd = prefill_step([40, 33, 30])  # 103 tokens -> the 112 bucket, a padding sequence of 9
    exact = [ProgramRunner(model, num_blocks=64).run(prefill_step([n]))[0][0] for n in (40, 33, 30)]
    assert runner.native.bucket_key(odd) == (112, 4, 4, 4, -1, 0)  # T, S (+ the padding one), B, R, adapter, E
    logits, _ = runner.run(odd)
    for got, want in zip(logits, exact):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_step_input_make_checks_lengths():
    with pytest.raises(InvalidArgumentError, match="inconsistent lengths"):
        StepInput.make([1, 2], [0], [0, 1], [0, 2], [2], [0], [1])
    with pytest.raises(InvalidArgumentError, match="need_logits"):
        StepInput.make([1, 2], [0, 1], [0, 1], [0, 2], [2], [0], [1], need_logits=[1, 0])


def test_greedy_through_the_argmax_equals_greedy_from_full_logits(model):
    """logprobs=0 makes the engine read each row's logits and argmax them on the host; without it
    the device's argmax is used. Same tokens, and a seeded sampled request beside them is
    unaffected by the others."""
    rng = np.random.default_rng(3)
    ps = [rng.integers(3, 200, int(n)).tolist() for n in (3, 17, 30, 9)]
    fast = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    full = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=0)
    sampled = SamplingParams(temperature=0.9, top_p=0.9, seed=11, max_tokens=12, ignore_eos=True)
    with engine(model) as client:
        def run(params_list):
            ids = [client.submit(p, params) for p, params in zip(ps, params_list)]
            return [[t for out in client.wait(i, timeout=60) for t in out.new_token_ids] for i in ids]

        a = run([fast] * 4)
        b = run([full] * 4)
        c = run([fast, sampled, full, sampled])
        d = run([sampled] * 4)
    assert a == b
    assert c[0] == a[0] and c[2] == a[2]
    assert c[1] == d[1] and c[3] == d[3]


def test_nan_logits_finish_greedy_requests_with_an_error(tmp_path):
    broken = surogate.load_model(make_qwen3(tmp_path / "q", seed=5))
    broken.params["norm.weight"][:] = np.nan  # every logit NaN
    with engine(broken) as client:
        out = client.wait(client.submit([5, 6, 7], SamplingParams(temperature=0.0, max_tokens=3)), timeout=60)
    last = out[-1]
    assert last.finish_reason == "error" and "non-finite" in last.finish_message


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_fused_qkv_serves_the_same_logits(family, tmp_path):
    from sgtest.tiny_models import make_llama

    make = make_llama if family == "llama" else make_qwen3
    m = surogate.load_model(make(tmp_path / family, seed=9, initializer_range=0.2))
    step = prefill_step([5, 21, 40])
    plain, a = ProgramRunner(m, num_blocks=32, fuse_qkv=False).run(step)
    fused_runner = ProgramRunner(m, num_blocks=32, fuse_qkv=True)
    fused, b = fused_runner.run(step)
    np.testing.assert_allclose(fused, plain, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(a, b)
    assert sorted(fused_runner.fused) == sorted(f"layers.{i}.self_attn.qkv_proj.weight" for i in range(m.spec.num_layers))
    exe = next(iter(fused_runner._programs.values()))
    ops = [exe.program.instr(i) for i in range(exe.program.num_instrs)]
    assert not any("q_proj.weight" in o for o in ops) and sum("qkv_proj.weight" in o for o in ops) == m.spec.num_layers


@pytest.mark.parametrize("fuse_qkv", [False, True])
def test_serving_program_folds_norms_and_the_activation_into_the_matmuls(model, fuse_qkv):
    """Each layer's norms go into the first projection after them (the fused qkv, else only
    gate_up) and its activation into down_proj (the HF comparisons of test_model_engine check
    the tokens)."""
    runner = ProgramRunner(model, num_blocks=32, fuse_qkv=fuse_qkv)
    runner.run(prefill_step([5, 21]))
    exe = next(iter(runner._programs.values()))
    ops = [exe.program.instr(i).split("(")[0] for i in range(exe.program.num_instrs)]
    L = model.spec.num_layers
    assert ops.count("add_rmsnorm_matmul") == (2 if fuse_qkv else 1) * L and ops.count("gated_matmul") == L
    assert "swiglu_fwd" not in ops and ops.count("rmsnorm_fwd") == (0 if fuse_qkv else 1)


def test_release_and_restore_give_the_memory_back_and_the_same_tokens(model):
    """A sleeping model: the prefix cache is forgotten, the KV cache and Programs dropped; after
    restore the same prompts give the same tokens, computed afresh (no stale prefix hits)."""
    from sgtest.engine import generate

    rng = np.random.default_rng(4)
    ps = [rng.integers(3, 200, 40).tolist() for _ in range(3)]
    runner = ProgramRunner(model, num_blocks=64)
    from surogate.serve.engine_client import EngineClient
    from surogate.serve.types import EngineConfig

    with EngineClient(runner, EngineConfig(num_blocks=64, block_size=16)) as client:
        first = generate(client, ps, 6)
        assert client.stats().blocks_cached > 0
        assert client.reset_prefix_cache() > 0
        assert client.stats().blocks_cached == 0
        runner.release()
        assert runner.caches == {} and runner.native.num_programs == 0 and not model._on_device
        runner.restore()
        hits = client.stats().prefix_cache_hits
        assert generate(client, ps, 6) == first
        assert client.stats().prefix_cache_hits == hits  # nothing came from before the sleep
        assert generate(client, ps, 6) == first  # and the cache works again
        assert client.stats().prefix_cache_hits > hits


def test_a_runner_and_its_model_are_collected(tmp_path):
    """The native runner calls the Python one back to build Programs; held strongly, that made a
    cycle through C++ the collector cannot see, and every runner kept its model (a launch's
    profile run's model, one unloaded from the server) for the life of the process. Closed or
    not, after an engine ran steps over it, the runner and its model go."""
    import gc
    import weakref

    for close, serve in ((True, False), (False, False), (True, True)):
        model = surogate.load_model(make_qwen3(tmp_path / f"q{close}{serve}"))
        runner = ProgramRunner(model, num_blocks=32)
        if serve:
            with engine(model) as client:
                i = client.submit([5, 6, 7], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
                assert len([t for o in client.wait(i, timeout=60) for t in o.new_token_ids]) == 3
            del client
        runner.profile(64, 4)
        if close:
            runner.close()
        refs = weakref.ref(model), weakref.ref(runner)
        del model, runner
        gc.collect()
        assert [r() for r in refs] == [None, None], (close, serve)
