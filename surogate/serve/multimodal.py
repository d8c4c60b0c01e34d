"""Images in chat messages, in the form HF chat templates take them.

A message with images has a content list: ``{"type": "text", "text": ...}`` and ``{"type":
"image"}`` parts in the order the client sent them; the decoded images (``PIL.Image.Image``, RGB,
from ``surogate.io.images``) travel beside the messages as one list, in the order their parts
appear in the conversation (message by message, part by part), which is the order a template
writes their placeholders. The template writes one placeholder per part (Gemma 3:
``<start_of_image>``; Qwen-VL: ``<|vision_start|><|image_pad|><|vision_end|>``); the model's
``image_placeholder`` names it, and the rendered prompt must hold exactly one per image: a template
that ignores image parts (a text-only one) would otherwise drop them without a word.

``ImageEncoder`` is a served model's image path (its family's ``ImagePrompt``, its encoder): the
rendered text's placeholders expanded as the HF processor expands them (``expand``), then the
prompt's image tokens given their rows (``spans``: one ``EmbedSpan`` per run of image tokens, keyed
by the image's ``image_hash``). Each distinct image is encoded once (the model's
``encode_images``, under a lock: one Executable is never run by two threads at once) and its rows
kept in a small LRU, so a repeated image is not encoded again.

Concurrent requests share tower calls (a group commit): a request's images that are neither in
the LRU nor already in flight for another request go through the processor in the request's own
thread and join one queue, each a job its requests wait on; whichever waiting thread finds the
tower free leads: it takes the queue (every waiting request's images, up to ENCODE_IMAGES images
and ENCODE_ROWS pixel rows) into one ``encode_batch`` call and hands each job its rows (or the
call's error, to every request of that batch), then the next waiter with work still queued leads.
So 32 requests arriving together cost a few batched tower calls, not 32 serial ones, and an image
two requests share is encoded once. Waiting is on a condition (no polling).

LoRA adapters that trained the projector (train_projector; Model.projectors, by engine slot):
a request of such an adapter gets its images' rows from the base tower and the adapter's
projector (``adapter=`` the slot). Its rows are cached and shared under (slot, image) and its
EmbedSpans keyed by both (``span_key``), so neither the cache nor the prefix cache ever hands
them to the base model or another adapter; a tower call takes the images of one projector only
(the queue's first and those of the same projector after it); ``forget_adapter`` drops a slot's
rows once it is unloaded. Requests of adapters without a projector share the base model's rows.

Videos (a family whose ImagePrompt has ``video``: Qwen3-VL) ride the same path: ``{"type":
"video"}`` parts, one ``surogate.io.videos.Video`` (sampled frames) each beside the messages, the
template's video placeholder checked (``check_rendered_videos``) and expanded (``expand_videos``),
and a video is one item of ``rows`` like an image (its frames processed by ``VideoPrompt.batch``,
keyed by ``Video.key``), its spans placed by the family's ``spans``.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from surogate.errors import InvalidArgumentError

def count_image_parts(messages: Sequence[Mapping], kind: str = "image") -> int:
    """How many ``{"type": kind}`` parts (``image``, ``video``) the messages' content lists hold."""
    n = 0
    for m in messages:
        content = m.get("content")
        if isinstance(content, (list, tuple)):
            n += sum(1 for part in content if isinstance(part, Mapping) and part.get("type") == kind)
    return n


def check_rendered_videos(text: str, num_parts: int, num_videos: int, video_placeholder: str | None, *,
                          param: str = "messages") -> None:
    """``check_rendered_images`` for ``{"type": "video"}`` parts and the model's video placeholder."""
    from surogate.serve.frontend import RequestError

    if num_parts != num_videos:
        raise InvalidArgumentError(f"the messages hold {num_parts} video parts but {num_videos} videos came with them",
                                   hint="pass one decoded video per {\"type\": \"video\"} part, in order")
    if num_parts == 0:
        return
    if video_placeholder is None:
        raise RequestError(f"the messages hold {num_parts} video(s), and this model does not take videos",
                           param=param, hint="send text (or images, to a vision model) only, or serve a model that "
                                             "reads videos (Qwen3-VL)")
    written = text.count(video_placeholder)
    if written != num_parts:
        what = "drops video parts" if written < num_parts else "the text itself contains the placeholder"
        raise RequestError(f"the prompt holds {written} video placeholder(s) ({video_placeholder!r}) for {num_parts} "
                           f"video(s): {what}", param=param,
                           hint="use the model's own chat template, and do not write the placeholder in the text")


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


