"""Videos a request names: decoded into the RGB frames a video processor samples, under the same
media rules as images (surogate.io.images: data: URLs always, local files under
``--allowed-local-media-path``, http(s) with ``--allow-remote-media``).

A video comes as:

- an animated GIF, WebP or PNG (APNG), which Pillow decodes frame by frame: the frames' durations
  give the clip's frame rate (frames / seconds; 0-length frames count as the processor's rate);
- vLLM's frame list, ``data:video/jpeg;base64,<frame>,<frame>,...`` (each frame a base64 JPEG or
  PNG): frames already sampled, so they are taken at the processor's own rate (``default_fps``);
- a codec container (MP4 / MOV, WebM / MKV, AVI, FLV, MPEG; by its media type or its first bytes),
  decoded by PyAV (FFmpeg) when the optional ``video`` extra is installed (``pip install
  'surogate[video]'``), as transformers' ``read_video_pyav`` reads it: the stream's frame count and
  average rate, frames decoded in order and the sampled ones kept as RGB. Without PyAV it is
  refused with an error that says so and names the forms above. Only the frames the processor samples (``sample(total, fps)``: transformers'
uniform indices for ``fps`` frames a second, within min / max frames) are kept, and the source's
size is checked first: at most MAX_VIDEO_FRAMES frames of at most MAX_PIXELS each, and the kept
frames at most MAX_VIDEO_PIXELS in all.
"""

from __future__ import annotations

import hashlib
import io
import struct
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError

from surogate.errors import InvalidArgumentError
from surogate.io.images import (LOCAL_FLAG, MAX_PIXELS, REMOTE_FLAG, _data_url, _read_file, _short, _to_rgb,
                                b64decode, decode_image, fetch, image_hash, local_path)

ANIMATED = ("GIF", "WEBP", "PNG")  # Pillow decoders whose files hold frames
MEDIA_TYPES = {"image/gif", "image/webp", "image/png", "image/apng", "video/gif", "video/webp", "video/apng"}
FRAME_LIST = "video/jpeg"  # vLLM's frame list: base64 frames separated by commas
MAX_VIDEO_FRAMES = 4096  # frames in a source clip
MAX_VIDEO_PIXELS = 128 * 1024 * 1024  # the kept frames' pixels in all (384 MiB as RGB)
MAX_VIDEO_BYTES = 64 * 1024 * 1024  # a file read or fetched

FORMS = ("send an animated GIF, WebP or PNG (a data: URL or a file), or the frames as vLLM's "
         "data:video/jpeg;base64,<frame>,<frame>,... (each a base64 JPEG or PNG)")
Sampler = Callable[[int, float], Sequence[int]]  # (frames in the clip, its fps) -> the frame indices to keep


@dataclass(frozen=True, eq=False)
class Video:
    """A clip's sampled frames (RGB, one size), which source frame each is, and the source's frame
    rate (the clock of the indices: frame i is at i / fps seconds). ``key``: sha256 of the frames'
    pixels (their ``image_hash``es), the encoder cache's and prefix cache's key of its rows."""

    frames: tuple[Image.Image, ...]
    frame_indices: tuple[int, ...]
    fps: float

    def __post_init__(self):
        if not self.frames or len(self.frames) != len(self.frame_indices):
            raise InvalidArgumentError(f"a video of {len(self.frames)} frames and {len(self.frame_indices)} indices",
                                       hint="one source index per frame, at least one frame")
        if len({f.size for f in self.frames}) > 1:
            raise InvalidArgumentError(f"a video's frames differ in size: {sorted({f.size for f in self.frames})}",
                                       hint="every frame of one video must have the same size")

    @property
    def size(self) -> tuple[int, int]:
        return self.frames[0].size

    @property
    def key(self) -> bytes:
        h = hashlib.sha256(b"video\0" + struct.pack("<I", len(self.frames)))
        for f in self.frames:
            h.update(image_hash(f))
        return h.digest()


def load_video(url: str, sample: Sampler, default_fps: float, *, allowed_local_media_path: str | None = None,
               allow_remote: bool = False, max_bytes: int = MAX_VIDEO_BYTES) -> Video:
    """The video ``url`` names (data:, file://, an absolute path or http(s)://), sampled by ``sample``."""
    if not isinstance(url, str) or not url:
        raise InvalidArgumentError("a video URL is empty", hint=FORMS)
    scheme = url.split(":", 1)[0].lower() if ":" in url[:12] else ""
    if scheme == "data":
        head = url[5:].partition(",")[0]
        media_type = head.split(";")[0].strip().lower()
        if media_type == FRAME_LIST:
            return frame_list(url[5:].partition(",")[2], sample, default_fps)
        data, media_type = _data_url(url)
        return decode_video(data, sample, default_fps, media_type=media_type)
    if scheme in ("http", "https"):
        if not allow_remote:
            raise InvalidArgumentError(f"remote video URLs are off on this server ({_short(url)})",
                                       hint=f"send the video inline as a data: URL, or start the server with "
                                            f"{REMOTE_FLAG}")
        return decode_video(fetch(url, max_bytes=max_bytes), sample, default_fps, origin=_short(url))
    if scheme == "file" or url.startswith("/"):
        path = local_path(url, allowed_local_media_path)
        return decode_video(_read_file(path, max_bytes), sample, default_fps, origin=path)
    raise InvalidArgumentError(f"{_short(url)} is not a video URL this server reads",
                               hint=f"use a data: URL, an http(s) URL (with {REMOTE_FLAG}) or a file:// URL / "
                                    f"absolute path (under {LOCAL_FLAG}); {FORMS}")


