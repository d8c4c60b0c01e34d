"""Qwen3-VL images end to end: `surogate serve` of a tiny random Qwen3-VL folder
(sgtest/vision.py make_qwen3_vl_chat), no flag beyond the folder, through the OpenAI SDK, against
transformers' Qwen3VLForConditionalGeneration.generate on Qwen3VLProcessor's inputs (greedy): chat
with ``image_url`` data URLs of two images of different grids, plain and streamed: the answer's
text and usage.prompt_tokens (the expanded prompt) equal HF's, and the same request again reports
its prompt's full blocks as cached."""

from __future__ import annotations


import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
openai = pytest.importorskip("openai")

from sgtest.vision import image, image_url_part, make_qwen3_vl_chat, qwen3_vl_reference  # noqa: E402

N = 6
MODEL = "q3vl"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_qwen3_vl_chat(tmp_path_factory.mktemp("q3vl"), seed=4)


@pytest.fixture(scope="module")
def server(folder):
    pytest.importorskip("granian")
    from sgtest.server import surogate_serve

    with surogate_serve(f"{MODEL}={folder}", "--kv-cache-tokens", "2048") as base:
        yield base


def test_openai_chat_with_two_images_equals_transformers(server, folder):
    _, generate = qwen3_vl_reference(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    pics = [image(41, (20, 50)), image(42, (70, 30))]
    ids, prompt = generate([{"role": "user", "content": [{"type": "text", "text": "What is in these pictures?"},
                                                         *[{"type": "image", "image": p} for p in pics]]}], N)
    want = tokenizer.decode(ids, skip_special_tokens=True)
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0)
    content = [{"type": "text", "text": "What is in these pictures?"}] + [image_url_part(p) for p in pics]
    kw = dict(model=MODEL, max_tokens=N, temperature=0, extra_body={"ignore_eos": True},
              messages=[{"role": "user", "content": content}])
    r = client.chat.completions.create(**kw)
    assert r.choices[0].message.content == want
    assert r.usage.prompt_tokens == len(prompt) and r.usage.completion_tokens == N
    again = client.chat.completions.create(**kw)  # the images' rows cached; the prompt's blocks too
    assert again.choices[0].message.content == want
    assert again.usage.prompt_tokens_details.cached_tokens >= 16
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**kw, stream=True)
                       if c.choices)
    assert streamed == want
