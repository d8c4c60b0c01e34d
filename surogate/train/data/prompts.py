"""Prompt rows (`surogate grpo`) -> prompt token ids, kept beside their rows for the rewards.

A row's ``prompt_field`` (default "prompt") is a plain string (tokenized as it is, with the
tokenizer's special tokens) or a list of messages (rendered with the chat template and the
generation prompt; a dataset's ``system_prompt`` is put first when the row has no system
message). The whole row goes to the reward functions. A prompt over max_prompt_length keeps its
last tokens (TRL truncates on the left). ``path: builtin:NAME`` is a generated set
(surogate.train.grpo_env). The epoch order and the checkpointed position are the SFT data's
(``BatchIterator``): a "row" here is one prompt, a micro-batch B prompts.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import numpy as np

from surogate.config.sft import DatasetConfig
from surogate.errors import ConfigError, InvalidArgumentError
from surogate.io import Tokenizer
from surogate.train.data.dataset import BatchIterator, BatchPosition
from surogate.train.data.formats import RowError
from surogate.train.data.preference import _side
from surogate.train.data.sources import Row, RowErrors, read_rows, resolve_files

log = logging.getLogger(__name__)


class PromptSample(NamedTuple):
    prompt_ids: list[int]
    prompt: list[dict] | str  # as the row gives it (what reward functions see)
    row: dict


class PromptDataset:
    """Prompts in file order; ``order`` / ``batch`` / ``iterator`` as PackedDataset's."""

    def __init__(self, samples: list[PromptSample], seed: int = 0):
        self.samples = samples
        self.seed = seed

    @property
    def num_rows(self) -> int:
        return len(self.samples)

    def __len__(self) -> int:
        return len(self.samples)

    def num_batches(self, batch_size: int) -> int:
        return -(-self.num_rows // batch_size)

    def order(self, epoch: int, shuffle: bool = True) -> np.ndarray:
        if not shuffle:
            return np.arange(self.num_rows)
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_rows)

    def batch(self, rows) -> list[PromptSample]:
        """The prompts of these indices (-1, the padding of a short last batch: left out)."""
        return [self.samples[int(r)] for r in rows if r >= 0]

    def iterator(self, batch_size: int, position: BatchPosition | tuple[int, int] = (0, 0)) -> BatchIterator:
        return BatchIterator(self, batch_size, BatchPosition(*position))


class PromptEncoder:
    def __init__(self, tokenizer: Tokenizer, max_prompt_length: int, chat_template: str | None = None):
        self.tokenizer = tokenizer
        self.max_prompt_length = max_prompt_length
        self.chat_template = chat_template
        self._template = None
        self.truncated = 0

    def encode(self, prompt: list[dict] | str, dataset: DatasetConfig) -> list[int]:
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt, add_special_tokens=True)
        else:
            if dataset.system_prompt and not any(m.get("role") == "system" for m in prompt):
                prompt = [{"role": "system", "content": dataset.system_prompt}, *prompt]
            text = self._render(prompt)
            ids = self.tokenizer.encode(text, add_special_tokens=False)
        if not ids:
            raise RowError("the prompt has no tokens")
        if len(ids) > self.max_prompt_length:
            ids, self.truncated = ids[len(ids) - self.max_prompt_length:], self.truncated + 1
        return list(ids)

    def _render(self, messages: list[dict]) -> str:
        if self._template is None:
            try:
                self._template = self.tokenizer.get_chat_template(self.chat_template)
            except InvalidArgumentError as e:
                raise InvalidArgumentError(e.message, hint="set chat_template: in the config to a Jinja template "
                                           "(base models often have none), or give plain-string prompts") from None
        try:
            return self._template.render(messages, add_generation_prompt=True, **self.tokenizer.special_tokens_map)
        except InvalidArgumentError as e:
            raise RowError(e.message, hint=e.hint) from None


def build_prompt_dataset(config, tokenizer: Tokenizer) -> PromptDataset:
    from surogate.train.grpo_env import BUILTIN_PREFIX, generated_rows

    encoder = PromptEncoder(tokenizer, config.max_prompt_length, config.chat_template)
    samples: list[PromptSample] = []
    for i, dataset in enumerate(config.datasets):
        name = f"datasets[{i}]"
        errors = RowErrors(config.skip_bad_rows)
        if dataset.path.startswith(BUILTIN_PREFIX):
            rows = [Row(r, f"{dataset.path} row {k + 1}")
                    for k, r in enumerate(generated_rows(dataset.path, dataset.samples, config.seed, name))]
        else:
            rows = read_rows(resolve_files(dataset), errors)
        read = 0
        for row in rows:
            if dataset.samples is not None and read >= dataset.samples:
                break
            try:
                prompt = _side(row.record, dataset.prompt_field, "prompt_field")
                ids = encoder.encode(prompt, dataset)
            except RowError as e:
                errors.bad(row.where, e.problem, e.hint or (f"set {name}.{e.key} to the field that holds it"
                                                            if e.key else None))
                continue
            read += 1
            samples.append(PromptSample(ids, prompt, row.record))
        if errors.count:
            log.warning("%s (%s): skipped %d malformed rows, e.g. %s", name, dataset.path, errors.count,
                        "; ".join(errors.examples[:3]))
    if encoder.truncated:
        log.warning("%d prompts were cut to their last max_prompt_length=%d tokens", encoder.truncated,
                    config.max_prompt_length)
    if not samples:
        raise ConfigError("no training prompts: every row was skipped", where="datasets",
                          hint="check the datasets' prompt field (prompt_field)")
    log.info("prompt data: %d prompts", len(samples))
    return PromptDataset(samples, seed=config.seed)
