"""Grammar masks applied on the device (issue #20), through the real engine on a tiny random Qwen3
with llguidance grammars: once the helper thread has filled a step's masks, the ProgramRunner runs
the `sample` op with its mask input over the constrained rows' logits, still in the Program's
buffer, and only their tokens come back. SUROGATE_DEVICE_MASKS=0 (read when an engine is made)
keeps every grammar row on the host Sampler's path; both paths give the same tokens, greedy and
seeded-sampled, alone and in mixed batches (constrained + plain + logit_bias rows, which stay on
the host), and the answers still parse against their schema. A grammar that allows nothing fails
the request with the host's error on both paths."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("llguidance")

import surogate  # noqa: E402
from sgtest.engine import engine, prompts  # noqa: E402
from sgtest.tiny_models import make_qwen3  # noqa: E402
from surogate.serve.structured import Grammars  # noqa: E402
from surogate.serve.types import SamplingParams, StructuredOutputsParams  # noqa: E402

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "kind": {"enum": ["a", "bb", "ccc"]}},
          "required": ["ok", "kind"], "additionalProperties": False}
JSON = StructuredOutputsParams(json=json.dumps(SCHEMA))
REGEX = StructuredOutputsParams(regex="[a-z ]{1,10}")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return surogate.load_model(make_qwen3(tmp_path_factory.mktemp("q"), seed=7, initializer_range=0.2))


def run(model, monkeypatch, jobs, device: bool):
    """jobs: (prompt, SamplingParams) -> per job (token ids, finish reason, error text). Checks
    which path the grammar rows took (EngineStats.device_masked_rows)."""
    monkeypatch.setenv("SUROGATE_DEVICE_MASKS", "1" if device else "0")
    grammars = Grammars(model.tokenizer, model.spec.vocab_size)
    out = []
    with engine(model, eos_token_ids=list(model.tokenizer.eos_token_ids)) as client:
        ids = []
        for p, params in jobs:
            spec = params.structured_outputs
            ids.append(client.submit(p, params, matcher=grammars.matcher(grammars.compile(spec)) if spec else None))
        for i in ids:
            outs = client.wait(i, timeout=120)
            out.append(([t for o in outs for t in o.new_token_ids], outs[-1].finish_reason,
                        outs[-1].finish_message))
        masked = client.stats().device_masked_rows
    constrained = [p.structured_outputs is not None and not p.logit_bias for _, p in jobs]
    assert (masked > 0) == (device and any(constrained)), masked
    if device:  # every answer token of a plain grammar row but the last (EOS, after the grammar ended)
        assert masked >= sum(len(o[0]) - 1 for o, c in zip(out, constrained) if c)
    return out


def answer(model, tokens) -> str:
    eos = set(model.tokenizer.eos_token_ids)
    return model.tokenizer.decode([t for t in tokens if t not in eos])


def test_constrained_greedy_and_seeded_rows_equal_the_host_path_and_parse(model, monkeypatch):
    ps = prompts(model.spec.vocab_size, 6, seed=4)
    knobs = [dict(temperature=0.0), dict(temperature=0.9, seed=11), dict(temperature=0.7, top_k=20, seed=12),
             dict(temperature=1.1, top_p=0.9, seed=13), dict(temperature=0.8, min_p=0.05, logprobs=0, seed=14),
             dict(temperature=1.0)]  # the last unseeded: the engine's own seed per request
    jobs = [(p, SamplingParams(max_tokens=40, structured_outputs=JSON, **k)) for p, k in zip(ps, knobs)]
    dev = run(model, monkeypatch, jobs[:5], True)
    host = run(model, monkeypatch, jobs[:5], False)
    assert [d[0] for d in dev] == [h[0] for h in host]
    for tokens, reason, _ in dev:
        assert reason == "stop", reason
        got = json.loads(answer(model, tokens))
        assert set(got) == {"ok", "kind"} and isinstance(got["ok"], bool) and got["kind"] in ("a", "bb", "ccc")
    (unseeded, _, _), = run(model, monkeypatch, jobs[5:], True)
    assert json.loads(answer(model, unseeded))["kind"] in ("a", "bb", "ccc")
    assert len({tuple(d[0]) for d in dev}) > 1  # not one answer for all


def test_mixed_batches_of_constrained_plain_and_logit_bias_rows(model, monkeypatch):
    """Constrained rows (device path), plain greedy / sampled rows, logit_bias rows and a
    constrained row with logit_bias (both host-only: it keeps the host path) in one batch: every
    request's tokens equal the host path's, and equal its tokens alone."""
    ps = prompts(model.spec.vocab_size, 8, seed=9)
    specs = [JSON, None, REGEX, None, JSON, REGEX, None, JSON]
    extra = [dict(temperature=0.0), dict(temperature=0.8, seed=3), dict(temperature=0.6, seed=4),
             dict(temperature=0.0, logit_bias={5: 9.0}), dict(temperature=0.7, seed=8, logit_bias={7: 3.0}),
             dict(temperature=0.0), dict(temperature=1.2, top_k=8, seed=5), dict(temperature=0.9, seed=6, logprobs=0)]
    jobs = [(p, SamplingParams(max_tokens=16, ignore_eos=s is None, structured_outputs=s, **e))
            for p, s, e in zip(ps, specs, extra)]
    dev = run(model, monkeypatch, jobs, True)
    host = run(model, monkeypatch, jobs, False)
    assert [d[0] for d in dev] == [h[0] for h in host]
    alone = [run(model, monkeypatch, [j], True)[0] for j in jobs[:3]]
    assert [a[0] for a in alone] == [d[0] for d in dev[:3]]
    for (tokens, _, _), s in zip(dev, specs):
        if s is REGEX:
            text = answer(model, tokens)
            assert 1 <= len(text) <= 10 and set(text) <= set("abcdefghijklmnopqrstuvwxyz ")


def test_logprobs_of_device_masked_rows_are_the_raw_ones(model, monkeypatch):
    """logprobs 0 on a constrained row: the chosen token's raw log_softmax and rank come from the
    device with it, equal to the host Sampler's."""
    ps = prompts(model.spec.vocab_size, 3, seed=2)
    jobs = [(p, SamplingParams(max_tokens=12, structured_outputs=REGEX, logprobs=0, temperature=t, seed=21))
            for p, t in zip(ps, (0.0, 0.8, 1.3))]

    def lps(device):
        monkeypatch.setenv("SUROGATE_DEVICE_MASKS", "1" if device else "0")
        grammars = Grammars(model.tokenizer, model.spec.vocab_size)
        with engine(model, eos_token_ids=list(model.tokenizer.eos_token_ids)) as client:
            ids = [client.submit(p, params, matcher=grammars.matcher(grammars.compile(REGEX))) for p, params in jobs]
            got = [[(lp.token_id, lp.logprob, lp.rank) for o in client.wait(i, timeout=120) for lp in o.logprobs]
                   for i in ids]
            assert (client.stats().device_masked_rows > 0) == device
            return got

    dev, host = lps(True), lps(False)
    for d, h in zip(dev, host):
        assert [x[0] for x in d] == [x[0] for x in h] and [x[2] for x in d] == [x[2] for x in h]
        np.testing.assert_allclose([x[1] for x in d], [x[1] for x in h], rtol=1e-5, atol=1e-5)


