"""surogate.io.videos: animated GIF / WebP / PNG decoded into the frames a sampler keeps (against
Pillow's own frame iteration), the clip's frame rate from the frames' durations, vLLM's frame list,
MP4 / WebM / AVI through PyAV (against transformers' read_video_pyav on the same file), and the
refusals (codec containers without PyAV, corrupt containers, too many frames, bad data)."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image, ImageSequence

from surogate.errors import InvalidArgumentError
from surogate.io import videos
from surogate.io.videos import Video, decode_video, load_video


def frames(n: int, seed: int = 0, size=(12, 8)) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    w, h = size
    return [Image.fromarray((rng.integers(0, 4, (h, w, 3)) * 85).astype(np.uint8)) for _ in range(n)]


def animated(pics, fmt: str, duration) -> bytes:
    buf = io.BytesIO()
    extra = {"lossless": True} if fmt == "WEBP" else {}
    pics[0].save(buf, fmt, save_all=True, append_images=pics[1:], duration=duration, loop=0, **extra)
    return buf.getvalue()


def every(total, fps):
    return range(total)


@pytest.mark.parametrize("fmt", ["GIF", "WEBP", "PNG"])
def test_animated_files_decode_to_pillows_frames_and_their_rate(fmt):
    pics = frames(5)
    data = animated(pics, fmt, 200)
    want = [f.convert("RGB") for f in ImageSequence.Iterator(Image.open(io.BytesIO(data)))]
    seen = []
    v = decode_video(data, lambda total, fps: seen.append((total, fps)) or [0, 2, 4], default_fps=2.0)
    assert seen == [(5, pytest.approx(5.0))]  # 5 frames of 200 ms: 5 frames a second
    assert v.frame_indices == (0, 2, 4) and v.fps == pytest.approx(5.0)
    assert all(np.array_equal(np.asarray(g), np.asarray(want[i])) for g, i in zip(v.frames, (0, 2, 4)))
    assert all(np.array_equal(np.asarray(g), np.asarray(pics[i])) for g, i in zip(v.frames, (0, 2, 4)))  # lossless


def test_frames_without_durations_take_the_default_rate_and_equal_videos_share_a_key():
    pics = frames(3)
    data = animated(pics, "PNG", 0)
    v = decode_video(data, every, default_fps=2.0)
    assert v.fps == 2.0 and v.frame_indices == (0, 1, 2)
    same = Video(tuple(pics), (0, 1, 2), 7.0)
    assert v.key == same.key and v.key != Video(tuple(pics[:2]), (0, 1), 2.0).key


def test_vllms_frame_list_is_taken_at_the_default_rate():
    pics = frames(4, seed=1)
    parts = []
    for p in pics:
        buf = io.BytesIO()
        p.save(buf, "PNG")
        parts.append(base64.b64encode(buf.getvalue()).decode())
    v = load_video("data:video/jpeg;base64," + ",".join(parts), lambda total, fps: [0, 3], default_fps=2.0)
    assert v.frame_indices == (0, 3) and v.fps == 2.0
    assert all(np.array_equal(np.asarray(g), np.asarray(pics[i])) for g, i in zip(v.frames, (0, 3)))


CONTAINERS = [
    (b"\x00\x00\x00\x18ftypmp42" + bytes(32), None, "an MP4 / MOV video"),
    (b"\x1a\x45\xdf\xa3" + bytes(32), "video/webm", "a WebM / MKV video"),
    (b"RIFF\x00\x00\x00\x00AVI LIST" + bytes(16), None, "an AVI video"),
    (b"\x00" * 40, "video/quicktime", "an MP4 / MOV video"),
]


def test_an_hls_playlist_is_not_a_container_we_let_ffmpeg_probe(tmp_path):
    """A playlist naming a local file: never handed to FFmpeg to probe (it would read the file)."""
    (tmp_path / "secret.ts").write_bytes(b"\x47" + bytes(187))
    playlist = f"#EXTM3U\n#EXT-X-TARGETDURATION:1\n#EXTINF:1,\nfile://{tmp_path}/secret.ts\n#EXT-X-ENDLIST\n"
    with pytest.raises(InvalidArgumentError, match="not a video this server decodes"):
        decode_video(playlist.encode(), every, 2.0, media_type="application/vnd.apple.mpegurl")
    with pytest.raises(InvalidArgumentError, match="not a container this server reads"):
        decode_video(playlist.encode(), every, 2.0, media_type="video/x-mpegurl")


@pytest.mark.parametrize("data, media_type, what", CONTAINERS)
def test_containers_without_pyav_are_refused_by_name(data, media_type, what, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "av", None)  # import av: ImportError
    with pytest.raises(InvalidArgumentError, match=f"is {what}, and this server has no video decoder") as e:
        decode_video(data, every, 2.0, media_type=media_type)
    assert "surogate[video]" in e.value.hint and "data:video/jpeg" in e.value.hint and "GIF" in e.value.hint


@pytest.mark.parametrize("data, media_type, what", [
    *CONTAINERS,
    (b"\x00" * 40, "video/x-ogm", "is a video/x-ogm video, not a container this server reads"),
    (b"not a video at all", None, "not an animated GIF, WebP or PNG"),
    (b"", "image/gif", "is empty"),
])
def test_what_we_cannot_decode_is_refused_by_name(data, media_type, what):
    if what.endswith(" video"):  # a container: PyAV reads it, and finds it corrupt
        pytest.importorskip("av")
        what = f"is truncated or corrupt \\({what.removesuffix(' video')}"
    with pytest.raises(InvalidArgumentError, match=what):
        decode_video(data, every, 2.0, media_type=media_type)


def encoded(pics, fmt: str, codec: str, fps: int, **options) -> bytes:
    """``pics`` encoded by PyAV (FFmpeg) into a ``fmt`` container."""
    av = pytest.importorskip("av")
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as c:
        s = c.add_stream(codec, rate=fps, options=options)
        s.width, s.height = pics[0].size
        s.pix_fmt = "yuv420p"
        for p in pics:
            for packet in s.encode(av.VideoFrame.from_image(p)):
                c.mux(packet)
        for packet in s.encode():
            c.mux(packet)
    return buf.getvalue()


def smooth(n: int, size=(64, 48)) -> list[Image.Image]:
    """Frames a lossy codec keeps close: moving gradients."""
    w, h = size
    y, x = np.mgrid[0:h, 0:w]
    return [Image.fromarray(np.stack([(x * 4 + 9 * i) % 256, (y * 5 + 5 * i) % 256, np.full_like(x, 30 * i % 256)],
                                     -1).astype(np.uint8)) for i in range(n)]


@pytest.mark.parametrize("fmt, codec, media_type", [("mp4", "mpeg4", "video/mp4"), ("mp4", "libx264", None),
                                                    ("webm", "libvpx-vp9", "video/webm"), ("avi", "mpeg4", None),
                                                    ("mov", "mpeg4", "video/quicktime")])
def test_containers_decode_as_transformers_reads_them_with_pyav(fmt, codec, media_type, tmp_path):
    """The frames, the frame count and rate the sampler sees, and the indices kept equal
    transformers' read_video_pyav on the same file (the loader its video processors use)."""
    av = pytest.importorskip("av")
    if codec not in av.codecs_available:
        pytest.skip(f"this PyAV build has no {codec} encoder")
    video_utils = pytest.importorskip("transformers.video_utils")
    pics = smooth(12)
    data = encoded(pics, fmt, codec, fps=6)
    path = tmp_path / f"clip.{fmt}"
    path.write_bytes(data)
    seen = []

    def sample(total, fps):
        seen.append((total, fps))
        return [0, 4, 7, 11]

    v = decode_video(data, sample, default_fps=2.0, media_type=media_type)
    ref, meta = video_utils.read_video_pyav(str(path), lambda metadata, **_: np.array([0, 4, 7, 11]))
    assert seen == [(12, 6.0)] and meta.fps == 6.0
    # WebM's header has no frame count: transformers reads 0 there, we count the stream's packets
    assert meta.total_num_frames == (0 if fmt == "webm" else 12)
    assert v.frame_indices == (0, 4, 7, 11) and v.fps == 6.0 and v.size == (64, 48)
    assert np.array_equal(np.stack([np.asarray(f) for f in v.frames]), ref)
    # and the frames are the clip's (a lossy codec: close, not equal)
    assert np.abs(np.asarray(v.frames[1], np.int16) - np.asarray(pics[4], np.int16)).mean() < 8


