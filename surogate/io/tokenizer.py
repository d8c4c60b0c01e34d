"""A model's tokenizer: tokenizer.json run by the `tokenizers` library, plus what
tokenizer_config.json and generation_config.json say about special tokens and chat templates.

Goal: the same ids and text as transformers' fast tokenizer (``AutoTokenizer``) for the same
folder. The pipeline in tokenizer.json decides everything about encoding, including whether a
BOS is added: Llama 3's post-processor prepends ``<|begin_of_text|>``, Qwen's adds nothing. Like
transformers, ``add_bos_token`` / ``add_eos_token`` in tokenizer_config.json are ignored when a
tokenizer.json exists; ``add_bos_token`` here reports what the post-processor does. Named
special tokens missing from tokenizer.json's added tokens are added as special tokens, as
transformers does, so they are never split and ``skip_special_tokens`` drops them.
"""

from __future__ import annotations

import functools

import os
from collections.abc import Iterable, Mapping, Sequence

import tokenizers

from surogate.errors import FileFormatError
from surogate.io.chat_template import ChatTemplate, select_template
from surogate.io.hf_folder import ModelFolder, read_json

# transformers' named special tokens, in the order it adds missing ones to the vocabulary.
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class Tokenizer:
    """Encode, decode, and render chat templates for one model. Takes over ``backend`` (adds the
    special tokens the config names, turns truncation and padding off)."""

    def __init__(self, backend: tokenizers.Tokenizer, config: Mapping | None = None, *,
                 chat_templates: Mapping[str, str] | None = None,
                 chat_template_origins: Mapping[str, str] | None = None,
                 extra_eos_token_ids: Iterable[int] = ()):
        config = dict(config or {})
        self._backend = backend
        # No silent truncation or padding, whatever tokenizer.json was saved with.
        backend.no_truncation()
        backend.no_padding()
        backend.encode_special_tokens = bool(config.get("split_special_tokens", False))
        self.special_tokens_map = _named_special_tokens(config)  # what chat templates see
        extra = config.get("extra_special_tokens")  # a dict there names tokens; then the v4 list applies
        extra = extra if isinstance(extra, list) else config.get("additional_special_tokens")
        self.extra_special_tokens = [t for t in map(_content, extra) if t] if isinstance(extra, list) else []
        _register_special_tokens(backend, config, [*self.special_tokens_map.values(), *self.extra_special_tokens])
        # transformers skips this clean-up for BPE models, where it would eat real spaces.
        is_bpe = type(backend.model).__name__ == "BPE"
        self._cleanup_spaces = bool(config.get("clean_up_tokenization_spaces")) and not is_bpe
        self.chat_templates = dict(chat_templates or {})
        self.chat_template_origins = dict(chat_template_origins or {})
        eos = [self.eos_token_id] if self.eos_token_id is not None else []
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys([*eos, *extra_eos_token_ids]))
        probe = backend.encode("", add_special_tokens=True).ids
        self.add_bos_token = self.bos_token_id is not None and probe[:1] == [self.bos_token_id]
        self.add_eos_token = self.eos_token_id is not None and probe[-1:] == [self.eos_token_id]

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The ``tokenizers.Tokenizer`` underneath, for what this class does not wrap (offsets, the
        serialised vocabulary a grammar engine or a cache key reads). Not for changing settings."""
        return self._backend

    @classmethod
    def from_folder(cls, folder: str | os.PathLike | ModelFolder) -> Tokenizer:
        folder = folder if isinstance(folder, ModelFolder) else ModelFolder(folder)
        path = folder.tokenizer_file
        try:
            backend = tokenizers.Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises plain Exceptions with serde's message
            raise FileFormatError(f"{path}: cannot load the tokenizer: {e}",
                                  hint="the file is damaged, or needs a newer `tokenizers` (pip install -U tokenizers)"
                                  ) from None
        config = dict(folder.tokenizer_config)
        legacy_map = folder.path / "special_tokens_map.json"
        if "added_tokens_decoder" not in config and legacy_map.is_file():
            # Older folders keep special tokens here; transformers lets this file win.
            config.update(read_json(legacy_map))
        # Generation stops on generation_config's eos ids; without that file transformers takes config.json's.
        generation = folder.generation_config
        if generation is None and (folder.path / "config.json").is_file():
            generation = folder.config
        eos_ids = (generation or {}).get("eos_token_id")
        eos_ids = [eos_ids] if isinstance(eos_ids, int) else [i for i in eos_ids or () if isinstance(i, int)]
        return cls(backend, config, chat_templates=folder.chat_templates,
                   chat_template_origins=folder.chat_template_origins, extra_eos_token_ids=eos_ids)

    @classmethod
    def from_gguf(cls, gguf) -> Tokenizer:
        """The tokenizer a GGUF file describes in its metadata (a path or a ``GGUFFile``); see
        ``surogate.io.gguf_tokenizer`` for how llama.cpp's vocabularies map to ours."""
        from surogate.io.gguf_tokenizer import tokenizer_from_gguf

        return tokenizer_from_gguf(gguf, cls)

    # -- special tokens --

    @property
    def bos_token(self) -> str | None:
        return self.special_tokens_map.get("bos_token")

    @property
    def eos_token(self) -> str | None:
        return self.special_tokens_map.get("eos_token")

    @property
    def pad_token(self) -> str | None:
        return self.special_tokens_map.get("pad_token")

    @property
    def unk_token(self) -> str | None:
        return self.special_tokens_map.get("unk_token")

    @property
    def bos_token_id(self) -> int | None:
        return self.token_to_id(self.bos_token)

    @property
    def eos_token_id(self) -> int | None:
        return self.token_to_id(self.eos_token)

    @property
    def pad_token_id(self) -> int | None:
        return self.token_to_id(self.pad_token)

    @property
    def vocab_size(self) -> int:
        """Every id the tokenizer can produce, added tokens included (``len(tokenizer)`` in transformers)."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str | None) -> int | None:
        return None if token is None else self._backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._backend.id_to_token(token_id)

    # -- text --

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        """Many texts at once, on the tokenizers library's thread pool."""
        return [e.ids for e in self._backend.encode_batch_fast(list(texts), add_special_tokens=add_special_tokens)]

    @functools.cached_property
    def special_ids(self) -> frozenset[int]:
        """Ids of the special added tokens (what ``skip_special_tokens`` drops)."""
        return frozenset(i for i, t in self._backend.get_added_tokens_decoder().items() if t.special)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        text = self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return _clean_up_tokenization(text) if self._cleanup_spaces else text

    # -- chat --

    @property
    def chat_template(self) -> str | None:
        """The default template's text, if the model has one."""
        return self.chat_templates.get("default")

    def get_chat_template(self, name: str | None = None, tools: Sequence | None = None) -> ChatTemplate:
        """The compiled template: ``name`` (a template name or a whole template), else the model's choice."""
        source = select_template(self.chat_templates, name, tools)
        origin = next((self.chat_template_origins.get(n, n) for n, text in self.chat_templates.items()
                       if text == source), "chat_template argument")
        return ChatTemplate(source, origin=origin)

    def apply_chat_template(self, messages: Sequence[Mapping], tools: Sequence[Mapping] | None = None,
                            add_generation_prompt: bool = False, tokenize: bool = True, *,
                            chat_template: str | None = None, documents: Sequence[Mapping] | None = None,
                            continue_final_message: bool | str = False, **template_kwargs) -> list[int] | str:
        """The conversation rendered by the model's chat template: token ids, or the text when
        ``tokenize=False``. ``template_kwargs`` (``enable_thinking=False``, ...) reach the template."""
        template = self.get_chat_template(chat_template, tools)
        text = template.render(messages, tools=tools, documents=documents,
                               add_generation_prompt=add_generation_prompt,
                               continue_final_message=continue_final_message,
                               **{**self.special_tokens_map, **template_kwargs})
        # The template writes the special tokens itself, so the post-processor must not add more.
        return self.encode(text, add_special_tokens=False) if tokenize else text

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, bos={self.bos_token!r}, eos={self.eos_token!r})"


