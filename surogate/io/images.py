"""Images a request names: decoded into RGB ``PIL.Image.Image``s, under the server's media rules.

A request names an image by URL:

- ``data:image/...;base64,...``: inline bytes, always accepted (what OpenAI's and Anthropic's
  clients send by default);
- ``file:///abs/path`` or ``/abs/path``: only inside ``allowed_local_media_path`` (vLLM's
  ``--allowed-local-media-path``), after resolving ``..`` and symlinks, so no request reads a
  file outside it;
- ``http(s)://``: only with ``allow_remote`` (``--allow-remote-media``): fetched with the
  standard library, redirects only to http(s), at most ``max_bytes`` and ``timeout`` seconds in all.

Only PNG, JPEG, WebP and GIF (its first frame) are decoded; Pillow's other decoders are never
tried. The header's size is checked against ``max_pixels`` before any pixel is decoded (a
decompression bomb never expands). The EXIF orientation is applied (the image as a viewer shows
it, as transformers' ``load_image`` does), and transparency is composited onto white (as
transformers' ``convert_to_rgb`` and vLLM do), so an image processor gets RGB as it is.

Every failure is an ``InvalidArgumentError`` saying what is wrong with the image and, where a
server flag would allow it, which one.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import os
import stat
import struct
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings

from PIL import Image, ImageOps, UnidentifiedImageError

from surogate.errors import InvalidArgumentError

FORMATS = ("PNG", "JPEG", "WEBP", "GIF")  # Pillow's names for the decoders we allow
MEDIA_TYPES = {"image/png": "PNG", "image/jpeg": "JPEG", "image/jpg": "JPEG", "image/webp": "WEBP", "image/gif": "GIF"}
MAX_PIXELS = 8192 * 8192  # 64 Mi pixels: 192 MiB as RGB; Pillow's own bomb limit is 89 Mi (warning) / 179 Mi
MAX_BYTES = 32 * 1024 * 1024  # an encoded image read from a file or fetched (a data: URL is bounded by the body limit)
FETCH_TIMEOUT = 10.0  # seconds for a whole remote fetch

LOCAL_FLAG = "--allowed-local-media-path"
REMOTE_FLAG = "--allow-remote-media"


def load_image(url: str, *, allowed_local_media_path: str | None = None, allow_remote: bool = False,
               max_bytes: int = MAX_BYTES, max_pixels: int = MAX_PIXELS, timeout: float = FETCH_TIMEOUT) -> Image.Image:
    """The RGB image ``url`` names (a data:, file:// or http(s):// URL, or an absolute path)."""
    if not isinstance(url, str) or not url:
        raise InvalidArgumentError("an image URL is empty", hint="send a data: URL (data:image/png;base64,...)")
    scheme = url.split(":", 1)[0].lower() if ":" in url[:12] else ""
    if scheme == "data":
        data, media_type = _data_url(url)
        return decode_image(data, media_type=media_type, max_pixels=max_pixels)
    if scheme in ("http", "https"):
        if not allow_remote:
            raise InvalidArgumentError(
                f"remote image URLs are off on this server ({_short(url)})",
                hint=f"send the image inline as a data: URL (base64), or start the server with {REMOTE_FLAG}")
        return decode_image(fetch(url, max_bytes=max_bytes, timeout=timeout), max_pixels=max_pixels, origin=_short(url))
    if scheme == "file" or url.startswith("/"):
        path = local_path(url, allowed_local_media_path)
        return decode_image(_read_file(path, max_bytes), max_pixels=max_pixels, origin=path)
    raise InvalidArgumentError(
        f"{_short(url)} is not an image URL this server reads",
        hint=f"use a data: URL (data:image/png;base64,...), an http(s) URL (with {REMOTE_FLAG}), "
             f"or a file:// URL / absolute path (under {LOCAL_FLAG})")


def decode_image(data: bytes, *, media_type: str | None = None, max_pixels: int = MAX_PIXELS,
                 origin: str = "the image") -> Image.Image:
    """Encoded PNG / JPEG / WebP / GIF bytes -> an RGB image (the first frame of an animation).
    ``media_type``, when given, must be an image type we decode; the bytes decide the format
    (clients often label every image ``image/jpeg``)."""
    if media_type is not None and media_type.lower() not in MEDIA_TYPES:
        raise InvalidArgumentError(f"{origin} has media type {media_type!r}, not one this server decodes",
                                   hint="send image/png, image/jpeg, image/webp or image/gif")
    if not data:
        raise InvalidArgumentError(f"{origin} is empty (no bytes)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # our own limit below is lower
            img = Image.open(io.BytesIO(data), formats=FORMATS)
    except UnidentifiedImageError:
        raise InvalidArgumentError(f"{origin} is not a PNG, JPEG, WebP or GIF image (or its header is corrupt)",
                                   hint="send one of those formats") from None
    except Image.DecompressionBombError as e:
        raise InvalidArgumentError(f"{origin} is too large to decode: {e}", hint=_SMALLER) from None
    except (OSError, ValueError, SyntaxError) as e:  # Pillow's plugins raise all three on a bad header
        raise InvalidArgumentError(f"{origin} is truncated or corrupt (its header: {e})",
                                   hint="send the whole file") from None
    width, height = img.size
    if width * height > max_pixels:
        raise InvalidArgumentError(f"{origin} is {width} x {height} = {width * height:,} pixels, more than the "
                                   f"{max_pixels:,} this server decodes", hint=_SMALLER)
    try:
        img.load()  # the first frame
        ImageOps.exif_transpose(img, in_place=True)
    except (OSError, ValueError, SyntaxError, struct.error, EOFError) as e:
        raise InvalidArgumentError(f"{origin} is truncated or corrupt (its {img.format} data: {e})",
                                   hint="send the whole file") from None
    return _to_rgb(img)


def _to_rgb(img: Image.Image) -> Image.Image:
    # transformers' convert_to_rgb, kept a PIL image (image_processing.to_rgb is the same step to numpy)
    if img.mode == "RGB":
        return img
    if "A" in img.getbands() or img.info.get("transparency") is not None:
        rgba = img.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return img.convert("RGB")


def image_hash(img: Image.Image) -> bytes:
    """32-byte sha256 of the mode, the size and the pixel bytes: equal for equal pixels, whatever
    the encoding they came in (the prefix cache's key for an image's embedding rows)."""
    h = hashlib.sha256()
    h.update(img.mode.encode("ascii") + b"\0")
    h.update(struct.pack("<II", *img.size))
    h.update(img.tobytes())
    return h.digest()


# -- sources ----------------------------------------------------------------------------------------

def local_path(url: str, allowed_local_media_path: str | None) -> str:
    """The resolved file a ``file://`` URL or absolute path names, if it lies inside
    ``allowed_local_media_path`` (itself resolved): ``..`` and symlinks cannot leave it."""
    if url.startswith("/"):
        path = url
    else:
        parts = urllib.parse.urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise InvalidArgumentError(f"{_short(url)}: a file:// URL names a file on this host (file:///path)")
        path = urllib.parse.unquote(parts.path)
    if allowed_local_media_path is None:
        raise InvalidArgumentError(f"local image files are off on this server ({_short(url)})",
                                   hint=f"send the image inline as a data: URL, or start the server with "
                                        f"{LOCAL_FLAG} DIR to let requests read images under DIR")
    root = os.path.realpath(allowed_local_media_path)
    resolved = os.path.realpath(path)
    if os.path.commonpath([root, resolved]) != root:
        raise InvalidArgumentError(f"{_short(url)} is outside the folder this server reads images from "
                                   f"({LOCAL_FLAG} {allowed_local_media_path})",
                                   hint="name a file inside that folder (symlinks and .. that leave it are refused)")
    return resolved


def _read_file(path: str, max_bytes: int) -> bytes:
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidArgumentError(f"{path} is not a regular file")
        if st.st_size > max_bytes:
            raise InvalidArgumentError(f"{path} is {st.st_size:,} bytes, more than the {max_bytes:,} an image may be")
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise InvalidArgumentError(f"{path} does not exist") from None
    except PermissionError:
        raise InvalidArgumentError(f"{path} cannot be read (permission denied)") from None
    if len(data) > max_bytes:
        raise InvalidArgumentError(f"{path} is more than the {max_bytes:,} bytes an image may be")
    return data


def _data_url(url: str) -> tuple[bytes, str | None]:
    """``data:[<media type>][;base64],<data>`` -> (bytes, media type or None)."""
    head, sep, payload = url[5:].partition(",")
    if not sep:
        raise InvalidArgumentError(f"{_short(url)} is not a data URL: it has no ','",
                                   hint="write data:image/png;base64,<base64 of the file>")
    params = head.split(";")
    media_type = params[0].strip() or None
    if "base64" in (p.strip().lower() for p in params[1:]):
        return b64decode(payload, "the data URL's base64"), media_type
    return urllib.parse.unquote_to_bytes(payload), media_type


def b64decode(text: str, what: str = "the image's base64") -> bytes:
    """Standard base64, padding and line breaks tolerated (Anthropic's ``source.data`` too)."""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        pass
    try:
        compact = "".join(text.split())
        return base64.b64decode(compact + "=" * (-len(compact) % 4), validate=True)
    except (binascii.Error, ValueError) as e:
        raise InvalidArgumentError(f"{what} is not valid base64 ({e})",
                                   hint="encode the file's bytes with standard base64 (A-Z a-z 0-9 + /)") from None


class _HttpRedirects(urllib.request.HTTPRedirectHandler):
    # urllib follows redirects to ftp:// too; an image fetch stays on http(s)
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if urllib.parse.urlsplit(newurl).scheme.lower() not in ("http", "https"):
            raise InvalidArgumentError(f"{_short(req.full_url)} redirects to {_short(newurl)}, which is not http(s)")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _opener() -> urllib.request.OpenerDirector:
    opener = urllib.request.OpenerDirector()  # no file:, ftp: or data: handlers, unlike build_opener()
    for handler in (urllib.request.ProxyHandler(), urllib.request.HTTPHandler(), urllib.request.HTTPSHandler(),
                    urllib.request.HTTPDefaultErrorHandler(), _HttpRedirects(), urllib.request.HTTPErrorProcessor()):
        opener.add_handler(handler)
    return opener


def fetch(url: str, *, max_bytes: int = MAX_BYTES, timeout: float = FETCH_TIMEOUT) -> bytes:
    """An http(s) URL's body: at most ``max_bytes``, within ``timeout`` seconds in all."""
    deadline = time.monotonic() + timeout
    request = urllib.request.Request(url, headers={"User-Agent": "surogate", "Accept": "image/*"})
    try:
        with _opener().open(request, timeout=timeout) as response:
            length = response.headers.get("Content-Length")
            if length is not None and length.isdigit() and int(length) > max_bytes:
                raise InvalidArgumentError(f"{_short(url)} is {int(length):,} bytes, more than the {max_bytes:,} "
                                           "an image may be")
            chunks, size = [], 0
            while chunk := response.read1(min(1 << 16, max_bytes + 1 - size)):  # what arrived: a trickle still ends
                chunks.append(chunk)
                size += len(chunk)
                if size > max_bytes:
                    raise InvalidArgumentError(f"{_short(url)} is more than the {max_bytes:,} bytes an image may be")
                if time.monotonic() > deadline:
                    raise TimeoutError
    except urllib.error.HTTPError as e:
        raise InvalidArgumentError(f"fetching {_short(url)} failed: HTTP {e.code} {e.reason}") from None
    except (TimeoutError, OSError) as e:  # URLError is an OSError; socket timeouts are TimeoutErrors
        if isinstance(e, TimeoutError) or isinstance(getattr(e, "reason", None), TimeoutError):
            raise InvalidArgumentError(f"fetching {_short(url)} took more than {timeout:g} s") from None
        raise InvalidArgumentError(f"fetching {_short(url)} failed: {getattr(e, 'reason', e)}") from None
    return b"".join(chunks)


_SMALLER = "send a smaller image (vision models resize images to under 1000 x 1000 pixels anyway)"


def _short(url: str, limit: int = 64) -> str:
    """A URL as an error message shows it: a data URL's payload is megabytes."""
    return f"`{url}`" if len(url) <= limit else f"`{url[:limit]}...`"
