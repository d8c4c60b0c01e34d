"""The engine serving each registered family's tiny model through its Program over the paged KV
cache: greedy outputs equal HF transformers' greedy generation token for token, alone and 20 at
once, with the prefix cache cold and warm, under chunked prefill and preemption; aborts free
blocks."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import surogate  # noqa: E402
from sgtest.engine import engine, generate, hf_greedy, prompts  # noqa: E402
from sgtest.tiny_models import make_model  # noqa: E402
from surogate.models import REGISTRY  # noqa: E402
from surogate.serve.types import SamplingParams  # noqa: E402

@pytest.fixture(scope="module", params=[f.name for f in REGISTRY])
def family(request, tmp_path_factory):
    path = make_model(request.param, tmp_path_factory.mktemp(request.param), seed=21, initializer_range=0.2)
    ours = surogate.load_model(path)
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    return ours, ref


@pytest.mark.parametrize("fuse_qkv", [False, True])
def test_greedy_alone_and_concurrent_equals_transformers_cold_and_warm(family, fuse_qkv):
    ours, ref = family
    ps = prompts(ours.spec.vocab_size, 20, seed=1)
    expected = [hf_greedy(ref, p, 10) for p in ps]
    with engine(ours, fuse_qkv=fuse_qkv) as client:
        assert generate(client, ps[:1], 10) == expected[:1]  # alone
        assert generate(client, ps, 10) == expected  # 20 at once (some prefixes now cached)
        hits_before = client.stats().prefix_cache_hits
        assert generate(client, ps, 10) == expected  # warm: every full prompt block is cached
        if client.runner.has_recurrent_state:  # conv layers: the engine runs without the prefix cache
            assert client.stats().prefix_cache_hits == hits_before == 0
        else:
            assert client.stats().prefix_cache_hits > hits_before


def test_chunked_prefill_and_preemption_change_nothing(family):
    ours, ref = family
    ps = prompts(ours.spec.vocab_size, 12, seed=2)
    expected = [hf_greedy(ref, p, 12) for p in ps]
    # A 7-token budget splits every longer prompt; 12 blocks of 4 force preemption.
    with engine(ours, num_blocks=12, block_size=4, max_num_batched_tokens=7, enable_prefix_caching=False) as client:
        assert generate(client, ps, 12) == expected
        assert client.stats().num_preemptions > 0


def test_abort_frees_the_blocks(family):
    ours, _ = family
    with engine(ours) as client:
        rid = client.submit(list(range(3, 40)), SamplingParams(temperature=0.0, max_tokens=10_000, ignore_eos=True))
        stream_first = None
        import time

        deadline = time.time() + 30
        while client.stats().blocks_used == 0 and time.time() < deadline:
            time.sleep(0.01)
        assert client.stats().blocks_used > 0
        client.abort(rid)
        outs = client.wait(rid, timeout=30)
        assert outs[-1].finish_reason == "abort"
        assert client.stats().blocks_used == 0
        del stream_first


def test_200_requests_against_a_cache_that_fits_10(family):
    ours, ref = family
    rng = np.random.default_rng(3)
    ps = [rng.integers(3, ours.spec.vocab_size, 5).tolist() for _ in range(200)]
    # 5 prompt + 4 output tokens = 3 blocks of 4 per request: 30 blocks hold 10 requests.
    with engine(ours, num_blocks=30, block_size=4) as client:
        outs = generate(client, ps, 4)
        assert all(len(o) == 4 for o in outs)
        assert client.stats().blocks_used == 0
    for p, o in list(zip(ps, outs))[:5]:  # spot-check against transformers
        assert o == hf_greedy(ref, p, 4)