def _content(token) -> str | None:
    # A token is a string or a serialized AddedToken ({"__type": "AddedToken", "content": ...}).
    if isinstance(token, dict):
        return token.get("content")
    return token if isinstance(token, str) else None


def _named_special_tokens(config: Mapping) -> dict[str, str]:
    named = {name: _content(config.get(name)) for name in SPECIAL_TOKEN_NAMES}
    # Model-specific named tokens (image_token, ...) count too: any other "*_token" key holding a token.
    named.update({k: _content(v) for k, v in config.items()
                  if k.endswith("_token") and k not in named and _content(v) is not None})
    extra = config.get("extra_special_tokens")
    if isinstance(extra, dict):
        named.update({k: _content(v) for k, v in extra.items()})
    return {k: v for k, v in named.items() if v is not None}


def _register_special_tokens(backend: tokenizers.Tokenizer, config: Mapping, tokens: Iterable[str]) -> None:
    """Make every named or extra special token a special added token, as transformers does: one
    missing from tokenizer.json is added (with the flags tokenizer_config.json gives it), one
    present but not special keeps its flags and becomes special."""
    present = {t.content: t for t in backend.get_added_tokens_decoder().values()}
    given = {}
    for value in [*(config.get(n) for n in SPECIAL_TOKEN_NAMES), *(config.get("added_tokens_decoder") or {}).values()]:
        if isinstance(value, dict) and "content" in value:
            given[value["content"]] = {k: value[k] for k in ("single_word", "lstrip", "rstrip", "normalized")
                                       if k in value}
    updates = []
    for content in dict.fromkeys(tokens):
        if content in present:
            old = present[content]
            if not old.special:
                updates.append(tokenizers.AddedToken(content, single_word=old.single_word, lstrip=old.lstrip,
                                                     rstrip=old.rstrip, normalized=old.normalized, special=True))
        else:
            updates.append(tokenizers.AddedToken(content, **{"normalized": False, **given.get(content, {})},
                                                 special=True))
    if updates:
        backend.add_special_tokens(updates)


def _clean_up_tokenization(text: str) -> str:
    # transformers' clean_up_tokenization, for the WordPiece-style tokenizers that ask for it.
    for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                          (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(before, after)
    return text
