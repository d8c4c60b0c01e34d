"""Preference rows (`surogate dpo`) -> token pairs -> micro-batches of chosen / rejected documents.

Rows are TRL's: ``{"prompt": ..., "chosen": ..., "rejected": ...}``, each value a list of
messages (conversational) or a plain string; without a prompt field, the prompt is the messages
chosen and rejected share at the start (TRL's implicit prompt). Field names come from the
dataset's prompt_field / chosen_field / rejected_field.

Encoding, as TRL's DPOTrainer does it: the prompt is rendered with the chat template and the
generation prompt, the completion is what rendering prompt + chosen adds after it (the template
must write the prompt as a prefix; a row whose template does not is an error naming it). Prompt
and completion are tokenized separately, so their boundary is a token boundary; plain-string
completions get the eos token appended. Only completion tokens are scored (the loss mask).
Truncation: the prompt keeps its last max_prompt_length tokens, the completion its first
max_completion_length; then, over max_length, keep_end drops the prompt's first tokens
(keep_start the completion's last ones). A pair with an empty side is an error naming the row.

A micro-batch is B pairs, chosen and rejected of pair i as documents 2i and 2i+1 of one flat
row of N = B * 2 * max_length tokens (padding at the end), so the sums over each document's
targets are the sequence log-probs the loss compares. Shape letters: P pairs, B pairs per
micro-batch, N tokens in a micro-batch.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import msgspec
import numpy as np

from surogate.config.sft import DatasetConfig
from surogate.errors import ConfigError, InvalidArgumentError
from surogate.io import Tokenizer
from surogate.train.data import cache
from surogate.train.data.dataset import DataStats, PackedDataset
from surogate.train.data.formats import RowError, _fields, _kind, _message
from surogate.train.data.packing import IGNORE, Batch, Documents, PackPlan, collate
from surogate.train.data.sources import RowErrors, fingerprint, read_rows, resolve_files

log = logging.getLogger(__name__)


class PreferenceSample(NamedTuple):
    """One row: prompt and the two completions, all messages (lists) or all strings."""

    prompt: list[dict] | str
    chosen: list[dict] | str
    rejected: list[dict] | str


@dataclass(frozen=True)
class PairBatch(Batch):
    """A micro-batch of ``pairs`` preference pairs: segments 2i (chosen) and 2i+1 (rejected) of
    ``cu_seqlens``, then padding."""

    pairs: int = 0


# -- rows --

def normalize_preference(record: dict, dataset: DatasetConfig) -> PreferenceSample:
    chosen = _side(record, dataset.chosen_field, "chosen_field")
    rejected = _side(record, dataset.rejected_field, "rejected_field")
    if type(chosen) is not type(rejected):
        raise RowError(f"fields {dataset.chosen_field!r} and {dataset.rejected_field!r} must both be messages or "
                       f"both be strings, got {_kind(chosen)} and {_kind(rejected)}")
    if dataset.prompt_field in record:
        prompt = _side(record, dataset.prompt_field, "prompt_field", allow_empty=True)
        if type(prompt) is not type(chosen):
            raise RowError(f"field {dataset.prompt_field!r} is {_kind(prompt)} but {dataset.chosen_field!r} is "
                           f"{_kind(chosen)}: a row is all messages or all strings")
        return PreferenceSample(prompt, chosen, rejected)
    if isinstance(chosen, str):
        raise RowError(f"no {dataset.prompt_field!r} field (fields: {_fields(record)})", key="prompt_field",
                       hint="string completions need a prompt; message lists may leave it out (the shared "
                            "start of chosen and rejected is the prompt)")
    n = 0  # TRL's implicit prompt: the longest common start of the two conversations
    while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
        n += 1
    if n == len(chosen) or n == len(rejected):
        raise RowError(f"fields {dataset.chosen_field!r} and {dataset.rejected_field!r}: one conversation is the "
                       "start of the other, so one completion is empty")
    return PreferenceSample(chosen[:n], chosen[n:], rejected[n:])


def _side(record: dict, field: str, key: str, allow_empty: bool = False) -> list[dict] | str:
    if field not in record:
        raise RowError(f"no {field!r} field (fields: {_fields(record)})", key=key)
    value = record[field]
    if isinstance(value, str) and value.lstrip()[:1] == "[":  # messages stored as a JSON string (CSV, hub sets)
        try:
            decoded = json.loads(value)
        except json.JSONDecodeError:
            decoded = None
        if isinstance(decoded, list) and decoded and all(isinstance(m, dict) for m in decoded):
            value = decoded  # else it is plain text that starts with "["
    if isinstance(value, str):
        if not value and not allow_empty:
            raise RowError(f"field {field!r} is empty")
        return value
    if not isinstance(value, list) or (not value and not allow_empty):
        raise RowError(f"field {field!r} must be a string or a non-empty list of messages, got {_kind(value)}")
    return [_message(m, f"{field}[{i}]") for i, m in enumerate(value)]


# -- tokens --

class PreferenceEncoder:
    """Preference samples -> (chosen ids, mask), (rejected ids, mask) for one tokenizer and template."""

    def __init__(self, tokenizer: Tokenizer, config, chat_template: str | None = None):
        self.tokenizer = tokenizer
        self.config = config
        self.chat_template = chat_template
        self._variables = dict(tokenizer.special_tokens_map)
        self._eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else \
            next(iter(tokenizer.eos_token_ids), None)
        self.truncated = 0  # sides cut to the length limits so far

    def encode(self, sample: PreferenceSample) -> tuple[tuple[np.ndarray, np.ndarray], ...] | RowError:
        """Both sides, or the RowError that says why not; ``self.truncated`` counts cut sides."""
        try:
            if isinstance(sample.chosen, str):
                prompt = self.tokenizer.encode(sample.prompt, add_special_tokens=True) if sample.prompt else []
                sides = [self.tokenizer.encode(c, add_special_tokens=False) + ([self._eos] if self._eos is not None
                                                                                else [])
                         for c in (sample.chosen, sample.rejected)]
                prompts = [prompt, prompt]
            else:
                prompts, sides = self._render(sample)
            return tuple(self._join(p, c, name) for p, c, name in zip(prompts, sides, ("chosen", "rejected")))
        except RowError as e:
            return e

    def _render(self, sample: PreferenceSample) -> tuple[list[list[int]], list[list[int]]]:
        try:
            template = self.tokenizer.get_chat_template(self.chat_template)
        except InvalidArgumentError as e:
            raise InvalidArgumentError(e.message, hint="set chat_template: in the config to a Jinja template "
                                       "(base models often have none)") from None

        def render(messages, generation_prompt=False):
            try:
                return template.render(messages, add_generation_prompt=generation_prompt, **self._variables)
            except InvalidArgumentError as e:
                raise RowError(e.message, hint=e.hint) from None

        prompt_text = render(sample.prompt, generation_prompt=True) if sample.prompt else ""
        prompt = self.tokenizer.encode(prompt_text, add_special_tokens=False)
        sides = []
        for name, completion in (("chosen", sample.chosen), ("rejected", sample.rejected)):
            full = render(sample.prompt + completion)
            if not full.startswith(prompt_text):
                raise RowError(f"{template.origin}: the prompt with the generation prompt is not the start of "
                               f"prompt + {name} as the template renders them, so the completion cannot be cut off",
                               hint="set chat_template: to a template that renders the conversation's start the "
                                    "same way, or give plain-string rows")
            sides.append(self.tokenizer.encode(full[len(prompt_text):], add_special_tokens=False))
        return [prompt, prompt], sides

    def _join(self, prompt: list[int], completion: list[int], name: str) -> tuple[np.ndarray, np.ndarray]:
        c = self.config
        if not completion:
            raise RowError(f"the {name} completion has no tokens")
        cut = False
        if c.max_prompt_length is not None and len(prompt) > c.max_prompt_length:
            prompt, cut = prompt[len(prompt) - c.max_prompt_length:], True
        if c.max_completion_length is not None and len(completion) > c.max_completion_length:
            completion, cut = completion[:c.max_completion_length], True
        over = len(prompt) + len(completion) - c.max_length
        if over > 0:
            cut = True
            if c.truncation_mode == "keep_end":
                drop = min(over, len(prompt))
                prompt, over = prompt[drop:], over - drop
            if over > 0:
                if over >= len(completion):
                    raise RowError(f"the prompt ({len(prompt)} tokens) leaves no room for the {name} completion "
                                   f"within max_length={c.max_length}",
                                   hint="set max_prompt_length below max_length, raise max_length, or use "
                                        "truncation_mode: keep_end")
                completion = completion[:len(completion) - over]
        self.truncated += cut
        ids = np.asarray(prompt + completion, np.int32)
        mask = np.zeros(len(ids), bool)
        mask[len(prompt):] = True
        return ids, mask


# -- the dataset --

class PreferencePairs(PackedDataset):
    """P pairs as 2P documents (chosen 2i, rejected 2i+1); a "row" of the SFT dataset is a pair
    here, so the epoch order, ``batches`` and ``iterator`` are the SFT data's."""

    def __init__(self, docs: Documents, max_length: int, *, pad_id: int = 0, seed: int = 0,
                 stats: DataStats | None = None):
        assert len(docs) % 2 == 0
        self.docs = docs
        self.max_length = max_length
        self.sequence_len = 2 * max_length  # a pair's room in the micro-batch
        self.pad_id = pad_id
        self.seed = seed
        self.stats = stats or DataStats(documents=len(docs), tokens=docs.num_tokens, target_tokens=docs.num_targets)

    @property
    def num_rows(self) -> int:
        return len(self.docs) // 2

    def batch(self, pairs) -> PairBatch:
        """The micro-batch of these pair indices (-1: a padding slot, left out)."""
        real = [int(p) for p in pairs if p >= 0]
        docs = np.array([d for p in real for d in (2 * p, 2 * p + 1)], np.int64)
        b = collate(self.docs, PackPlan(np.array([0, len(docs)], np.int64), docs), [0],
                    len(pairs) * self.sequence_len, self.pad_id)
        return PairBatch(**b.__dict__, pairs=len(real))

    def split(self, batch: PairBatch, parts: int) -> list[PairBatch]:
        """A micro-batch of parts * b pair slots as ``parts`` micro-batches of b slots (data
        parallel: part p is rank p's share), each the one ``batch`` makes of those slots: a
        micro-batch's real pairs come first, so part p holds pairs p * b .. (p + 1) * b - 1 of
        them, and the documents are whole, so their tokens, positions and targets carry over."""
        slots = batch.num_tokens // self.sequence_len
        if slots % parts:
            raise ValueError(f"{slots} pair slots do not split into {parts} equal parts")
        per, cu = slots // parts, batch.cu_seqlens.astype(np.int64)
        n = per * self.sequence_len
        out = []
        for p in range(parts):
            first, last = min(p * per, batch.pairs), min((p + 1) * per, batch.pairs)
            lo, hi = int(cu[2 * first]), int(cu[2 * last])
            pad = n - (hi - lo)
            seg = cu[2 * first:2 * last + 1] - lo
            if pad:
                seg = np.append(seg, n)
            out.append(PairBatch(
                input_ids=np.concatenate([batch.input_ids[lo:hi], np.full(pad, self.pad_id, np.int32)]),
                position_ids=np.concatenate([batch.position_ids[lo:hi], np.arange(pad, dtype=np.int32)]),
                cu_seqlens=seg.astype(np.int32),
                targets=np.concatenate([batch.targets[lo:hi], np.full(pad, IGNORE, np.int32)]),
                num_target_tokens=int((batch.targets[lo:hi] != IGNORE).sum()), max_seqlen=int(np.diff(seg).max()),
                rows=1, sequence_len=n, pairs=last - first))
        return out


