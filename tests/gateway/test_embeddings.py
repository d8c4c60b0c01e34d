"""/v1/embeddings through the openai SDK (``client.embeddings.create``, float and base64) on a tiny
random model served by the native engine's "hidden" build: each vector equals transformers' last
hidden state pooled the same way (last token, mean) and L2-normalised; ``dimensions`` keeps the
first components renormalised; bad inputs are 400s naming the field. Every registered family's
hidden states equal transformers' (the mode is the shared builder's, not a family's). On the GPU
(skipped without one) the vectors equal the CPU's."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
openai = pytest.importorskip("openai")

import surogate  # noqa: E402
from sgtest.tiny_models import make_model, make_qwen3  # noqa: E402
from surogate import _native  # noqa: E402
from surogate.gateway.app import GatewayApp  # noqa: E402
from surogate.gateway.models import ServedModel  # noqa: E402
from surogate.models import REGISTRY  # noqa: E402
from surogate.serve import Embedder  # noqa: E402
from surogate.serve.launch import launch  # noqa: E402

try:
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx

TEXTS = ["Hello world!", "The quick brown fox jumps over the lazy dog.", "a"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = make_qwen3(tmp_path_factory.mktemp("emb"), seed=11, initializer_range=0.2)
    m = launch(str(path), name="tiny", kv_cache_tokens=256)
    models = [ServedModel("tiny", m.llm(), embedder=m.embedder("last")),
              ServedModel("tiny-mean", m.llm(), embedder=m.embedder("mean")),
              ServedModel("no-embed", m.llm())]
    ref = transformers.AutoModel.from_pretrained(str(path), dtype=torch.float32).eval()
    yield GatewayApp(models), m.model.tokenizer, ref
    m.client.close()


def hf_embedding(ref, ids: list[int], pooling: str) -> np.ndarray:
    with torch.no_grad():
        h = ref(torch.tensor([ids])).last_hidden_state[0].numpy()
    v = h[-1] if pooling == "last" else h.mean(axis=0)
    return v / np.linalg.norm(v)


def sdk(app) -> openai.AsyncOpenAI:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")
    return openai.AsyncOpenAI(api_key="none", base_url="http://gw/v1", http_client=http, max_retries=0)


@pytest.mark.parametrize("model,pooling", [("tiny", "last"), ("tiny-mean", "mean")])
@pytest.mark.parametrize("encoding_format", ["float", "base64"])
def test_embeddings_equal_transformers_pooled(served, model, pooling, encoding_format):
    app, tok, ref = served
    # the SDK asks for base64 when no format is given and decodes it into floats
    kw = {"encoding_format": "float"} if encoding_format == "float" else {}
    r = asyncio.run(sdk(app).embeddings.create(model=model, input=TEXTS, **kw))
    assert [d.index for d in r.data] == [0, 1, 2] and r.model == model
    ids = [tok.encode(t) for t in TEXTS]
    assert r.usage.prompt_tokens == r.usage.total_tokens == sum(len(x) for x in ids)
    for d, x in zip(r.data, ids):
        got = np.asarray(d.embedding, np.float32)
        assert got.shape == (ref.config.hidden_size,)
        np.testing.assert_allclose(got, hf_embedding(ref, x, pooling), atol=1e-5)
    one = asyncio.run(sdk(app).embeddings.create(model=model, input=ids[1], **kw))  # token ids in
    np.testing.assert_allclose(one.data[0].embedding, r.data[1].embedding, atol=1e-6)


def test_base64_is_little_endian_float32_of_the_floats(served):
    import base64

    app, _, _ = served

    async def both():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c:
            f = await c.post("/v1/embeddings", json={"model": "tiny", "input": "Hello", "encoding_format": "float"})
            b = await c.post("/v1/embeddings", json={"model": "tiny", "input": "Hello", "encoding_format": "base64"})
            return f.json(), b.json()

    f, b = asyncio.run(both())
    decoded = np.frombuffer(base64.b64decode(b["data"][0]["embedding"]), "<f4")
    np.testing.assert_array_equal(decoded, np.asarray(f["data"][0]["embedding"], np.float32))
    assert b["object"] == "list" and b["data"][0]["object"] == "embedding" and b["usage"]["prompt_tokens"] > 0


def test_dimensions_keep_the_first_components_renormalised(served):
    app, tok, ref = served
    r = asyncio.run(sdk(app).embeddings.create(model="tiny", input=TEXTS[1], dimensions=16, encoding_format="float"))
    full = hf_embedding(ref, tok.encode(TEXTS[1]), "last")[:16]
    np.testing.assert_allclose(r.data[0].embedding, full / np.linalg.norm(full), atol=1e-5)


@pytest.mark.parametrize("body,param,says", [
    ({"model": "tiny", "input": "x", "dimensions": 0}, "dimensions", "dimensions"),
    ({"model": "tiny", "input": "x", "dimensions": 100000}, "dimensions", "dimensions"),
    ({"model": "tiny", "input": []}, "input", "empty"),
    ({"model": "tiny", "input": [[]]}, "input[0]", "empty"),
    ({"model": "tiny", "input": [99999999]}, "input", "outside the vocabulary"),
    ({"model": "tiny", "input": [1, "a"]}, "input[0]", "mixes"),
    ({"model": "tiny", "input": [1] * 300}, "input", "context"),
    ({"model": "tiny", "input": "x", "encoding_format": "int8"}, "encoding_format", "int8"),
    ({"model": "no-embed", "input": "x"}, "model", "does not serve embeddings"),
])
def test_bad_requests_are_400s_naming_the_field(served, body, param, says):
    app, _, _ = served
    e = None
    try:
        asyncio.run(sdk(app).post("/embeddings", body=body, cast_to=object))
    except openai.BadRequestError as err:
        e = err
    assert e is not None and e.status_code == 400
    assert e.body["param"] == param and says in e.body["message"], e.body


def test_unknown_model_is_404(served):
    app, _, _ = served
    with pytest.raises(openai.NotFoundError):
        asyncio.run(sdk(app).embeddings.create(model="nope", input="x"))


@pytest.mark.parametrize("family", [f.name for f in REGISTRY])
def test_hidden_states_equal_transformers_last_hidden_state(family, tmp_path):
    path = make_model(family, tmp_path / family, seed=3, initializer_range=0.2)
    ours = surogate.load_model(path)
    ref = transformers.AutoModel.from_pretrained(str(path), dtype=torch.float32).eval()
    docs = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14]]
    h = ours.hidden_states(docs, pad_to=16)  # two documents and a padding one, packed
    start = 0
    for d in docs:
        with torch.no_grad():
            want = ref(torch.tensor([d])).last_hidden_state[0].numpy()
        np.testing.assert_allclose(h[start:start + len(d)], want, atol=1e-4, err_msg=family)
        start += len(d)


@pytest.mark.cuda
@pytest.mark.skipif(not (_native.build_info()["cuda"] and _native.cuda_devices()), reason="no CUDA build or no GPU")
@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_embeddings_on_cuda_equal_the_cpu(tmp_path, pooling):
    path = make_qwen3(tmp_path / "q", seed=11, initializer_range=0.2)
    ids = [[5, 6, 7, 8, 9], list(range(3, 40)), [17]]
    cpu = Embedder(surogate.load_model(path), pooling).embed(ids)
    gpu = Embedder(surogate.load_model(path, device="cuda"), pooling).embed(ids)
    np.testing.assert_allclose(gpu, cpu, atol=1e-4)


@pytest.mark.cuda
@pytest.mark.skipif(not (_native.build_info()["cuda"] and _native.cuda_devices()), reason="no CUDA build or no GPU")
def test_embeddings_on_cuda_while_the_engine_generates(tmp_path):
    """The embedder's Programs run on the GPU beside the serving engine's (its own thread, CUDA
    graphs): both answers stay right."""
    import threading

    from sgtest.engine import hf_greedy
    from surogate.serve import SamplingParams

    path = make_qwen3(tmp_path / "q", seed=11, initializer_range=0.2)
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    m = launch(str(path), device="cuda", dtype="float32", kv_cache_tokens=4096)
    rng = np.random.default_rng(2)
    prompts = [rng.integers(3, 400, n).tolist() for n in (7, 30, 61, 90)]
    want_tokens = [hf_greedy(ref, p, 24) for p in prompts]
    cpu = Embedder(surogate.load_model(path), "mean").embed(prompts)
    embedder = Embedder(m.model, "mean")
    got: list = []
    stop = threading.Event()

    def embed_loop():
        while not stop.is_set():
            got.append(embedder.embed(prompts))

    worker = threading.Thread(target=embed_loop)
    worker.start()
    try:
        params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
        for _ in range(3):
            ids = [m.client.submit(p, params) for p in prompts]
            tokens = [[t for out in m.client.wait(i, timeout=120) for t in out.new_token_ids] for i in ids]
            assert tokens == want_tokens
    finally:
        stop.set()
        worker.join()
        m.client.close()
    assert got
    for vectors in got:
        np.testing.assert_allclose(vectors, cpu, atol=1e-4)
