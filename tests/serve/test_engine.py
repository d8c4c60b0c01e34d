"""Unit tests of the native serving engine's bookkeeping (scheduler, block manager, prefix cache,
preemption, chunked prefill, stop rules, logprobs, abort), driven through PyModelRunner by a
deterministic toy runner. Not a model integration test: no real model runs here.

The toy runner keeps its own "KV cache", one value per slot, written at ``slot_mapping`` and
read back through ``block_tables`` / ``context_lens``. The next-token logits of a row depend on
every (token, position) the engine claims is in the cache for that sequence, so a wrong slot, a
wrong block table, a prefix-cache hit on the wrong block or a bad recompute after preemption
all change the generated tokens; ``reference`` computes what they must be from plain token lists.
(One file past 400 lines: every test here shares the toy runner and the reference.)
"""

from __future__ import annotations

import numpy as np
import pytest

from surogate import _native
from surogate.errors import InvalidArgumentError
from surogate.serve import EngineClient, EngineConfig, SamplingParams

V = 61
EOS = 0
_M = (1 << 61) - 1
_RAMP = -0.25 * np.arange(V, dtype=np.float32)  # distinct logits: argmax unique, sampling not one-hot


def kv_of(token: int, pos: int) -> int:
    return (int(token) + 1) * 1_000_003 + int(pos) * 7919


def chain(h: int, kv: int) -> int:
    return (h * 1_000_003 + kv) % _M


def logits_of(h: int) -> np.ndarray:
    """Row whose argmax is h % V, the others falling off by 0.25 per step away from it."""
    return np.roll(_RAMP, h % V)


