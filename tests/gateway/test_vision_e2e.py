"""Images end to end: `surogate serve` of a tiny random Gemma 3 vision folder (sgtest/vision.py),
no flag beyond the folder, through the official SDKs, against transformers'
Gemma3ForConditionalGeneration.generate on Gemma3Processor's inputs (greedy):

- OpenAI chat with ``image_url`` data URLs (one and two images; plain and streamed): the answer's
  text and usage.prompt_tokens (the expanded prompt, image tokens included) equal HF's; the same
  request again reports its prompt's full blocks as cached (prefix cache over the image span);
  Responses with an ``input_image``;
- Anthropic messages with a base64 image block: the text and usage.input_tokens equal HF's, and
  count_tokens counts the same expanded prompt; /tokenize too;
- a text-only request to the vision model still answers as HF does;
- in process: the images are encoded off the event loop, one encode at a time; a POST /sleep
  while an image encodes waits for the tower before the engine gives its memory back.
"""

from __future__ import annotations

import json
import urllib.request

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

from sgtest.vision import b64, hf_generate, image, image_url_part, make_gemma3_vision_chat  # noqa: E402

N = 6
MODEL = "g3v"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_gemma3_vision_chat(tmp_path_factory.mktemp("g3v"), seed=3)


@pytest.fixture(scope="module")
def ref(folder):
    return transformers.Gemma3ForConditionalGeneration.from_pretrained(str(folder), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def processor(folder):
    return transformers.AutoProcessor.from_pretrained(str(folder))


@pytest.fixture(scope="module")
def server(folder):
    pytest.importorskip("granian")
    from sgtest.server import surogate_serve

    with surogate_serve(f"{MODEL}={folder}", "--kv-cache-tokens", "2048") as base:
        yield base


def reference(ref, processor, parts, n=N, ignore_eos=True) -> tuple[str, int]:
    """HF's greedy text and prompt length for one user turn of text and PIL images."""
    content = [{"type": "text", "text": p} if isinstance(p, str) else {"type": "image", "image": p} for p in parts]
    ids, prompt = hf_generate(ref, processor, [{"role": "user", "content": content}], n, ignore_eos=ignore_eos)
    return processor.tokenizer.decode(ids, skip_special_tokens=True), len(prompt)


def test_openai_chat_with_images_equals_transformers(server, ref, processor):
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0)
    for pics in ([image(40)], [image(41, (20, 50)), image(42, (70, 30))]):
        parts = ["What is in these pictures?", *pics]
        want, prompt_len = reference(ref, processor, parts)
        content = [{"type": "text", "text": parts[0]}] + [image_url_part(p) for p in pics]
        kw = dict(model=MODEL, max_tokens=N, temperature=0, extra_body={"ignore_eos": True},
                  messages=[{"role": "user", "content": content}])
        r = client.chat.completions.create(**kw)
        assert r.choices[0].message.content == want
        assert r.usage.prompt_tokens == prompt_len and r.usage.completion_tokens == N
        again = client.chat.completions.create(**kw)  # the image's rows cached; the prompt's blocks too
        assert again.choices[0].message.content == want
        assert again.usage.prompt_tokens_details.cached_tokens >= 16
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**kw, stream=True)
                           if c.choices)
        assert streamed == want


def test_openai_responses_with_an_input_image_equal_transformers(server, ref, processor):
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0)
    pic = image(45, (50, 26))
    want, prompt_len = reference(ref, processor, ["What is this?", pic])
    r = client.responses.create(model=MODEL, max_output_tokens=N, temperature=0, extra_body={"ignore_eos": True},
                                input=[{"role": "user", "content": [
                                    {"type": "input_text", "text": "What is this?"},
                                    {"type": "input_image", "image_url": image_url_part(pic)["image_url"]["url"],
                                     "detail": "auto"}]}])
    assert r.output_text == want and r.usage.input_tokens == prompt_len


def test_anthropic_messages_with_a_base64_image_equal_transformers(server, ref, processor):
    client = anthropic.Anthropic(base_url=server, api_key="none", max_retries=0)
    pic = image(43, (36, 36))
    want, prompt_len = reference(ref, processor, ["Describe this image.", pic], ignore_eos=False)
    messages = [{"role": "user", "content": [
        {"type": "text", "text": "Describe this image."},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(pic)}}]}]
    r = client.messages.create(model=MODEL, max_tokens=N, messages=messages, extra_body={"temperature": 0})
    assert "".join(b.text for b in r.content if b.type == "text") == want
    assert r.usage.input_tokens == prompt_len
    assert client.messages.count_tokens(model=MODEL, messages=messages).input_tokens == prompt_len


