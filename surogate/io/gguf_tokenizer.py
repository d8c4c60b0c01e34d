"""Tokenizers and GGUF metadata, both ways: a `tokenizers.Tokenizer` built from a GGUF file's
``tokenizer.ggml.*`` keys, and those keys from a Hugging Face tokenizer.json.

Two GGUF vocabularies exist in the families we run:

- ``gpt2``: byte-level BPE (Llama 3, Qwen, SmolLM). Tokens are spelled in GPT-2's byte
  alphabet, merges are listed. How text is split before BPE is not in the file, only named by
  ``tokenizer.ggml.pre``; ``PRE_SPLITS`` gives the split llama.cpp runs for each name (an
  unknown name gets GPT-2's regex, as transformers does). Llama 3's ``llama-bpe`` also looks
  whole words up before merging (``ignore_merges``), as llama.cpp and Llama 3's tokenizer.json do.
- ``llama``: SentencePiece BPE (Llama 2, Mistral). Tokens carry scores instead of merges; the
  merges are rebuilt from them (a pair of tokens merges with the score of the token it makes,
  best first), unknown bytes fall back to ``<0xNN>`` tokens, and ``\u2581`` stands for a space, one
  prepended to the text unless ``tokenizer.ggml.add_space_prefix`` is false.

- ``gemma4``: SentencePiece-style BPE over characters (Gemma 4; llama.cpp's vocab type BPE with
  pre-type gemma4): tokens are raw text with ``\u2581`` for a space (every space escaped, none
  prepended), merges are listed, text is split only into runs of newlines and of the rest, and
  a character without a token falls back to ``<0xNN>`` byte tokens. llama.cpp's converter writes
  it for Gemma 4 (scores -1000, a BOS added); ``gguf_tokenizer_metadata`` writes it for any
  tokenizer.json of that kind (byte-fallback BPE whose normalizer escapes spaces).

Token types (``tokenizer.ggml.token_type``): CONTROL tokens become special added tokens and
USER_DEFINED ones plain added tokens, both matched whole in the text as llama.cpp does. A BOS is
added when ``tokenizer.ggml.add_bos_token`` says so (llama.cpp's defaults when the key is absent).
Generation stops where llama.cpp stops: on eos, eot and eom, and on control tokens whose text
marks an end (``<|eot_id|>``, ``<|im_end|>``, ``<|endoftext|>``, ...).
"""

from __future__ import annotations

import json
from pathlib import Path

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors

from surogate.errors import FileFormatError, UnsupportedError
from surogate.io.gguf import GGUFFile

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
DIGIT_SPLIT = r"\p{N}"

# tokenizer.ggml.pre -> the regexes llama.cpp applies in turn (llama-vocab.cpp's pre types).
PRE_SPLITS: dict[str, tuple[str, ...]] = {
    **{name: (GPT2_SPLIT,) for name in ("gpt2", "mpt", "olmo", "jais", "trillion")},
    **{name: (DIGIT_SPLIT, GPT2_SPLIT) for name in ("smollm", "starcoder", "refact", "command-r", "codeshell",
                                                    "exaone", "minerva")},
    **{name: (LLAMA3_SPLIT,) for name in ("llama-bpe", "llama3", "llama-v3", "falcon3", "pixtral", "smaug-bpe",
                                          "dbrx")},
    **{name: (QWEN2_SPLIT,) for name in ("qwen2", "deepseek-r1-qwen")},
}
IGNORE_MERGES = {"llama-bpe", "llama3", "llama-v3", "falcon3", "pixtral"}

_SPECIAL_IDS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
                "pad_token": "padding_token_id", "sep_token": "seperator_token_id", "cls_token": "cls_token_id",
                "mask_token": "mask_token_id"}
_STOP_IDS = ("eos_token_id", "eot_token_id", "eom_token_id")
# Control tokens llama.cpp also ends generation on, found by their text (llama-vocab.cpp's EOG list).
_STOP_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>",
               "_<EOT>", "<|end_of_text|>", "<end_of_utterance>")


