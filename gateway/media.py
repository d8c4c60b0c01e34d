"""Image inputs of the three APIs, from the wire to the images a prompt carries.

Each API's converter writes an image part where the client put it, as the part HF processors
take, ``{"type": "image", "image": ImageInput}``: the source (a URL, or Anthropic's base64 with its
media type) and where it was in the request, in that API's spelling (``messages[0].content[1]``,
``input[2].content[0]``, ``messages.0.content.1``). ``load_images`` then takes the sources out in
the conversation's order (the parts become ``{"type": "image"}``, surogate.serve.multimodal's
form), refuses them when the model takes no images or when there are more than the server allows
(``--limit-mm-per-prompt``), and decodes them under the server's media rules
(``--allowed-local-media-path``, ``--allow-remote-media``; surogate.io.images). Every refusal is a
400 naming the part.

Videos (OpenAI chat ``video_url`` parts, vLLM's extension) travel the same way as
``{"type": "video", "video": ImageInput}`` parts: ``load_media`` takes them out too (the parts become
``{"type": "video"}``), refuses them for a model that reads no videos (``--limit-mm-per-prompt``'s
``video`` count caps them), and decodes each into the frames the model's video processor samples
(surogate.io.videos: animated GIF / WebP / PNG, vLLM's ``data:video/jpeg`` frame list, or an MP4 /
WebM / AVI ... through PyAV when the ``video`` extra is installed; without it such a file is a 400
that says so and names the other forms).

Decoding (and fetching) runs outside the event loop: a request with images is converted in a
worker thread (``converted``), so one large JPEG or a slow remote host stalls no other stream.
Encoding the images (the model's vision tower, surogate.serve.LLM.embed) runs in a worker thread
too, once the request is admitted (``embedded``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TypeVar

import msgspec

from surogate.errors import SurogateError
from surogate.io.images import b64decode, decode_image, load_image
from surogate.io.videos import load_video
from surogate.serve.frontend import RequestError

from . import errors
from .errors import ApiError
from .models import GatewayConfig, ServedModel

T = TypeVar("T")


class ImageInput(msgspec.Struct, frozen=True):
    """One image a request names: ``url`` (data:, file://, http(s)://) or ``base64`` data."""

    param: str
    url: str | None = None
    base64: str | None = None
    media_type: str | None = None


def image_part(source: ImageInput) -> dict:
    return {"type": "image", "image": source}


def video_part(source: ImageInput) -> dict:
    return {"type": "video", "video": source}


def take_images(messages: Sequence[dict], kind: str = "image") -> list[ImageInput]:
    """The image (``kind`` video: video) parts' sources in the conversation's order; each part
    becomes ``{"type": kind}``."""
    found = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and part.get("type") == kind and kind in part:
                    found.append(part.pop(kind))
    return found


def check_count(sources: list[ImageInput], limit: int, kind: str) -> None:
    """A RequestError naming the first part past ``limit`` parts of ``kind`` (image / video)."""
    if len(sources) > limit:
        raise RequestError(f"The request holds {len(sources)} {kind}s; this server takes at most {limit} per prompt.",
                           param=sources[limit].param,
                           hint=f'send fewer {kind}s, or start the server with --limit-mm-per-prompt \'{{"{kind}": N}}\'')


def load_media(model: ServedModel, messages: Sequence[dict], config: GatewayConfig) -> tuple[list, list]:
    """(``load_images``, the decoded videos in order), or a RequestError naming the first part the
    server cannot take."""
    images = load_images(model, messages, config)
    sources = take_images(messages, "video")
    if not sources:
        return images, []
    llm = model.llm
    if not llm.accepts_videos:
        what = "reads images but no videos" if llm.accepts_images else "takes no images or videos"
        raise RequestError(f"`{sources[0].param}` is a video, and the model `{model.name}` {what}.",
                           param=sources[0].param,
                           hint="send text (or images) only, or serve a model that reads videos (Qwen3-VL)")
    check_count(sources, config.max_videos_per_prompt, "video")
    video = llm.images.prompt.video
    videos = []
    for s in sources:
        try:
            v = load_video(s.url or "", video.sample, video.fps,
                           allowed_local_media_path=config.allowed_local_media_path,
                           allow_remote=config.allow_remote_media)
            video.text_of(v)  # the processor's checks (frames, sizes) here, naming the part
            videos.append(v)
        except SurogateError as e:
            raise RequestError(f"`{s.param}`: {e.message}", param=s.param, hint=e.hint) from None
    return images, videos


def load_images(model: ServedModel, messages: Sequence[dict], config: GatewayConfig) -> list:
    """The decoded images of ``messages`` (taken out of their parts), in order, or a RequestError
    naming the first part the server cannot take."""
    sources = take_images(messages)
    if not sources:
        return []
    if not model.llm.accepts_images:
        raise RequestError(f"`{sources[0].param}` is an image, and the model `{model.name}` does not take images "
                           "(it has no vision encoder).", param=sources[0].param,
                           hint="send text only, or serve a vision model")
    check_count(sources, config.max_images_per_prompt, "image")
    return [decode(s, config) for s in sources]


def decode(source: ImageInput, config: GatewayConfig):
    try:
        if source.base64 is not None:
            return decode_image(b64decode(source.base64), media_type=source.media_type)
        return load_image(source.url or "", allowed_local_media_path=config.allowed_local_media_path,
                          allow_remote=config.allow_remote_media)
    except SurogateError as e:
        raise RequestError(f"`{source.param}`: {e.message}", param=source.param, hint=e.hint) from None


async def converted(convert: Callable[..., T], *args, images: bool) -> T:
    """``convert(*args)``: in a worker thread when the request has images (they are decoded there)."""
    return await asyncio.to_thread(convert, *args) if images else convert(*args)


async def embedded(job) -> ApiError | None:
    """The images (and videos) of ``job``'s prompt encoded into its EmbedSpans, in a worker thread
    (an error value when the encoder refuses them); nothing to do for a prompt without them."""
    if not job.prompt.images and not job.prompt.videos:
        return None
    try:
        job.prompt = await asyncio.to_thread(job.model.llm.embed, job.prompt, job.adapter)
    except SurogateError as e:  # put to sleep since admitted: the engine refuses to encode (weights_held)
        return errors.model_asleep(job.model.name) if job.model.asleep else errors.from_exception(e)
    return None
