"""A Hugging Face model folder: config.json, safetensors weights, tokenizer files, chat templates.

``resolve_model_path`` turns what a user typed (a folder, or a hub id such as
``Qwen/Qwen3-0.6B``) into a local path; ``ModelFolder`` finds the pieces inside it. Each piece
is read on first use, so a folder holding only a tokenizer is still a usable ``ModelFolder``,
and a missing or damaged file is reported by the property that needed it, naming the file.
"""

from __future__ import annotations

import json
import os
import re
from functools import cached_property
from pathlib import Path

from surogate.errors import FileFormatError, NotFoundError
from surogate.io.safetensors import SafetensorsFile, ShardedCheckpoint

SINGLE_WEIGHTS = "model.safetensors"
SHARDED_INDEX = "model.safetensors.index.json"

# Weight formats we do not read; downloads skip them, and a folder holding only these says so.
_OTHER_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.h5", "*.msgpack", "*.onnx", "*.ot", "*.tflite")
_REPO_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")


def resolve_model_path(path_or_id: str | os.PathLike, *, download: bool = False,
                       revision: str | None = None, cache_dir: str | os.PathLike | None = None) -> Path:
    """A local path as is; otherwise a hub id looked up in the local HF cache (fetched if ``download``)."""
    path = Path(path_or_id).expanduser()
    if path.exists():
        return path
    text = str(path_or_id)
    # A missing .gguf is a file the user meant, never a hub id.
    if not _REPO_ID.match(text) or text.startswith((".", "/", "~")) or text.lower().endswith(".gguf"):
        raise NotFoundError(f"no such file or folder: {text}",
                            hint="check the path; a Hugging Face model id looks like 'org/name'")

    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(text, revision=revision, cache_dir=cache_dir, local_files_only=not download,
                                   ignore_patterns=list(_OTHER_WEIGHTS))
    except Exception as e:  # the hub raises many kinds: not cached, bad id, HTTP, gated repo, network
        at = f" at revision {revision}" if revision else ""
        if download:
            raise NotFoundError(f"could not download '{text}'{at} from the Hugging Face Hub: {e}",
                                hint="check the id and the network; gated models need `hf auth login` first") from e
        raise NotFoundError(
            f"'{text}' is not a local folder and is not in the Hugging Face cache{at}",
            hint=f"download it first (`hf download {text}`, or `huggingface-cli download {text}`), "
                 "pass download=True, or give the path of a local folder") from e
    return Path(folder)