def byte_alphabet() -> dict[int, str]:
    """GPT-2's spelling of bytes as printable characters: printable Latin-1 bytes stand for
    themselves, the other 68 take the code points from 256 up, in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
            *range(ord("\u00ae"), ord("\u00ff") + 1)]
    spelling = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in spelling:
            spelling[b] = chr(256 + extra)
            extra += 1
    return spelling


# ---- GGUF -> tokenizers --------------------------------------------------------------------

def tokenizer_from_gguf(gf: GGUFFile | str | Path, cls=None):
    """Our ``Tokenizer`` (or ``cls``) for the vocabulary a GGUF file describes."""
    from surogate.io.tokenizer import Tokenizer

    gf = gf if isinstance(gf, GGUFFile) else GGUFFile(gf)
    backend, config, stop_ids = build_backend(gf)
    templates, origins = chat_templates(gf)
    return (cls or Tokenizer)(backend, config, chat_templates=templates, chat_template_origins=origins,
                              extra_eos_token_ids=stop_ids)


def build_backend(gf: GGUFFile) -> tuple[tokenizers.Tokenizer, dict, list[int]]:
    """(backend, tokenizer_config-style dict, ids generation stops on)."""
    kind = gf.get("tokenizer.ggml.model")
    tokens = _list_of(gf, "tokenizer.ggml.tokens", str)
    if kind is None or tokens is None:
        raise FileFormatError(f"{gf.path}: no tokenizer in the metadata (tokenizer.ggml.model / tokens)",
                              hint="pass token ids instead, or use a GGUF converted with its tokenizer")
    types = _list_of(gf, "tokenizer.ggml.token_type", int) or [NORMAL] * len(tokens)
    if len(types) != len(tokens):
        raise FileFormatError(f"{gf.path}: {len(tokens)} tokens but {len(types)} token types",
                              hint="the file is damaged")
    pre = gf.get("tokenizer.ggml.pre")
    if kind not in ("gpt2", "llama", "gemma4"):
        raise UnsupportedError(f"{gf.path}: GGUF tokenizer model {kind!r} is not supported",
                               hint="supported: gpt2 (byte-level BPE), llama (SentencePiece BPE), "
                                    "gemma4 (SentencePiece-style BPE with merges)")
    try:
        backend = (_byte_level_bpe(gf, tokens, types, pre) if kind == "gpt2" else
                   _gemma4_bpe(gf, tokens) if kind == "gemma4" else _sentencepiece_bpe(gf, tokens, types))
    except (FileFormatError, UnsupportedError):
        raise
    except Exception as e:  # the tokenizers library rejects the vocabulary or merges
        raise FileFormatError(f"{gf.path}: the tokenizer in the metadata cannot be built: {e}",
                              hint="the file is damaged") from None
    default_bos = pre in IGNORE_MERGES if kind == "gpt2" else True

    # Control tokens are special, user-defined ones are added as they are: both stay whole.
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t, ty in zip(tokens, types) if ty == CONTROL])
    backend.add_tokens([AddedToken(t, special=False, normalized=False)
                        for t, ty in zip(tokens, types) if ty == USER_DEFINED])

    config: dict = {"clean_up_tokenization_spaces": False}
    for name, key in _SPECIAL_IDS.items():
        token_id = gf.get(f"tokenizer.ggml.{key}")
        if token_id is not None:
            config[name] = tokens[_check_id(gf, key, token_id, len(tokens))]
    add_bos = bool(gf.get("tokenizer.ggml.add_bos_token", default_bos)) and "bos_token" in config
    add_eos = bool(gf.get("tokenizer.ggml.add_eos_token", False)) and "eos_token" in config
    backend.post_processor = _post_processor(backend, config, add_bos, add_eos)
    config["add_bos_token"], config["add_eos_token"] = add_bos, add_eos
    stop_ids = [_check_id(gf, k, gf.get(f"tokenizer.ggml.{k}"), len(tokens)) for k in _STOP_IDS
                if gf.get(f"tokenizer.ggml.{k}") is not None]
    stop_ids += [i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == CONTROL and t in _STOP_TEXTS]
    return backend, config, stop_ids


def chat_templates(gf: GGUFFile) -> tuple[dict[str, str], dict[str, str]]:
    """Named templates: ``tokenizer.chat_template`` is "default", ``tokenizer.chat_template.NAME`` the rest."""
    templates, origins = {}, {}
    for key in gf.metadata:
        if key == "tokenizer.chat_template" or key.startswith("tokenizer.chat_template."):
            name = "default" if key == "tokenizer.chat_template" else key.split(".", 2)[2]
            value = gf.get(key)
            if isinstance(value, str):
                templates[name], origins[name] = value, f"{gf.path} ({key})"
    return templates, origins


def _byte_level_bpe(gf: GGUFFile, tokens: list[str], types: list[int], pre: str | None) -> tokenizers.Tokenizer:
    alphabet = set(byte_alphabet().values())
    spell = byte_alphabet()
    vocab = {}
    for i, (t, ty) in enumerate(zip(tokens, types)):
        if ty in (NORMAL, UNUSED, BYTE) and not set(t) <= alphabet:
            # A plain token written as raw text: spell it in the byte alphabet BPE produces.
            t = "".join(spell[b] for b in t.encode("utf-8"))
        vocab[t] = i
    merges = [_split_merge(gf, m) for m in _list_of(gf, "tokenizer.ggml.merges", str) or []]
    backend = tokenizers.Tokenizer(models.BPE(vocab, merges, ignore_merges=pre in IGNORE_MERGES))
    splits = PRE_SPLITS.get(pre or "", (GPT2_SPLIT,))
    if splits[-1] == GPT2_SPLIT:  # the byte-level pre-tokenizer's own regex is GPT-2's
        steps = [pre_tokenizers.Split(Regex(s), behavior="isolated") for s in splits[:-1]]
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=True))
    else:
        steps = [pre_tokenizers.Split(Regex(s), behavior="isolated") for s in splits]
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False))
    backend.pre_tokenizer = steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)
    backend.decoder = decoders.ByteLevel()
    return backend


def _sentencepiece_bpe(gf: GGUFFile, tokens: list[str], types: list[int]) -> tokenizers.Tokenizer:
    scores = _list_of(gf, "tokenizer.ggml.scores", (int, float))
    if scores is None or len(scores) != len(tokens):
        raise FileFormatError(f"{gf.path}: a SentencePiece vocabulary needs one score per token "
                              "(tokenizer.ggml.scores)", hint="the file is damaged or incomplete")
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = _list_of(gf, "tokenizer.ggml.merges", str)
    merges = [_split_merge(gf, m) for m in merges] if merges else merges_from_scores(tokens, scores)
    unk_id = gf.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else None
    backend = tokenizers.Tokenizer(models.BPE(vocab, merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    prefix = bool(gf.get("tokenizer.ggml.add_space_prefix", True))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first" if prefix else "never",
                                                     split=False)
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    backend.decoder = decoders.Sequence(steps)
    return backend


GEMMA4_SPLIT = r"[^\n]+|[\n]+"  # llama.cpp's LLAMA_VOCAB_PRE_TYPE_GEMMA4 regex


def _gemma4_bpe(gf: GGUFFile, tokens: list[str]) -> tokenizers.Tokenizer:
    merges = _list_of(gf, "tokenizer.ggml.merges", str)
    if not merges:
        raise FileFormatError(f"{gf.path}: a gemma4 vocabulary needs its merges (tokenizer.ggml.merges)",
                              hint="the file is damaged or incomplete")
    vocab = {t: i for i, t in enumerate(tokens)}
    backend = tokenizers.Tokenizer(models.BPE(vocab, [_split_merge(gf, m) for m in merges], byte_fallback=True))
    backend.normalizer = normalizers.Replace(" ", "\u2581")  # llama_escape_whitespace: every space, none prepended
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(GEMMA4_SPLIT), behavior="isolated")
    backend.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    return backend


def merges_from_scores(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """SentencePiece BPE as merges: every split of a token into two tokens of the vocabulary is a
    merge ranked by the token's score (higher first; longer left part first on ties)."""
    ids = {t: i for i, t in enumerate(tokens)}
    found = []
    for token, score in zip(tokens, scores):
        pairs = [(token[:k], token[k:]) for k in range(1, len(token)) if token[:k] in ids and token[k:] in ids]
        pairs.sort(key=lambda p: (ids[p[0]], ids[p[1]]))
        found.extend((-score, -len(a), -len(b), a, b) for a, b in pairs)
    order = sorted(range(len(found)), key=lambda n: found[n][:3])
    return [(found[n][3], found[n][4]) for n in order]


