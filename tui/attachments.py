"""Images attached to the Chat screen's next message: local files, checked when attached (Pillow
reads the header only: the format and the size, no pixels) and again when sent, then sent as
OpenAI chat ``image_url`` parts holding data URLs, so the gateway needs no
``--allowed-local-media-path`` and the files may live on the TUI's machine only (an SSH session).

Only what the gateway decodes is taken (surogate.io.images.FORMATS: PNG, JPEG, WebP, GIF), at most
``MAX_IMAGE_BYTES`` a file and ``MAX_REQUEST_BYTES`` for all the images a request carries (its
history's included): base64 makes them a third larger, under the gateway's 32 MiB body limit.
Every failure is an InvalidArgumentError naming the file. Plain data (no Textual); blocks on the
file system: workers only.
"""

from __future__ import annotations

import base64
import io
import os
import stat
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from surogate.errors import InvalidArgumentError
from surogate.io.images import FORMATS, MAX_PIXELS

MAX_IMAGE_BYTES = 20 * 1024 * 1024
MAX_REQUEST_BYTES = 24 * 1024 * 1024  # 32 MiB as base64: the gateway's default --max-body-bytes
MEDIA_TYPES = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}


@dataclass(frozen=True)
class Attachment:
    path: Path  # absolute
    size: int  # bytes
    format: str  # Pillow's name: PNG, JPEG, WEBP, GIF
    width: int
    height: int

    @property
    def name(self) -> str:
        return self.path.name

    def label(self) -> str:
        return f"{self.name} ({human_bytes(self.size)}, {self.width}x{self.height})"


def human_bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}"
    raise AssertionError


def check_image(path: str | os.PathLike) -> Attachment:
    """The file at ``path`` (~ expanded, relative to the current directory) as an Attachment, or an
    InvalidArgumentError saying why it cannot be sent: missing, not a file, unreadable, too large,
    not an image the gateway decodes, too many pixels."""
    p = Path(path).expanduser()
    p = (p if p.is_absolute() else Path.cwd() / p).resolve()
    size = _stat(p)
    try:
        with open(p, "rb") as f:  # Pillow reads as much as the header takes, no pixels
            return _header(p, f, size)
    except PermissionError:
        raise InvalidArgumentError(f"{p} cannot be read (permission denied)") from None
    except OSError as e:
        raise InvalidArgumentError(f"{p} cannot be read: {e.strerror or e}") from None


def image_part(att: Attachment) -> tuple[dict, Attachment]:
    """The file read whole (and checked again: it may have changed since it was attached) as an
    ``image_url`` part with a data URL, and what it is now."""
    data = _read(att.path)
    now = _header(att.path, io.BytesIO(data), len(data))
    url = f"data:{MEDIA_TYPES[now.format]};base64,{base64.b64encode(data).decode('ascii')}"
    return {"type": "image_url", "image_url": {"url": url}}, now


def check_request_size(total: int) -> None:
    if total > MAX_REQUEST_BYTES:
        raise InvalidArgumentError(
            f"the images of this conversation are {human_bytes(total)} in all, more than the "
            f"{human_bytes(MAX_REQUEST_BYTES)} one request may carry (every turn resends its images)",
            hint="start a new chat (ctrl+n) or attach smaller images")


def _stat(p: Path) -> int:
    try:
        st = os.stat(p)
        if stat.S_ISDIR(st.st_mode):
            raise InvalidArgumentError(f"{p} is a folder, not an image file", hint="name an image file in it")
        if not stat.S_ISREG(st.st_mode):
            raise InvalidArgumentError(f"{p} is not a regular file")
        if st.st_size > MAX_IMAGE_BYTES:
            raise InvalidArgumentError(f"{p} is {human_bytes(st.st_size)}, more than the "
                                       f"{human_bytes(MAX_IMAGE_BYTES)} an attached image may be",
                                       hint="attach a smaller image (resize or re-encode it)")
        if st.st_size == 0:
            raise InvalidArgumentError(f"{p} is empty (0 bytes)")
        return st.st_size
    except FileNotFoundError:
        raise InvalidArgumentError(f"{p} does not exist", hint="check the path (relative to the folder the TUI "
                                   f"was started in, {Path.cwd()})") from None
    except PermissionError:
        raise InvalidArgumentError(f"{p} cannot be read (permission denied)") from None
    except OSError as e:
        raise InvalidArgumentError(f"{p} cannot be read: {e.strerror or e}") from None


def _read(p: Path) -> bytes:
    _stat(p)
    try:
        with open(p, "rb") as f:
            data = f.read(MAX_IMAGE_BYTES + 1)
    except PermissionError:
        raise InvalidArgumentError(f"{p} cannot be read (permission denied)") from None
    except OSError as e:
        raise InvalidArgumentError(f"{p} cannot be read: {e.strerror or e}") from None
    if len(data) > MAX_IMAGE_BYTES:
        raise InvalidArgumentError(f"{p} is more than the {human_bytes(MAX_IMAGE_BYTES)} an attached image may be")
    if not data:
        raise InvalidArgumentError(f"{p} is empty (0 bytes)")
    return data


def _header(p: Path, fp: BinaryIO, size: int) -> Attachment:
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(fp, formats=FORMATS)  # the header only: no pixels decoded
    except UnidentifiedImageError:
        raise InvalidArgumentError(f"{p} is not a PNG, JPEG, WebP or GIF image (or its header is corrupt)",
                                   hint="attach one of those formats") from None
    except Image.DecompressionBombError as e:
        raise InvalidArgumentError(f"{p} has too many pixels: {e}", hint="attach a smaller image") from None
    except (OSError, ValueError, SyntaxError) as e:
        raise InvalidArgumentError(f"{p} is truncated or corrupt (its header: {e})") from None
    w, h = img.size
    if w * h > MAX_PIXELS:
        raise InvalidArgumentError(f"{p} is {w} x {h} pixels, more than the {MAX_PIXELS:,} the gateway decodes",
                                   hint="attach a smaller image")
    return Attachment(p, size, img.format, w, h)
