"""Qwen3-VL videos through the gateway: OpenAI chat ``video_url`` parts (vLLM's extension) against
the tiny random Qwen3-VL (sgtest/vision.py make_qwen3_vl_chat, with a video processor config), in
process (the ASGI app over the openai SDK):

- an animated GIF data URL, the same frames as a lossless WebP file (``--allowed-local-media-path``)
  and vLLM's ``data:video/jpeg`` frame list: each greedy answer equals LLM.chat called directly with
  the same frames (surogate.io.videos.Video), and transformers' Qwen3VLForConditionalGeneration
  .generate on our prompt ids and pixel rows (the video processor equals transformers' in
  tests/io/test_image_processing.py); usage.prompt_tokens is the expanded prompt's length;
- the same video again is not encoded again (the encoder cache keyed by the video's hash);
- an MP4 (PyAV, the optional ``video`` extra) answers as the engine does on transformers'
  read_video_pyav frames of the same file;
- 400s naming the part: a corrupt MP4, a one-frame clip, a remote URL, too many videos, a model that reads
  no videos (text-only; images only).
"""

from __future__ import annotations

import asyncio
import base64
import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from PIL import Image  # noqa: E402

from sgtest.vision import QWEN3_VL_VIDEO_PREPROCESSOR, b64, make_qwen3_vl_chat, qwen3_vl_reference  # noqa: E402
from surogate.gateway.app import GatewayApp  # noqa: E402
from surogate.gateway.models import GatewayConfig, ServedModel  # noqa: E402
from surogate.io.videos import Video  # noqa: E402
from surogate.serve import LLM, SamplingParams  # noqa: E402
from surogate.serve.launch import launch  # noqa: E402

N = 6
MODEL = "q3vl"
FPS = 4.0  # the clips' frame rate: 250 ms a frame
QUESTION = "What happens in this clip?"


def frames(seed: int, n: int = 7, size=(40, 30)) -> list[Image.Image]:
    """Random frames of 64 colours (a GIF holds them exactly)."""
    w, h = size
    rng = np.random.default_rng(seed)
    return [Image.fromarray((rng.integers(0, 4, (h, w, 3)) * 85).astype(np.uint8)) for _ in range(n)]


def animated(pics: list[Image.Image], fmt: str) -> bytes:
    buf = io.BytesIO()
    extra = {"lossless": True} if fmt == "WEBP" else {}
    pics[0].save(buf, fmt, save_all=True, append_images=pics[1:], duration=int(1000 / FPS), loop=0, **extra)
    return buf.getvalue()


def video_part(url: str) -> dict:
    return {"type": "video_url", "video_url": {"url": url}}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_qwen3_vl_chat(tmp_path_factory.mktemp("q3vl"), seed=4)


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("videos")


@pytest.fixture(scope="module")
def served(folder, media_dir):
    m = launch(str(folder), kv_cache_tokens=2048)
    llm = m.llm()
    images_only = LLM(None, m.model.tokenizer, max_model_len=2048, image_placeholder=llm.image_placeholder)
    text_only = LLM(None, m.model.tokenizer, max_model_len=2048)
    app = GatewayApp([ServedModel(MODEL, llm), ServedModel("images-only", images_only),
                      ServedModel("text-only", text_only)],
                     GatewayConfig(allowed_local_media_path=str(media_dir), max_videos_per_prompt=1))
    yield m, llm, app
    m.client.close()


def chat(app, content: list[dict], model: str = MODEL):
    async def call():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw", timeout=120) as h:
            client = openai.AsyncOpenAI(api_key="none", base_url="http://gw/v1", http_client=h, max_retries=0)
            return await client.chat.completions.create(
                model=model, max_tokens=N, temperature=0, extra_body={"ignore_eos": True},
                messages=[{"role": "user", "content": content}])

    return asyncio.run(call())


def direct(llm, video: Video) -> tuple[list[int], list[int]]:
    """LLM.chat with the video itself: (answer ids, prompt ids)."""
    messages = [{"role": "user", "content": [{"type": "text", "text": QUESTION}, {"type": "video"}]}]
    prompt = llm.render(messages, videos=[video])
    out = llm.chat(messages, SamplingParams(temperature=0.0, max_tokens=N, ignore_eos=True),
                   videos=[video]).result(timeout=120)[0]
    return out.new_token_ids, prompt.token_ids