def build_preference_datasets(config, tokenizer: Tokenizer, *, cache_dir=None
                              ) -> tuple[PreferencePairs, PreferencePairs | None]:
    """(train, eval or None) pairs for a DPO config; the eval pairs as build_datasets holds out documents."""
    cache_dir = Path(cache_dir) if cache_dir is not None else Path(config.output_dir) / ".cache" / "tokenized"
    encoder = PreferenceEncoder(tokenizer, config, config.chat_template)
    tok_fp = cache.tokenizer_fingerprint(tokenizer, config.chat_template)
    train_stats = DataStats()
    train = Documents.concat([_load(encoder, d, f"datasets[{i}]", train_stats, cache_dir, tok_fp)
                              for i, d in enumerate(config.datasets)])
    evaluation, eval_stats = None, None
    if config.validation_datasets and config.eval_steps > 0:
        eval_stats = DataStats()
        evaluation = Documents.concat([_load(encoder, d, f"validation_datasets[{i}]", eval_stats, cache_dir, tok_fp)
                                       for i, d in enumerate(config.validation_datasets)])
    elif config.eval_split_ratio > 0 and len(train) >= 4:
        n = len(train) // 2
        n_eval = min(max(1, round(config.eval_split_ratio * n)), n - 1)
        perm = np.random.default_rng(config.seed).permutation(n)
        evaluation = train.select(_docs_of(np.sort(perm[:n_eval])))
        train = train.select(_docs_of(np.sort(perm[n_eval:])))
    if len(train) == 0:
        raise ConfigError("no training pairs: every row was skipped", where="datasets",
                          hint="check the datasets' prompt / chosen / rejected fields")
    pad_id = next((i for i in (tokenizer.pad_token_id, tokenizer.eos_token_id, *tokenizer.eos_token_ids)
                   if i is not None), 0)
    kw = dict(pad_id=pad_id, seed=config.seed)
    out = PreferencePairs(train, config.max_length, stats=_final(train_stats, train), **kw)
    ev = None
    if evaluation is not None and len(evaluation):
        ev = PreferencePairs(evaluation, config.max_length, stats=_final(eval_stats or DataStats(), evaluation), **kw)
    log.info("preference data: %d pairs, %d tokens (%d scored)%s", out.num_rows, train.num_tokens, train.num_targets,
             f"; evaluation: {ev.num_rows} pairs" if ev else "")
    return out, ev


