"""A request's images encoded in one tower call (serve.multimodal ImageEncoder.encode_batch), on
the tiny random Gemma 3 and Qwen3-VL checkpoints (sgtest/vision.py):

- Gemma 3: the not-yet-cached images' views stacked, zero-padded to a power of two (3 images: one
  call of 4 views; in calls of at most ENCODE_BATCH), and each image's rows equal
  Model.encode_images of that image alone (f32 rounding); cached and repeated images are not
  encoded again;
- Qwen3-VL: the images' patch rows and grids (two different grids) in one call, split back per
  image, equal to each image encoded alone (the served chats against transformers are
  tests/serve/test_vision_serving.py's and test_qwen3_vl_serving.py's, on this path);
- a sleep (EngineClient.release) while an image is being encoded waits for the encode (the engine
  is not idle meanwhile), and an encode while asleep is refused until restore.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

pytest.importorskip("transformers")

from sgtest.vision import image, make_gemma3_vision_chat, make_qwen3_vl_chat  # noqa: E402
from surogate.errors import UnsupportedError  # noqa: E402
from surogate.serve import multimodal  # noqa: E402
from surogate.serve.launch import launch  # noqa: E402
from surogate.serve.multimodal import ImageEncoder  # noqa: E402


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    m = launch(str(make_gemma3_vision_chat(tmp_path_factory.mktemp("g3v"), seed=3)), kv_cache_tokens=2048)
    yield m
    m.client.close()


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    m = launch(str(make_qwen3_vl_chat(tmp_path_factory.mktemp("q3vl"), seed=4)), kv_cache_tokens=2048)
    yield m
    m.client.close()


def counted(encode, calls: list):
    def run(*args):
        calls.append(len(args[0]) if len(args) == 1 else [tuple(g) for g in args[1]])
        return encode(*args)
    return run


def test_gemma_images_in_one_padded_call_equal_one_at_a_time(gemma):
    prompt, model = gemma.images.prompt, gemma.model
    pics = [image(40 + i, (40 + 8 * i, 30)) for i in range(3)]
    alone = [model.encode_images(prompt.processor([p]).pixel_values) for p in pics]
    calls = []
    enc = ImageEncoder(prompt, counted(model.encode_images, calls))
    got = enc.rows(pics)
    assert calls == [4]  # the three images and one zero image, in one call
    for a, b in zip(got, alone):
        assert a.shape == b.shape == (prompt.tokens_per_view, model.spec.hidden_size)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # the cached ones are not encoded again; a repeated new one once: 2 new images, one call of 2
    new = [image(50), image(51)]
    rows = enc.rows([pics[1], new[0], new[1], new[0]])
    assert calls == [4, 2] and enc.encodes == 5 and enc.hits == 1
    np.testing.assert_array_equal(rows[0], got[1])
    np.testing.assert_array_equal(rows[1], rows[3])
    np.testing.assert_allclose(rows[2], model.encode_images(prompt.processor([new[1]]).pixel_values),
                               rtol=1e-5, atol=1e-6)


def test_gemma_batches_are_powers_of_two_up_to_the_cap(gemma, monkeypatch):
    monkeypatch.setattr(multimodal, "ENCODE_BATCH", 4)
    prompt, model = gemma.images.prompt, gemma.model
    pics = [image(60 + i) for i in range(7)]
    calls = []
    rows = ImageEncoder(prompt, counted(model.encode_images, calls)).rows(pics)
    assert calls == [4, 4]  # 4 views, then 3 padded to 4: the Programs of 4 views only
    for p, r in zip(pics[3:], rows[3:]):
        np.testing.assert_allclose(r, model.encode_images(prompt.processor([p]).pixel_values), rtol=1e-5, atol=1e-6)


def test_qwen_images_of_two_grids_in_one_call_equal_one_at_a_time(qwen):
    prompt, model = qwen.images.prompt, qwen.model
    pics = [image(10), image(11, (24, 64)), image(12)]  # grids (1, 4, 4), (1, 8, 4), (1, 4, 4)
    alone = [prompt.encode(model.encode_images, [prompt.processor([p])])[0] for p in pics]
    calls = []
    got = ImageEncoder(prompt, counted(model.encode_images, calls)).rows(pics)
    assert calls == [[(1, 4, 4), (1, 8, 4), (1, 4, 4)]]
    assert [len(r) for r in got] == [4, 8, 4]
    for a, b in zip(got, alone):
        assert a.shape == b.shape  # f32 rounding: the packed sequence's sums in another order
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_sleep_waits_for_the_encode_in_flight_and_refuses_one_while_asleep(gemma):
    client, prompt = gemma.client, gemma.images.prompt
    entered, go = threading.Event(), threading.Event()
    seen = {}

    def slow(px):
        entered.set()
        assert go.wait(30)
        rows = gemma.model.encode_images(px)
        seen["released during the encode"] = gemma.runner.released
        return rows

    llm = gemma.llm()
    llm.images = ImageEncoder(prompt, slow)
    ids = llm.render([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}],
                     images=[image(70)])
    result, slept = {}, threading.Event()
    encoding = threading.Thread(target=lambda: result.update(p=llm.embed(ids)))
    encoding.start()
    assert entered.wait(30)
    assert not client.idle()  # the gateway's sleep waits for idle: an encode counts
    sleeping = threading.Thread(target=lambda: (client.release(), slept.set()))
    sleeping.start()
    time.sleep(0.3)
    assert not slept.is_set() and not gemma.runner.released  # release waits for the tower
    go.set()
    encoding.join(30)
    sleeping.join(30)
    assert slept.is_set() and gemma.runner.released and seen == {"released during the encode": False}
    assert len(result["p"].embeds) == 1
    try:
        with pytest.raises(UnsupportedError, match="asleep"):
            llm.embed(llm.render([{"role": "user", "content": [{"type": "image"}]}], images=[image(71)]))
    finally:
        client.restore()
    again = llm.embed(llm.render([{"role": "user", "content": [{"type": "image"}]}], images=[image(71)]))
    assert len(again.embeds) == 1 and client.idle()