def hf_answer(folder, llm, video: Video, prompt_ids: list[int]) -> list[int]:
    """transformers' greedy answer on our prompt ids and the video processor's pixel rows."""
    ref, _ = qwen3_vl_reference(folder)
    batch = llm.images.prompt.video.batch(video)
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = ref.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=N,
                           min_new_tokens=N, eos_token_id=None, pad_token_id=0,
                           pixel_values_videos=torch.tensor(batch.pixel_values),
                           video_grid_thw=torch.tensor(batch.image_grid_thw),
                           mm_token_type_ids=(ids == ref.config.video_token_id).long() * 2)
    return out[0, len(prompt_ids):].tolist()


def sampled(pics, fps: float) -> Video:
    """The Video the processor's sampling keeps of ``pics`` at ``fps`` (its own rule, as the server's)."""
    keep = np.linspace(0, len(pics) - 1, min(max(int(len(pics) / fps * QWEN3_VL_VIDEO_PREPROCESSOR["fps"]),
                                                 QWEN3_VL_VIDEO_PREPROCESSOR["min_frames"]),
                                             QWEN3_VL_VIDEO_PREPROCESSOR["max_frames"], len(pics))).round().astype(int)
    return Video(tuple(pics[i] for i in keep), tuple(int(i) for i in keep), fps)


def test_a_gif_and_a_webp_file_answer_as_the_engine_and_transformers_do(served, folder, media_dir):
    m, llm, app = served
    pics = frames(1)  # 7 frames at 4 fps: 1.75 s, sampled at 2 fps to 3 frames
    video = sampled(pics, FPS)
    assert video.frame_indices == (0, 3, 6)
    want, prompt_ids = direct(llm, video)
    assert want == hf_answer(folder, llm, video, prompt_ids)
    tok = m.model.tokenizer
    text = tok.decode(want, skip_special_tokens=True)

    gif = f"data:image/gif;base64,{base64.b64encode(animated(pics, 'GIF')).decode()}"
    r = chat(app, [{"type": "text", "text": QUESTION}, video_part(gif)])
    assert r.choices[0].message.content == text
    assert r.usage.prompt_tokens == len(prompt_ids)

    (media_dir / "clip.webp").write_bytes(animated(pics, "WEBP"))
    encodes = m.images.encodes
    r = chat(app, [{"type": "text", "text": QUESTION}, video_part(f"file://{media_dir / 'clip.webp'}")])
    assert r.choices[0].message.content == text
    assert m.images.encodes == encodes  # the same frames: the encoder's cache, keyed by the video's hash


def test_a_frame_list_is_taken_at_the_processors_rate(served, folder):
    m, llm, app = served
    pics = frames(2, n=4, size=(30, 40))
    video = Video(tuple(pics), tuple(range(4)), float(QWEN3_VL_VIDEO_PREPROCESSOR["fps"]))  # every frame, at 2 fps
    want, prompt_ids = direct(llm, video)
    assert want == hf_answer(folder, llm, video, prompt_ids)
    url = "data:video/jpeg;base64," + ",".join(b64(p) for p in pics)  # vLLM's form (PNG frames: lossless)
    r = chat(app, [{"type": "text", "text": QUESTION}, video_part(url)])
    assert r.choices[0].message.content == m.model.tokenizer.decode(want, skip_special_tokens=True)
    assert r.usage.prompt_tokens == len(prompt_ids)


