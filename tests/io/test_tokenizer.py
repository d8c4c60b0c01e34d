"""Our Tokenizer against transformers' AutoTokenizer on the same folders: ids and text must match."""

import json

import pytest

from sgtest import tiny_models
from surogate.errors import FileFormatError, NotFoundError
from surogate.io import Tokenizer

TEXTS = [
    "Hello world!",
    "",
    "  leading spaces\n\nnewlines\ttabs   and trailing  ",
    "Ünïcödé 🙂 中文字符, and bytes never seen in training: ŧ€ß",
    "don't you're we'll 1234567 3.14",
    "<|begin_of_text|>special<|eot_id|> tokens <|im_start|>user\nhi<|im_end|>",
    "<think>plain added tokens</think> <tool_call>{}</tool_call>",
]


def test_encode_and_decode_match_transformers(tokenizer_dir, hf_tokenizer):
    ours, hf = Tokenizer.from_folder(tokenizer_dir), hf_tokenizer(tokenizer_dir)
    assert len(ours) == len(hf)
    for text in TEXTS:
        for add_special in (True, False):
            ids = ours.encode(text, add_special_tokens=add_special)
            assert ids == hf(text, add_special_tokens=add_special)["input_ids"], (text, add_special)
            for skip in (False, True):
                assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
    assert ours.encode_batch(TEXTS) == [ours.encode(t) for t in TEXTS]


def test_bos_comes_from_the_post_processor(tokenizer_dir):
    tok = Tokenizer.from_folder(tokenizer_dir)
    ids = tok.encode("Hello")
    if tok.bos_token:  # Llama 3: <|begin_of_text|> prepended, never an eos appended
        assert tok.add_bos_token and ids[0] == tok.bos_token_id == tok.token_to_id("<|begin_of_text|>")
        assert tok.encode("Hello", add_special_tokens=False) == ids[1:]
    else:  # Qwen: no bos at all
        assert not tok.add_bos_token and tok.bos_token_id is None
        assert tok.encode("Hello", add_special_tokens=False) == ids
    assert not tok.add_eos_token


def test_eos_ids_join_tokenizer_and_generation_config(tokenizer_dir):
    tok = Tokenizer.from_folder(tokenizer_dir)
    generation = json.loads((tokenizer_dir / "generation_config.json").read_text())["eos_token_id"]
    assert tok.eos_token_ids[0] == tok.eos_token_id
    assert set(tok.eos_token_ids) == {tok.eos_token_id, *generation}
    expected = {"<|eot_id|>", "<|end_of_text|>"} if tok.bos_token else {"<|im_end|>", "<|endoftext|>"}
    assert {tok.id_to_token(i) for i in tok.eos_token_ids} == expected


def test_eos_falls_back_to_config_json(tmp_path):
    path = tiny_models.make_tokenizer(tmp_path, "chatml")
    (path / "generation_config.json").unlink()
    (path / "config.json").write_text(json.dumps({"eos_token_id": 400}))
    tok = Tokenizer.from_folder(path)
    assert tok.eos_token_ids == (tok.eos_token_id, 400)


# tokenizer_config.json variations that change which tokens are special, as found on the Hub.
SPECIAL_TOKEN_CASES = {
    "eos not in tokenizer.json": {"eos_token": "<|new_eos|>", "additional_special_tokens": ["<|extra|>"]},
    "pad is an ordinary vocab word": {"pad_token": "weather"},
    "eos is a non-special added token": {"eos_token": "<think>"},
    "model-specific named token": {"extra_special_tokens": {"image_token": "<|image|>"}},
    "AddedToken dict with lstrip": {"eos_token": {"__type": "AddedToken", "content": "<|zz|>", "lstrip": True,
                                                  "rstrip": False, "normalized": False, "single_word": False,
                                                  "special": True}},
}


@pytest.mark.parametrize("case", SPECIAL_TOKEN_CASES)
def test_special_token_variants_match_transformers(case, tmp_path):
    from transformers import AutoTokenizer

    path = tiny_models.make_tokenizer(tmp_path, "chatml")
    config = json.loads((path / "tokenizer_config.json").read_text())
    # The generic class keeps tokenizer.json's pipeline and the config's flags as given.
    config.update(SPECIAL_TOKEN_CASES[case], tokenizer_class="PreTrainedTokenizerFast")
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    ours, hf = Tokenizer.from_folder(path), AutoTokenizer.from_pretrained(str(path))
    assert ours.special_tokens_map == hf.special_tokens_map
    assert len(ours) == len(hf)
    text = "a weather b <|new_eos|> <|extra|> <think>q</think> <|image|> <|zz|> x"
    ids = ours.encode(text)
    assert ids == hf(text)["input_ids"]
    assert ours.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True)
    messages = [{"role": "user", "content": "hi"}]
    assert (ours.apply_chat_template(messages, add_generation_prompt=True)
            == hf.apply_chat_template(messages, add_generation_prompt=True, return_dict=False))


def test_transformers_save_pretrained_layout(tmp_path):
    """What PreTrainedTokenizerFast.save_pretrained writes (template in chat_template.jinja) loads the same."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tiny_models.build_tokenizer("llama3"),
                                   bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
                                   chat_template=tiny_models.LLAMA3_TEMPLATE)
    fast.save_pretrained(tmp_path)
    assert (tmp_path / "chat_template.jinja").is_file()
    ours, hf = Tokenizer.from_folder(tmp_path), AutoTokenizer.from_pretrained(str(tmp_path))
    for text in TEXTS:
        assert ours.encode(text) == hf(text)["input_ids"]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert ours.apply_chat_template(messages, add_generation_prompt=True) == hf.apply_chat_template(
        messages, add_generation_prompt=True, return_dict=False)
    assert ours.eos_token_ids == (ours.token_to_id("<|eot_id|>"),)


def test_missing_or_damaged_tokenizer_json(tmp_path):
    with pytest.raises(NotFoundError, match="tokenizer.json"):
        Tokenizer.from_folder(tmp_path)
    path = tiny_models.make_tokenizer(tmp_path / "t", "llama3")
    text = (path / "tokenizer.json").read_text()
    (path / "tokenizer.json").write_text(text[: len(text) // 2])
    with pytest.raises(FileFormatError) as e:
        Tokenizer.from_folder(path)
    assert "tokenizer.json" in str(e.value) and e.value.hint


def test_reads_the_tokenizer_of_a_model_folder(qwen3_dir):
    tok = Tokenizer.from_folder(qwen3_dir)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    # The model's embedding is padded past the tokenizer, as in the real Qwen3.
    assert json.loads((qwen3_dir / "config.json").read_text())["vocab_size"] >= len(tok)


def test_legacy_special_tokens_map(tmp_path):
    path = tiny_models.make_tokenizer(tmp_path, "chatml")
    config = json.loads((path / "tokenizer_config.json").read_text())
    del config["added_tokens_decoder"], config["eos_token"]
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    (path / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    from transformers import AutoTokenizer

    ours, hf = Tokenizer.from_folder(path), AutoTokenizer.from_pretrained(str(path))
    assert ours.eos_token == hf.eos_token == "<|endoftext|>"