def test_tokenize_counts_the_expanded_prompt(server, ref, processor):
    pic = image(44)
    _, prompt_len = reference(ref, processor, ["Hi", pic], n=1)
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "Hi"}, image_url_part(pic)]}]})
    req = urllib.request.Request(f"{server}/tokenize", body.encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(req) as r:
        out = json.loads(r.read())
    assert out["count"] == prompt_len == len(out["tokens"])


def test_text_only_request_to_the_vision_model(server, ref, processor):
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0)
    want, prompt_len = reference(ref, processor, ["Tell me a story."])
    r = client.chat.completions.create(model=MODEL, max_tokens=N, temperature=0, extra_body={"ignore_eos": True},
                                       messages=[{"role": "user", "content": "Tell me a story."}])
    assert r.choices[0].message.content == want and r.usage.prompt_tokens == prompt_len


def test_encoding_runs_off_the_event_loop_one_at_a_time(folder, ref, processor):
    """In process (the gateway app over a launched model): while two requests' images encode
    (each encode slowed to 0.5 s), the loop answers /v1/models at once, the encodes never overlap
    (one lock per model), and both answers equal HF's."""
    import asyncio
    import threading
    import time

    httpx = pytest.importorskip("httpx")
    from surogate.gateway.app import GatewayApp
    from surogate.gateway.models import GatewayConfig, ServedModel
    from surogate.serve.launch import launch

    m = launch(str(folder), kv_cache_tokens=2048)
    enc = m.images
    real, running, overlap = enc._encode, [0], []
    lock = threading.Lock()

    def slow(pixels):
        with lock:
            running[0] += 1
            overlap.append(running[0])
        time.sleep(0.5)
        try:
            return real(pixels)
        finally:
            with lock:
                running[0] -= 1

    enc._encode = slow
    app = GatewayApp([ServedModel(MODEL, m.llm())], GatewayConfig())
    pics = [image(50), image(51, (30, 60))]

    def body(pic):
        return {"model": MODEL, "max_tokens": N, "temperature": 0, "ignore_eos": True, "messages": [{
            "role": "user", "content": [{"type": "text", "text": "What is this?"}, image_url_part(pic)]}]}

    async def check():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw", timeout=60) as c:
            answers = [asyncio.create_task(c.post("/v1/chat/completions", json=body(p))) for p in pics]
            await asyncio.sleep(0.2)
            start = time.perf_counter()
            models = await c.get("/v1/models")
            assert models.status_code == 200 and time.perf_counter() - start < 0.3
            assert not any(a.done() for a in answers)
            return [(await a).json() for a in answers]

    try:
        replies = asyncio.run(check())
    finally:
        m.client.close()
    assert max(overlap) == 1 and enc.encodes == 2
    for pic, reply in zip(pics, replies):
        assert reply["choices"][0]["message"]["content"] == reference(ref, processor, ["What is this?", pic])[0]


def test_sleep_while_an_image_encodes_waits_for_it(folder, ref, processor):
    """In process: POST /sleep while a request's image encodes (slowed to 0.6 s, then 0.2 s more
    before the submit): the engine gives its memory back only after the request has run (from its
    admission on it counts as running), the request still answers as HF does, and the sleep's
    reply comes after it has released."""
    import asyncio
    import time

    httpx = pytest.importorskip("httpx")
    from surogate.gateway.app import GatewayApp
    from surogate.gateway.models import GatewayConfig, ServedModel
    from surogate.serve.launch import launch

    m = launch(str(folder), kv_cache_tokens=2048)
    enc, runner = m.images, m.runner
    real, events = enc._encode, []

    def slow(pixels):
        events.append("encode")
        time.sleep(0.6)
        rows = real(pixels)
        events.append("encoded" if not runner.released else "encoded after the release")
        return rows

    release = runner.release

    def released():
        events.append("release")
        release()

    enc._encode, runner.release = slow, released
    llm = m.llm()
    embed = llm.embed

    def late(prompt, *args):  # a gap after the tower, before the submit: the request still counts as running
        out = embed(prompt, *args)
        time.sleep(0.2)
        return out

    llm.embed = late
    app = GatewayApp([ServedModel(MODEL, llm)], GatewayConfig())
    pic = image(52)
    body = {"model": MODEL, "max_tokens": N, "temperature": 0, "ignore_eos": True, "messages": [{
        "role": "user", "content": [{"type": "text", "text": "What is this?"}, image_url_part(pic)]}]}

    async def check():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw", timeout=60) as c:
            answer = asyncio.create_task(c.post("/v1/chat/completions", json=body))
            while not events:
                await asyncio.sleep(0.01)
            slept = await c.post("/sleep", params={"model": MODEL})
            answered_first = answer.done()
            woke = await c.post("/wake_up", params={"model": MODEL})
            return await answer, slept, woke, answered_first

    try:
        reply, slept, woke, answered_first = asyncio.run(check())
    finally:
        m.client.close()
    assert events == ["encode", "encoded", "release"]
    assert answered_first, "the sleep released the engine before the admitted request had run"
    assert slept.status_code == 200 and slept.json() == {"model": MODEL, "status": "sleeping"}
    assert woke.status_code == 200 and woke.json()["status"] == "loaded"
    assert reply.status_code == 200
    assert reply.json()["choices"][0]["message"]["content"] == reference(ref, processor, ["What is this?", pic])[0]