BASE = -1  # the projector of the model itself (an adapter slot is >= 0)
ENCODER_CACHE_IMAGES = 64  # the images whose rows an ImageEncoder keeps (Gemma 3 4B: 256 x 2560 f32 = 2.6 MB each)
ENCODE_BATCH = 16  # views per tower call at most (Gemma 3 4B: 16 x 4096 patches; Programs of 1, 2, 4, 8 and 16 views)
ENCODE_IMAGES = 32  # images one leader encodes at most (from all waiting requests), in one encode_batch
ENCODE_ROWS = 65536  # and pixel rows at most (the processor's: Qwen3-VL patches, Gemma 3 views)


class _Job:
    """One image waiting for its rows: made by the first request that misses it; ``batch`` holds
    its processor output once queued; ``rows`` or ``error`` is set once, then ``done``."""

    __slots__ = ("key", "projector", "batch", "size", "rows", "error", "done")

    def __init__(self, key: tuple[int, bytes]):
        self.key = key  # (the projector's slot or BASE, the image's hash)
        self.projector = key[0]
        self.batch = None
        self.size = 1  # its pixel rows (batch_rows counts them)
        self.rows: np.ndarray | None = None
        self.error: BaseException | None = None
        self.done = False


class ImageEncoder:
    """One served model's images: ``prompt`` is its family's ``surogate.models.family.ImagePrompt``,
    ``encode(pixel_values) -> rows`` its ``Model.encode_images``. ``encodes`` counts the images
    encoded, ``hits`` those a request got without an encode of its own (from the cache, or from
    another request's encode in flight), ``calls`` the batches encoded (one ``encode_batch`` each).
    ``batch_images`` / ``batch_rows``: the caps of one batch (images; the processor's pixel rows).
    ``has_projector(slot)``: whether adapter ``slot`` has a projector of its own, which ``encode``
    then takes as ``projector=slot`` (Model.projectors; default: none has)."""

    def __init__(self, prompt, encode: Callable[..., np.ndarray], *, cache_images: int = ENCODER_CACHE_IMAGES,
                 batch_images: int = ENCODE_IMAGES, batch_rows: int = ENCODE_ROWS,
                 has_projector: Callable[[int], bool] | None = None):
        self.prompt = prompt
        self._encode = encode
        self._has_projector = has_projector or (lambda slot: False)
        self._cache: OrderedDict[tuple[int, bytes], np.ndarray] = OrderedDict()
        self._cache_images = cache_images
        self._batch_images = batch_images
        self._batch_rows = batch_rows
        self._lock = threading.Lock()  # the tower: one Executable is never run by two threads at once
        self._cond = threading.Condition()  # guards the cache, the jobs, the queue and the counters
        self._jobs: dict[tuple[int, bytes], _Job] = {}  # the images being prepared, queued or encoded
        self._queue: list[_Job] = []  # processed, waiting for a leader
        self._leading = False  # a thread is encoding a batch now
        self.encodes = 0
        self.hits = 0
        self.calls = 0

    @property
    def placeholder(self) -> str:
        return self.prompt.placeholder

    def expand(self, text: str, images: Sequence) -> str:
        """``text`` with its i-th placeholder replaced by image i's text (its crops' too)."""
        text_of = self.prompt.text_of or (lambda image: self.prompt.image_text(self.prompt.num_crops(image)))
        return replace_placeholders(text, self.prompt.placeholder, images, text_of, "image")

    @property
    def video_placeholder(self) -> str | None:
        return self.prompt.video.placeholder if self.prompt.video is not None else None

    def expand_videos(self, text: str, videos: Sequence) -> str:
        """``text`` with its i-th video placeholder replaced by video i's text (VideoPrompt.text_of)."""
        return replace_placeholders(text, self.video_placeholder, videos, self.prompt.video.text_of, "video")

    def projector_for(self, adapter: int | None) -> int:
        """The projector adapter slot ``adapter``'s images go through: its own, or BASE (the
        base model's request, or an adapter that did not train the projector)."""
        return adapter if adapter is not None and adapter >= 0 and self._has_projector(adapter) else BASE

    def spans(self, token_ids: Sequence[int], images: Sequence, videos: Sequence = (), adapter: int | None = None
              ) -> list:
        """One EmbedSpan per view (an image, then its crops) at its run of image tokens, in order;
        a family with videos places theirs too (Qwen3-VL: one per temporal patch). Images and
        videos are encoded in the same tower calls, each keyed by its hash (and by the projector of
        ``adapter``, an engine slot, when it has one: ``projector_for``)."""
        from surogate.serve.types import EmbedSpan

        if videos and (self.prompt.video is None or self.prompt.spans is None):
            raise InvalidArgumentError("this model's prompts take no videos", hint="send images or text only")
        projector = self.projector_for(adapter)
        media = [media_key(item) for item in [*images, *videos]]
        rows = self.rows([*images, *videos], media, adapter=projector)
        keys = [span_key(k, projector) for k in media]
        if self.prompt.spans is not None:  # the family places them (Qwen3-VL: MRoPE positions in the rows)
            if videos:
                n = len(images)
                return self.prompt.spans(token_ids, images, keys[:n], rows[:n], videos=videos, video_keys=keys[n:],
                                         video_rows=rows[n:])
            return self.prompt.spans(token_ids, images, keys, rows)
        runs = image_runs(token_ids, self.prompt.image_token_id)
        per = self.prompt.tokens_per_view
        views = [(key if v == 0 else hashlib.sha256(key + v.to_bytes(4, "little")).digest(), r[v * per:(v + 1) * per])
                 for key, r in zip(keys, rows) for v in range(len(r) // per)]
        if [n for _, n in runs] != [per] * len(views):
            raise InvalidArgumentError(
                f"the prompt's image tokens (id {self.prompt.image_token_id}) come in runs of "
                f"{[n for _, n in runs]}; its {len(images)} image(s) need {len(views)} run(s) of {per}",
                hint="render the messages with the model's chat template (LLM.render), which expands each image; "
                     "do not write the image token in the text")
        return [EmbedSpan(start, np.ascontiguousarray(r, dtype=np.float32), key, self.prompt.bidirectional)
                for (start, _), (key, r) in zip(runs, views)]

    def rows(self, images: Sequence, keys: Sequence[bytes] | None = None, adapter: int | None = None
             ) -> list[np.ndarray]:
        """Each image's rows (its views': the image's, then its crops'), [views * tokens_per_view, hidden];
        blocking. The images neither cached nor in flight are processed in this thread and queued;
        then whichever waiting thread finds the tower free leads: it encodes the queue (every waiting
        request's images, up to the batch caps) in one ``encode_batch`` and hands each its rows, while
        the others wait for theirs (a group commit: concurrent requests share tower calls). An encode
        that raises fails every request with an image in that batch, with its error. A video
        (surogate.io.videos.Video) is one item like an image: its frames' rows, keyed by its hash.
        ``adapter``: an engine slot; its projector's rows when it has one (``projector_for``)."""
        projector = self.projector_for(adapter)
        keys = [(projector, k) for k in (keys if keys is not None else [media_key(img) for img in images])]
        out: dict[tuple[int, bytes], np.ndarray] = {}
        waiting: dict[tuple[int, bytes], _Job] = {}
        mine: list[tuple[_Job, object]] = []  # the jobs this request made, to process and queue
        with self._cond:
            for key, image in zip(keys, images):
                if key in out or key in waiting:
                    continue
                cached = self._cache.get(key)
                if cached is not None:
                    self._cache.move_to_end(key)
                    self.hits += 1
                    out[key] = cached
                elif key in self._jobs:  # another request's image, being encoded: shared
                    self.hits += 1
                    waiting[key] = self._jobs[key]
                else:
                    waiting[key] = self._jobs[key] = _Job(key)
                    mine.append((waiting[key], image))
        if mine:
            self._prepare(mine)
        for key, job in waiting.items():
            out[key] = self._wait(job)
        return [out[k] for k in keys]

    def _prepare(self, jobs: list[tuple[_Job, object]]) -> None:
        """Each new image through the processor (in the request's thread, outside the locks), then queued."""
        try:
            for job, image in jobs:
                job.batch = self.prompt.video.batch(image) if is_video(image) else self.prompt.processor([image])
                job.size = len(job.batch.pixel_values)
        except BaseException as e:
            with self._cond:
                self._finish([job for job, _ in jobs], error=e)
            raise
        with self._cond:
            self._queue += [job for job, _ in jobs]
            self._cond.notify_all()

    def _wait(self, job: _Job) -> np.ndarray:
        """``job``'s rows: leads a batch whenever the tower is free and images are queued, else
        sleeps until a batch ends or an image is queued."""
        with self._cond:
            while not job.done:
                if self._leading or not self._queue:
                    self._cond.wait()
                    continue
                batch = self._take()
                self._leading = True
                self._cond.release()
                try:
                    with self._lock:
                        rows = self._encode_processed([j.batch for j in batch], batch[0].projector)
                    if len(rows) != len(batch):  # a family's encode hook out of step: fail, never hang
                        raise RuntimeError(f"the image encoder gave rows for {len(rows)} of {len(batch)} images")
                    error = None
                except BaseException as e:
                    rows, error = None, e
                finally:
                    self._cond.acquire()
                self._leading = False
                self._finish(batch, rows=rows, error=error)
            if job.error is not None:
                raise job.error
            return job.rows

    def _take(self) -> list[_Job]:
        """The queue's first image and those after it of the same projector, up to the caps (at
        least one); the others keep their places."""
        projector = self._queue[0].projector
        batch, rest, size = [], [], 0
        for job in self._queue:
            if job.projector != projector or (batch and (len(batch) == self._batch_images
                                                         or size + job.size > self._batch_rows)):
                rest.append(job)
                continue
            batch.append(job)
            size += job.size
        self._queue = rest
        return batch

    def _finish(self, jobs: list[_Job], rows=None, error: BaseException | None = None) -> None:
        """(under the condition) ``jobs`` done with their rows or the error; the waiters woken."""
        if error is None:
            self.calls += 1
        for i, job in enumerate(jobs):
            if error is None:
                job.rows = rows[i]
                self.encodes += 1
                if job.projector == BASE or self._has_projector(job.projector):  # (not unloaded meanwhile)
                    self._cache[job.key] = job.rows
            else:
                job.error = error
            job.done = True
            self._jobs.pop(job.key, None)
        while len(self._cache) > self._cache_images:
            self._cache.popitem(last=False)
        self._cond.notify_all()

    def forget_adapter(self, slot: int) -> None:
        """Drop the rows of adapter ``slot``'s projector (it was unloaded: EngineClient.on_adapter_drop)."""
        with self._cond:
            for key in [k for k in self._cache if k[0] == slot]:
                del self._cache[key]

    def encode_batch(self, images: Sequence, adapter: int | None = None) -> list[np.ndarray]:
        """The rows of each of ``images``, from one tower call over all of them (the family's
        ``ImagePrompt.encode``; by default: the views' pixel values stacked, in calls of at most
        ENCODE_BATCH views, each zero-padded to a power of two views so that the compiled Programs
        are those of 1, 2, 4, .. ENCODE_BATCH views). Each image is processed on its own (a
        processor may refuse to stack images of different sizes). ``adapter``: as in ``rows``."""
        batches = [self.prompt.processor([image]) for image in images]
        with self._lock:
            return self._encode_processed(batches, self.projector_for(adapter))

    def _encode_processed(self, batches: list, projector: int = -1) -> list[np.ndarray]:
        """encode_batch over the processor's outputs, one per image (the tower lock held), through
        adapter slot ``projector``'s projector (BASE: the model's)."""
        encode = self._encode if projector == BASE else functools.partial(self._encode, projector=projector)
        if self.prompt.encode is not None:
            return [np.asarray(r, dtype=np.float32) for r in self.prompt.encode(encode, batches)]
        views = [len(b.pixel_values) for b in batches]
        px = np.concatenate([b.pixel_values for b in batches])
        parts = []
        for s in range(0, len(px), ENCODE_BATCH):
            chunk = px[s:s + ENCODE_BATCH]
            k = len(chunk)
            size = 1 << (k - 1).bit_length()
            if size > k:  # zero images: each image attends within itself, so they change no real one's rows
                chunk = np.concatenate([chunk, np.zeros((size - k, *chunk.shape[1:]), chunk.dtype)])
            rows = np.asarray(encode(chunk), dtype=np.float32)
            parts.append(rows[:k * (len(rows) // size)])
        rows = np.concatenate(parts)
        per = len(rows) // len(px)
        bounds = np.cumsum([0, *views]) * per
        return [rows[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def replace_placeholders(text: str, placeholder: str, items: Sequence, text_of, kind: str) -> str:
    """``text`` with its i-th ``placeholder`` replaced by ``text_of(items[i])`` (``kind``: image /
    video, for the error; check_rendered_images / _videos have made sure of the count for rendered chats)."""
    pieces = text.split(placeholder)
    if len(pieces) != len(items) + 1:
        raise InvalidArgumentError(f"the prompt holds {len(pieces) - 1} {kind} placeholders for {len(items)} "
                                   f"{kind}(s)", hint=f"write {placeholder!r} once per {kind}")
    out = [pieces[0]]
    for item, piece in zip(items, pieces[1:]):
        out += [text_of(item), piece]
    return "".join(out)


def is_video(item) -> bool:
    from surogate.io.videos import Video

    return isinstance(item, Video)


def span_key(key: bytes, projector: int) -> bytes:
    """An EmbedSpan's key (the prefix cache's): the image's, or with an adapter's projector
    (its engine slot) a digest of both, so that its rows never pass for another's."""
    if projector == BASE:
        return key
    return hashlib.sha256(b"projector" + projector.to_bytes(8, "little", signed=True) + key).digest()


def media_key(item) -> bytes:
    """An image's ``image_hash`` or a video's ``key``: the encoder cache's key of its rows."""
    from surogate.io.images import image_hash

    return item.key if is_video(item) else image_hash(item)


def image_runs(token_ids: Sequence[int], image_token_id: int) -> list[tuple[int, int]]:
    """(start, length) of each run of ``image_token_id`` in ``token_ids``."""
    ids = np.asarray(token_ids)
    hit = np.concatenate([[False], ids == image_token_id, [False]])
    edges = np.flatnonzero(hit[1:] != hit[:-1])
    return [(int(a), int(b - a)) for a, b in zip(edges[::2], edges[1::2])]