def frame_list(payload: str, sample: Sampler, fps: float) -> Video:
    """vLLM's ``video/jpeg`` payload: base64 frames joined by commas, taken at ``fps``."""
    parts = payload.split(",")
    if len(parts) > MAX_VIDEO_FRAMES:
        raise InvalidArgumentError(f"the frame list has {len(parts)} frames, more than the {MAX_VIDEO_FRAMES} a "
                                   "video may have", hint="send fewer frames")
    keep = _indices(sample, len(parts), fps)
    frames = [decode_image(b64decode(parts[i], f"frame {i}'s base64"), origin=f"frame {i}") for i in keep]
    _check_pixels(len(frames), *frames[0].size)
    return Video(tuple(frames), tuple(keep), fps)


def decode_video(data: bytes, sample: Sampler, default_fps: float, *, media_type: str | None = None,
                 origin: str = "the video") -> Video:
    """An animated GIF / WebP / PNG's or (with PyAV) a codec container's sampled frames."""
    container = _container(data, media_type)
    if container is not None:
        return decode_container(data, sample, default_fps, container, origin)
    if media_type is not None and media_type.lower() not in MEDIA_TYPES:
        raise InvalidArgumentError(f"{origin} has media type {media_type!r}, not a video this server decodes",
                                   hint=FORMS)
    if not data:
        raise InvalidArgumentError(f"{origin} is empty (no bytes)", hint=FORMS)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data), formats=ANIMATED)
        total = getattr(img, "n_frames", 1)
    except UnidentifiedImageError:
        raise InvalidArgumentError(f"{origin} is not an animated GIF, WebP or PNG (or its header is corrupt)",
                                   hint=FORMS) from None
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise InvalidArgumentError(f"{origin} is truncated or corrupt ({e})", hint="send the whole file") from None
    width, height = img.size
    if width * height > MAX_PIXELS:
        raise InvalidArgumentError(f"{origin}'s frames are {width} x {height} pixels, more than the {MAX_PIXELS:,} "
                                   "a frame may have", hint="send a smaller clip")
    if total > MAX_VIDEO_FRAMES:
        raise InvalidArgumentError(f"{origin} has {total} frames, more than the {MAX_VIDEO_FRAMES} a video may have",
                                   hint="send a shorter clip")
    try:
        durations = []
        for i in range(total):
            img.seek(i)
            img.load()  # WebP sets a frame's duration as it decodes it
            durations.append(float(img.info.get("duration") or 0))
        seconds = sum(durations) / 1000
        fps = total / seconds if seconds > 0 and all(durations) else default_fps
        keep = _indices(sample, total, fps)
        _check_pixels(len(keep), width, height)
        frames = []
        for i in keep:
            img.seek(i)
            img.load()
            frame = _to_rgb(img)
            frames.append(frame.copy() if frame is img else frame)  # the next seek reuses img's pixels
    except (OSError, ValueError, SyntaxError, struct.error, EOFError) as e:
        raise InvalidArgumentError(f"{origin} is truncated or corrupt (its {img.format} data: {e})",
                                   hint="send the whole file") from None
    return Video(tuple(frames), tuple(keep), fps)