class ModelFolder:
    """The files of one HF model folder, each read on first use."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.is_dir():
            what = "a file, not a folder" if self.path.exists() else "not found"
            raise NotFoundError(f"model folder {self.path}: {what}",
                                hint="pass the folder that holds config.json (resolve hub ids with resolve_model_path)")

    @cached_property
    def config(self) -> dict:
        path = self.path / "config.json"
        if not path.is_file():
            raise NotFoundError(f"no config.json in {self.path}", hint=f"found: {self._listing()}; "
                                "a Hugging Face model folder needs the config.json the model was saved with")
        return read_json(path)

    @cached_property
    def generation_config(self) -> dict | None:
        path = self.path / "generation_config.json"
        return read_json(path) if path.is_file() else None

    @cached_property
    def tokenizer_config(self) -> dict:
        path = self.path / "tokenizer_config.json"
        return read_json(path) if path.is_file() else {}

    @property
    def tokenizer_file(self) -> Path:
        path = self.path / "tokenizer.json"
        if path.is_file():
            return path
        if (self.path / "tokenizer.model").is_file() or (self.path / "vocab.json").is_file():
            hint = ("this folder has only a slow tokenizer (tokenizer.model or vocab.json); write tokenizer.json with "
                    "transformers: AutoTokenizer.from_pretrained(folder).save_pretrained(folder)")
        else:
            hint = f"found: {self._listing()}"
        raise NotFoundError(f"no tokenizer.json in {self.path}", hint=hint)

    @property
    def chat_templates(self) -> dict[str, str]:
        """Named chat templates ("default" for the unnamed one), found where transformers looks."""
        return {name: text for name, (text, _) in self._chat_templates.items()}

    @property
    def chat_template_origins(self) -> dict[str, str]:
        """The file each chat template came from, for error messages."""
        return {name: origin for name, (_, origin) in self._chat_templates.items()}

    @cached_property
    def _chat_templates(self) -> dict[str, tuple[str, str]]:
        # Stand-alone .jinja files replace whatever tokenizer_config.json holds (transformers does the same).
        files = [self.path / "chat_template.jinja", *sorted((self.path / "additional_chat_templates").glob("*.jinja"))]
        templates = {"default" if f.name == "chat_template.jinja" else f.stem: (f.read_text(encoding="utf-8"), str(f))
                     for f in files if f.is_file()}
        if templates:
            return templates

        origin = self.path / "tokenizer_config.json"
        value = self.tokenizer_config.get("chat_template")
        if value is None:
            # The multimodal processors' older file; transformers' processors read it when no .jinja exists.
            origin = self.path / "chat_template.json"
            value = read_json(origin).get("chat_template") if origin.is_file() else None
        if value is None:
            return {}
        if isinstance(value, str):
            return {"default": (value, str(origin))}
        if isinstance(value, list) and all(isinstance(t, dict) and {"name", "template"} <= t.keys() for t in value):
            return {t["name"]: (t["template"], f"{origin} ({t['name']})") for t in value}
        raise FileFormatError(f"{origin}: 'chat_template' must be a string or a list of {{name, template}} objects",
                              hint="fix or remove the chat_template entry")

    @property
    def weights_file(self) -> Path:
        """``model.safetensors.index.json`` for a sharded checkpoint, else ``model.safetensors``."""
        for name in (SHARDED_INDEX, SINGLE_WEIGHTS):
            if (self.path / name).is_file():
                return self.path / name
        others = sorted({p.name for pattern in (*_OTHER_WEIGHTS, "*.safetensors", "*.gguf")
                         for p in self.path.glob(pattern)})
        hint = f"found {', '.join(others)}. " if others else f"found: {self._listing()}. "
        hint += (f"Surogate reads {SINGLE_WEIGHTS} or {SHARDED_INDEX} with its shards; "
                 "convert other formats with transformers: "
                 "AutoModelForCausalLM.from_pretrained(folder).save_pretrained(folder)")
        raise NotFoundError(f"no safetensors weights in {self.path}", hint=hint)

    def open_weights(self):
        """The checkpoint's tensors (``get``, ``in``, ``keys``): the safetensors file or shards, read
        through the config's ``quantization_config`` (io/quantized_checkpoint.py: block FP8 comes
        out dequantized; a method not read here is refused by name)."""
        from surogate.io.quantized_checkpoint import weights_reader

        path = self.weights_file
        raw = ShardedCheckpoint(path) if path.name == SHARDED_INDEX else SafetensorsFile(path)
        return weights_reader(raw, self.config, str(self.path / "config.json"))

    def _listing(self, limit: int = 12) -> str:
        names = sorted(p.name for p in self.path.iterdir())
        if not names:
            return "nothing (the folder is empty)"
        return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")

    def __repr__(self) -> str:
        return f"ModelFolder({str(self.path)!r})"


def read_json(path: Path) -> dict:
    """A JSON object from ``path``; a missing, malformed or non-object file is an error naming it."""
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except FileNotFoundError:
        raise NotFoundError(f"no such file: {path}") from None
    except json.JSONDecodeError as e:
        raise FileFormatError(f"{path} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}",
                              hint="the file is damaged or incomplete; fetch it again or fix it by hand") from None
    except UnicodeDecodeError as e:
        raise FileFormatError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})",
                              hint="the file is damaged or is not JSON") from None
    if not isinstance(value, dict):
        raise FileFormatError(f"{path}: expected a JSON object, found {type(value).__name__}",
                              hint="the file is damaged or is not the file its name says")
    return value
