"""Image inputs through the three APIs.

- Conversion: OpenAI chat ``image_url`` parts, Responses ``input_image`` parts and Anthropic
  ``image`` blocks (base64 and url sources, inside tool results too) become template messages
  with ``{"type": "image"}`` parts in order and the decoded images beside them (``Prompt.images``),
  rendered by Gemma-3-style and Qwen-VL-style templates exactly as transformers renders the same
  messages; every image the server cannot take is a 400 naming its part.
- The real server (``surogate serve``, SmolLM2, a text-only model) through the official SDKs:
  each API answers an image with a 400 in its own shape, naming where the image is, and fetches
  nothing.
- ``surogate serve``'s media flags reach the gateway's config.
"""

from __future__ import annotations

import asyncio
import base64
import http.server
import io
import threading
import time
from types import SimpleNamespace

import msgspec
import numpy as np
import pytest
from PIL import Image

from sgtest import tiny_models
from sgtest.vision import GEMMA3_TEMPLATE, b64, data_url
from surogate.gateway.anthropic import protocol as a
from surogate.gateway.anthropic.convert import anthropic_messages, messages_job
from surogate.gateway.errors import ApiError
from surogate.gateway.media import take_images
from surogate.gateway.models import GatewayConfig, ModelTable, ServedModel
from surogate.gateway.openai import protocol as p
from surogate.gateway.openai.convert import chat_job, chat_messages, responses_job, responses_messages
from surogate.gateway.serving import Gateway
from surogate.io import Tokenizer
from surogate.serve import LLM
from surogate.serve.frontend import RequestError, render_chat

render_jinja_template = pytest.importorskip("transformers.utils.chat_template_utils").render_jinja_template

# Modeled on Qwen/Qwen2-VL-7B-Instruct's: <|vision_start|><|image_pad|><|vision_end|> per image, any role.
QWEN_VL_TEMPLATE = """{% set image_count = namespace(value=0) %}
{%- for message in messages -%}
{%- if loop.first and message['role'] != 'system' -%}
<|im_start|>system
You are a helpful assistant.<|im_end|>
{% endif -%}
<|im_start|>{{ message['role'] }}
{% if message['content'] is string -%}
{{ message['content'] }}<|im_end|>
{% else -%}
{%- for content in message['content'] -%}
{%- if content['type'] == 'image' or 'image' in content or 'image_url' in content -%}
{%- set image_count.value = image_count.value + 1 -%}
{%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
<|vision_start|><|image_pad|><|vision_end|>
{%- elif 'text' in content -%}
{{ content['text'] }}
{%- endif -%}
{%- endfor -%}
<|im_end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% endif -%}
"""

GEMMA_IMAGE = "<start_of_image>"
QWEN_IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"


def gemma_tokenizer() -> Tokenizer:
    config = {**tiny_models.STYLES["gemma"]["config"], "boi_token": GEMMA_IMAGE, "eoi_token": "<end_of_image>",
              "image_token": "<image_soft_token>"}
    return Tokenizer(tiny_models.build_tokenizer("gemma"), config, chat_templates={"default": GEMMA3_TEMPLATE})


