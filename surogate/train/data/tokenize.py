"""Samples -> token ids and a per-token loss mask (the token is a label the model learns to predict).

Conversations go through the model's chat template (the same rendering as
``Tokenizer.apply_chat_template``) and are tokenized with character offsets; the mask is built
in characters first and then mapped to the tokens that overlap those characters.

Which tokens count, per ``train_on``:
- all: every token of the rendered conversation (and every token of a Document).
- assistant: what each assistant message contributes (its content, its reasoning and its tool
  calls, as the template writes them) plus the end-of-turn token that closes the message
  (an eos id of the tokenizer, e.g. ``<|im_end|>`` or ``<|eot_id|>``, and any whitespace
  before it). Template chrome is not trained on: role headers, the ``\\n`` after ``<|im_end|>``,
  and an empty ``<think></think>`` block the template inserts on its own. This is what TRL's
  ``assistant_only_loss`` and axolotl's ``roles_to_train: [assistant]`` with
  ``train_on_eos: turn`` train on.
- last_turn: the same, for the final assistant message only.

How the assistant characters are found:
1. Templates with ``{% generation %}`` blocks say it themselves (``render_with_generation_spans``).
2. Otherwise the conversation is rendered a second time with every assistant message replaced
   by a numbered placeholder; when the real text is the probe's text with each placeholder
   swapped for some string, those strings are the messages. When it is not (the template
   renders a turn differently for the placeholder, e.g. Qwen3 with reasoning in the last turn),
   each message gets a probe of its own and its span is where the two renderings differ.
   Both work for templates that are not prefix-stable (rendering ``messages[:i+1]`` is not a
   prefix of rendering all messages): Qwen3's template, for one, gives the last assistant turn
   an empty ``<think>`` block that earlier turns lack, so comparing prefix renderings would
   misplace every turn but the last. The spans are checked (the placeholder lies inside the
   changed span, spans come in message order without overlap); a template that fails the check
   is an error that suggests a template with ``{% generation %}`` blocks. Text the template
   writes for the placeholder too is chrome: Qwen3's ``<think>\n`` before the reasoning is not
   trained on, the reasoning is.
A Document is the text with the tokenizer's own special tokens (Llama's BOS) plus an eos token.

Images (a model with a vision tower: ``image_prompt``, its family's ``Family.image_prompt``): the
template writes one placeholder per image part; the rendered text must hold exactly one per image
of the row (a template that drops image parts, or text that contains the placeholder itself, is an
error). Each placeholder is then replaced by the image's text as the model's processor writes it
(``ImagePrompt.image_text``: Gemma 3's full_image_sequence), the spans moved with it, and the text
tokenized; the image tokens are never targets, whatever train_on says. An image with pan-and-scan
crops (``Conversation.image_crops``) becomes its own view's tokens and each crop's, as the
processor writes them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from surogate.errors import InvalidArgumentError
from surogate.io import ChatTemplate, Tokenizer
from surogate.models.family import ImagePrompt
from surogate.train.data.formats import Conversation, Document, RowError, Sample

TRAIN_ON = ("assistant", "last_turn", "all")
_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
# Placeholders for assistant messages, between private-use characters: no real message starts
# or ends with them, so the rendered texts differ exactly where the message was.
_SENTINEL_OPEN, _SENTINEL_CLOSE = "\ue000surogate", "\ue001"
_SENTINEL_SPLIT = re.compile("\ue000surogate(\\d+)\ue001")


class Encoded:
    """One tokenized sample: ``input_ids`` int32 [T] and ``loss_mask`` bool [T]; ``images``: the
    sources of its images, in the order of their token spans; ``views``: each one's views (1 + its
    pan-and-scan crops), each a run of the image token."""

    __slots__ = ("input_ids", "loss_mask", "images", "views")

    def __init__(self, input_ids: np.ndarray, loss_mask: np.ndarray, images: tuple = (), views: tuple = ()):
        self.input_ids = input_ids
        self.loss_mask = loss_mask
        self.images = images
        self.views = views

    def __len__(self) -> int:
        return len(self.input_ids)


class ChatEncoder:
    """Encodes samples for one tokenizer and chat template (``chat_template``: a template name of
    the model or a whole template; None takes the model's default)."""

    def __init__(self, tokenizer: Tokenizer, chat_template: str | None = None,
                 image_prompt: ImagePrompt | None = None, images_refused: tuple[str, str] | None = None):
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.image_prompt = image_prompt  # None: the model takes no images
        # Without image_prompt: (why, hint) an image row is refused; None: the model has no vision tower.
        self.images_refused = images_refused
        self._variables = dict(tokenizer.special_tokens_map)
        self._eot_ids = frozenset(tokenizer.eos_token_ids)
        self._eos_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else \
            next(iter(tokenizer.eos_token_ids), None)
        self._templates: dict[bool, ChatTemplate] = {}

    def encode(self, sample: Sample, train_on: str = "assistant") -> Encoded:
        return self.encode_batch([sample], train_on)[0]

    def encode_batch(self, samples: Sequence[Sample], train_on: str = "assistant") -> list[Encoded | RowError]:
        """Each sample encoded, or the ``RowError`` that says why it could not be (the caller decides)."""
        if train_on not in TRAIN_ON:
            raise InvalidArgumentError(f"train_on must be one of {TRAIN_ON}, got {train_on!r}")
        out: list[Encoded | RowError | None] = [None] * len(samples)
        chats: list[tuple[int, str, list[tuple[int, int]]]] = []
        docs: list[tuple[int, str]] = []
        for i, sample in enumerate(samples):
            if isinstance(sample, Document):
                docs.append((i, sample.text))
                continue
            try:
                text, spans = self._render(sample, train_on)
                if sample.images:
                    text, spans = self._expand_images(text, spans, len(sample.images), _crops(sample))
            except RowError as e:
                out[i] = e
                continue
            chats.append((i, text, spans))
        backend = self.tokenizer.backend  # offsets come from the backend
        if chats:
            encodings = backend.encode_batch([text for _, text, _ in chats], add_special_tokens=False)
            for (i, text, spans), enc in zip(chats, encodings):
                out[i] = self._masked(text, spans, enc)
                if samples[i].images:
                    try:
                        out[i] = self._image_targets_off(out[i], samples[i].images, _crops(samples[i]))
                    except RowError as e:
                        out[i] = e
        if docs:
            encodings = backend.encode_batch([text for _, text in docs], add_special_tokens=True)
            for (i, _), enc in zip(docs, encodings):
                ids = enc.ids
                if self._eos_id is not None and not (self.tokenizer.add_eos_token and ids[-1:] == [self._eos_id]):
                    ids = [*ids, self._eos_id]
                out[i] = Encoded(np.asarray(ids, np.int32), np.ones(len(ids), bool))
        return out

    # -- images --

    def _expand_images(self, text: str, spans: list[tuple[int, int]], n: int,
                       crops: tuple) -> tuple[str, list[tuple[int, int]]]:
        p = self.image_prompt
        if p is None:
            why, hint = self.images_refused or (
                "this model takes no images (it has no vision tower)",
                "train a model with a vision tower (Gemma3ForConditionalGeneration, Qwen3VLForConditionalGeneration), "
                "or remove the row's images")
            raise RowError(f"the row has {n} image(s), and {why}", hint=hint)
        written = text.count(p.placeholder)
        if written != n:
            why = ("the chat template drops image parts" if written < n else
                   f"the text itself contains the image placeholder {p.placeholder!r}")
            raise RowError(f"the rendered conversation holds {written} image placeholder(s) ({p.placeholder!r}) for "
                           f"{n} image(s): {why}",
                           hint="use the model's own chat template, which renders each {\"type\": \"image\"} part"
                           if written < n else f"remove {p.placeholder!r} from the messages' text")
        return _expand_images(text, spans, p.placeholder, [p.image_text(c) for c in crops])

    def _image_targets_off(self, enc: Encoded, images: tuple, crops: tuple) -> Encoded:
        p = self.image_prompt
        is_image = enc.input_ids == p.image_token_id
        # A family with size-dependent image tokens: ``crops`` are each image's token count (one view each).
        views = tuple(crops) if p.image_tokens is not None else tuple(1 + c for c in crops)
        per = 1 if p.image_tokens is not None else p.tokens_per_view
        want = sum(views) * per
        if int(is_image.sum()) != want:
            raise RowError(f"the tokenized row has {int(is_image.sum())} image tokens (id {p.image_token_id}) for "
                           f"{sum(views)} view(s) of {per}",
                           hint="the tokenizer must keep the image token whole (an added special token)")
        return Encoded(enc.input_ids, enc.loss_mask & ~is_image, tuple(images), views)

    # -- rendering --

    def _template(self, tools) -> ChatTemplate:
        key = tools is not None
        if key not in self._templates:
            try:
                self._templates[key] = self.tokenizer.get_chat_template(self.chat_template, tools)
            except InvalidArgumentError as e:
                raise InvalidArgumentError(e.message, hint="set chat_template: in the config to a Jinja template "
                                           "(base models often have none)") from None
        return self._templates[key]

    def _render(self, chat: Conversation, train_on: str) -> tuple[str, list[tuple[int, int]]]:
        """The text and the [start, end) character spans to train on."""
        template = self._template(chat.tools)

        def render(messages, spans=False):
            try:
                result = template.render_with_generation_spans(messages, tools=chat.tools, **self._variables)
            except InvalidArgumentError as e:
                raise RowError(e.message, hint=e.hint) from None
            return result if spans else result[0]

        messages = chat.messages
        if train_on == "all":
            text = render(messages)
            return text, [(0, len(text))]
        assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if train_on == "last_turn":
            assistant = assistant[-1:]
        if _GENERATION_TAG.search(template.source):
            text, spans = render(messages, spans=True)
            return text, (spans[-1:] if train_on == "last_turn" else spans)
        text = render(messages)
        if not assistant:
            return text, []
        spans = _aligned_spans(text, render(_probe(messages, assistant)), len(assistant))
        if spans is None:  # the turns rendered differently with placeholders: one probe per message
            spans = self._spans_one_by_one(text, messages, assistant, render, template.origin)
        return text, spans

    @staticmethod
    def _spans_one_by_one(text, messages, assistant, render, origin) -> list[tuple[int, int]]:
        spans: list[tuple[int, int]] = []
        for i in assistant:
            other = render(_probe(messages, [i]))
            sentinel = _sentinel(0)
            at = other.find(sentinel)
            if at < 0:
                continue  # the template does not show this message (some drop old turns)
            start = _common_prefix(text, other)
            tail = _common_suffix(text[start:], other[start:])
            end = len(text) - tail
            if not (start <= at and at + len(sentinel) <= len(other) - tail) or (spans and start < spans[-1][1]):
                raise RowError(f"{origin}: cannot locate assistant message {i} in the rendered text: "
                               "the template rewrites other parts of the conversation around it",
                               hint="set chat_template: to a template that marks assistant text with "
                                    "{% generation %} ... {% endgeneration %}, or use train_on: all")
            spans.append((start, end))
        return spans

    def _masked(self, text: str, spans: list[tuple[int, int]], enc) -> Encoded:
        ids = np.asarray(enc.ids, np.int32)
        offsets = np.asarray(enc.offsets, np.int64).reshape(-1, 2)
        starts, ends = offsets[:, 0], offsets[:, 1]
        mask = np.zeros(len(ids), bool)
        for a, b in spans:
            if b > a:
                mask |= (starts < b) & (ends > a)
            # The end-of-turn token closing the message, after optional whitespace.
            j = int(np.searchsorted(starts, b, side="left"))
            k = j
            while k < len(ids) and int(ids[k]) not in self._eot_ids and not text[starts[k]:ends[k]].strip():
                k += 1
            if k < len(ids) and int(ids[k]) in self._eot_ids:
                mask[j:k + 1] = True
        return Encoded(ids, mask)


def _crops(sample: Conversation) -> tuple:
    return sample.image_crops or (0,) * len(sample.images)


def _expand_images(text: str, spans: list[tuple[int, int]], placeholder: str,
                   replacements: list[str]) -> tuple[str, list[tuple[int, int]]]:
    """``text`` with its i-th placeholder replaced by ``replacements[i]``, and the character spans
    moved to match (a span boundary is never inside a placeholder: the template writes it whole)."""
    pieces = text.split(placeholder)
    assert len(pieces) == len(replacements) + 1
    edits, pos, out = [], 0, [pieces[0]]
    for piece, new in zip(pieces, replacements):
        pos += len(piece)
        edits.append((pos, len(new) - len(placeholder)))
        pos += len(placeholder)
    for new, piece in zip(replacements, pieces[1:]):
        out += [new, piece]

    def moved(x: int) -> int:
        return x + sum(grow for at, grow in edits if at < x)
    return "".join(out), [(moved(a), moved(b)) for a, b in spans]


def _sentinel(n: int) -> str:
    return f"{_SENTINEL_OPEN}{n}{_SENTINEL_CLOSE}"


def _probe(messages: list[dict], indices: list[int]) -> list[dict]:
    """The conversation with the messages at ``indices`` replaced by numbered placeholders."""
    probe = list(messages)
    for n, i in enumerate(indices):
        probe[i] = {"role": "assistant", "content": _sentinel(n)}
    return probe


def _aligned_spans(text: str, probe_text: str, count: int) -> list[tuple[int, int]] | None:
    """Spans of the placeholders' counterparts in ``text``, when ``text`` is exactly the probe's
    text with each placeholder replaced by some string (the template wrote everything else the
    same way); else None."""
    chunks = _SENTINEL_SPLIT.split(probe_text)
    numbers = chunks[1::2]
    if numbers != [str(n) for n in range(count)]:
        return None
    chunks = chunks[::2]
    if not text.startswith(chunks[0]):
        return None
    spans, pos = [], len(chunks[0])
    for n, chunk in enumerate(chunks[1:], 1):
        if n < count and not chunk:
            return None  # two placeholders side by side: nothing tells their texts apart
        end = len(text) - len(chunk) if n == count else text.find(chunk, pos)
        if end < pos or (n == count and not text.endswith(chunk)):
            return None
        spans.append((pos, end))
        pos = end + len(chunk)
    return spans


def _common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix (binary search over slice compares: C speed)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _common_suffix(a: str, b: str) -> int:
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[len(a) - mid:] == b[len(b) - mid:]:
            lo = mid
        else:
            hi = mid - 1
    return lo
