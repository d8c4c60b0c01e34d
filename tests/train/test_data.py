"""Training data end to end: files -> rows -> messages -> token ids and loss masks -> datasets.

The mask tests decode what is trained on and compare it with the assistant's words plus the
end-of-turn token, for a Llama-3-style and a Qwen3-style (ChatML) tokenizer. Packing and
micro-batch invariants are in test_packing.py.
"""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from surogate.config import DatasetConfig, load_config
from surogate.errors import FileFormatError, NotFoundError, UnsupportedError
from surogate.train.data import ChatEncoder, Conversation, Document, RowError, build_datasets, normalize
from surogate.train.data.sources import RowErrors, read_rows, resolve_files

EOT = {"llama3": "<|eot_id|>", "chatml": "<|im_end|>"}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}}}}}]
CHAT = [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello world!"},
        {"role": "assistant", "content": "Hello! What is the weather like today?"},
        {"role": "user", "content": "What is 12 + 30?"},
        {"role": "assistant", "content": "The answer is 42 🙂 (中文字符)."}]


def style(tokenizer) -> str:
    return "llama3" if tokenizer.bos_token else "chatml"


def trained_runs(tokenizer, encoded) -> list[str]:
    """The loss-masked tokens, decoded one contiguous run at a time."""
    ids, mask = encoded.input_ids, encoded.loss_mask
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return [tokenizer.decode(ids[a:b]) for a, b in zip(edges[::2], edges[1::2])]


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def chats(n: int) -> list[dict]:
    return [{"messages": [{"role": "user", "content": f"What is {i} + {i}?"},
                          {"role": "assistant", "content": f"The answer is {2 * i}."}]} for i in range(n)]


def config(tmp_path: Path, datasets, kind: str = "sft", **keys):
    return load_config({"model": "unused", "output_dir": str(tmp_path / "out"), "datasets": datasets,
                        "sequence_len": 256, **keys}, kind=kind)


# -- sources --

def test_every_file_format_reads_the_same_rows(tmp_path: Path) -> None:
    rows = [{"text": "Hello world!"}, {"text": "The quick brown fox."}]
    write_jsonl(tmp_path / "a.jsonl", rows)
    (tmp_path / "b.json").write_text(json.dumps(rows))
    (tmp_path / "c.json").write_text(json.dumps({"data": rows}))
    with open(tmp_path / "d.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, ["text"])
        writer.writeheader()
        writer.writerows(rows)
    write_jsonl(tmp_path / "e.json", rows)  # JSON Lines under a .json name
    for name in ("a.jsonl", "b.json", "c.json", "d.csv", "e.json"):
        got = list(read_rows(resolve_files(DatasetConfig(path=str(tmp_path / name))), RowErrors(False)))
        assert [r.record for r in got] == rows, name
    where = [r.where for r in read_rows([tmp_path / "d.csv"], RowErrors(False))]
    assert where == [f"{tmp_path / 'd.csv'} line 2", f"{tmp_path / 'd.csv'} line 3"]


@pytest.mark.skipif(importlib.util.find_spec("pyarrow") is None, reason="pyarrow is not installed")
def test_parquet(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["a", "b", "c"]}), tmp_path / "x.parquet")
    rows = list(read_rows([tmp_path / "x.parquet"], RowErrors(False)))
    assert [r.record["text"] for r in rows] == ["a", "b", "c"] and rows[2].where.endswith("row 3")


@pytest.mark.skipif(importlib.util.find_spec("pyarrow") is not None, reason="pyarrow is installed")
def test_parquet_without_pyarrow_says_what_to_install(tmp_path: Path) -> None:
    (tmp_path / "x.parquet").write_bytes(b"PAR1")
    with pytest.raises(UnsupportedError, match="install pyarrow to read parquet"):
        list(read_rows([tmp_path / "x.parquet"], RowErrors(False)))