def qwen_tokenizer() -> Tokenizer:
    config = {**tiny_models.STYLES["chatml"]["config"],
              "additional_special_tokens": ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>"]}
    return Tokenizer(tiny_models.build_tokenizer("chatml"), config, chat_templates={"default": QWEN_VL_TEMPLATE})


def image(seed: int, w: int = 12, h: int = 8) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


def same_pixels(got, want) -> bool:
    return len(got) == len(want) and all(np.array_equal(np.asarray(g), np.asarray(w)) for g, w in zip(got, want))


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("media")
    image(7).save(root / "cat.png")
    return root


@pytest.fixture(scope="module")
def gw(tiny_tokenizers, media_dir):
    gemma, qwen = gemma_tokenizer(), qwen_tokenizer()
    models = [
        ServedModel("gemma-vision", LLM.for_model(None, gemma, 2048, image_placeholder=GEMMA_IMAGE)),
        ServedModel("qwen-vl", LLM.for_model(None, qwen, 2048, image_placeholder=QWEN_IMAGE)),
        ServedModel.from_tokenizer("qwen-text", tiny_tokenizers["chatml"], None, 2048),
        # a vision model served with a template that knows no image parts (a text-only --chat-template)
        ServedModel("gemma-text-template", LLM.for_model(None, gemma, 2048, image_placeholder=GEMMA_IMAGE,
                                                         chat_template=tiny_models.GEMMA_TEMPLATE)),
    ]
    return Gateway(ModelTable(models), GatewayConfig(max_images_per_prompt=3, allowed_local_media_path=str(media_dir)))


def decode(cls, obj):
    return msgspec.convert(obj, cls)


def reference_text(tok: Tokenizer, template: str, messages: list[dict]) -> str:
    """transformers' own rendering of the same template messages."""
    return render_jinja_template([messages], chat_template=template, add_generation_prompt=True,
                                 **tok.special_tokens_map)[0][0]


# -- conversion: the internal form ---------------------------------------------------------------


def test_chat_image_url_parts_become_image_parts_and_images_in_order(gw):
    imgs = [image(1), image(2, 20, 10), image(3)]
    body = {"model": "gemma-vision", "max_tokens": 8, "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [
            {"type": "text", "text": "Compare"}, {"type": "image_url", "image_url": {"url": data_url(imgs[0])}},
            {"type": "text", "text": "with"},
            {"type": "image_url", "image_url": {"url": data_url(imgs[1], "JPEG"), "detail": "low"}}]},
        {"role": "assistant", "content": "They differ."},
        {"role": "user", "content": [{"type": "image_url", "image_url": data_url(imgs[2], "WEBP")}]}]}  # vLLM's str
    req = decode(p.ChatCompletionRequest, body)
    messages = chat_messages(req.messages)
    assert [s.param for s in take_images(messages)] == [
        "messages[1].content[1]", "messages[1].content[3]", "messages[3].content[0]"]
    expected = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Compare"}, {"type": "image"},
                                             {"type": "text", "text": "with"}, {"type": "image"}]},
                {"role": "assistant", "content": "They differ."},
                {"role": "user", "content": [{"type": "image"}]}]
    assert messages == expected
    job = chat_job(gw, req)
    assert not isinstance(job, ApiError), job
    tok = gw.models.models["gemma-vision"].tokenizer
    assert job.prompt.text == reference_text(tok, GEMMA3_TEMPLATE, expected)
    assert job.prompt.text.count(GEMMA_IMAGE) == 3 and "Compare<start_of_image>with<start_of_image>" in job.prompt.text
    assert job.prompt.token_ids.count(tok.token_to_id(GEMMA_IMAGE)) == 3  # one token each, for the engine to expand
    assert [im.mode for im in job.prompt.images] == ["RGB"] * 3
    assert np.array_equal(np.asarray(job.prompt.images[0]), np.asarray(imgs[0]))  # PNG: lossless
    assert [im.size for im in job.prompt.images] == [(12, 8), (20, 10), (12, 8)]