def test_an_mp4_answers_as_the_engine_does_on_transformers_frames(served, folder, media_dir):
    av = pytest.importorskip("av")
    from transformers.video_utils import read_video_pyav

    m, llm, app = served
    pics = frames(6, n=8)
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as c:
        s = c.add_stream("mpeg4", rate=int(FPS))
        s.width, s.height, s.pix_fmt = 40, 30, "yuv420p"
        for p in [*(s.encode(av.VideoFrame.from_image(p)) for p in pics), s.encode()]:
            for packet in p:
                c.mux(packet)
    (media_dir / "clip.mp4").write_bytes(buf.getvalue())
    keep = sampled(pics, FPS).frame_indices  # 8 frames at 4 fps: 2 s, 4 frames at the processor's 2 fps
    ref, _ = read_video_pyav(str(media_dir / "clip.mp4"), lambda metadata, **_: np.array(keep))
    video = Video(tuple(Image.fromarray(f) for f in ref), keep, FPS)
    want, prompt_ids = direct(llm, video)
    assert want == hf_answer(folder, llm, video, prompt_ids)
    text = m.model.tokenizer.decode(want, skip_special_tokens=True)
    url = f"data:video/mp4;base64,{base64.b64encode(buf.getvalue()).decode()}"
    for part in (video_part(url), video_part(f"file://{media_dir / 'clip.mp4'}")):
        r = chat(app, [{"type": "text", "text": QUESTION}, part])
        assert r.choices[0].message.content == text and r.usage.prompt_tokens == len(prompt_ids)


def mp4() -> str:
    box = b"\x00\x00\x00\x18ftypisom\x00\x00\x02\x00isomiso2"
    return f"data:video/mp4;base64,{base64.b64encode(box + bytes(64)).decode()}"


try:
    import av  # noqa: F401

    CORRUPT_MP4 = "is truncated or corrupt (an MP4 / MOV"
except ImportError:
    CORRUPT_MP4 = "is an MP4 / MOV video, and this server has no video decoder"


@pytest.mark.parametrize("model, content, what", [
    (MODEL, [video_part(mp4())], CORRUPT_MP4),
    (MODEL, [video_part(f"data:image/png;base64,{b64(frames(3, n=1)[0])}")], "shorter than temporal_patch_size"),
    (MODEL, [video_part("https://example.com/clip.gif")], "remote video URLs are off"),
    (MODEL, [video_part("data:video/jpeg;base64,AAAA"), video_part("data:video/jpeg;base64,AAAA")],
     "2 videos; this server takes at most 1"),
    ("text-only", [video_part("data:video/jpeg;base64,AAAA")], "takes no images or videos"),
    ("images-only", [video_part("data:video/jpeg;base64,AAAA")], "reads images but no videos"),
])
def test_videos_the_server_cannot_take_are_400s_naming_the_part(served, model, content, what):
    _, _, app = served
    with pytest.raises(openai.BadRequestError) as e:
        chat(app, [{"type": "text", "text": "?"}, *content], model=model)
    param = "messages[0].content[2]" if "at most" in what else "messages[0].content[1]"
    assert e.value.body["param"] == param and what in e.value.body["message"], e.value.body
    if "no video decoder" in what:
        assert "animated GIF, WebP or PNG" in e.value.body["message"] and "data:video/jpeg" in e.value.body["message"]


def test_a_videos_prompt_text_is_transformers_expansion(served):
    """VideoPrompt.text_of is Qwen3VLProcessor.replace_video_token's text (timestamps of the sampled
    frames, pad tokens per frame), which replaces the template's whole placeholder as vLLM does."""
    from types import SimpleNamespace

    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.video_utils import VideoMetadata

    _, llm, _ = served
    video = sampled(frames(5, n=11), 3.0)  # 3.67 s at 2 fps: 7 frames of 11, the last temporal patch padded
    assert len(video.frames) == 7
    grid = llm.images.prompt.video.batch(video).image_grid_thw
    stub = SimpleNamespace(video_processor=SimpleNamespace(merge_size=2, temporal_patch_size=2),
                           vision_start_token="<|vision_start|>", vision_end_token="<|vision_end|>",
                           video_token="<|video_pad|>")
    stub._calculate_timestamps = lambda *a: Qwen3VLProcessor._calculate_timestamps(stub, *a)
    meta = VideoMetadata(total_num_frames=11, fps=3.0, frames_indices=list(video.frame_indices))
    want = Qwen3VLProcessor.replace_video_token(stub, {"video_grid_thw": grid, "video_metadata": [meta]}, 0)
    assert llm.images.prompt.video.text_of(video) == want
    assert want.count("seconds>") == 4 and want.count("<|video_pad|>") == 4 * 4
