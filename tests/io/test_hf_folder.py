import json
import shutil

import pytest

from surogate.errors import FileFormatError, NotFoundError
from surogate.io import ModelFolder, SafetensorsFile, ShardedCheckpoint, resolve_model_path


def test_reads_a_saved_transformers_folder(llama_dir, llama_sharded_dir):
    folder = ModelFolder(llama_dir)
    assert folder.config["model_type"] == "llama" and folder.config["num_hidden_layers"] == 2
    assert len(folder.generation_config["eos_token_id"]) == 2
    assert folder.tokenizer_file.name == "tokenizer.json"
    assert folder.tokenizer_config["bos_token"] == "<|begin_of_text|>"
    assert "<|start_header_id|>" in folder.chat_templates["default"]
    assert folder.chat_template_origins["default"].endswith("tokenizer_config.json")
    assert isinstance(folder.open_weights(), SafetensorsFile)

    sharded = ModelFolder(llama_sharded_dir)
    assert sharded.weights_file.name == "model.safetensors.index.json"
    weights = sharded.open_weights()
    assert isinstance(weights, ShardedCheckpoint)
    assert sorted(weights.keys()) == sorted(folder.open_weights().keys())


def copy_without(src, dst, *names):
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(*names))
    return dst


def test_missing_or_broken_config(llama_dir, tmp_path):
    folder = ModelFolder(copy_without(llama_dir, tmp_path / "m", "config.json"))
    with pytest.raises(NotFoundError) as e:
        folder.config
    assert "config.json" in str(e.value) and "model.safetensors" in e.value.hint
    # Everything else in the folder is still readable.
    assert folder.tokenizer_config and folder.generation_config

    (tmp_path / "m" / "config.json").write_text('{"model_type": "llama",\n "hidden_size": }')
    with pytest.raises(FileFormatError, match=r"config\.json is not valid JSON: .* line 2"):
        ModelFolder(tmp_path / "m").config
    (tmp_path / "m" / "config.json").write_text("[]")
    with pytest.raises(FileFormatError, match="expected a JSON object"):
        ModelFolder(tmp_path / "m").config


def test_missing_weights_lists_what_is_there(llama_dir, tmp_path):
    path = copy_without(llama_dir, tmp_path / "m", "model.safetensors")
    (path / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(NotFoundError) as e:
        ModelFolder(path).open_weights()
    assert str(path) in str(e.value)
    assert "pytorch_model.bin" in e.value.hint and "save_pretrained" in e.value.hint


def test_not_a_folder(tmp_path):
    with pytest.raises(NotFoundError, match="not found"):
        ModelFolder(tmp_path / "absent")
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotFoundError, match="a file, not a folder"):
        ModelFolder(tmp_path / "file")


def test_no_tokenizer_json(tmp_path):
    (tmp_path / "tokenizer.model").write_bytes(b"spm")
    with pytest.raises(NotFoundError) as e:
        ModelFolder(tmp_path).tokenizer_file
    assert "tokenizer.json" in str(e.value) and "save_pretrained" in e.value.hint


# -- chat templates: where transformers looks, in its order --

def write_json(path, value):
    path.write_text(json.dumps(value))


def test_chat_template_string_in_tokenizer_config(tmp_path):
    write_json(tmp_path / "tokenizer_config.json", {"chat_template": "A"})
    assert ModelFolder(tmp_path).chat_templates == {"default": "A"}


def test_named_chat_templates_in_tokenizer_config(tmp_path):
    write_json(tmp_path / "tokenizer_config.json",
               {"chat_template": [{"name": "default", "template": "A"}, {"name": "tool_use", "template": "T"}]})
    assert ModelFolder(tmp_path).chat_templates == {"default": "A", "tool_use": "T"}


def test_jinja_files_win_over_tokenizer_config(tmp_path):
    write_json(tmp_path / "tokenizer_config.json", {"chat_template": "old"})
    (tmp_path / "chat_template.jinja").write_text("new")
    (tmp_path / "additional_chat_templates").mkdir()
    (tmp_path / "additional_chat_templates" / "rag.jinja").write_text("R")
    folder = ModelFolder(tmp_path)
    assert folder.chat_templates == {"default": "new", "rag": "R"}
    assert folder.chat_template_origins["rag"].endswith("additional_chat_templates/rag.jinja")


def test_processor_chat_template_json(tmp_path):
    write_json(tmp_path / "chat_template.json", {"chat_template": "P"})
    assert ModelFolder(tmp_path).chat_templates == {"default": "P"}
    write_json(tmp_path / "tokenizer_config.json", {"chat_template": "A"})
    assert ModelFolder(tmp_path).chat_templates == {"default": "A"}


def test_no_or_bad_chat_template(tmp_path):
    assert ModelFolder(tmp_path).chat_templates == {}
    write_json(tmp_path / "tokenizer_config.json", {"chat_template": 3})
    with pytest.raises(FileFormatError, match="tokenizer_config.json"):
        ModelFolder(tmp_path).chat_templates


# -- resolving what the user typed --

def test_local_paths_resolve_to_themselves(llama_dir, tmp_path):
    assert resolve_model_path(llama_dir) == llama_dir
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    assert resolve_model_path(str(tmp_path / "model.gguf")) == tmp_path / "model.gguf"
    with pytest.raises(NotFoundError, match="no such file or folder"):
        resolve_model_path(tmp_path / "absent")
    with pytest.raises(NotFoundError, match="no such file or folder"):
        resolve_model_path("./relative/absent")


def fake_hub_cache(cache, repo_id, files):
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    shutil.copytree(files, snapshot)
    return snapshot


def test_hub_id_from_the_local_cache(llama_dir, tmp_path):
    snapshot = fake_hub_cache(tmp_path / "hub", "acme/tiny-llama", llama_dir)
    path = resolve_model_path("acme/tiny-llama", cache_dir=tmp_path / "hub")
    assert path == snapshot and ModelFolder(path).config["model_type"] == "llama"


def test_hub_id_not_in_the_cache(tmp_path):
    with pytest.raises(NotFoundError) as e:
        resolve_model_path("acme/not-cached", cache_dir=tmp_path / "hub")
    assert "not a local folder" in str(e.value) and "not in the Hugging Face cache" in str(e.value)
    assert "hf download acme/not-cached" in e.value.hint and "download=True" in e.value.hint