class ToyKVRunner:
    vocab_size = V

    def __init__(self, num_slots: int) -> None:
        self.kv = np.full(num_slots, -1, dtype=np.int64)
        self.steps: list[tuple[int, int]] = []  # (tokens, seqs) per step
        self.inputs = []
        self.raise_on_step: int | None = None

    def run(self, step) -> np.ndarray:
        T, S, bs = step.num_tokens, step.num_seqs, step.block_size
        tok, pos, slot = step.token_ids, step.positions, step.slot_mapping
        cu, ctx, bt, rows = step.cu_q, step.context_lens, step.block_tables, step.logits_rows
        self.steps.append((T, S))
        self.inputs.append(step)
        if self.raise_on_step is not None and len(self.steps) == self.raise_on_step:
            raise RuntimeError("toy runner failure")
        # The interface's invariants.
        assert cu[0] == 0 and cu[-1] == T and (np.diff(cu) > 0).all()
        assert bt.shape == (S, step.max_blocks_per_seq)
        for s in range(S):
            p = pos[cu[s]:cu[s + 1]]
            assert (np.diff(p) == 1).all() and p[-1] + 1 == ctx[s]
            assert (bt[s, : -(-ctx[s] // bs)] >= 0).all() and (bt[s, -(-ctx[s] // bs):] == -1).all()
            blocks = bt[s][p // bs]
            assert (slot[cu[s]:cu[s + 1]] == blocks * bs + p % bs).all()
        assert (np.diff(rows) > 0).all() if len(rows) > 1 else True
        assert len(set(slot.tolist())) == T, "two tokens of one step write the same slot"
        # Store K/V first, then "attend" (as a layer does).
        for i in range(T):
            self.kv[slot[i]] = kv_of(tok[i], pos[i])
        out = np.empty((len(rows), V), np.float32)
        seq_of_row = np.searchsorted(cu, rows, side="right") - 1
        prefix: dict[int, list[int]] = {}
        for j, r in enumerate(rows):
            s = int(seq_of_row[j])
            if s not in prefix:
                q = np.arange(ctx[s])
                vals = self.kv[bt[s][q // bs] * bs + q % bs]
                assert (vals >= 0).all(), "read a slot that was never written"
                hs, h = [], 0
                for kv in vals.tolist():
                    h = chain(h, kv)
                    hs.append(h)
                prefix[s] = hs
            out[j] = logits_of(prefix[s][pos[r]])
        return out


def toy_logits(tokens: list[int]) -> np.ndarray:
    h = 0
    for i, t in enumerate(tokens):
        h = chain(h, kv_of(t, i))
    return logits_of(h)


def reference(prompt, max_tokens=None, min_tokens=0, eos=(EOS,), ignore_eos=False, stop=(), max_model_len=None):
    """Greedy tokens and finish reason the engine must produce for `prompt` on the toy model."""
    h = 0
    for i, t in enumerate(prompt):
        h = chain(h, kv_of(t, i))
    n, out = len(prompt), []
    while True:
        lg = logits_of(h).copy()
        if len(out) < min_tokens:
            lg[list(stop)] = -np.inf
            if not ignore_eos:
                lg[list(eos)] = -np.inf
        t = int(np.argmax(lg))
        out.append(t)
        h = chain(h, kv_of(t, n))
        n += 1
        if len(out) >= min_tokens and ((not ignore_eos and t in eos) or t in stop):
            return out, "stop"
        if max_tokens is not None and len(out) >= max_tokens:
            return out, "length"
        if max_model_len is not None and n >= max_model_len:
            return out, "length"


def make_engine(num_blocks=64, block_size=4, **kw):
    config = EngineConfig(num_blocks=num_blocks, block_size=block_size, eos_token_ids=[EOS], seed=1234, **kw)
    runner = ToyKVRunner(num_blocks * block_size)
    engine = _native.serve.Engine(_native.serve.PyModelRunner(runner.run, V), config)
    return engine, runner


def run_to_end(engine, max_steps=100_000) -> dict[int, dict]:
    """Step the engine until nothing is left; per request: tokens, finish reason, outputs."""
    results: dict[int, dict] = {}
    for _ in range(max_steps):
        engine.step()
        for t in engine.poll(0):
            r = results.setdefault(t[0], {"tokens": [], "outputs": [], "finish": None})
            r["tokens"] += t[1]
            r["outputs"].append(t)
            if t[4] is not None:
                r["finish"] = t[4]
        s = engine.stats()
        if s["num_running"] == 0 and s["num_waiting"] == 0:
            for t in engine.poll(0):
                raise AssertionError(f"output after the engine went idle: {t}")
            return results
    raise AssertionError("the engine did not finish")


def greedy(max_tokens=None, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **kw)


def prompts(n, lo=3, hi=30, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, V, size=int(rng.integers(lo, hi + 1))).tolist() for _ in range(n)]


# ---- the interface -------------------------------------------------------------------------

def test_step_input_layout():
    engine, runner = make_engine(num_blocks=16, block_size=4)
    a = engine.submit([5, 6, 7, 8, 9, 10], greedy(2))
    engine.step()
    b = engine.submit([11, 12, 13], greedy(2))
    engine.step()
    step = runner.inputs[1]  # a decodes (1 token), b prefills (3 tokens)
    assert (step.num_tokens, step.num_seqs, step.block_size) == (4, 2, 4)
    assert step.request_ids.tolist() == [a, b]
    assert step.cu_q.tolist() == [0, 1, 4]
    assert step.positions.tolist() == [6, 0, 1, 2]
    assert step.context_lens.tolist() == [7, 3]
    bt = step.block_tables
    assert bt.shape == (2, 2) and bt[1, 1] == -1
    assert step.slot_mapping.tolist() == [bt[0, 1] * 4 + 2, bt[1, 0] * 4, bt[1, 0] * 4 + 1, bt[1, 0] * 4 + 2]
    assert step.logits_rows.tolist() == [0, 3]
    assert step.adapter_ids.tolist() == [-1, -1]
    assert (step.max_query_len, step.max_context_len) == (3, 7)
    run_to_end(engine)


# ---- greedy correctness --------------------------------------------------------------------

def test_greedy_single_request_matches_reference():
    engine, _ = make_engine()
    prompt = [3, 14, 15, 9, 26, 5, 35]
    rid = engine.submit(prompt, greedy(25))
    res = run_to_end(engine)[rid]
    assert (res["tokens"], res["finish"]) == reference(prompt, 25)
    last = res["outputs"][-1]
    assert (last[7], last[9]) == (len(prompt), len(res["tokens"]))


def test_greedy_20_concurrent_requests_of_different_lengths():
    config = EngineConfig(num_blocks=256, block_size=4, eos_token_ids=[EOS])
    ps = prompts(20, 1, 40, seed=1)
    with EngineClient(ToyKVRunner(256 * 4), config) as client:
        ids = [client.submit(p, greedy(5 + i)) for i, p in enumerate(ps)]
        for i, (rid, p) in enumerate(zip(ids, ps)):
            outs = client.wait(rid, timeout=30)
            assert ([t for o in outs for t in o.new_token_ids], outs[-1].finish_reason) == reference(p, 5 + i)
        stats = client.stats()
    assert stats.num_finished == 20 and stats.blocks_used == 0


def test_eos_stops_with_the_token_included():
    engine, _ = make_engine()
    ps = prompts(40, seed=2)
    ids = [engine.submit(p, greedy(60)) for p in ps]
    res = run_to_end(engine)
    stopped = 0
    for rid, p in zip(ids, ps):
        assert (res[rid]["tokens"], res[rid]["finish"]) == reference(p, 60)
        if res[rid]["finish"] == "stop":
            stopped += 1
            assert res[rid]["tokens"][-1] == EOS and res[rid]["outputs"][-1][6] == EOS
    assert stopped > 0


# ---- prefix cache ----------------------------------------------------------------------------

def test_prefix_cache_cold_and_warm_give_the_same_outputs():
    shared = prompts(1, 23, 23, seed=3)[0]
    ps = [shared + tail for tail in prompts(6, 1, 9, seed=4)] + [shared[:13], shared]
    expected = [reference(p, 12) for p in ps]

    engine, _ = make_engine(num_blocks=128, block_size=4)
    cold_ids = [engine.submit(p, greedy(12)) for p in ps]  # one batch: nothing is computed yet
    cold = run_to_end(engine)
    assert [(cold[i]["tokens"], cold[i]["finish"]) for i in cold_ids] == expected
    assert engine.stats()["prefix_cache_hits"] == 0

    warm_ids = [engine.submit(p, greedy(12)) for p in ps]
    warm = run_to_end(engine)
    assert [(warm[i]["tokens"], warm[i]["finish"]) for i in warm_ids] == expected
    cached = [warm[i]["outputs"][0][8] for i in warm_ids]
    # Every full block before the last prompt token is a hit (the last token is recomputed).
    assert cached == [(len(p) - 1) // 4 * 4 for p in ps]
    stats = engine.stats()
    assert stats["prefix_cache_hits"] == sum(cached)
    assert stats["prefix_cache_queries"] == 2 * sum(len(p) for p in ps)

    off, _ = make_engine(num_blocks=128, block_size=4, enable_prefix_caching=False)
    off_ids = [off.submit(p, greedy(12)) for p in ps]
    res = run_to_end(off)
    assert [(res[i]["tokens"], res[i]["finish"]) for i in off_ids] == expected
    assert off.stats()["prefix_cache_hits"] == 0


def test_prefix_shared_with_a_running_request_and_its_outputs():
    # A second request whose prompt is the first's prompt + output hits blocks the first is
    # still using (ref count 2) and blocks that only its decode filled.
    engine, _ = make_engine(num_blocks=64, block_size=4)
    p = prompts(1, 10, 10, seed=5)[0]
    first = engine.submit(p, greedy(20, ignore_eos=True))
    for _ in range(12):
        engine.step()
    so_far = [t for o in engine.poll(0) for t in o[1]]
    assert len(so_far) == 12
    second_prompt = p + so_far[:9]
    second = engine.submit(second_prompt, greedy(6))
    res = run_to_end(engine)
    assert so_far + res[first]["tokens"] == reference(p, 20, ignore_eos=True)[0]
    assert (res[second]["tokens"], res[second]["finish"]) == reference(second_prompt, 6)
    assert res[second]["outputs"][0][8] == (len(second_prompt) - 1) // 4 * 4


def test_a_prefix_still_being_prefilled_is_only_reused_where_computed():
    # Blocks join the prefix cache once their KV is computed, never at allocation: a request
    # sharing the prompt of one in mid chunked prefill reuses only the chunks already done.
    engine, _ = make_engine(num_blocks=64, block_size=4, max_num_batched_tokens=12)
    p = prompts(1, 40, 40, seed=13)[0]
    first = engine.submit(p, greedy(4))
    for _ in range(3):
        engine.step()  # tokens 0..35 computed; the next step computes 36..39
    second = engine.submit(p + [5], greedy(4))
    res = run_to_end(engine)
    assert (res[first]["tokens"], res[first]["finish"]) == reference(p, 4)
    assert (res[second]["tokens"], res[second]["finish"]) == reference(p + [5], 4)
    assert res[second]["outputs"][0][8] == 36


def test_equal_blocks_after_different_prefixes_are_not_shared():
    engine, _ = make_engine(num_blocks=64, block_size=4)
    tail = [7, 7, 7, 7, 9, 9, 9, 9, 3]
    a, b = [1, 2, 3, 4] + tail, [5, 6, 7, 8] + tail
    ra = engine.submit(a, greedy(5))
    res = run_to_end(engine)
    rb = engine.submit(b, greedy(5))
    res.update(run_to_end(engine))
    assert (res[ra]["tokens"], res[ra]["finish"]) == reference(a, 5)
    assert (res[rb]["tokens"], res[rb]["finish"]) == reference(b, 5)
    assert res[rb]["outputs"][0][8] == 0


def test_cached_blocks_are_evicted_lru_when_memory_is_needed():
    engine, _ = make_engine(num_blocks=12, block_size=4)
    ps = prompts(8, 12, 16, seed=6)
    for p in ps:  # one after another: each leaves its blocks cached, then needs some back
        rid = engine.submit(p, greedy(8))
        res = run_to_end(engine)
        assert (res[rid]["tokens"], res[rid]["finish"]) == reference(p, 8)
        stats = engine.stats()
        assert stats["blocks_used"] == 0 and stats["blocks_free"] == 12
    assert 0 < stats["blocks_cached"] <= 12
    rid = engine.submit(ps[-1], greedy(8))  # the most recent prefix is still there
    res = run_to_end(engine)
    assert res[rid]["outputs"][0][8] > 0


# ---- chunked prefill -------------------------------------------------------------------------

@pytest.mark.parametrize("budget", [1, 5, 16])
def test_chunked_prefill_gives_the_same_outputs(budget):
    engine, runner = make_engine(num_blocks=128, block_size=4, max_num_batched_tokens=budget)
    ps = prompts(6, 17, 40, seed=7)
    ids = [engine.submit(p, greedy(6, prompt_logprobs=2 if i == 0 else None)) for i, p in enumerate(ps)]
    res = run_to_end(engine)
    for rid, p in zip(ids, ps):
        assert (res[rid]["tokens"], res[rid]["finish"]) == reference(p, 6)
    assert max(t for t, _ in runner.steps) <= budget
    # Prompt logprobs survive being computed chunk by chunk.
    plp = res[ids[0]]["outputs"][0][3]
    p = ps[0]
    assert plp[0] is None and len(plp) == len(p)
    for i in range(1, len(p)):
        lp = toy_logits(p[:i]) - np.logaddexp.reduce(toy_logits(p[:i]))
        assert plp[i][0] == p[i] and plp[i][1] == pytest.approx(lp[p[i]], abs=1e-5)
        assert [t for t, _ in plp[i][3]] == list(np.argsort(-lp, kind="stable")[:2])


# ---- preemption and capacity -------------------------------------------------------------------

@pytest.mark.parametrize("prefix_caching", [True, False])
def test_preemption_under_a_tiny_cache_gives_the_same_outputs(prefix_caching):
    engine, _ = make_engine(num_blocks=14, block_size=4, enable_prefix_caching=prefix_caching)
    ps = prompts(8, 6, 14, seed=8)
    ids = [engine.submit(p, greedy(24, ignore_eos=True, logprobs=1)) for p in ps]
    res = run_to_end(engine)
    for rid, p in zip(ids, ps):
        assert (res[rid]["tokens"], res[rid]["finish"]) == reference(p, 24, ignore_eos=True)
        lps = [lp for o in res[rid]["outputs"] for lp in (o[2] or [])]
        assert len(lps) == 24  # one logprob per token, none lost or repeated by recompute
    stats = engine.stats()
    assert stats["num_preemptions"] > 0
    assert stats["blocks_used"] == 0


def test_200_requests_against_a_cache_that_fits_10_all_complete():
    # Each request needs at most 5 blocks of 4 tokens (prompt <= 12, 8 new tokens).
    config = EngineConfig(num_blocks=50, block_size=4, eos_token_ids=[EOS], max_num_batched_tokens=64)
    ps = prompts(200, 4, 12, seed=9)
    with EngineClient(ToyKVRunner(200), config) as client:
        ids = [client.submit(p, greedy(8)) for p in ps]
        for rid, p in zip(ids, ps):
            outs = client.wait(rid, timeout=60)
            assert ([t for o in outs for t in o.new_token_ids], outs[-1].finish_reason) == reference(p, 8)
        stats = client.stats()
    assert stats.num_finished == 200 and stats.blocks_used == 0 and stats.num_running == 0


def test_a_prompt_larger_than_the_cache_fails_with_a_reason():
    engine, _ = make_engine(num_blocks=4, block_size=4)
    bad = engine.submit(list(range(1, 18)), greedy(4))
    good = engine.submit([1, 2, 3], greedy(4))
    res = run_to_end(engine)
    assert res[bad]["finish"] == "error" and res[bad]["tokens"] == []
    assert "can never fit in the KV cache" in res[bad]["outputs"][-1][5]
    assert (res[good]["tokens"], res[good]["finish"]) == reference([1, 2, 3], 4)


def test_max_model_len_limits_prompt_and_output():
    engine, _ = make_engine(num_blocks=16, block_size=4, max_model_len=10)
    long = engine.submit(list(range(1, 12)), greedy())
    p = [7, 8, 9]
    ok = engine.submit(p, greedy(ignore_eos=True))
    res = run_to_end(engine)
    assert res[long]["finish"] == "error" and "max_model_len" in res[long]["outputs"][-1][5]
    assert res[ok]["finish"] == "length" and len(p) + len(res[ok]["tokens"]) == 10
    assert res[ok]["tokens"] == reference(p, ignore_eos=True, max_model_len=10)[0]


def test_a_sequence_that_outgrows_the_cache_alone_finishes_with_length():
    engine, _ = make_engine(num_blocks=3, block_size=4)
    p = [4, 5, 6]
    rid = engine.submit(p, greedy(ignore_eos=True))
    res = run_to_end(engine)
    assert res[rid]["finish"] == "length" and len(p) + len(res[rid]["tokens"]) == 12
    assert engine.max_model_len == 12


# ---- abort ---------------------------------------------------------------------------------------

def test_abort_mid_prefill_frees_blocks():
    engine, _ = make_engine(num_blocks=32, block_size=4, max_num_batched_tokens=8)
    rid = engine.submit(prompts(1, 40, 40, seed=10)[0], greedy(5))
    engine.step()
    assert engine.stats()["blocks_used"] == 10 and engine.poll(0) == []
    engine.abort(rid)
    engine.step()
    out = engine.poll(0)
    assert [(o[0], o[1], o[4]) for o in out] == [(rid, [], "abort")]
    stats = engine.stats()
    assert stats["blocks_used"] == 0 and stats["num_running"] == 0 and stats["num_waiting"] == 0


def test_abort_mid_decode_frees_blocks():
    engine, _ = make_engine(num_blocks=32, block_size=4)
    rid = engine.submit([1, 2, 3, 4, 5], greedy(50, ignore_eos=True))
    other = engine.submit([6, 7, 8], greedy(6, ignore_eos=True))
    for _ in range(3):
        engine.step()
    early = engine.poll(0)
    assert len([t for o in early if o[0] == rid for t in o[1]]) == 3
    engine.abort(rid)
    engine.abort(rid)  # twice: harmless
    engine.abort(987654)  # unknown: ignored
    res = run_to_end(engine)
    assert res[rid]["finish"] == "abort" and res[rid]["tokens"] == []
    other_tokens = [t for o in early if o[0] == other for t in o[1]] + res[other]["tokens"]
    assert (other_tokens, res[other]["finish"]) == reference([6, 7, 8], 6, ignore_eos=True)
    assert engine.stats()["blocks_used"] == 0


def test_abort_before_admission():
    engine, _ = make_engine()
    rid = engine.submit([1, 2, 3], greedy(5))
    engine.abort(rid)
    res = run_to_end(engine)
    assert res[rid]["finish"] == "abort" and res[rid]["tokens"] == []


# ---- stop rules, sampling and logprobs through the engine --------------------------------------

def test_min_tokens_suppresses_eos_and_stop_tokens():
    ps = prompts(30, seed=11)
    engine, _ = make_engine()
    eos_first = [p for p in ps if reference(p, 1)[0] == [EOS]]
    assert eos_first, "the fixture needs a prompt whose first greedy token is eos"
    p = eos_first[0]
    a = engine.submit(p, greedy(10))
    b = engine.submit(p, greedy(10, min_tokens=3))
    res = run_to_end(engine)
    assert res[a]["tokens"] == [EOS] and res[a]["finish"] == "stop"
    assert (res[b]["tokens"], res[b]["finish"]) == reference(p, 10, min_tokens=3)
    assert EOS not in res[b]["tokens"][:3]


def test_stop_token_ids_and_max_tokens():
    p = [9, 8, 7, 6]
    full, _ = reference(p, 12, ignore_eos=True)
    stop = full[4]
    first = full.index(stop)
    engine, _ = make_engine()
    a = engine.submit(p, greedy(12, ignore_eos=True, stop_token_ids=[stop]))
    b = engine.submit(p, greedy(3, ignore_eos=True))
    res = run_to_end(engine)
    assert res[a]["tokens"] == full[: first + 1] and res[a]["finish"] == "stop"
    assert res[a]["outputs"][-1][6] == stop
    assert res[b]["tokens"] == full[:3] and res[b]["finish"] == "length"


def test_logprobs_equal_log_softmax_of_the_row():
    p = [2, 4, 6, 8, 10]
    engine, _ = make_engine()
    rid = engine.submit(p, SamplingParams(temperature=0.7, seed=3, max_tokens=8, ignore_eos=True, logprobs=5))
    res = run_to_end(engine)[rid]
    ctx = list(p)
    lps = [lp for o in res["outputs"] for lp in o[2]]
    for tok, lp in zip(res["tokens"], lps):
        row = toy_logits(ctx)
        ref = row - np.logaddexp.reduce(row)  # raw: before temperature
        assert lp[0] == tok and lp[1] == pytest.approx(ref[tok], abs=1e-5)
        assert lp[2] == 1 + int((ref > ref[tok]).sum())
        assert [t for t, _ in lp[3]] == list(np.argsort(-ref, kind="stable")[:5])
        assert [v for _, v in lp[3]] == pytest.approx(np.sort(ref)[::-1][:5], abs=1e-5)
        ctx.append(tok)


def test_seeded_sampling_is_reproducible():
    p = [11, 22, 33]
    params = SamplingParams(temperature=1.0, seed=42, max_tokens=16, ignore_eos=True)

    def run(params_list):
        engine, _ = make_engine()
        ids = [engine.submit(p, sp) for sp in params_list]
        res = run_to_end(engine)
        return [res[i]["tokens"] for i in ids]

    a, b, c = run([params, params, SamplingParams(temperature=1.0, seed=43, max_tokens=16, ignore_eos=True)])
    assert a == b != c
    assert run([params])[0] == a  # another engine, another batch: same tokens
    assert a != reference(p, 16, ignore_eos=True)[0]  # it did sample


def test_top_k_1_equals_greedy():
    ps = prompts(5, seed=12)
    engine, _ = make_engine()
    ids = [engine.submit(p, SamplingParams(temperature=1.5, top_k=1, max_tokens=10)) for p in ps]
    res = run_to_end(engine)
    for rid, p in zip(ids, ps):
        assert (res[rid]["tokens"], res[rid]["finish"]) == reference(p, 10)


# ---- errors ------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("field", "params"),
    [
        ("temperature", SamplingParams(temperature=-1.0)),
        ("top_k", SamplingParams(top_k=-2)),
        ("top_p", SamplingParams(top_p=0.0)),
        ("min_p", SamplingParams(min_p=1.5)),
        ("repetition_penalty", SamplingParams(repetition_penalty=0.0)),
        ("presence_penalty", SamplingParams(presence_penalty=2.5)),
        ("frequency_penalty", SamplingParams(frequency_penalty=-3.0)),
        ("max_tokens", SamplingParams(max_tokens=0)),
        ("min_tokens", SamplingParams(max_tokens=2, min_tokens=3)),
        ("logprobs", SamplingParams(logprobs=21)),
        ("prompt_logprobs", SamplingParams(prompt_logprobs=-1)),
        ("stop_token_ids", SamplingParams(stop_token_ids=[V])),
        ("eos_token_ids", SamplingParams(eos_token_ids=[-1])),
        ("temperature", SamplingParams(temperature="hot")),  # type: ignore[arg-type]
    ],
)
def test_bad_sampling_params_raise_naming_the_field(field, params):
    engine, _ = make_engine()
    with pytest.raises(InvalidArgumentError, match=f"'{field}'"):
        engine.submit([1, 2], params)


def test_bad_prompts_raise():
    engine, _ = make_engine()
    with pytest.raises(InvalidArgumentError, match="empty"):
        engine.submit([], greedy(1))
    with pytest.raises(InvalidArgumentError, match=r"prompt token \[1\] = 61"):
        engine.submit([1, V], greedy(1))
    with pytest.raises(InvalidArgumentError, match="num_blocks"):
        _native.serve.Engine(_native.serve.PyModelRunner(lambda s: None, V), EngineConfig(num_blocks=0))
    with pytest.raises(InvalidArgumentError, match="max_model_len"):
        _native.serve.Engine(_native.serve.PyModelRunner(lambda s: None, V),
                             EngineConfig(num_blocks=2, block_size=4, max_model_len=9))


def test_a_failing_runner_fails_its_requests_and_the_engine_goes_on():
    engine, runner = make_engine()
    runner.raise_on_step = 2
    a = engine.submit([1, 2, 3], greedy(5))
    res = run_to_end(engine)
    assert res[a]["finish"] == "error" and "toy runner failure" in res[a]["outputs"][-1][5]
    assert "toy runner failure" in engine.stats()["last_error"]
    assert engine.stats()["blocks_used"] == 0
    b = engine.submit([1, 2, 3], greedy(5))
    res = run_to_end(engine)
    assert (res[b]["tokens"], res[b]["finish"]) == reference([1, 2, 3], 5)


def test_wrong_logits_shape_is_an_error_not_a_crash():
    engine = _native.serve.Engine(_native.serve.PyModelRunner(lambda s: np.zeros((1, V + 1), np.float32), V),
                                  EngineConfig(num_blocks=8))
    rid = engine.submit([1, 2], greedy(2))
    res = run_to_end(engine)
    assert res[rid]["finish"] == "error" and "expected float32[1, 61]" in res[rid]["outputs"][-1][5]


def test_nan_logits_fail_the_request():
    def run(step):
        out = np.zeros((len(step.logits_rows), V), np.float32)
        out[:, 3] = np.nan
        return out

    engine = _native.serve.Engine(_native.serve.PyModelRunner(run, V), EngineConfig(num_blocks=8))
    rid = engine.submit([1, 2], greedy(2))
    res = run_to_end(engine)
    assert res[rid]["finish"] == "error" and "non-finite" in res[rid]["outputs"][-1][5]
