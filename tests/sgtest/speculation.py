"""The toy model of the speculative-decoding tests (tests/serve/test_speculative*.py,
test_draft_speculation.py): a next-token rule known in closed form, and a runner that keeps its
"KV" (token, position) in the slots the engine's block tables address and reads a row's whole
context back from there, so a wrong slot, position or stale rollback changes its tokens."""

from __future__ import annotations

import numpy as np

V = 61
PERIOD = 6
_M = (1 << 61) - 1


def rule(tokens: list[int]) -> int:
    """The toy's next token: mostly the token PERIOD back (a copy: n-gram drafts hit), but a
    hash of the whole prefix picks a surprise one time in four (drafts miss, and any wrong
    token, position or stale slot read back from the cache changes everything after)."""
    h = 0
    for i, t in enumerate(tokens):
        h = (h * 1_000_003 + (t + 1) * 7919 + i) % _M
    if h % 4 == 0 or len(tokens) < PERIOD:
        return int(h // 4 % V)
    return int(tokens[-PERIOD])


def row_for(t: int) -> np.ndarray:
    return np.roll(-0.5 * np.arange(V, dtype=np.float32), t)


class CopyRunner:
    """Writes (token, position) at each slot, reads a row's whole context back through the block
    table (asserting every slot was written at that position) and applies `rule` to it."""

    vocab_size = V

    def __init__(self, num_slots: int) -> None:
        self.kv = np.full((num_slots, 2), -1, dtype=np.int64)
        self.steps: list[tuple[int, int, int]] = []  # (tokens, seqs, logits rows)

    def run(self, step) -> np.ndarray:
        T, bs = step.num_tokens, step.block_size
        tok, pos, slot = step.token_ids, step.positions, step.slot_mapping
        cu, ctx, bt, rows = step.cu_q, step.context_lens, step.block_tables, step.logits_rows
        self.steps.append((T, step.num_seqs, len(rows)))
        assert len(set(slot.tolist())) == T
        for i in range(T):
            self.kv[slot[i]] = (tok[i], pos[i])
        seq_of_row = np.searchsorted(cu, rows, side="right") - 1
        out = np.empty((len(rows), V), np.float32)
        for j, r in enumerate(rows):
            s, p = int(seq_of_row[j]), int(pos[r])
            q = np.arange(p + 1)
            vals = self.kv[bt[s][q // bs] * bs + q % bs]
            assert (vals[:, 1] == q).all(), "read a slot holding another position's KV"
            out[j] = row_for(rule(vals[:, 0].tolist()))
        return out


def reference(prompt, max_tokens, eos=(), stop=(), min_tokens=0, max_model_len=None):
    toks, out = list(prompt), []
    while True:
        lg = row_for(rule(toks))
        if len(out) < min_tokens:
            lg[list(eos) + list(stop)] = -np.inf
        t = int(np.argmax(lg))
        toks.append(t)
        out.append(t)
        if len(out) >= min_tokens and (t in eos or t in stop):
            return out, "stop"
        if len(out) >= max_tokens or (max_model_len is not None and len(toks) >= max_model_len):
            return out, "length"


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    ps = []
    for _ in range(n):
        unit = rng.integers(1, V, PERIOD).tolist()
        ps.append((unit * int(rng.integers(1, 4)))[: int(rng.integers(PERIOD, 3 * PERIOD + 1))])
    return ps
