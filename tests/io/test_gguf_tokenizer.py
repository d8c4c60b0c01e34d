"""Tokenizers from GGUF metadata against transformers' tokenizer loaded from the same file
(``AutoTokenizer.from_pretrained(dir, gguf_file=name)``): SmolLM2's byte-level BPE and a
SentencePiece-style ("llama") vocabulary with scores and byte fallback. Plus the way back:
tokenizer metadata we write from an HF folder gives the folder's own tokenizer again."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sgtest.smollm2 import smollm2_path
from gguf import GGUFWriter

from surogate.errors import FileFormatError, UnsupportedError
from surogate.io import GGUFFile, Tokenizer, save_hf_tokenizer

TEXTS = [
    "Hello world! This is SmolLM2 speaking.",
    "  leading spaces,   runs of spaces\tand tabs\n\nand blank lines\n",
    "Numbers: 1234567890, 3.14159, -42, 1e-5, 2024-06-01 and 100,000,000.",
    "Ünïcödé text, emoji 🙂👍🏽 and 中文字符 and العربية and русский.",
    "def add(a, b):\n    return a + b  # code with    indentation\n",
    "<|im_start|>user\nspecial tokens in the text<|im_end|>\n<|im_start|>assistant\n",
    "don't won't I'm you're they've we'll she'd IT'S",
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    "",
    " ",
    "a",
]
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi!"},
     {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Count: 1 2 3"}],
]




def hf_tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def assert_same(ours: Tokenizer, ref, texts=TEXTS, chats=CHATS):
    for text in texts:
        for special in (True, False):
            ids = ours.encode(text, add_special_tokens=special)
            assert ids == ref.encode(text, add_special_tokens=special), (text, special)
            for skip in (False, True):
                assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip), text
    for chat in chats:
        for prompt in (False, True):
            text = ours.apply_chat_template(chat, add_generation_prompt=prompt, tokenize=False)
            assert text == ref.apply_chat_template(chat, add_generation_prompt=prompt, tokenize=False)
            assert ours.apply_chat_template(chat, add_generation_prompt=prompt) == ref.apply_chat_template(
                chat, add_generation_prompt=prompt, tokenize=True, return_dict=False)


# ---- SmolLM2: byte-level BPE ("gpt2", pre "smollm") ------------------------------------------

@pytest.fixture(scope="module")
def smollm2():
    path = smollm2_path()
    return Tokenizer.from_gguf(path), hf_tokenizer(path)


def test_smollm2_matches_transformers(smollm2):
    ours, ref = smollm2
    assert_same(ours, ref)
    assert len(ours) == len(ref) == 49152
    assert (ours.bos_token, ours.eos_token, ours.unk_token, ours.pad_token) == (
        ref.bos_token, ref.eos_token, ref.unk_token, ref.pad_token)
    # Generation stops where llama.cpp stops: eos <|im_end|>, and <|endoftext|> by its text.
    assert ours.add_bos_token is False and ours.eos_token_ids == (2, 0)
    assert ours.chat_template == ref.chat_template


def test_smollm2_digits_split_one_by_one(smollm2):
    # llama.cpp's "smollm" pre-tokenizer isolates every digit (SmolLM2's tokenizer.json does the same).
    ours, _ = smollm2
    ids = ours.encode("x 2024")
    assert [ours.id_to_token(i) for i in ids] == ["x", "\u0120", "2", "0", "2", "4"]


def test_saved_hf_tokenizer_folder_loads_the_same(smollm2, tmp_path):
    ours, _ = smollm2
    folder = save_hf_tokenizer(smollm2_path(), tmp_path / "tok")
    again = Tokenizer.from_folder(folder)
    for text in TEXTS:
        assert again.encode(text) == ours.encode(text)
    assert again.chat_template == ours.chat_template and again.eos_token == ours.eos_token


# ---- SentencePiece-style vocabulary ("llama") ------------------------------------------------

SPM_CORPUS = ["the quick brown fox jumps over the lazy dog", "hello world, hello there", "a tokenizer for tests",
              "she sells sea shells by the sea shore", "the theme of the thesis"] * 3


def write_spm_gguf(path: Path, add_space_prefix: bool | None = None) -> Path:
    """A Llama-2-style vocabulary: <unk> <s> </s>, 256 byte tokens, then pieces scored by merge order."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers, trainers

    trainer_tok = HFTokenizer(models.BPE())
    trainer_tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=True)
    trainer_tok.train_from_iterator(SPM_CORPUS, trainers.BpeTrainer(vocab_size=120, show_progress=False))
    pieces = [t for t, _ in sorted(trainer_tok.get_vocab().items(), key=lambda kv: kv[1])]
    tokens = ["<unk>", "<s>", "</s>", *[f"<0x{b:02X}>" for b in range(256)], *pieces, "<tool>"]
    types = [2, 3, 3, *[6] * 256, *[1] * len(pieces), 4]
    scores = [0.0, 0.0, 0.0, *[0.0] * 256, *[-float(i) for i in range(len(pieces))], 0.0]
    w = GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_context_length(128)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(np.array(scores, np.float32).tolist())
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    if add_space_prefix is not None:
        w.add_add_space_prefix(add_space_prefix)
    w.add_tensor("token_embd.weight", np.zeros((len(tokens), 64), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


SPM_TEXTS = ["the quick brown fox", "hello world", "  two leading spaces", "Ünïcödé 🙂 falls back to bytes",
             "the thesis <tool> theme", "new\nlines\n", "shells", ""]


def test_sentencepiece_vocabulary_matches_transformers(tmp_path):
    path = write_spm_gguf(tmp_path / "spm.gguf")
    ours, ref = Tokenizer.from_gguf(path), hf_tokenizer(path)
    assert_same(ours, ref, texts=SPM_TEXTS, chats=[])
    assert ours.add_bos_token is True and ours.encode("the")[0] == 1
    # Bytes outside the vocabulary come out as <0xNN> tokens and decode back.
    ids = ours.encode("🙂", add_special_tokens=False)
    assert all(ours.id_to_token(i).startswith("<0x") for i in ids[1:]) and ours.decode(ids) == "🙂"


def test_sentencepiece_without_space_prefix(tmp_path):
    ours = Tokenizer.from_gguf(write_spm_gguf(tmp_path / "np.gguf", add_space_prefix=False))
    assert ours.id_to_token(ours.encode("the", add_special_tokens=False)[0]) != "\u2581the"
    assert ours.decode(ours.encode("the sea", add_special_tokens=False)) == "the sea"


# ---- errors --------------------------------------------------------------------------------

def _file_with(tmp_path, **kv) -> Path:
    w = GGUFWriter(tmp_path / "e.gguf", "llama")
    for key, value in kv.items():
        key = key.replace("__", ".")
        if isinstance(value, list):
            w.add_array(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        else:
            w.add_string(key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tmp_path / "e.gguf"


def test_errors(tmp_path):
    with pytest.raises(FileFormatError, match="no tokenizer"):
        Tokenizer.from_gguf(_file_with(tmp_path, general__name="x"))
    with pytest.raises(UnsupportedError, match="tokenizer model 'rwkv'"):
        Tokenizer.from_gguf(_file_with(tmp_path, tokenizer__ggml__model="rwkv", tokenizer__ggml__tokens=["a"]))
    with pytest.raises(FileFormatError, match="bos_token_id is 7, outside the 1 tokens"):
        Tokenizer.from_gguf(_file_with(tmp_path, tokenizer__ggml__model="gpt2", tokenizer__ggml__tokens=["a"],
                                       tokenizer__ggml__bos_token_id=7))
    with pytest.raises(FileFormatError, match="not two tokens"):
        Tokenizer.from_gguf(_file_with(tmp_path, tokenizer__ggml__model="gpt2", tokenizer__ggml__tokens=["a", "b"],
                                       tokenizer__ggml__merges=["a b c"]))
    with pytest.raises(FileFormatError, match="tokenizer.ggml.tokens is not an array of str"):
        Tokenizer.from_gguf(_file_with(tmp_path, tokenizer__ggml__model="gpt2", tokenizer__ggml__tokens=[1, 2]))
    with pytest.raises(FileFormatError, match="cannot be built"):
        Tokenizer.from_gguf(_file_with(tmp_path, tokenizer__ggml__model="gpt2", tokenizer__ggml__tokens=["a", "b"],
                                       tokenizer__ggml__merges=["a c"]))
    assert GGUFFile(_file_with(tmp_path, tokenizer__ggml__model="gpt2", tokenizer__ggml__tokens=["a", "b"]))
