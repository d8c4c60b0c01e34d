"""Structured outputs: a request's grammar (StructuredOutputsParams) as llguidance matchers, and
the engine's TokenMasker that advances them and writes the allowed-token bitmasks.

Why llguidance: MIT, no torch. Measured on SmolLM2's 49,152-token vocabulary, a 4-property
json_schema walked token by token on one core: llguidance 15 us per mask (p99 59 us, 0.7 ms per
matcher), xgrammar 4 us (p99 12 us) but it needs torch, triton and tvm-ffi. Masks cost what the
state allows: a key or a number is 20-200 us, a free string (nearly every token allowed) 0.4-9 ms
on SmolLM2's vocabulary and more on a 152k one, so 128 streams' masks outlast a small model's
step. The engine therefore draws a greedy or temperature-only row first and asks the grammar
whether the draw may come next (``TokenMasks.check``, microseconds); only a refused draw needs its
mask, and refusals happen where masks are cheap (kernels_native/serve/token_mask.h). The masks
still needed (truncated rows: top-k / top-p / min-p) are computed on a helper thread while the
model runs the step.

Flow: ``Grammars.compile`` turns a spec into llguidance's grammar text once per request (a bad
schema / regex / grammar is an InvalidArgumentError naming ``structured_outputs.<kind>``);
``Grammars.matcher`` makes one matcher per answer; the engine client registers it under the
engine request id before the engine can step it, and ``TokenMasks.fill`` (the engine's hook)
feeds each matcher the answer tokens sampled since the last step and fills the row for the next.
A finished matcher allows only EOS, so the answer ends where the grammar does.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import numpy as np

from surogate.errors import InvalidArgumentError
from surogate.io import Tokenizer
from surogate.serve.types import StructuredOutputsParams

_INSTALL_HINT = "structured outputs need llguidance: pip install 'surogate[serve]' (or pip install llguidance)"


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError:
        raise InvalidArgumentError("structured outputs are off on this server: llguidance is not installed",
                                   hint=_INSTALL_HINT) from None
    return llguidance


def grammar_text(spec: StructuredOutputsParams) -> tuple[str, str]:
    """(llguidance grammar, the spec's field name) for the one kind the spec sets."""
    try:
        return _grammar_text(spec)
    except (ValueError, TypeError) as e:  # llguidance's own refusals of a schema it cannot read
        if isinstance(e, InvalidArgumentError):
            raise
        raise InvalidArgumentError(f"structured_outputs: {e}", hint="check the schema / regex / grammar") from None


def _grammar_text(spec: StructuredOutputsParams) -> tuple[str, str]:
    llg = _llguidance()
    given = [k for k in ("json", "json_object", "regex", "choice", "grammar") if getattr(spec, k) not in (None, False)]
    if len(given) != 1:
        raise InvalidArgumentError(f"structured_outputs sets {given or 'nothing'}; set exactly one of json, "
                                   "json_object, regex, choice, grammar", hint="e.g. {\"json\": {\"type\": \"object\"}}")
    kind = given[0]
    if kind == "json":
        schema = spec.json
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as e:
                raise InvalidArgumentError(f"structured_outputs.json is not JSON: {e}",
                                           hint="send the JSON schema as an object") from None
        if not isinstance(schema, dict):
            raise InvalidArgumentError("structured_outputs.json must be a JSON schema object",
                                       hint="e.g. {\"type\": \"object\", \"properties\": {...}}")
        return llg.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False}), kind
    if kind == "json_object":
        return llg.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults={"whitespace_flexible": False}), kind
    if kind == "regex":
        return llg.LLMatcher.grammar_from_regex(spec.regex), kind
    if kind == "choice":
        if not spec.choice or not all(isinstance(c, str) and c for c in spec.choice):
            raise InvalidArgumentError("structured_outputs.choice must be a non-empty list of non-empty strings",
                                       hint="e.g. [\"yes\", \"no\"]")
        return llg.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in spec.choice)), kind
    from llguidance.gbnf_to_lark import any_to_lark

    try:
        lark = any_to_lark(spec.grammar)
    except Exception as e:  # the converter's own error types
        raise InvalidArgumentError(f"structured_outputs.grammar is neither Lark nor GBNF: {e}",
                                   hint="write the grammar in Lark (llguidance's dialect) or GBNF") from None
    return llg.LLMatcher.grammar_from_lark(lark), kind