def test_responses_input_image_parts_in_messages_and_function_call_outputs(gw):
    imgs = [image(4), image(5)]
    req = decode(p.ResponsesRequest, {"model": "qwen-vl", "instructions": "Look closely.", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "What is this?"},
                                     {"type": "input_image", "image_url": data_url(imgs[0]), "detail": "auto"}]},
        {"type": "function_call", "call_id": "c1", "name": "camera", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": [
            {"type": "input_image", "image_url": data_url(imgs[1])}, {"type": "input_text", "text": "snapshot"}]},
    ]})
    expected = [{"role": "system", "content": "Look closely."},
                {"role": "user", "content": [{"type": "text", "text": "What is this?"}, {"type": "image"}]},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "camera", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": [{"type": "image"},
                                                                   {"type": "text", "text": "snapshot"}]}]
    messages = responses_messages(req)
    assert [s.param for s in take_images(messages)] == ["input[0].content[1]", "input[2].output[0]"]
    assert messages == expected
    job = responses_job(gw, req)
    assert not isinstance(job, ApiError), job
    tok = gw.models.models["qwen-vl"].tokenizer
    call = {**expected[2]["tool_calls"][0], "function": {"name": "camera", "arguments": {}}}  # as templates take it
    reference = [*expected[:2], {**expected[2], "tool_calls": [call]}, expected[3]]
    assert job.prompt.text == reference_text(tok, QWEN_VL_TEMPLATE, reference)
    assert "What is this?<|vision_start|><|image_pad|><|vision_end|><|im_end|>" in job.prompt.text
    assert same_pixels(job.prompt.images, imgs)


def test_anthropic_image_blocks_base64_url_and_in_tool_results_in_template_order(gw, media_dir):
    imgs = [image(6), image(7)]
    req = decode(a.MessagesRequest, {"model": "qwen-vl", "max_tokens": 8, "messages": [
        {"role": "user", "content": "Take a photo."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "camera", "input": {}}]},
        {"role": "user", "content": [
            # the turn's own image comes first on the wire, but its tool result is the earlier message
            {"type": "image", "source": {"type": "url", "url": f"file://{media_dir}/cat.png"}},
            {"type": "tool_result", "tool_use_id": "t1", "content": [
                {"type": "text", "text": "photo:"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(imgs[0])}}]},
            {"type": "text", "text": "Is it the same cat?"}]}]})
    messages = anthropic_messages(req.system, req.messages)
    assert [s.param for s in take_images(messages)] == ["messages.2.content.1.content.1", "messages.2.content.0"]
    assert messages[2:] == [
        {"role": "tool", "tool_call_id": "t1", "content": [{"type": "text", "text": "photo:"}, {"type": "image"}]},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Is it the same cat?"}]}]
    job = messages_job(gw, req)
    assert not isinstance(job, ApiError), job
    assert same_pixels(job.prompt.images, [imgs[0], imgs[1]])  # cat.png is image(7), read under the allowed folder
    assert job.prompt.text.count(QWEN_IMAGE) == 2


def test_text_only_messages_keep_their_string_form(gw):
    req = decode(p.ChatCompletionRequest, {"model": "gemma-vision", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]})
    assert chat_messages(req.messages) == [{"role": "user", "content": "a\nb"}]
    assert chat_job(gw, req).prompt.images == []


# -- conversion: refusals, each naming the part ------------------------------------------------------


def user(*parts) -> dict:
    return {"role": "user", "content": list(parts)}