def decode_container(data: bytes, sample: Sampler, default_fps: float, container: str, origin: str) -> Video:
    """An MP4 / WebM / ... video's sampled frames through PyAV, read as transformers'
    ``read_video_pyav`` reads them (so the processor sees the same frames): the first video
    stream's frame count (counted from its packets where the container does not say) and average
    rate, frames decoded in order up to the last index kept."""
    try:
        import av
    except ImportError:
        raise InvalidArgumentError(f"{origin} is {container} video, and this server has no video decoder",
                                   hint=f"install PyAV on the server (pip install 'surogate[video]'), or {FORMS}") \
            from None
    if not data:
        raise InvalidArgumentError(f"{origin} is empty (no bytes)", hint=FORMS)
    if container not in DEMUXERS:
        raise InvalidArgumentError(f"{origin} is {container} video, not a container this server reads",
                                   hint=f"send an MP4, WebM, MKV, AVI, FLV or MPEG file, or {FORMS}")
    try:
        with av.open(io.BytesIO(data), mode="r", format=DEMUXERS[container]) as c:
            if not c.streams.video:
                raise InvalidArgumentError(f"{origin} ({container}) has no video stream", hint=FORMS)
            stream = c.streams.video[0]
            width, height = stream.codec_context.width, stream.codec_context.height
            if width * height > MAX_PIXELS:
                raise InvalidArgumentError(f"{origin}'s frames are {width} x {height} pixels, more than the "
                                           f"{MAX_PIXELS:,} a frame may have", hint="send a smaller clip")
            total = stream.frames
            if total <= 0:  # not in the header (WebM, some MPEG streams): count the packets
                total = sum(1 for p in c.demux(stream) if p.size)
                c.seek(0)
            if total > MAX_VIDEO_FRAMES:
                raise InvalidArgumentError(f"{origin} has {total} frames, more than the {MAX_VIDEO_FRAMES} a video "
                                           "may have", hint="send a shorter clip")
            if total <= 0:
                raise InvalidArgumentError(f"{origin} ({container}) holds no frames", hint="send the whole file")
            rate = stream.average_rate or stream.guessed_rate
            fps = float(rate) if rate else default_fps
            keep = _indices(sample, total, fps)
            _check_pixels(len(keep), width, height)
            wanted, frames, got = set(keep), [], []
            for i, frame in enumerate(c.decode(stream)):
                if i > keep[-1]:
                    break
                if i in wanted:
                    frames.append(frame.to_image())  # RGB, as to_ndarray(format="rgb24")
                    got.append(i)
    except InvalidArgumentError:
        raise
    except (av.FFmpegError, OSError, ValueError, EOFError) as e:
        raise InvalidArgumentError(f"{origin} is truncated or corrupt ({container}: {e})",
                                   hint="send the whole file") from None
    if not got:  # a header that promises frames the stream does not decode
        raise InvalidArgumentError(f"{origin} ({container}) decodes none of the {total} frames its header promises",
                                   hint="send the whole file")
    # Fewer than its header said (a count a few frames off is common): the ones decoded, as transformers
    if {f.size for f in frames} != {(width, height)}:
        raise InvalidArgumentError(f"{origin}'s frames change size mid-stream", hint="re-encode the clip at one size")
    return Video(tuple(frames), tuple(got), fps)


def _indices(sample: Sampler, total: int, fps: float) -> list[int]:
    keep = sorted({int(i) for i in sample(total, fps)})
    if not keep or keep[0] < 0 or keep[-1] >= total:
        raise InvalidArgumentError(f"the frame sampler chose {keep} of {total} frames", hint="a bug: report it")
    return keep


def _check_pixels(frames: int, width: int, height: int) -> None:
    if frames * width * height > MAX_VIDEO_PIXELS:
        raise InvalidArgumentError(f"the video's {frames} sampled frames of {width} x {height} are more than the "
                                   f"{MAX_VIDEO_PIXELS:,} pixels a video may have", hint="send a shorter or smaller clip")


# The FFmpeg demuxer of each container we read. PyAV is told which one (never left to probe), so
# a file cannot pick a demuxer that follows references elsewhere (an HLS or concat playlist naming
# local files or URLs); the mov demuxer's external data references (enable_drefs) stay off.
DEMUXERS = {"an MP4 / MOV": "mp4", "a WebM / MKV": "matroska", "an AVI": "avi", "an FLV": "flv",
            "an MPEG program stream": "mpeg", "an MPEG transport stream": "mpegts"}
VIDEO_MEDIA_TYPES = {"video/mp4": "an MP4 / MOV", "video/quicktime": "an MP4 / MOV", "video/webm": "a WebM / MKV",
                     "video/x-matroska": "a WebM / MKV", "video/x-msvideo": "an AVI", "video/avi": "an AVI",
                     "video/x-flv": "an FLV", "video/mpeg": "an MPEG program stream",
                     "video/mp2t": "an MPEG transport stream"}


def _container(data: bytes, media_type: str | None) -> str | None:
    """The codec container the bytes (or else the media type) are, by name (a DEMUXERS key, or
    "a video/..." for a media type we know no demuxer of); None for anything else."""
    if data[4:8] == b"ftyp":
        return "an MP4 / MOV"
    if data[:4] == b"\x1a\x45\xdf\xa3":
        return "a WebM / MKV"
    if data[:4] == b"RIFF" and data[8:12] == b"AVI ":
        return "an AVI"
    if data[:3] == b"FLV":
        return "an FLV"
    if data[:4] in (b"\x00\x00\x01\xba", b"\x00\x00\x01\xb3"):
        return "an MPEG program stream"
    if data[:1] == b"\x47" and data[188:189] == b"\x47":
        return "an MPEG transport stream"
    mt = (media_type or "").lower()
    if mt.startswith("video/") and mt not in MEDIA_TYPES:
        return VIDEO_MEDIA_TYPES.get(mt, f"a {mt}")
    return None
