"""Speculative decoding (n-gram) on the GPU: verification spans of 1 + k tokens per sequence run
through the serving Program's general paged-attention path, in buckets of their own, eagerly,
captured into CUDA graphs and replayed (each batch runs three times); greedy output must equal
plain decoding on every tiny family (f32), under preemption, and on SmolLM2 (f32, also against
the CPU). Skipped without a CUDA build and a GPU: written without one, never run on a GPU yet."""

from __future__ import annotations

import pytest

from surogate import _native

pytestmark = pytest.mark.cuda
if not (_native.build_info()["cuda"] and _native.cuda_devices()):
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)

import surogate  # noqa: E402
from sgtest.engine import draft_engine, engine, generate, prompts  # noqa: E402
from sgtest.tiny_models import make_model  # noqa: E402
from surogate.models import REGISTRY  # noqa: E402

NGRAM = dict(speculative_method="ngram", num_speculative_tokens=4, prompt_lookup_min=1, prompt_lookup_max=3)


@pytest.fixture(scope="module", params=[f.name for f in REGISTRY])
def tiny(request, tmp_path_factory):
    path = make_model(request.param, tmp_path_factory.mktemp(request.param), seed=21, initializer_range=0.2)
    return surogate.load_model(path, device="cuda")


def test_greedy_speculation_on_cuda_equals_plain(tiny):
    if "conv" in tiny.spec.layer_kinds:
        pytest.skip("conv layers keep a recurrent state: speculation is refused (test_speculative_models.py)")
    ps = [(p * 3)[:40] for p in prompts(tiny.spec.vocab_size, 16, seed=4)]
    with engine(tiny) as plain:
        want = generate(plain, ps, 12)
    with engine(tiny, **NGRAM) as spec:
        for _ in range(3):  # eager, graph capture, replay
            assert generate(spec, ps, 12) == want
        assert spec.stats().spec_num_draft_tokens > 0
    with engine(tiny, num_blocks=14, block_size=4, max_num_batched_tokens=9, enable_prefix_caching=False,
                **NGRAM) as small:
        assert generate(small, ps, 12) == want
        assert small.stats().num_preemptions > 0


def test_a_draft_model_on_cuda_changes_no_greedy_output(tiny, tmp_path):
    """speculative_method "draft" on the GPU: a random draft of the same family (other weights; its
    own runner, KV cache on the target's blocks), eager, captured and replayed; then the target as
    its own draft is accepted nearly always (its draft KV read through the target's block tables).
    The draft keeps the tiny config's layer count: Gemma 4's and GPT-OSS's configs list per-layer
    settings that transformers refuses for fewer layers."""
    if "conv" in tiny.spec.layer_kinds:
        pytest.skip("conv layers keep a recurrent state: speculation is refused (test_speculative_models.py)")
    draft = surogate.load_model(make_model(tiny.family.name, tmp_path / "d", seed=5, initializer_range=0.2),
                                device="cuda")
    ps = prompts(tiny.spec.vocab_size, 16, seed=6)
    with engine(tiny) as plain:
        want = generate(plain, ps, 12)
    with draft_engine(tiny, draft) as spec:
        for _ in range(3):  # eager, graph capture, replay
            assert generate(spec, ps, 12) == want
        s = spec.stats()
        assert s.spec_num_draft_tokens > 0 and s.last_error is None
    with draft_engine(tiny, tiny) as itself:
        assert generate(itself, ps, 12) == want
        s = itself.stats()
    assert s.spec_num_accepted_tokens >= 0.95 * s.spec_num_draft_tokens > 0


def test_smollm2_speculation_on_cuda_equals_plain_and_the_cpu():
    from sgtest.smollm2 import smollm2_path

    path = smollm2_path()
    gpu = surogate.load_model(path, device="cuda")
    tok = gpu.tokenizer
    texts = ["Repeat this list twice: apple, banana, cherry, date, elderberry, fig, grape",
             "Write the numbers from 1 to 30, separated by commas.",
             "Copy exactly: The cat sat on the mat. The dog sat on the log."]
    ps = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True) for t in texts]
    with engine(surogate.load_model(path)) as cpu:
        want = generate(cpu, ps, 32)
    with engine(gpu) as plain:
        assert generate(plain, ps, 32) == want
    with engine(gpu, **dict(NGRAM, prompt_lookup_min=2, prompt_lookup_max=4)) as spec:
        for _ in range(3):
            assert generate(spec, ps, 32) == want
        s = spec.stats()
    assert s.spec_num_accepted_tokens / s.spec_num_draft_tokens > 0.3