def test_folder_split_and_subset(tmp_path: Path) -> None:
    for rel in ("en/train-00000.jsonl", "en/train-00001.jsonl", "en/test.jsonl", "de/train.jsonl", ".cache/x.jsonl"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        write_jsonl(tmp_path / rel, [{"text": rel}])
    def names(**kw):
        return [str(p.relative_to(tmp_path)) for p in resolve_files(DatasetConfig(path=str(tmp_path), **kw))]

    assert names() == ["de/train.jsonl", "en/train-00000.jsonl", "en/train-00001.jsonl"]
    assert names(subset="en", split="test") == ["en/test.jsonl"]
    with pytest.raises(Exception, match="split 'validation'"):
        names(split="validation")
    plain = tmp_path / "plain"
    plain.mkdir()
    write_jsonl(plain / "a.jsonl", [{"text": "x"}])
    assert len(resolve_files(DatasetConfig(path=str(plain)))) == 1  # no split names: all files are train
    for missing in (str(tmp_path / "missing.jsonl"), "data/missing.jsonl"):  # never looked up on the hub
        with pytest.raises(NotFoundError, match="dataset not found"):
            resolve_files(DatasetConfig(path=missing))


def test_malformed_rows_name_file_and_line(tmp_path: Path, llama3) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", [chats(1)[0], '{"messages": [', chats(1)[0]])
    with pytest.raises(FileFormatError) as info:
        build_datasets(config(tmp_path, [{"path": str(data)}]), llama3)
    assert f"{data} line 2: invalid JSON" in info.value.message
    assert "skip_bad_rows" in info.value.hint


@pytest.mark.parametrize("row, words", [
    ({"conversation_log": []}, "cannot tell the row's format"),
    ({"messages": [{"role": "user", "content": 3}]}, "content must be a string"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "role must be one of"),
    ({"messages": "not a list"}, "must be a non-empty list"),
])
def test_rows_of_the_wrong_shape_name_file_line_and_problem(tmp_path: Path, llama3, row, words) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", [*chats(2), row])
    with pytest.raises(FileFormatError) as info:
        build_datasets(config(tmp_path, [{"path": str(data)}]), llama3)
    assert info.value.message.startswith(f"{data} line 3:") and words in info.value.message


def test_missing_field_hint_names_the_dataset_key(tmp_path: Path, llama3) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "x", "text": "y"}])
    with pytest.raises(FileFormatError) as info:
        build_datasets(config(tmp_path, [{"path": str(data), "type": "instruction"}]), llama3)
    assert "line 1: no 'instruction' field (fields: prompt, text)" in info.value.message
    assert "datasets[0].instruction_field" in info.value.hint


def test_csv_row_with_too_many_fields(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text("text\nfine\n\"a\",b\n")
    with pytest.raises(FileFormatError, match=r"d.csv line 3: has more fields than the header's 1"):
        list(read_rows([tmp_path / "d.csv"], RowErrors(False)))
    skipping = RowErrors(True)
    assert [r.record for r in read_rows([tmp_path / "d.csv"], skipping)] == [{"text": "fine"}]
    assert skipping.count == 1


def test_skip_bad_rows_counts_them(tmp_path: Path, llama3) -> None:
    good = chats(6)
    data = write_jsonl(tmp_path / "d.jsonl", [good[0], "{oops", good[1], {"messages": [{"role": "x"}]}, *good[2:],
                                               "[1, 2]", {"messages": [{"role": "user", "content": "no reply"}]}])
    train, _ = build_datasets(config(tmp_path, [{"path": str(data)}], skip_bad_rows=True, eval_steps=0), llama3)
    s = train.stats
    assert (s.bad_rows, s.rows, s.no_targets, s.documents) == (3, 7, 1, 6)


# -- formats --

def test_auto_detects_each_type() -> None:
    d = DatasetConfig(path="x")
    assert normalize({"messages": CHAT}, d) == Conversation(CHAT)
    sharegpt = normalize({"conversations": [{"from": "system", "value": "S"}, {"from": "human", "value": "Q"},
                                            {"from": "gpt", "value": "A"}]}, d)
    roles = [(m["role"], m["content"]) for m in sharegpt.messages]
    assert roles == [("system", "S"), ("user", "Q"), ("assistant", "A")]
    alpaca = normalize({"instruction": "Add.", "input": "2 and 3", "output": "5", "system": "Math."}, d)
    assert alpaca.messages == [{"role": "system", "content": "Math."}, {"role": "user", "content": "Add.\n\n2 and 3"},
                               {"role": "assistant", "content": "5"}]
    assert normalize({"instruction": "Hi", "input": "", "output": "Hello"}, d).messages[0] == \
        {"role": "user", "content": "Hi"}
    assert normalize({"text": "raw"}, d) == Document("raw")
    with pytest.raises(RowError, match="cannot tell"):
        normalize({"question": "q"}, d)


def test_messages_with_tools_stored_as_json_strings() -> None:
    row = {"messages": json.dumps([
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "content": "sunny"}]), "tools": json.dumps(TOOLS)}
    chat = normalize(row, DatasetConfig(path="x", type="messages", system_prompt="Be brief."))
    assert chat.tools == TOOLS
    assert chat.messages[0] == {"role": "system", "content": "Be brief."}
    assert chat.messages[2]["content"] == "" and chat.messages[2]["tool_calls"][0]["function"]["arguments"] == \
        {"city": "Paris"}


