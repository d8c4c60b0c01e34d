"""surogate.io.videos: animated GIF / WebP / PNG decoded into the frames a sampler keeps (against
Pillow's own frame iteration), the clip's frame rate from the frames' durations, vLLM's frame list,
and the refusals (codec containers by their bytes or media type, too many frames, bad data)."""

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


@pytest.mark.parametrize("data, media_type, what", [
    (b"\x00\x00\x00\x18ftypmp42" + bytes(32), None, "an MP4 / MOV video"),
    (b"\x1a\x45\xdf\xa3" + bytes(32), "video/webm", "a WebM / MKV video"),
    (b"RIFF\x00\x00\x00\x00AVI LIST" + bytes(16), None, "an AVI video"),
    (b"\x00" * 40, "video/quicktime", "a video/quicktime video"),
    (b"not a video at all", None, "not an animated GIF, WebP or PNG"),
    (b"", "image/gif", "is empty"),
])
def test_what_we_cannot_decode_is_refused_by_name(data, media_type, what):
    with pytest.raises(InvalidArgumentError, match=what) as e:
        decode_video(data, every, 2.0, media_type=media_type)
    if "video" in what and "not" not in what:
        assert "data:video/jpeg" in e.value.hint and "GIF" in e.value.hint


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
