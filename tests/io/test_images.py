"""Image inputs (surogate.io.images): data URLs of each format decode to the pixels transformers'
own loaders give, the server's media rules (local folder, remote fetch) hold, and every bad image
is a clear error, a decompression bomb included."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.server
import io
import os
import struct
import threading
import time
import zlib

import numpy as np
import pytest
from PIL import Image

from surogate.errors import InvalidArgumentError
from surogate.io.images import decode_image, image_hash, load_image

transformers_image_utils = pytest.importorskip("transformers.image_utils")
from transformers.image_transforms import convert_to_rgb  # noqa: E402


def encoded(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def noise(w: int = 48, h: int = 32, channels: int = 3, seed: int = 0) -> Image.Image:
    a = np.random.default_rng(seed).integers(0, 256, (h, w, channels), dtype=np.uint8)
    return Image.fromarray(a, "RGB" if channels == 3 else "RGBA")


def pixels(img: Image.Image) -> np.ndarray:
    return np.asarray(img)


# -- decoding ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt,media_type", [("PNG", "image/png"), ("JPEG", "image/jpeg"), ("WEBP", "image/webp"),
                                            ("GIF", "image/gif")])
def test_each_format_decodes_as_transformers_load_image_does(fmt, media_type):
    data = encoded(noise(), fmt)
    img = load_image(data_url(data, media_type))
    ref = transformers_image_utils.load_image(data_url(data, media_type))
    assert img.mode == "RGB" and img.size == (48, 32)
    np.testing.assert_array_equal(pixels(img), pixels(ref))
    if fmt == "PNG":  # lossless: the very pixels that were encoded
        np.testing.assert_array_equal(pixels(img), pixels(noise()))


def test_the_exif_orientation_is_applied():
    img = noise(40, 20)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to view
    data = encoded(img, "JPEG", exif=exif.tobytes())
    out = load_image(data_url(data, "image/jpeg"))
    assert out.size == (20, 40)
    np.testing.assert_array_equal(pixels(out), pixels(transformers_image_utils.load_image(data_url(data))))


@pytest.mark.parametrize("fmt", ["PNG", "WEBP"])
def test_transparency_is_composited_onto_white_as_convert_to_rgb_does(fmt):
    rgba = noise(channels=4, seed=1)
    data = encoded(rgba, fmt, **({"lossless": True} if fmt == "WEBP" else {}))
    out = load_image(data_url(data))
    np.testing.assert_array_equal(pixels(out), convert_to_rgb(Image.open(io.BytesIO(data)), return_numpy=True))
    clear = Image.new("RGBA", (4, 4), (200, 10, 10, 0))  # fully transparent red: white
    assert set(load_image(data_url(encoded(clear, "PNG"))).get_flattened_data()) == {(255, 255, 255)}


def test_an_animated_gif_gives_its_first_frame():
    frames = [Image.new("RGB", (8, 8), c) for c in [(255, 0, 0), (0, 0, 255)]]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:], duration=50)
    assert set(load_image(data_url(buf.getvalue(), "image/gif")).get_flattened_data()) == {(255, 0, 0)}


def test_data_url_forms():
    data = encoded(noise(), "PNG")
    b64 = base64.b64encode(data).decode()
    want = pixels(noise())
    # line breaks (MIME base64), missing padding, no media type, a mislabelled type, percent-encoding
    for url in [f"data:image/png;base64,{b64[:50]}\n{b64[50:]}", f"data:image/png;base64,{b64.rstrip('=')}",
                f"data:;base64,{b64}", f"data:image/jpeg;base64,{b64}",
                "data:image/png," + "".join(f"%{b:02X}" for b in data)]:
        np.testing.assert_array_equal(pixels(load_image(url)), want)


@pytest.mark.parametrize("url,what", [
    ("data:image/png;base64,%%%%", "not valid base64"),
    ("data:image/png;base64", "no ','"),
    ("data:text/plain;base64,aGVsbG8=", "media type 'text/plain'"),
    ("data:image/png;base64,", "empty"),
    ("data:image/png;base64,aGVsbG8gd29ybGQ=", "not a PNG, JPEG, WebP or GIF"),
    ("", "empty"),
    ("relative/cat.png", "not an image URL"),
    ("ftp://host/cat.png", "not an image URL"),
])
def test_bad_data_urls_are_clear_errors(url, what):
    with pytest.raises(InvalidArgumentError, match=what):
        load_image(url)


@pytest.mark.parametrize("fmt", ["BMP", "TIFF", "ICO"])
def test_other_formats_are_refused(fmt):
    with pytest.raises(InvalidArgumentError, match="not a PNG, JPEG, WebP or GIF"):
        decode_image(encoded(noise(), fmt))


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "GIF"])
def test_truncated_data_is_a_clear_error(fmt):
    data = encoded(noise(64, 64), fmt)
    with pytest.raises(InvalidArgumentError, match="truncated or corrupt"):
        decode_image(data[:len(data) // 2])


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` (the bytes of a decompression bomb's start)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


@pytest.mark.parametrize("size", [(9000, 9000), (100_000, 100_000)])  # past our limit; past Pillow's own too
def test_a_decompression_bomb_is_refused_before_decoding(size):
    start = time.perf_counter()
    with pytest.raises(InvalidArgumentError, match="pixels"):
        decode_image(png_header_only(*size))
    assert time.perf_counter() - start < 1.0  # the header alone: nothing was expanded


def test_the_pixel_limit_is_a_parameter():
    data = encoded(noise(48, 32), "PNG")
    with pytest.raises(InvalidArgumentError, match="48 x 32 = 1,536 pixels, more than the 1,000"):
        decode_image(data, max_pixels=1000)
    assert decode_image(data, max_pixels=1536).size == (48, 32)


# -- image_hash ---------------------------------------------------------------------------------------


def test_image_hash_is_sha256_of_mode_size_and_pixels():
    img = noise()
    want = hashlib.sha256(b"RGB\0" + struct.pack("<II", 48, 32) + img.tobytes()).digest()
    assert image_hash(img) == want and len(want) == 32
    # the same pixels through another encoding hash the same; a changed pixel or shape does not
    assert image_hash(load_image(data_url(encoded(img, "WEBP", lossless=True), "image/webp"))) == want
    other = img.copy()
    other.putpixel((0, 0), (0, 0, 0) if img.getpixel((0, 0)) != (0, 0, 0) else (1, 1, 1))
    assert image_hash(other) != want
    flat = Image.frombytes("RGB", (32, 48), img.tobytes())  # same bytes, other shape
    assert image_hash(flat) != want


# -- local files ----------------------------------------------------------------------------------------


@pytest.fixture
def media(tmp_path):
    root = tmp_path / "media"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "cat.png").write_bytes(encoded(noise(), "PNG"))
    (tmp_path / "secret.png").write_bytes(encoded(noise(seed=2), "PNG"))
    return root


def test_local_files_inside_the_allowed_folder_load(media):
    want = pixels(noise())
    path = media / "sub" / "cat.png"
    for url in [f"file://{path}", str(path), f"file://localhost{path}", f"file://{media}/sub/../sub/cat.png",
                f"file://{str(path).replace('cat', '%63at')}"]:
        np.testing.assert_array_equal(pixels(load_image(url, allowed_local_media_path=str(media))), want)


def test_local_files_are_off_without_the_flag(media):
    with pytest.raises(InvalidArgumentError, match="local image files are off") as e:
        load_image(f"file://{media}/sub/cat.png")
    assert "--allowed-local-media-path" in e.value.hint


def test_nothing_outside_the_allowed_folder_is_read(media, tmp_path):
    (media / "link.png").symlink_to(tmp_path / "secret.png")
    (media / "dirlink").symlink_to(tmp_path)
    sibling = tmp_path / "media2"  # a folder whose name merely starts with the allowed one's
    sibling.mkdir()
    (sibling / "x.png").write_bytes(encoded(noise(), "PNG"))
    for url in [f"file://{media}/../secret.png", f"{media}/sub/../../secret.png", f"file://{media}/link.png",
                f"file://{media}/dirlink/secret.png", str(sibling / "x.png"), "/etc/passwd"]:
        with pytest.raises(InvalidArgumentError, match="outside the folder"):
            load_image(url, allowed_local_media_path=str(media))


@pytest.mark.parametrize("name,what", [("missing.png", "does not exist"), ("sub", "not a regular file")])
def test_missing_files_and_folders_are_clear_errors(media, name, what):
    with pytest.raises(InvalidArgumentError, match=what):
        load_image(str(media / name), allowed_local_media_path=str(media))


def test_file_urls_of_other_hosts_and_oversized_files_are_refused(media):
    with pytest.raises(InvalidArgumentError, match="file on this host"):
        load_image(f"file://otherhost{media}/sub/cat.png", allowed_local_media_path=str(media))
    with pytest.raises(InvalidArgumentError, match="more than the 100 an image may be"):
        load_image(str(media / "sub" / "cat.png"), allowed_local_media_path=str(media), max_bytes=100)


# -- remote ------------------------------------------------------------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    png = encoded(noise(), "PNG")

    def do_GET(self):  # noqa: N802
        if self.path == "/cat.png":
            self._send(200, self.png)
        elif self.path == "/unsized":  # no Content-Length: read until the server closes
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"\0" * 5000)
        elif self.path == "/slow":
            self.send_response(200)
            self.end_headers()
            for _ in range(40):
                self.wfile.write(b"\0" * 10)
                self.wfile.flush()
                time.sleep(0.05)
        elif self.path in ("/to-file", "/to-ftp"):
            self.send_response(302)
            self.send_header("Location", "file:///etc/passwd" if self.path == "/to-file" else "ftp://127.0.0.1/x")
            self.end_headers()
        elif self.path == "/to-cat":
            self.send_response(301)
            self.send_header("Location", "/cat.png")
            self.end_headers()
        else:
            self._send(404, b"no")

    def _send(self, status: int, body: bytes):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def http_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def remote():
    saved = {v: os.environ.pop(v) for v in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY") if v in os.environ}
    try:  # loopback, not through a proxy the environment names
        with http_server() as base:
            yield base
    finally:
        os.environ.update(saved)


def test_remote_urls_are_off_without_the_flag(remote):
    with pytest.raises(InvalidArgumentError, match="remote image URLs are off") as e:
        load_image(f"{remote}/cat.png")
    assert "--allow-remote-media" in e.value.hint


def test_remote_urls_are_fetched_with_the_flag(remote):
    for path in ("/cat.png", "/to-cat"):
        np.testing.assert_array_equal(pixels(load_image(remote + path, allow_remote=True)), pixels(noise()))


@pytest.mark.parametrize("path,kw,what", [
    ("/missing.png", {}, "HTTP 404"),
    ("/cat.png", {"max_bytes": 100}, "more than the 100"),  # Content-Length says so
    ("/unsized", {"max_bytes": 1000}, "more than the 1,000"),  # counted while reading
    ("/slow", {"timeout": 0.5}, "took more than 0.5 s"),  # the whole fetch, not one read
    ("/to-file", {}, "Redirection to url 'file:///etc/passwd' is not allowed"),  # urllib's own rule
    ("/to-ftp", {}, "redirects to `ftp://127.0.0.1/x`, which is not http"),  # ours: urllib would follow it
])
def test_remote_fetch_limits(remote, path, kw, what):
    start = time.perf_counter()
    with pytest.raises(InvalidArgumentError, match=what):
        load_image(remote + path, allow_remote=True, **kw)
    assert time.perf_counter() - start < 1.5


def test_an_unreachable_host_is_a_clear_error():
    with http_server() as base:
        pass  # closed: nothing listens there now
    with pytest.raises(InvalidArgumentError, match="fetching .* failed"):
        load_image(f"{base}/cat.png", allow_remote=True)