def test_field_names_are_configurable() -> None:
    d = DatasetConfig(path="x", type="instruction", instruction_field="q", output_field="a", input_field="ctx")
    assert normalize({"q": "Q", "a": "A"}, d).messages == [{"role": "user", "content": "Q"},
                                                           {"role": "assistant", "content": "A"}]
    assert normalize({"body": "T"}, DatasetConfig(path="x", text_field="body")) == Document("T")
    chat = normalize({"dialog": CHAT[1:3]}, DatasetConfig(path="x", messages_field="dialog"))
    assert chat.messages == CHAT[1:3]


# -- loss masks --

def test_assistant_mask_is_each_reply_plus_its_end_of_turn(tokenizer) -> None:
    encoded = ChatEncoder(tokenizer).encode(Conversation(CHAT), "assistant")
    eot = EOT[style(tokenizer)]
    assert trained_runs(tokenizer, encoded) == [CHAT[2]["content"] + eot, CHAT[4]["content"] + eot]
    # The template renders every token: the ids are what apply_chat_template gives.
    assert encoded.input_ids.tolist() == tokenizer.apply_chat_template(CHAT)


def test_last_turn_and_all(tokenizer) -> None:
    encoder = ChatEncoder(tokenizer)
    last = encoder.encode(Conversation(CHAT), "last_turn")
    assert trained_runs(tokenizer, last) == [CHAT[4]["content"] + EOT[style(tokenizer)]]
    everything = encoder.encode(Conversation(CHAT), "all")
    assert everything.loss_mask.all() and everything.input_ids.tolist() == tokenizer.apply_chat_template(CHAT)


def test_qwen3_template_is_not_prefix_stable_and_masks_are_still_right(tokenizers_by_style) -> None:
    tok = tokenizers_by_style["chatml"]
    # The last assistant turn gets an empty <think> block; the same turn followed by more does not.
    prefix = tok.apply_chat_template(CHAT[:3], tokenize=False)
    assert not tok.apply_chat_template(CHAT, tokenize=False).startswith(prefix)
    encoded = ChatEncoder(tok).encode(Conversation(CHAT), "assistant")
    runs = trained_runs(tok, encoded)
    assert runs == ["Hello! What is the weather like today?<|im_end|>", "The answer is 42 🙂 (中文字符).<|im_end|>"]