class Grammars:
    """One model's grammar compiler: its tokenizer in llguidance's form (built once, ~0.2 s).
    ``vocab_size``: the model's (its logits rows), which may exceed the tokenizer's (padded
    embeddings); the ids past the tokenizer's are never allowed."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int | None = None) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = max(vocab_size or 0, tokenizer.vocab_size)
        self._ll: Any = None
        self._lock = threading.Lock()

    @property
    def ll_tokenizer(self) -> Any:
        with self._lock:
            if self._ll is None:
                llg = _llguidance()
                t = self._tokenizer
                self._ll = llg.LLTokenizer(t.backend.to_str(), n_vocab=self._vocab_size,
                                           eos_token=list(t.eos_token_ids) or t.eos_token_id)
            return self._ll

    def compile(self, spec: StructuredOutputsParams) -> str:
        """The spec's grammar, checked against the vocabulary (a 400 on a bad one)."""
        grammar, kind = grammar_text(spec)
        err = _llguidance().LLMatcher.validate_grammar(grammar, self.ll_tokenizer)
        if err and not err.startswith("WARNING"):
            raise InvalidArgumentError(f"structured_outputs.{kind} is not a grammar this server can follow: {err}",
                                       hint="check the schema / regex / grammar")
        return grammar

    def matcher(self, grammar: str) -> Any:
        m = _llguidance().LLMatcher(self.ll_tokenizer, grammar, log_level=0)
        if m.is_error():
            raise InvalidArgumentError(f"structured_outputs: {m.get_error()}", hint="check the schema / regex / grammar")
        return m


