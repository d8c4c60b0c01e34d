"""Images in chat messages, in the form HF chat templates take them.

A message with images has a content list: ``{"type": "text", "text": ...}`` and ``{"type":
"image"}`` parts in the order the client sent them; the decoded images (``PIL.Image.Image``, RGB,
from ``surogate.io.images``) travel beside the messages as one list, in the order their parts
appear in the conversation (message by message, part by part), which is the order a template
writes their placeholders. The template writes one placeholder per part (Gemma 3:
``<start_of_image>``; Qwen-VL: ``<|vision_start|><|image_pad|><|vision_end|>``); the model's
``image_placeholder`` names it, and the rendered prompt must hold exactly one per image: a template
that ignores image parts (a text-only one) would otherwise drop them without a word.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from surogate.errors import InvalidArgumentError

def count_image_parts(messages: Sequence[Mapping]) -> int:
    """How many ``{"type": "image"}`` parts the messages' content lists hold."""
    n = 0
    for m in messages:
        content = m.get("content")
        if isinstance(content, (list, tuple)):
            n += sum(1 for part in content if isinstance(part, Mapping) and part.get("type") == "image")
    return n


def check_rendered_images(text: str, num_parts: int, num_images: int, image_placeholder: str | None, *,
                          param: str = "messages") -> None:
    """The rendered prompt ``text`` holds one ``image_placeholder`` per image part (raises a
    ``RequestError`` naming ``param`` when it does not, or when the model takes no images)."""
    from surogate.serve.frontend import RequestError  # frontend imports this module

    if num_parts != num_images:
        raise InvalidArgumentError(f"the messages hold {num_parts} image parts but {num_images} images came with them",
                                   hint="pass one decoded image per {\"type\": \"image\"} part, in order")
    if image_placeholder is None:
        if num_parts == 0:
            return
        raise RequestError(f"the messages hold {num_parts} image(s), and this model does not take images "
                           "(it has no vision encoder)", param=param, hint="send text only, or serve a vision model")
    written = text.count(image_placeholder)
    if written < num_parts:
        raise RequestError(f"the chat template wrote {written} image placeholder(s) ({image_placeholder!r}) for "
                           f"{num_parts} image(s): it drops image parts", param=param,
                           hint="use the model's own chat template, which renders each {\"type\": \"image\"} part")
    if written > num_parts:
        raise RequestError(f"the prompt holds {written} image placeholders ({image_placeholder!r}) for {num_parts} "
                           "image(s): the text itself contains the placeholder", param=param,
                           hint=f"remove {image_placeholder!r} from the messages' text")