def test_a_mask_allowing_nothing_fails_as_on_the_host(model, monkeypatch):
    """An all-zero mask row (a grammar allowing nothing): the request finishes with the host
    Sampler's "every token is masked" error, from the device path (the op's token -2) as from the
    host path; a plain request beside it is unaffected."""
    from surogate.serve.structured import TokenMasks

    def nothing(self, ids, toks, cands, rows=None, refused=None):  # every draw refused, its mask all zero
        if cands is None:
            return None
        rows.fill(0)
        return [False] * len(cands)

    monkeypatch.setattr(TokenMasks, "_fill", lambda self, batch, rows: rows.fill(0))  # every mask row: all zero
    monkeypatch.setattr(TokenMasks, "check", nothing)
    results = {}
    for device in (True, False):
        monkeypatch.setenv("SUROGATE_DEVICE_MASKS", "1" if device else "0")
        grammars = Grammars(model.tokenizer, model.spec.vocab_size)
        with engine(model) as client:
            bad = [client.submit([5, 6, 7], SamplingParams(max_tokens=4, structured_outputs=REGEX, **k),
                                 matcher=grammars.matcher(grammars.compile(REGEX)))
                   for k in (dict(temperature=0.0), dict(temperature=0.9, seed=2))]
            plain = client.submit([5, 6, 7], SamplingParams(max_tokens=4, ignore_eos=True, temperature=0.0))
            outs = [client.wait(i, timeout=120) for i in bad + [plain]]
            assert (client.stats().device_masked_rows == 2) == device
        results[device] = [(o[-1].finish_reason, o[-1].finish_message, [t for x in o for t in x.new_token_ids])
                           for o in outs]
    assert results[True] == results[False]
    for reason, message, tokens in results[True][:2]:
        assert reason == "error" and "every token is masked" in message and tokens == []
    assert results[True][2][0] == "length" and len(results[True][2][2]) == 4