class TokenMasks:
    """The engine's TokenMasker: matchers by engine request id. ``lock`` is held by the engine
    client from submitting a request to registering its matcher, so ``fill`` never meets an id
    it does not know yet. Only the engine's threads call ``fill`` and ``check``, a step at a time.

    ``check`` (kernels_native/serve/token_mask.h) says whether a drawn token may come next as the
    mask would, without the mask where it can: llguidance's validate_tokens says whether a
    token's bytes may follow, which is the mask's bit except in three states, where the mask is
    read instead: where the grammar forces bytes (the mask allows only their canonical tokens:
    after ``{"`` the key's own token, not a shorter split), an EOS where the grammar may end
    (validate_tokens refuses it), and a stopped matcher (EOS only). So every refused token has
    its mask filled, in parallel, straight into the row the engine draws it again under.

    Which masks are filled beside the model (the helper thread, while it runs), straight into the
    engine's rows (it then tests the draw's bit itself): those of rows whose last draw was refused
    (the engine's record, a state the grammar narrows, a key or a number: the next draw is likely
    refused too, and the mask is cheap), of rows not drawn yet, and of rows where the grammar forces
    bytes; a row whose draw passed (a free string: its mask, the costly one, walks the whole
    vocabulary) is checked with validate_tokens after the model and gets a mask only if refused.
    Which path a row takes changes no answer: each says what the mask says. Matchers advance over
    a step's single new tokens in parallel (llguidance's consume_token_par, without the GIL the
    model runner's thread needs).

    Counters, as `surogate bench serve --structured` reads them: ``helper_seconds`` /
    ``helper_calls``: on the engine's helper thread while the model runs (the masks of rows masked
    before their draw, every matcher advanced); ``after_seconds``: checking the step's draws
    after the model ran (the step waits for it); ``masks_filled``: masks computed, anywhere;
    ``check_rows``: draws checked."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._matchers: dict[int, Any] = {}
        self._executor: Any = None
        self.helper_seconds = 0.0
        self.helper_calls = 0
        self.after_seconds = 0.0
        self.masks_filled = 0
        self.check_rows = 0
        self._advanced: set[int] = set()  # this step's advanced request ids

    def add(self, request_id: int, matcher: Any) -> None:
        self._matchers[request_id] = matcher

    def release(self, request_id: int) -> None:
        with self.lock:
            self._matchers.pop(request_id, None)

    def __len__(self) -> int:
        return len(self._matchers)

    def fill(self, request_ids: list[int], new_tokens: list[list[int]], rows: np.ndarray) -> None:
        """Each matcher advanced over its new tokens, then its mask into rows[i]."""
        t0 = time.perf_counter()
        try:
            matchers = self._advance(request_ids, new_tokens)
            self._fill([(m, i) for i, m in enumerate(matchers)], rows)
            for i, m in enumerate(matchers):
                if m.is_error():
                    raise RuntimeError(f"request {request_ids[i]}: the grammar failed: {m.get_error()}")
        finally:
            self.helper_seconds += time.perf_counter() - t0
            self.helper_calls += 1

    def check(self, request_ids: list[int], new_tokens: list[list[int]], candidates: list[int] | None,
              rows: np.ndarray | None = None, refused: list[int] | None = None) -> list[bool] | None:
        """Each matcher advanced over its new tokens. With candidates: whether candidate i may
        come next (not consumed), as its mask would say, and the mask of each refused one in
        rows[i]. Without (beside the model): the masks of the rows likely refused (``refused``:
        each one's last checked draw, the engine's record: -1 none yet, 0 allowed, 1 refused;
        None: all narrow), filled into rows[i] now; returns which rows it filled."""
        t0 = time.perf_counter()
        try:
            matchers = self._advance(request_ids, new_tokens)
            if candidates is None:  # on the helper thread while the model runs: the masks likely read
                # A row whose last draw was refused is in a state the grammar narrows (a key, a
                # number): its next draw is likely refused too, and its mask is cheap. A row whose
                # draw passed (a free string) skips the mask, the costly one; a row where the
                # grammar forces bytes needs it (see the class docstring).
                last = refused if refused is not None else [-1] * len(matchers)
                # (a stopped matcher's mask, EOS alone, is cheap too)
                filled = [m.is_stopped() or r != 0 or bool(m.compute_ff_bytes()) for m, r in zip(matchers, last)]
                self._advanced = set(request_ids)
                if any(filled):
                    if rows is None:
                        raise RuntimeError("TokenMasks.check beside the model needs the rows to fill")
                    self._fill([(m, i) for i, (m, f) in enumerate(zip(matchers, filled)) if f], rows)
                return filled
            self.check_rows += len(candidates)
            advanced, self._advanced = self._advanced, set()  # (their forced bytes looked at: none where not filled)
            answers = [False] * len(candidates)
            pending: dict[int, int] = {}  # request id -> the first row asking (a request asked twice: one state)
            for i, (rid, m, t) in enumerate(zip(request_ids, matchers, candidates)):
                if not m.is_stopped() and (rid in advanced or not m.compute_ff_bytes()) and \
                        m.validate_tokens([t]) == 1:
                    answers[i] = True
                else:
                    pending.setdefault(rid, i)
            self._fill([(matchers[i], i) for i in pending.values()], rows)
            for i, (rid, t) in enumerate(zip(request_ids, candidates)):
                if rid in pending:
                    if i != pending[rid]:
                        rows[i] = rows[pending[rid]]
                    answers[i] = _allows(rows[i], t)
            return answers
        finally:
            if candidates is None:
                self.helper_seconds += time.perf_counter() - t0
            else:
                self.after_seconds += time.perf_counter() - t0

    def _exec(self) -> Any:
        """llguidance's thread pool for the parallel fills and advances (made on first use)."""
        if self._executor is None:
            self._executor = _llguidance().LLExecutor()
        return self._executor

    def _fill(self, batch: list[tuple[Any, int]], rows: np.ndarray) -> None:
        """The masks of (matcher, row) pairs into rows, in parallel (llguidance's executor)."""
        if not batch:
            return
        from llguidance.numpy import fill_next_token_bitmask_par

        fill_next_token_bitmask_par(self._exec(), batch, rows)
        self.masks_filled += len(batch)

    def _advance(self, request_ids: list[int], new_tokens: list[list[int]]) -> list[Any]:
        with self.lock:
            matchers = [self._matchers[rid] for rid in request_ids]
        # A stopped matcher (the grammar is complete) allows only EOS; an engine that does not
        # stop there (ignore_eos, or EOS ids the engine does not know) keeps getting that mask.
        live = [i for i, (m, tokens) in enumerate(zip(matchers, new_tokens)) if tokens and not m.is_stopped()]
        par = [i for i in live if len(new_tokens[i]) == 1]
        if len(par) < 2:  # (a decode step's single tokens go in parallel)
            par = []
        from llguidance.numpy import consume_token_par

        ok = dict(zip(par, consume_token_par(self._exec(), [(matchers[i], new_tokens[i][0]) for i in par]))) \
            if par else {}
        for i in live:
            if not (ok[i] if i in ok else matchers[i].consume_tokens(new_tokens[i])):
                raise RuntimeError(f"request {request_ids[i]}: the grammar refused a sampled token: "
                                   f"{matchers[i].get_error()}")
        return matchers


def _allows(row: np.ndarray, token: int) -> bool:
    """Bit ``token`` of a mask row (int32 words, token_mask.h's layout)."""
    return token >> 5 < len(row) and bool((int(row[token >> 5]) >> (token & 31)) & 1)
