"""Embedding rows (EmbedSpan) through the engine on the GPU: the rows go up with the step's inputs
and replace the embeddings there (a tiny Llama's greedy tokens equal transformers'
generate(inputs_embeds=...) in f32, under chunked prefill and from the prefix cache); a
bidirectional span on Gemma 3 gives transformers' logits under the span mask (the general paged
kernel with kv_limit); bf16 stays close to the CPU. Skipped without a CUDA build and a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from surogate import _native

pytestmark = pytest.mark.cuda
if not (_native.build_info()["cuda"] and _native.cuda_devices()):
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import surogate  # noqa: E402
from sgtest.embeds import (greedy, hf_greedy_embeds, hf_logits, log_softmax, prompt, served_logprobs,  # noqa: E402
                           with_placeholders)
from sgtest.engine import engine  # noqa: E402
from sgtest.tiny_models import make_model  # noqa: E402
from surogate.serve.types import EmbedSpan  # noqa: E402


@pytest.fixture(scope="module")
def llama_path(tmp_path_factory):
    return make_model("llama", tmp_path_factory.mktemp("llama"), seed=21, initializer_range=0.2)


@pytest.mark.parametrize("chunked", [False, True])
def test_rows_on_cuda_equal_transformers_inputs_embeds(llama_path, chunked):
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(llama_path), dtype=torch.float32).eval()
    ours = surogate.load_model(llama_path, device="cuda")
    rng = np.random.default_rng(2)
    C = ours.spec.hidden_size
    ids = with_placeholders(prompt(27, 3, ours.spec.vocab_size), [(2, 7), (12, 10)])
    spans = [EmbedSpan(2, rng.normal(0, 0.3, (7, C)).astype(np.float32), b"img0"),
             EmbedSpan(12, rng.normal(0, 0.3, (10, C)).astype(np.float32), b"img1")]
    expected = hf_greedy_embeds(ref, ids, spans, 8)
    kw = {"max_num_batched_tokens": 5, "block_size": 4} if chunked else {}
    with engine(ours, **kw) as client:
        assert greedy(client, ids, 8, spans)[0] == expected
        tokens, cached = greedy(client, ids, 8, spans)  # warm
        assert tokens == expected and cached > 0
        other = [EmbedSpan(s.start, s.rows[::-1].copy(), s.key + b"'") for s in spans]
        assert greedy(client, ids, 8, other)[0] == hf_greedy_embeds(ref, ids, other, 8)


def test_rows_in_bf16_on_cuda_stay_close_to_the_cpu(llama_path):
    rng = np.random.default_rng(5)
    cpu = surogate.load_model(llama_path, dtype="bfloat16")
    gpu = surogate.load_model(llama_path, device="cuda", dtype="bfloat16")
    C = cpu.spec.hidden_size
    ids = with_placeholders(prompt(30, 6, cpu.spec.vocab_size), [(4, 16)])
    spans = [EmbedSpan(4, rng.normal(0, 0.3, (16, C)).astype(np.float32), b"x")]
    want, _, _ = served_logprobs(cpu, ids, spans)
    got, _, _ = served_logprobs(gpu, ids, spans)
    np.testing.assert_allclose(got, want, atol=0.1)


@pytest.mark.parametrize("budget", [None, 3])
def test_bidirectional_span_on_cuda_gives_transformers_gemma3_logits(tmp_path_factory, budget):
    path = make_model("gemma3", tmp_path_factory.mktemp("gemma3"), seed=7, initializer_range=0.2)
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32,
                                                            attn_implementation="eager").eval()
    ours = surogate.load_model(path, device="cuda")
    rng = np.random.default_rng(8)
    C = ours.spec.hidden_size
    ids = with_placeholders(prompt(22, 9, ours.spec.vocab_size), [(5, 6), (14, 3)])
    spans = [EmbedSpan(5, rng.normal(0, 1.0, (6, C)).astype(np.float32), b"i0", True),
             EmbedSpan(14, rng.normal(0, 1.0, (3, C)).astype(np.float32), b"i1", True)]
    lp = log_softmax(hf_logits(ref, ids, spans))
    kw = {} if budget is None else {"max_num_batched_tokens": budget, "block_size": 4}
    got, top, _ = served_logprobs(ours, ids, spans, **kw)
    np.testing.assert_allclose(got, lp[np.arange(len(ids) - 1), ids[1:]], rtol=1e-3, atol=1e-3)
    order = np.argsort(-lp[-1], kind="stable")[:5]
    assert [t for t, _ in top] == order.tolist()