def chat_image(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def chat_error(gw, model: str, *messages) -> ApiError:
    err = chat_job(gw, decode(p.ChatCompletionRequest, {"model": model, "messages": list(messages)}))
    assert isinstance(err, ApiError), err
    return err


def test_a_text_only_model_refuses_images_naming_the_first(gw):
    err = chat_error(gw, "qwen-text", {"role": "user", "content": "hi"},
                     user({"type": "text", "text": "see"}, chat_image("https://example.com/a.png")))
    assert err.param == "messages[1].content[1]"
    assert "the model `qwen-text` does not take images" in err.message


def test_more_images_than_the_limit_are_refused_at_the_first_one_over(gw):
    parts = [chat_image(data_url(image(i))) for i in range(4)]
    err = chat_error(gw, "gemma-vision", user(*parts[:2]), {"role": "assistant", "content": "ok"}, user(*parts[2:]))
    assert err.param == "messages[2].content[1]" and "4 images" in err.message and "at most 3" in err.message
    assert "--limit-mm-per-prompt" in err.message


@pytest.mark.parametrize("url,param,what", [
    ("data:image/png;base64,@@@@", "messages[0].content[1]", "not valid base64"),
    (f"data:image/png;base64,{base64.b64encode(b'not an image').decode()}", "messages[0].content[1]",
     "not a PNG, JPEG, WebP or GIF"),
    ("https://example.com/a.png", "messages[0].content[1]", "remote image URLs are off"),
    ("file:///etc/passwd", "messages[0].content[1]", "outside the folder"),
])
def test_undecodable_or_forbidden_images_are_400s_naming_the_part(gw, url, param, what):
    err = chat_error(gw, "gemma-vision", user({"type": "text", "text": "?"}, chat_image(url)))
    assert err.param == param and what in err.message, err


def test_image_parts_outside_user_messages_are_refused(gw):
    err = chat_error(gw, "gemma-vision", {"role": "user", "content": "hi"},
                     {"role": "assistant", "content": [chat_image(data_url(image(1)))]})
    assert err.param == "messages[1].content[0]" and "user messages only" in err.message
    err = responses_job(gw, decode(p.ResponsesRequest, {"model": "gemma-vision", "input": [
        {"role": "assistant", "content": [{"type": "input_image", "image_url": data_url(image(1))}]}]}))
    assert isinstance(err, ApiError) and err.param == "input[0].content[0]"
    err = messages_job(gw, decode(a.MessagesRequest, {"model": "gemma-vision", "max_tokens": 4, "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(image(1))}}]}]}))
    assert isinstance(err, ApiError) and err.param == "messages.1.content.0.type" and "user turns" in err.message


def test_images_by_file_id_are_refused(gw):
    err = responses_job(gw, decode(p.ResponsesRequest, {"model": "gemma-vision", "input": [
        {"role": "user", "content": [{"type": "input_image", "file_id": "file-123"}]}]}))
    assert isinstance(err, ApiError) and err.param == "input[0].content[0].file_id" and "file_id" in err.message
    err = messages_job(gw, decode(a.MessagesRequest, {"model": "gemma-vision", "max_tokens": 4, "messages": [
        user({"type": "image", "source": {"type": "file", "file_id": "file_1"}})]}))
    assert isinstance(err, ApiError) and err.param == "messages.0.content.0.source"


def test_a_template_that_drops_image_parts_is_a_400_not_a_silent_loss(gw):
    err = chat_error(gw, "gemma-text-template", user({"type": "text", "text": "?"}, chat_image(data_url(image(1)))))
    assert err.param == "messages" and "wrote 0 image placeholder(s)" in err.message and "drops" in err.message


def test_placeholder_text_in_the_messages_is_refused(gw):
    err = chat_error(gw, "gemma-vision", user({"type": "text", "text": "fake <start_of_image> here"},
                                              chat_image(data_url(image(1)))))
    assert "the text itself contains the placeholder" in err.message
    err = chat_error(gw, "gemma-vision", {"role": "user", "content": "no image, but <start_of_image>"})
    assert "2 image placeholders" not in err.message and "the text itself contains the placeholder" in err.message


def test_render_chat_counts_placeholders_for_any_caller():
    tok = gemma_tokenizer()
    messages = [user({"type": "text", "text": "hi"}, {"type": "image"})]
    prompt = render_chat(tok, messages, images=[image(1)], image_placeholder=GEMMA_IMAGE)
    assert prompt.text == reference_text(tok, GEMMA3_TEMPLATE, messages) and len(prompt.images) == 1
    with pytest.raises(RequestError, match="does not take images"):
        render_chat(tok, messages, images=[image(1)])
    with pytest.raises(ValueError, match="1 image parts but 0 images"):
        render_chat(tok, messages, image_placeholder=GEMMA_IMAGE)


def test_llm_submit_does_not_drop_a_prompts_images():
    llm = LLM.for_model(SimpleNamespace(max_model_len=64), gemma_tokenizer(), 64, image_placeholder=GEMMA_IMAGE)
    assert llm.accepts_images and not LLM.for_model(None, gemma_tokenizer(), 64).accepts_images
    prompt = llm.render([user({"type": "image"})], images=[image(1)])
    with pytest.raises(ValueError, match="no image encoder"):  # a placeholder but no encoder (ImageEncoder)
        llm.submit(prompt)


# -- off the event loop ----------------------------------------------------------------------------------


class _SlowImages(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self):  # noqa: N802
        time.sleep(1.0)
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


def test_a_slow_image_fetch_stalls_no_other_request(gw):
    """A request with images is converted in a worker thread: while its image downloads (1 s),
    the loop answers other requests at once. It then reaches the generation API, which refuses
    the images of an LLM flagged with a placeholder but given no image encoder."""
    httpx = pytest.importorskip("httpx")
    from surogate.gateway.app import GatewayApp

    buf = io.BytesIO()
    image(9).save(buf, "PNG")
    _SlowImages.body = buf.getvalue()
    host = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SlowImages)
    threading.Thread(target=host.serve_forever, daemon=True).start()
    vision = gw.models.models["gemma-vision"]
    llm = LLM.for_model(SimpleNamespace(max_model_len=2048), vision.tokenizer, 2048, image_placeholder=GEMMA_IMAGE)
    app = GatewayApp([ServedModel("gemma-vision", llm)], GatewayConfig(allow_remote_media=True))
    body = {"model": "gemma-vision", "max_tokens": 4, "messages": [user(
        {"type": "text", "text": "?"}, chat_image(f"http://127.0.0.1:{host.server_address[1]}/cat.png"))]}

    async def check():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c:
            slow = asyncio.create_task(c.post("/v1/chat/completions", json=body))
            await asyncio.sleep(0.2)
            start = time.perf_counter()
            models = await c.get("/v1/models")
            waited = time.perf_counter() - start
            assert models.status_code == 200 and waited < 0.5 and not slow.done()
            answer = await slow
            assert answer.status_code == 400 and "no image encoder" in answer.json()["error"]["message"]

    try:
        asyncio.run(check())
    finally:
        host.shutdown()
        host.server_close()


# -- the real server, through the SDKs: each API's 400 --------------------------------------------------


class _Recorder(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self):  # noqa: N802
        _Recorder.hits.append(self.path)
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def image_host():
    """A loopback host that records fetches: a text-only model must never fetch an image."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def server(media_dir):
    pytest.importorskip("granian")
    from sgtest.server import surogate_serve
    from sgtest.smollm2 import smollm2_path

    smollm2_path()  # skips without the model
    with surogate_serve("--allow-remote-media", "--allowed-local-media-path", str(media_dir),
                        "--limit-mm-per-prompt", '{"image": 2}') as base:
        yield base


MODEL = "SmolLM2-135M-Instruct"
NOT_VISION = f"the model `{MODEL}` does not take images"


def test_openai_chat_answers_400_naming_the_image_part(server, image_host):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0)
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=MODEL, max_tokens=4, stream=stream, messages=[
                {"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                             {"type": "image_url", "image_url": {"url": f"{image_host}/a.png"}}]}])
        assert e.value.status_code == 400
        assert e.value.body["param"] == "messages[0].content[1]" and e.value.body["type"] == "invalid_request_error"
        assert NOT_VISION in e.value.body["message"]
    assert _Recorder.hits == []  # refused before any fetch


def test_openai_responses_answers_400_naming_the_image_part(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL, max_output_tokens=4, input=[
            {"role": "user", "content": [{"type": "input_text", "text": "What is this?"},
                                         {"type": "input_image", "image_url": data_url(image(1)), "detail": "auto"}]}])
    assert e.value.status_code == 400 and e.value.body["param"] == "input[0].content[1]"
    assert NOT_VISION in e.value.body["message"]


def test_tokenize_answers_400_naming_the_image_part(server):
    import urllib.error
    import urllib.request

    body = msgspec.json.encode({"model": MODEL, "messages": [user(chat_image(data_url(image(1))))]})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(urllib.request.Request(f"{server}/tokenize", body,
                                                      {"content-type": "application/json"}))
    error = msgspec.json.decode(e.value.read())["error"]
    assert e.value.code == 400 and error["param"] == "messages[0].content[0]" and NOT_VISION in error["message"]


def test_anthropic_messages_answer_400_in_anthropics_shape(server, image_host):
    anthropic = pytest.importorskip("anthropic")
    client = anthropic.Anthropic(base_url=server, api_key="none", max_retries=0)
    png = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(image(1))}}
    cases = [
        ([user({"type": "text", "text": "What is this?"}, png)], "messages.0.content.1"),
        ([user({"type": "image", "source": {"type": "url", "url": f"{image_host}/b.png"}})], "messages.0.content.0"),
        ([{"role": "user", "content": "Take a photo."},
          {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "camera", "input": {}}]},
          user({"type": "tool_result", "tool_use_id": "t1", "content": [png]})], "messages.2.content.0.content.0"),
    ]
    for messages, where in cases:
        with pytest.raises(anthropic.BadRequestError) as e:
            client.messages.create(model=MODEL, max_tokens=4, messages=messages)
        assert e.value.status_code == 400 and e.value.body["type"] == "error"
        assert e.value.body["error"]["type"] == "invalid_request_error"
        assert where in e.value.body["error"]["message"] and NOT_VISION in e.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.count_tokens(model=MODEL, messages=cases[0][0])
    assert "messages.0.content.1" in e.value.body["error"]["message"]
    assert _Recorder.hits == []


# -- surogate serve's flags ---------------------------------------------------------------------------------


def test_serve_media_flags_reach_the_gateway_config(monkeypatch, tmp_path, tiny_tokenizers):
    from typer.testing import CliRunner

    import surogate.gateway.server
    import surogate.serve.launch
    from surogate.cli.main import app

    seen = {}
    launched = SimpleNamespace(name="m", adapters={}, generates=True, offload=None, max_model_len=64,
                               kv_cache_tokens=16,
                               llm=lambda: LLM(None, tiny_tokenizers["chatml"], max_model_len=64),
                               embedder=lambda pooling: None)
    monkeypatch.setattr(surogate.serve.launch, "launch", lambda *args, **kw: launched)
    monkeypatch.setattr(surogate.gateway.server, "serve", lambda served, config, **kw: seen.update(config=config))
    runner = CliRunner()
    result = runner.invoke(app, ["serve", "m=x", "--allowed-local-media-path", str(tmp_path), "--allow-remote-media",
                                 "--limit-mm-per-prompt", '{"image": 5, "video": 1}'])
    assert result.exit_code == 0, result.output
    config = seen["config"]
    assert (config.allowed_local_media_path, config.allow_remote_media, config.max_images_per_prompt,
            config.max_videos_per_prompt) == (str(tmp_path), True, 5, 1)
    result = runner.invoke(app, ["serve", "m=x"])
    assert result.exit_code == 0, result.output
    config = seen["config"]
    assert (config.allowed_local_media_path, config.allow_remote_media, config.max_images_per_prompt,
            config.max_videos_per_prompt) == (None, False, 8, 2)  # no local files, no network, 8 images, 2 videos


@pytest.mark.parametrize("args,what", [
    (["--limit-mm-per-prompt", "four"], "not a JSON object of counts"),
    (["--limit-mm-per-prompt", '{"image": -1}'], "not a JSON object of counts"),
    (["--limit-mm-per-prompt", '{"audio": 1}'], "names audio"),
    (["--allowed-local-media-path", "/no/such/folder"], "is not a folder"),
])
def test_bad_media_flags_are_clear_errors(args, what):
    from surogate.cli.serve import media_options
    from surogate.errors import InvalidArgumentError

    kw = {"allowed_local_media_path": None, "allow_remote_media": False, "limit_mm_per_prompt": None}
    kw[args[0].lstrip("-").replace("-", "_")] = args[1]
    with pytest.raises(InvalidArgumentError, match=what):
        media_options(**kw)
