"""What a vision model's prompt holds for each image, and where its adapters and merged weights go.

A chat template writes one placeholder per ``{"type": "image"}`` part (Gemma 3: ``<start_of_image>``);
the model's processor then replaces each placeholder with the image's full token sequence. For
Gemma 3 that is transformers' ``Gemma3Processor.full_image_sequence``:
``"\\n\\n" + boi + image_token * mm_tokens_per_image + eoi + "\\n\\n"`` (and, for an image with
pan-and-scan crops, "Here is the original image {seq} and here are some crops to help you see
better " + the crops' sequences joined by spaces: ``replace_image_token``). The expansion is done
on the text, before tokenizing, as transformers does, so the ids are the processor's.

Training (`train/data`) and serving (`serve`) both take the expansion from here: `image_prompt`.
The strings come from the tokenizer, by the ids config.json names (boi_token_index,
image_token_index, eoi_token_index), so a tokenizer without those tokens is an error here rather
than wrong ids later.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from surogate.errors import ConfigError
from surogate.models.peft import LANGUAGE_MODEL_PREFIX

# peft on transformers' Gemma3ForConditionalGeneration: the language model's modules are
# model.language_model.layers.*; the SigLIP tower has q_proj / k_proj / v_proj too, which a
# target_modules list would also wrap (exclude_modules keeps the adapter to the language model).
GEMMA3_PEFT_PREFIX = LANGUAGE_MODEL_PREFIX
GEMMA3_PEFT_EXCLUDE = r".*(vision_tower|multi_modal_projector).*"


def vision_adapter_names() -> dict:
    """`save_peft_adapter`'s keywords for a Gemma 3 with images (peft's names on transformers')."""
    return {"module_prefix": GEMMA3_PEFT_PREFIX, "exclude_modules": GEMMA3_PEFT_EXCLUDE}


@dataclass(frozen=True)
class ImagePrompt:
    """One model's image placeholders: ``placeholder`` is what the template writes per image part,
    ``image_token_id`` the id of the tokens whose rows the images' features replace."""

    placeholder: str
    boi: str
    eoi: str
    image_token: str
    image_token_id: int
    tokens_per_image: int

    @property
    def full_image_sequence(self) -> str:
        return f"\n\n{self.boi}{self.image_token * self.tokens_per_image}{self.eoi}\n\n"

    def replacement(self, num_crops: int = 0) -> str:
        """The text one placeholder becomes (Gemma3Processor.replace_image_token)."""
        seq = self.full_image_sequence
        if not num_crops:
            return seq
        return (f"Here is the original image {seq} and here are some crops to help you see better "
                + " ".join([seq] * num_crops))

    def expand(self, text: str, num_crops: Sequence[int] | None = None) -> tuple[str, list[tuple[int, int, int]]]:
        """``text`` with each placeholder replaced, in order, and the edits as (position in ``text``,
        old length, new length), so character spans of ``text`` can be moved (`move_spans`)."""
        parts, edits, last = [], [], 0
        for n, m in enumerate(re.finditer(re.escape(self.placeholder), text)):
            new = self.replacement(num_crops[n] if num_crops else 0)
            parts += [text[last:m.start()], new]
            edits.append((m.start(), m.end() - m.start(), len(new)))
            last = m.end()
        parts.append(text[last:])
        return "".join(parts), edits


def move_spans(spans: list[tuple[int, int]], edits: list[tuple[int, int, int]]) -> list[tuple[int, int]]:
    """Character spans of a text moved to where they lie after `ImagePrompt.expand`'s edits (an
    edit inside a span grows the span; a span boundary is never inside a placeholder)."""
    def moved(x: int) -> int:
        return x + sum(new - old for at, old, new in edits if at < x)
    return [(moved(a), moved(b)) for a, b in spans]


def image_prompt(spec, tokenizer, source: str = "config.json") -> ImagePrompt | None:
    """The model's image placeholders (None for a model that takes no images)."""
    v = getattr(spec, "vision", None)
    if v is None:
        return None
    from surogate.dsl.nn_vision import VisionSpec  # Gemma 3's tower

    if not isinstance(v, VisionSpec):
        raise ConfigError(f"{spec.family}: no image prompt for this vision model yet",
                          hint="images in chat rows are supported for Gemma 3")
    names = {}
    for key, idx in (("boi_token_index", v.boi_token_index), ("eoi_token_index", v.eoi_token_index),
                     ("image_token_index", v.image_token_index)):
        token = tokenizer.id_to_token(idx) if idx is not None else None
        if token is None:
            raise ConfigError(f"{source}: {key} {idx} is not a token of the model's tokenizer",
                              hint="use the tokenizer that came with the checkpoint (it has <start_of_image>, "
                                   "<image_soft_token> and <end_of_image>)")
        names[key] = token
    return ImagePrompt(placeholder=names["boi_token_index"], boi=names["boi_token_index"],
                       eoi=names["eoi_token_index"], image_token=names["image_token_index"],
                       image_token_id=v.image_token_index, tokens_per_image=v.mm_tokens_per_image)