def test_grammar_rows_of_the_base_and_a_lora_adapter_in_one_step(model, monkeypatch, tmp_path):
    """A step split per adapter (one sub-step, one bucket Program each): the device masks each
    grammar row over its own sub-step's logits; the tokens equal the host path's."""
    from surogate.dsl.nn import LoRAConfig
    from surogate.serve.engine_client import EngineClient
    from surogate.serve.model_runner import ProgramRunner
    from surogate.serve.types import EngineConfig
    from surogate.train.lora import ALL_TARGETS, init_lora, load_peft_adapter, save_peft_adapter

    cfg = LoRAConfig(rank=4, alpha=8.0, targets=ALL_TARGETS)
    g = model.arch.build(mode="logits", dtype="float32", lora=cfg)
    rng = np.random.default_rng(3)
    params = {k: (v if k.endswith("lora_A") else rng.standard_normal(v.shape).astype(np.float32) * 0.3)
              for k, v in init_lora(g, 7).items()}
    adapter = save_peft_adapter(tmp_path / "adapter", params, cfg, base_model=str(model.path))
    ps = prompts(model.spec.vocab_size, 4, seed=5)
    jobs = [(p, SamplingParams(max_tokens=24, structured_outputs=JSON, seed=30 + k,
                               temperature=0.0 if k % 2 else 0.8), None if k < 2 else 0)
            for k, p in enumerate(ps)] + [(ps[0], SamplingParams(max_tokens=8, ignore_eos=True, temperature=0.0), 0)]

    def go(device):
        monkeypatch.setenv("SUROGATE_DEVICE_MASKS", "1" if device else "0")
        runner = ProgramRunner(model, num_blocks=64, block_size=16)
        runner.add_adapter(0, *load_peft_adapter(adapter))
        grammars = Grammars(model.tokenizer, model.spec.vocab_size)
        config = EngineConfig(num_blocks=64, block_size=16, eos_token_ids=list(model.tokenizer.eos_token_ids))
        with EngineClient(runner, config) as client:
            ids = [client.submit(p, sp, a, matcher=grammars.matcher(grammars.compile(JSON))
                                 if sp.structured_outputs else None) for p, sp, a in jobs]
            out = [[t for o in client.wait(i, timeout=120) for t in o.new_token_ids] for i in ids]
            assert (client.stats().device_masked_rows > 0) == device
        return out

    dev, host = go(True), go(False)
    assert dev == host
    assert dev[0] != dev[2] or dev[1] != dev[3]  # the adapter matters
