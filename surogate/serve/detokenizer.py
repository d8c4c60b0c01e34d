"""Incremental detokenization: token ids in, text deltas out, never a broken character.

A token can end in the middle of a UTF-8 character (byte-level BPE splits emoji and CJK into
several tokens), and for some tokenizers a token's text depends on its neighbours (SentencePiece
spaces, merges that only decode right in context). Decoding each token alone would emit U+FFFD
halves and wrong spaces. The fix used by TGI and vLLM: decode a small window twice, from
``prefix_offset`` up to ``read_offset`` (text already emitted) and up to the end; emit the
difference only when it grew and does not end in U+FFFD, then slide the window.

``flush()`` gives whatever is still owed so that all deltas together equal
``tokenizer.decode(all_ids)`` exactly.

``keep`` names special tokens that stay in the text although the others are skipped: the tags an
output parser reads (Gemma 4's, LFM2's and DeepSeek's call tokens, Mistral's ``[TOOL_CALLS]``),
as vLLM's tool parsers keep them. The other special tokens are dropped from the ids before
decoding, so the text is the context decode of the rest, not pieces glued together.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from surogate.io import Tokenizer

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True, keep: Collection[int] = ()):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        # skipping but keeping some: the special ids to drop by hand, decoding the rest with all specials
        self._drop = tokenizer.special_ids - frozenset(keep) if skip_special_tokens and keep else None
        self.token_ids: list[int] = []
        self.text = ""  # everything emitted so far
        self._prefix_offset = 0
        self._read_offset = 0

    def push(self, token_ids: Sequence[int]) -> str:
        """Append tokens; returns the new text that is certain now (may be empty)."""
        self.token_ids.extend(token_ids)
        ids = self.token_ids
        prefix = self._decode(ids[self._prefix_offset:self._read_offset])
        full = self._decode(ids[self._prefix_offset:])
        if len(full) > len(prefix) and not full.endswith(_REPLACEMENT) and full.startswith(prefix):
            delta = full[len(prefix):]
            self._prefix_offset = self._read_offset
            self._read_offset = len(ids)
            self.text += delta
            return delta
        return ""

    def flush(self) -> str:
        """The rest of the text, once no more tokens will come (a trailing U+FFFD is real then)."""
        full = self._decode(self.token_ids)
        if not full.startswith(self.text):  # cannot happen for prefix-stable decoders; never emit twice
            return ""
        delta = full[len(self.text):]
        self.text = full
        self._prefix_offset = self._read_offset = len(self.token_ids)
        return delta

    def _decode(self, ids: Sequence[int]) -> str:
        if self._drop is not None:
            ids = [i for i in ids if i not in self._drop]
            return self.tokenizer.decode(ids, skip_special_tokens=False) if ids else ""
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens) if ids else ""