def _docs_of(pairs: np.ndarray) -> np.ndarray:
    return np.stack([2 * pairs, 2 * pairs + 1], axis=1).reshape(-1)


def _final(stats: DataStats, docs: Documents) -> DataStats:
    stats.documents, stats.tokens, stats.target_tokens = len(docs), docs.num_tokens, docs.num_targets
    return stats


def _load(encoder: PreferenceEncoder, dataset: DatasetConfig, name: str, stats: DataStats, cache_dir,
          tokenizer_fp: str) -> Documents:
    c = encoder.config
    files = resolve_files(dataset)
    key = cache.cache_key({"kind": "preference", "dataset": msgspec.to_builtins(dataset), "files": fingerprint(files),
                           "tokenizer": tokenizer_fp, "max_length": c.max_length,
                           "max_prompt_length": c.max_prompt_length, "max_completion_length": c.max_completion_length,
                           "truncation_mode": c.truncation_mode, "skip_bad_rows": c.skip_bad_rows})
    path = cache_dir / f"{key}.npz"
    hit = cache.load(path)
    if hit is not None:
        docs, counts = hit
        stats.add({**counts, "cached": 1})
        return docs
    errors = RowErrors(c.skip_bad_rows)
    kept: list[tuple[np.ndarray, np.ndarray]] = []
    encoder.truncated = 0
    read = 0
    for row in read_rows(files, errors):
        if dataset.samples is not None and read >= dataset.samples:
            break
        try:
            sample = normalize_preference(row.record, dataset)
        except RowError as e:
            errors.bad(row.where, e.problem, e.hint or (f"set {name}.{e.key} to the field that holds it"
                                                        if e.key else None))
            continue
        read += 1
        enc = encoder.encode(sample)
        if isinstance(enc, RowError):
            errors.bad(row.where, enc.problem, enc.hint)
            continue
        kept.extend(enc)
    counts = {"rows": len(kept) // 2, "bad_rows": errors.count, "truncated": encoder.truncated, "no_targets": 0}
    if errors.count:
        log.warning("%s (%s): skipped %d malformed rows, e.g. %s", name, dataset.path, errors.count,
                    "; ".join(errors.examples[:3]))
    if encoder.truncated:
        log.warning("%s (%s): %d sequences were truncated (max_prompt_length / max_completion_length / "
                    "max_length=%d)", name, dataset.path,
                    encoder.truncated, c.max_length)
    docs = Documents.from_arrays(kept)
    cache.save(path, docs, counts)
    stats.add({**counts, "tokenized": 1})
    return docs