def test_reasoning_in_the_last_turn_is_trained_on(tokenizers_by_style) -> None:
    # The placeholder turn renders with an empty <think> block, the real one with the reasoning:
    # the per-message probe finds the difference.
    tok = tokenizers_by_style["chatml"]
    chat = Conversation([*CHAT[:4], {"role": "assistant", "content": "42.", "reasoning_content": "12 + 30 = 42"}])
    runs = trained_runs(tok, ChatEncoder(tok).encode(chat, "assistant"))
    assert runs == [CHAT[2]["content"] + "<|im_end|>", "12 + 30 = 42\n</think>\n\n42.<|im_end|>"]


def test_tool_calls_are_trained_on(tokenizer) -> None:
    chat = Conversation([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny."}], TOOLS)
    runs = trained_runs(tokenizer, ChatEncoder(tokenizer).encode(chat, "assistant"))
    call = {"llama3": '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>',
            "chatml": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'}
    assert runs == [call[style(tokenizer)], "It is sunny." + EOT[style(tokenizer)]]
    # The tool schema reached the prompt, and the tool result is not trained on.
    text = tokenizer.decode(ChatEncoder(tokenizer).encode(chat, "all").input_ids)
    assert "Weather in a city" in text and not any("sunny" in r for r in runs[:1])


def test_generation_blocks_decide_when_the_template_has_them(llama3) -> None:
    template = ("{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
                "{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}"
                "{% else %}{{ m.content }}{% endif %}<|eot_id|>{% endfor %}")
    encoded = ChatEncoder(llama3, chat_template=template).encode(Conversation(CHAT), "assistant")
    assert trained_runs(llama3, encoded) == [CHAT[2]["content"] + "<|eot_id|>", CHAT[4]["content"] + "<|eot_id|>"]
    last = ChatEncoder(llama3, chat_template=template).encode(Conversation(CHAT), "last_turn")
    assert trained_runs(llama3, last) == [CHAT[4]["content"] + "<|eot_id|>"]


def test_template_that_reorders_turns_is_rejected(llama3) -> None:
    template = "{% for m in messages | reverse %}<|start_header_id|>{{ m.role }}\n{{ m.content }}<|eot_id|>{% endfor %}"
    result = ChatEncoder(llama3, chat_template=template).encode_batch([Conversation(CHAT)], "assistant")[0]
    assert isinstance(result, RowError) and "cannot locate assistant message" in result.problem
    assert "{% generation %}" in result.hint


def test_text_rows_are_trained_whole_with_an_eos(tokenizer) -> None:
    encoded = ChatEncoder(tokenizer).encode(Document("Hello world!"), "assistant")
    text = tokenizer.decode(encoded.input_ids)
    assert text == (tokenizer.bos_token or "") + "Hello world!" + tokenizer.eos_token
    assert encoded.loss_mask.all()


# -- datasets: split, order, resume, cache --

def test_validation_split_is_deterministic_by_seed(tmp_path: Path, llama3) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", chats(40))
    cfg = config(tmp_path, [{"path": str(data)}], validation_split_ratio=0.25)
    train, evaluation = build_datasets(cfg, llama3)
    assert (len(train.docs), len(evaluation.docs)) == (30, 10)
    again_train, again_eval = build_datasets(cfg, llama3)
    assert np.array_equal(evaluation.docs.input_ids, again_eval.docs.input_ids)
    other = build_datasets(config(tmp_path, [{"path": str(data)}], validation_split_ratio=0.25, seed=7), llama3)[1]
    assert not np.array_equal(evaluation.docs.offsets, other.docs.offsets) or \
        not np.array_equal(evaluation.docs.input_ids, other.docs.input_ids)
    assert build_datasets(config(tmp_path, [{"path": str(data)}], eval_steps=0), llama3)[1] is None


def test_validation_datasets(tmp_path: Path, llama3) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", chats(8))
    held = write_jsonl(tmp_path / "v.jsonl", chats(3))
    train, evaluation = build_datasets(config(tmp_path, [{"path": str(data)}],
                                              validation_datasets=[{"path": str(held)}]), llama3)
    assert (len(train.docs), len(evaluation.docs)) == (8, 3)


def test_samples_limit_and_per_dataset_train_on(tmp_path: Path, llama3) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", chats(10))
    train, _ = build_datasets(config(tmp_path, [{"path": str(data), "samples": 4, "train_on": "all"}], eval_steps=0),
                              llama3)
    assert len(train.docs) == 4 and train.docs.loss_mask.all()


def test_epoch_order_is_seeded_and_resume_continues_exactly(tmp_path: Path, llama3) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", chats(50))
    train, _ = build_datasets(config(tmp_path, [{"path": str(data)}], eval_steps=0, sample_packing=False), llama3)
    assert train.num_rows == 50 and train.num_batches(4) == 13
    first, second = train.order(0), train.order(1)
    assert sorted(first) == list(range(50)) and not np.array_equal(first, second)
    assert np.array_equal(first, train.order(0))

    whole = train.iterator(4)
    expected = [next(whole) for _ in range(20)]  # crosses into the second epoch
    assert whole.position == (1, 7)
    part = train.iterator(4)
    for _ in range(9):
        next(part)
    resumed = train.iterator(4, position=part.position)
    for want, got in zip(expected[9:], (next(resumed) for _ in range(11))):
        assert np.array_equal(want.input_ids, got.input_ids) and np.array_equal(want.targets, got.targets)
    # Each epoch sees every row once; the last micro-batch is topped up with padding rows.
    seen = [b for b in train.batches(4, epoch=0)]
    assert sum(b.num_target_tokens for b in seen) == train.docs.num_targets
    assert all(b.rows == 4 for b in seen)


def test_cache_is_reused_and_invalidated_by_the_data(tmp_path: Path, llama3, monkeypatch) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", chats(12))
    cfg = config(tmp_path, [{"path": str(data)}])
    train, evaluation = build_datasets(cfg, llama3)
    assert (train.stats.tokenized, train.stats.cached) == (1, 0)
    assert list((tmp_path / "out" / ".cache" / "tokenized").glob("*.npz"))

    def no_tokenizing(*args, **kwargs):
        raise AssertionError("tokenized again")

    with monkeypatch.context() as m:
        m.setattr(ChatEncoder, "encode_batch", no_tokenizing)
        train2, evaluation2 = build_datasets(cfg, llama3)
    assert (train2.stats.tokenized, train2.stats.cached) == (0, 1)
    assert np.array_equal(train.docs.input_ids, train2.docs.input_ids)
    assert np.array_equal(train.docs.loss_mask, train2.docs.loss_mask)
    assert np.array_equal(evaluation.docs.input_ids, evaluation2.docs.input_ids)

    # Another train_on or sequence_len, or changed data: tokenized again.
    assert build_datasets(config(tmp_path, [{"path": str(data)}], train_on="all"), llama3)[0].stats.tokenized == 1
    write_jsonl(data, chats(13))
    assert build_datasets(cfg, llama3)[0].stats.tokenized == 1


def test_pt_documents(tmp_path: Path, llama3) -> None:
    texts = ["Hello world! This is a tiny tokenizer for tests.", "The quick brown fox jumps over the lazy dog."]
    data = write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in texts] + chats(1))
    train, _ = build_datasets(config(tmp_path, [{"path": str(data)}], kind="pt", eval_steps=0), llama3)
    docs = train.docs
    assert docs.loss_mask.all() and len(docs) == 3
    decoded = sorted(llama3.decode(docs[d][0]) for d in range(len(docs)))
    assert "<|begin_of_text|>" + texts[0] + "<|eot_id|>" in decoded
    assert any(d.startswith("<|begin_of_text|><|start_header_id|>") for d in decoded)  # chat rows: whole conversation


def test_truncation_is_counted(tmp_path: Path, llama3) -> None:
    long = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "again and " * 100}]}
    data = write_jsonl(tmp_path / "d.jsonl", [long, *chats(3)])
    train, _ = build_datasets(config(tmp_path, [{"path": str(data)}], eval_steps=0), llama3)
    assert train.stats.truncated == 1 and train.docs.lengths.max() == 256
