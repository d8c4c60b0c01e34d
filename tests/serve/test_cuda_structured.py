"""Structured outputs on the GPU (issue #20): grammar masks applied on the device by the `sample`
op's mask input after the step (ProgramRunner::sample_masked), against the host Sampler's masked
path on the same GPU (SUROGATE_DEVICE_MASKS=0) and against the CPU engine: the same tokens,
greedy and seeded-sampled, in mixed batches (constrained + plain + logit_bias rows), and the
answers parse against their schema. Skipped without a CUDA build and a GPU; run on the lent H200.
"""

from __future__ import annotations

import json

import pytest

from surogate import _native

pytestmark = pytest.mark.cuda
if not (_native.build_info()["cuda"] and _native.cuda_devices()):
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)
pytest.importorskip("llguidance")

import surogate  # noqa: E402
from sgtest.engine import engine, prompts  # noqa: E402
from sgtest.tiny_models import make_model  # noqa: E402
from surogate.serve.structured import Grammars  # noqa: E402
from surogate.serve.types import SamplingParams, StructuredOutputsParams  # noqa: E402

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "kind": {"enum": ["a", "bb", "ccc"]}},
          "required": ["ok", "kind"], "additionalProperties": False}
JSON = StructuredOutputsParams(json=json.dumps(SCHEMA))
REGEX = StructuredOutputsParams(regex="[a-z ]{1,10}")


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def path(request, tmp_path_factory):
    return make_model(request.param, tmp_path_factory.mktemp(request.param), seed=23, initializer_range=0.2)


def jobs(vocab):
    ps = prompts(vocab, 8, seed=12)
    specs = [JSON, JSON, REGEX, None, JSON, REGEX, None, JSON]
    knobs = [dict(temperature=0.0), dict(temperature=0.9, seed=1), dict(temperature=0.7, top_k=20, seed=2),
             dict(temperature=0.0, logit_bias={5: 8.0}), dict(temperature=1.1, top_p=0.9, seed=3, logprobs=0),
             dict(temperature=0.0, logit_bias={9: 2.0}), dict(temperature=0.8, seed=4), dict(temperature=0.0)]
    return [(p, SamplingParams(max_tokens=40, ignore_eos=s is None, structured_outputs=s, **k))
            for p, s, k in zip(ps, specs, knobs)]


def run(model, monkeypatch, device_masks: bool):
    monkeypatch.setenv("SUROGATE_DEVICE_MASKS", "1" if device_masks else "0")
    grammars = Grammars(model.tokenizer, model.spec.vocab_size)
    with engine(model, eos_token_ids=list(model.tokenizer.eos_token_ids)) as client:
        ids = [client.submit(p, params, matcher=grammars.matcher(grammars.compile(params.structured_outputs))
                             if params.structured_outputs else None) for p, params in jobs(model.spec.vocab_size)]
        out = [[t for o in client.wait(i, timeout=120) for t in o.new_token_ids] for i in ids]
        masked = client.stats().device_masked_rows
    return out, masked


def test_device_masked_rows_on_cuda_equal_the_host_path_and_the_cpu(path, monkeypatch):
    gpu = surogate.load_model(path, device="cuda")
    dev, masked = run(gpu, monkeypatch, True)
    host, host_masked = run(gpu, monkeypatch, False)
    cpu, _ = run(surogate.load_model(path), monkeypatch, False)
    assert masked > 0 and host_masked == 0
    greedy = [i for i, (_, p) in enumerate(jobs(gpu.spec.vocab_size)) if p.temperature == 0.0]
    assert [dev[i] for i in greedy] == [host[i] for i in greedy] == [cpu[i] for i in greedy]
    assert sum(a != b for a, b in zip(dev, host)) <= 1, (dev, host)  # (an expf an ulp apart could move one)
    eos = set(gpu.tokenizer.eos_token_ids)
    for (_, p), tokens in zip(jobs(gpu.spec.vocab_size), dev):
        if p.structured_outputs is JSON:
            got = json.loads(gpu.tokenizer.decode([t for t in tokens if t not in eos]))
            assert set(got) == {"ok", "kind"} and got["kind"] in ("a", "bb", "ccc")