def test_a_truncated_container_is_refused_and_fewer_frames_than_promised_are_kept():
    pytest.importorskip("av")
    data = encoded(smooth(12), "mp4", "mpeg4", fps=6)
    with pytest.raises(InvalidArgumentError, match="truncated or corrupt|decodes none"):
        decode_video(data[: len(data) // 3], every, 2.0)
    v = decode_video(data, lambda total, fps: [0, total - 1], 2.0)
    assert v.frame_indices == (0, 11)


def test_container_limits_are_checked_before_decoding(monkeypatch):
    pytest.importorskip("av")
    data = encoded(smooth(6), "mp4", "mpeg4", fps=6)
    monkeypatch.setattr(videos, "MAX_VIDEO_FRAMES", 5)
    with pytest.raises(InvalidArgumentError, match="6 frames, more than the 5"):
        decode_video(data, every, 2.0)
    monkeypatch.setattr(videos, "MAX_VIDEO_FRAMES", 4096)
    monkeypatch.setattr(videos, "MAX_PIXELS", 64 * 47)
    with pytest.raises(InvalidArgumentError, match="64 x 48 pixels"):
        decode_video(data, every, 2.0)


def test_limits_are_checked_before_the_frames_are_kept(monkeypatch):
    data = animated(frames(6), "GIF", 100)
    monkeypatch.setattr(videos, "MAX_VIDEO_FRAMES", 5)
    with pytest.raises(InvalidArgumentError, match="6 frames, more than the 5"):
        decode_video(data, every, 2.0)
    monkeypatch.setattr(videos, "MAX_VIDEO_FRAMES", 4096)
    monkeypatch.setattr(videos, "MAX_VIDEO_PIXELS", 12 * 8 * 3)
    with pytest.raises(InvalidArgumentError, match="6 sampled frames"):
        decode_video(data, every, 2.0)
    assert len(decode_video(data, lambda total, fps: [0, 5], 2.0).frames) == 2  # fewer kept: within the budget


def test_urls_follow_the_media_rules(tmp_path):
    (tmp_path / "a.gif").write_bytes(animated(frames(2), "GIF", 100))
    with pytest.raises(InvalidArgumentError, match="remote video URLs are off"):
        load_video("https://example.com/a.gif", every, 2.0)
    with pytest.raises(InvalidArgumentError, match="local image files are off"):
        load_video(f"file://{tmp_path}/a.gif", every, 2.0)
    v = load_video(f"file://{tmp_path}/a.gif", every, 2.0, allowed_local_media_path=str(tmp_path))
    assert len(v.frames) == 2 and v.fps == pytest.approx(10.0)