def _list_of(gf: GGUFFile, key: str, kind) -> list | None:
    value = gf.get(key)
    if value is not None and (not isinstance(value, list) or not all(isinstance(v, kind) for v in value)):
        raise FileFormatError(f"{gf.path}: {key} is not an array of {getattr(kind, '__name__', 'numbers')}",
                              hint="the file is damaged")
    return value


def _split_merge(gf: GGUFFile, merge: str) -> tuple[str, str]:
    parts = merge.split(" ")
    if len(parts) != 2:
        raise FileFormatError(f"{gf.path}: tokenizer.ggml.merges holds {merge!r}, not two tokens and a space",
                              hint="the file is damaged")
    return parts[0], parts[1]


def _check_id(gf: GGUFFile, key: str, token_id, n: int) -> int:
    if not isinstance(token_id, int) or not 0 <= token_id < n:
        raise FileFormatError(f"{gf.path}: tokenizer.ggml.{key} is {token_id!r}, outside the {n} tokens",
                              hint="the file is damaged")
    return token_id


def _post_processor(backend: tokenizers.Tokenizer, config: dict, add_bos: bool, add_eos: bool):
    bos, eos = config.get("bos_token"), config.get("eos_token")
    single = " ".join([*([f"{bos}:0"] if add_bos else []), "$A:0", *([f"{eos}:0"] if add_eos else [])])
    pair = " ".join([single, *([f"{bos}:1"] if add_bos else []), "$B:1", *([f"{eos}:1"] if add_eos else [])])
    special = [(t, backend.token_to_id(t)) for t, on in ((bos, add_bos), (eos, add_eos)) if on]
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)


