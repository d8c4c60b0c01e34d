"""Concurrent requests' images share tower calls (serve.multimodal ImageEncoder's group commit):

- requests arriving while the tower is busy are encoded together in the next call (fewer calls
  than requests), each request getting exactly the rows its images give alone (an elementwise
  stand-in tower, so that batching changes no bit), an image two requests share encoded once;
- the batch caps (images, pixel rows) split a long queue into several calls;
- an encode that raises fails every request of that batch with its error (none hangs), the next
  requests encode again; a processor that raises fails its own request only;
- on the tiny random Qwen3-VL checkpoint (sgtest/vision.py): concurrent requests through the
  bucketed tower get the rows of each image encoded alone (f32, 1e-5).
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from surogate.serve.multimodal import ImageEncoder

PER_VIEW = 3  # the stand-in tower's rows per view


def tower(px: np.ndarray) -> np.ndarray:
    """[k, 2, 2] pixel views -> [k * PER_VIEW, 4] rows, each view's rows from its pixels alone."""
    flat = px.reshape(len(px), -1).astype(np.float32)
    return np.concatenate([np.tanh(flat * s)[:, None, :] for s in (1, 2, 3)], axis=1).reshape(-1, 4)


def solo(img: np.ndarray) -> np.ndarray:
    return tower(img[None])


class Gate:
    """The stand-in tower, recording each call's views; call ``hold`` blocks until ``go``."""

    def __init__(self, hold: int | None = 0, fail: int | None = None):
        self.calls: list[int] = []
        self.hold, self.fail = hold, fail
        self.entered, self.go = threading.Event(), threading.Event()

    def __call__(self, px):
        i = len(self.calls)
        self.calls.append(len(px))
        if i == self.hold:
            self.entered.set()
            assert self.go.wait(30)
        if i == self.fail:
            raise RuntimeError("the tower ran out of memory")
        return tower(px)


def encoder(gate, **kw) -> ImageEncoder:
    prompt = SimpleNamespace(processor=lambda imgs: SimpleNamespace(pixel_values=np.stack(imgs)), encode=None)
    return ImageEncoder(prompt, gate, **kw)


def pic(i: int) -> tuple[np.ndarray, bytes]:
    return np.random.default_rng(i).standard_normal((2, 2)).astype(np.float32), b"img%d" % i


def start(enc, requests) -> tuple[list, dict]:
    """One thread per request (its (image, key) pairs), each storing its rows or its error."""
    results: dict = {}

    def run(i, req):
        try:
            results[i] = enc.rows([im for im, _ in req], [k for _, k in req])
        except Exception as e:  # noqa: BLE001 - the test reads it
            results[i] = e

    threads = [threading.Thread(target=run, args=(i, r), daemon=True) for i, r in enumerate(requests)]
    for t in threads:
        t.start()
    return threads, results


def queued(enc, n: int) -> None:
    deadline = time.monotonic() + 30
    while len(enc._queue) < n:  # the test waits for the requests to queue up; the encoder never polls
        assert time.monotonic() < deadline, f"{len(enc._queue)} of {n} images queued"
        time.sleep(0.005)


def join(threads) -> None:
    for t in threads:
        t.join(30)
        assert not t.is_alive(), "a request hangs"


def test_requests_arriving_together_share_one_call_and_get_their_solo_rows():
    gate = Gate(hold=0)
    enc = encoder(gate)
    first, res0 = start(enc, [[pic(0)]])
    assert gate.entered.wait(30)  # the tower is busy with request 0's image
    shared = pic(100)
    requests = [[pic(10 + 2 * i), pic(11 + 2 * i)] + ([shared] if i in (1, 4) else []) for i in range(6)]
    threads, results = start(enc, requests)
    queued(enc, 13)  # 6 x 2 images and the shared one once
    assert len(results) == 0
    gate.go.set()
    join(first + threads)
    assert gate.calls == [1, 16]  # request 0's own, then all six requests' 13 images (padded to 16) in one
    assert enc.calls == 2 and enc.encodes == 14 and enc.hits == 1  # the shared image: encoded once
    np.testing.assert_array_equal(res0[0][0], solo(pic(0)[0]))
    for i, req in enumerate(requests):
        assert len(results[i]) == len(req)
        for rows, (img, _) in zip(results[i], req):
            np.testing.assert_array_equal(rows, solo(img))
    np.testing.assert_array_equal(results[1][2], results[4][2])
    again = enc.rows([pic(10)[0], shared[0]], [pic(10)[1], shared[1]])  # both cached now
    assert enc.calls == 2 and enc.hits == 3
    np.testing.assert_array_equal(again[1], solo(shared[0]))


def test_the_caps_split_a_long_queue():
    gate = Gate(hold=0)
    enc = encoder(gate, batch_images=3)
    first, _ = start(enc, [[pic(0)]])
    assert gate.entered.wait(30)
    requests = [[pic(20 + i)] for i in range(7)]
    threads, results = start(enc, requests)
    queued(enc, 7)
    gate.go.set()
    join(first + threads)
    assert gate.calls == [1, 4, 4, 1]  # 3 images (padded to 4), 3, then the last one
    for i, req in enumerate(requests):
        np.testing.assert_array_equal(results[i][0], solo(req[0][0]))
    # a pixel-row cap: views of 2 and 2 fit under 5, the third starts the next call (one oversized alone)
    gate2 = Gate(hold=0)
    enc2 = ImageEncoder(SimpleNamespace(processor=lambda imgs: SimpleNamespace(pixel_values=np.stack(imgs[0])),
                                        encode=None), gate2, batch_rows=5)
    first, _ = start(enc2, [[(np.stack([pic(0)[0]]), b"a")]])
    assert gate2.entered.wait(30)
    threads, results = [], []
    for k, (seed, views, key) in enumerate([(1, 2, b"b"), (2, 2, b"c"), (3, 6, b"d")]):  # queued in this order
        t, r = start(enc2, [[(np.stack([pic(seed)[0]] * views), key)]])
        threads, results = threads + t, results + [r]
        queued(enc2, k + 1)
    gate2.go.set()
    join(first + threads)
    assert gate2.calls[1:] == [4, 8]  # b and c together (4 views), d alone (6, padded to 8)
    assert [len(r[0][0]) for r in results] == [2 * PER_VIEW, 2 * PER_VIEW, 6 * PER_VIEW]


def test_a_failed_encode_fails_every_request_of_its_batch_and_the_next_encode_again():
    gate = Gate(hold=0, fail=1)
    enc = encoder(gate)
    first, res0 = start(enc, [[pic(0)]])
    assert gate.entered.wait(30)
    shared = pic(100)
    requests = [[pic(30 + i), shared] for i in range(4)]
    threads, results = start(enc, requests)
    queued(enc, 5)
    gate.go.set()
    join(first + threads)
    np.testing.assert_array_equal(res0[0][0], solo(pic(0)[0]))  # the first batch was fine
    for i in range(4):
        assert isinstance(results[i], RuntimeError) and "out of memory" in str(results[i])
    assert gate.calls == [1, 8] and enc.encodes == 1 and not enc._jobs and not enc._queue
    rows = enc.rows([requests[0][0][0], shared[0]], [requests[0][0][1], shared[1]])  # not cached: encoded now
    assert gate.calls == [1, 8, 2] and enc.encodes == 3
    np.testing.assert_array_equal(rows[1], solo(shared[0]))


def test_a_processor_error_fails_its_own_request_only():
    def processor(imgs):
        if imgs[0] is None:
            raise ValueError("cannot decode the image")
        return SimpleNamespace(pixel_values=np.stack(imgs))

    gate = Gate(hold=None)
    enc = ImageEncoder(SimpleNamespace(processor=processor, encode=None), gate)
    with pytest.raises(ValueError, match="cannot decode"):
        enc.rows([pic(1)[0], None], [pic(1)[1], b"bad"])
    assert not enc._jobs and not enc._queue  # neither image left in flight
    rows = enc.rows([pic(2)[0], pic(1)[0]], [pic(2)[1], pic(1)[1]])
    np.testing.assert_array_equal(rows[1], solo(pic(1)[0]))


def test_qwen3_vl_concurrent_requests_get_their_solo_rows(tmp_path):
    pytest.importorskip("transformers")
    from sgtest.vision import image, make_qwen3_vl_chat
    from surogate.io.images import image_hash
    from surogate.serve.launch import launch

    served = launch(str(make_qwen3_vl_chat(tmp_path / "q3vl", seed=5)), kv_cache_tokens=2048)
    try:
        prompt, model = served.images.prompt, served.model
        sizes = [(40, 30), (24, 64), (32, 32), (48, 40)]
        requests = [[image(200 + 2 * i, sizes[i % 4]), image(201 + 2 * i, sizes[(i + 1) % 4])] for i in range(5)]
        alone = {id(p): prompt.encode(model.encode_images, [prompt.processor([p])])[0] for r in requests for p in r}
        calls = []
        entered, go = threading.Event(), threading.Event()

        def encode(px, grid):
            calls.append(len(grid))
            if len(calls) == 1:
                entered.set()
                assert go.wait(30)
            return model.encode_images(px, grid)

        enc = ImageEncoder(prompt, encode)
        keyed = [[(p, image_hash(p)) for p in r] for r in requests]
        first, res0 = start(enc, keyed[:1])
        assert entered.wait(30)
        threads, results = start(enc, keyed[1:])
        queued(enc, 8)
        go.set()
        join(first + threads)
        assert calls == [2, 8]  # request 0's two images, then the other four requests' eight in one call
        for got, r in [(res0[0], requests[0])] + [(results[i], requests[i + 1]) for i in range(4)]:
            for rows, p in zip(got, r):
                assert rows.shape == alone[id(p)].shape
                np.testing.assert_allclose(rows, alone[id(p)], rtol=1e-5, atol=1e-5)
    finally:
        served.client.close()