# ---- HF tokenizer folder <-> GGUF metadata -------------------------------------------------

def save_hf_tokenizer(gf: GGUFFile | str | Path, folder: str | Path) -> Path:
    """Write tokenizer.json and tokenizer_config.json for a GGUF's tokenizer, so an HF folder
    made from a GGUF model (``train.export.save_hf_folder``) carries its tokenizer."""
    gf = gf if isinstance(gf, GGUFFile) else GGUFFile(gf)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    backend, config, _ = build_backend(gf)
    backend.save(str(folder / "tokenizer.json"))
    templates, _ = chat_templates(gf)
    config = {**config, "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 30}
    if "default" in templates:
        config["chat_template"] = templates["default"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n",
                                                  encoding="utf-8")
    return folder


def pre_from_tokenizer_json(spec: dict, origin: str) -> str:
    """The ``tokenizer.ggml.pre`` name for a byte-level tokenizer.json's pre-tokenizer."""
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    splits = []
    for step in steps:
        kind = step.get("type")
        if kind == "Split":
            splits.append((step.get("pattern") or {}).get("Regex") or (step.get("pattern") or {}).get("String"))
        elif kind == "Digits":
            splits.append(DIGIT_SPLIT if step.get("individual_digits") else r"\p{N}+")
        elif kind == "ByteLevel":
            if step.get("use_regex", True):
                splits.append(GPT2_SPLIT)
        else:
            raise UnsupportedError(f"{origin}: pre-tokenizer step {kind} has no llama.cpp equivalent",
                                   hint="only byte-level BPE tokenizers (Llama 3, Qwen, SmolLM, GPT-2) are written")
    for name in ("llama-bpe", "qwen2", "smollm", "gpt2"):
        if tuple(splits) == PRE_SPLITS[name]:
            return name
    raise UnsupportedError(f"{origin}: a pre-tokenizer llama.cpp does not know ({splits})",
                           hint="known: " + ", ".join(sorted(PRE_SPLITS)))


# Added tokens llama.cpp's Gemma 4 converter writes USER_DEFINED (shown in the output, not hidden
# as control tokens), for the chat parsers.
GEMMA4_VISIBLE = frozenset({"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>",
                            "<tool_response|>", '<|"|>'})


def _is_byte_token(text: str) -> bool:
    return len(text) == 6 and text.startswith("<0x") and text.endswith(">") and all(
        c in "0123456789abcdefABCDEF" for c in text[3:5])


def _escapes_spaces(spec: dict) -> bool:
    """A byte-fallback BPE whose normalizer turns every space into \u2581 and prepends nothing,
    decoded back by a Replace (Gemma's tokenizer.json): what llama.cpp's Gemma 4 converter writes
    as a gemma4 vocabulary (it splits only at newlines, whatever the pre-tokenizer says)."""
    model, norm, dec = spec.get("model") or {}, spec.get("normalizer") or {}, spec.get("decoder") or {}
    steps = norm.get("normalizers", []) if norm.get("type") == "Sequence" else [norm]
    escapes = len(steps) == 1 and steps[0].get("type") == "Replace" and (
        steps[0].get("pattern") or {}).get("String") == " " and steps[0].get("content") == "\u2581"
    parts = dec.get("decoders", []) if dec.get("type") == "Sequence" else [dec]
    unescapes = any(d.get("type") == "Replace" and d.get("content") == " " for d in parts) and not any(
        d.get("type") == "Strip" for d in parts)
    return model.get("type") == "BPE" and bool(model.get("byte_fallback")) and escapes and unescapes


def gguf_tokenizer_metadata(tokenizer_json: str | Path, tokenizer, vocab_size: int) -> dict:
    """``tokenizer.ggml.*`` keys (and chat templates) for a byte-level BPE tokenizer.json, with
    our ``Tokenizer`` for the special tokens; ids up to ``vocab_size`` (the model's embedding
    rows) without a token become ``[PADn]`` (unused), as llama.cpp's converter writes them."""
    path = Path(tokenizer_json)
    spec = json.loads(path.read_text(encoding="utf-8"))
    model = spec.get("model") or {}
    decoder = spec.get("decoder") or {}
    gemma4 = _escapes_spaces(spec)
    byte_level = model.get("type") == "BPE" and not model.get("byte_fallback") and decoder.get("type") == "ByteLevel"
    if not (gemma4 or byte_level):
        raise UnsupportedError(f"{path}: only byte-level BPE tokenizers and Gemma's space-escaping byte-fallback BPE "
                               "are written to GGUF so far",
                               hint="SentencePiece-style vocabularies with a space prefix (Llama 2, Mistral) are not "
                                    "supported yet")
    added = {t["id"]: t for t in spec.get("added_tokens") or []}
    by_id = {i: t for t, i in (model.get("vocab") or {}).items()}
    by_id.update({i: t["content"] for i, t in added.items()})
    if by_id and max(by_id) >= vocab_size:
        raise UnsupportedError(f"{path}: the tokenizer has token ids up to {max(by_id)}, the model's embedding "
                               f"only {vocab_size} rows", hint="llama.cpp needs one token per embedding row")
    # Named special tokens are special whatever their flags (transformers and our Tokenizer agree).
    named = {t for t in (tokenizer.bos_token, tokenizer.eos_token, tokenizer.unk_token, tokenizer.pad_token) if t}
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
        elif gemma4 and i not in added and _is_byte_token(by_id[i]):
            tokens.append(by_id[i])
            types.append(BYTE)
        elif gemma4 and by_id[i] in GEMMA4_VISIBLE:
            tokens.append(by_id[i])  # the converter keeps these plain, so that the chat parser sees them
            types.append(USER_DEFINED)
        elif i in added or by_id[i] in named:
            tokens.append(by_id[i])
            types.append(CONTROL if by_id[i] in named or added[i].get("special") else USER_DEFINED)
        else:
            tokens.append(by_id[i])
            types.append(NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    if gemma4:  # as convert_hf_to_gguf.py's Gemma4Model.set_vocab writes it
        meta: dict = {"tokenizer.ggml.model": "gemma4", "tokenizer.ggml.tokens": tokens,
                      "tokenizer.ggml.scores": [-1000.0] * len(tokens), "tokenizer.ggml.token_type": types,
                      "tokenizer.ggml.merges": merges, "tokenizer.ggml.add_space_prefix": False,
                      "tokenizer.ggml.add_bos_token": True,
                      "tokenizer.ggml.add_eos_token": bool(tokenizer.add_eos_token)}
    else:
        meta = {
            "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.pre": pre_from_tokenizer_json(spec, str(path)),
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.add_bos_token": bool(tokenizer.add_bos_token),
            "tokenizer.ggml.add_eos_token": bool(tokenizer.add_eos_token),
        }
    for name, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("unk", "unknown_token_id"),
                      ("pad", "padding_token_id")):
        token_id = getattr(tokenizer, f"{name}_token_id", None) if name != "unk" else tokenizer.token_to_id(
            tokenizer.unk_token)
        if token_id is not None and token_id < vocab_size:
            meta[f"tokenizer.ggml.{key}"] = int(token_id)
    for name, text in tokenizer.chat_templates.items():
        meta["tokenizer.chat_template" if name == "default" else f"tokenizer.chat_template.{name}"] = text
    return meta
