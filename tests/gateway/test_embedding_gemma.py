"""EmbeddingGemma: a tiny random one (Gemma3TextModel with bidirectional attention, sliding window
4 so that the window shows, sentence-transformers' mean pooling, two dense projections and
normalisation) served by `launch` for /v1/embeddings only; through the openai SDK its vectors equal
transformers' Gemma3TextModel (use_bidirectional_attention) pooled and projected the same way,
written out in torch; Matryoshka ``dimensions`` truncate and renormalise; chat on it is a 400
(an encoder generates nothing), also through `surogate serve`. On the GPU (skipped without one)
the vectors equal the CPU's."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
openai = pytest.importorskip("openai")

import surogate  # noqa: E402
from sgtest.tiny_models import make_embedding_gemma  # noqa: E402
from surogate import _native  # noqa: E402
from surogate.gateway.app import GatewayApp  # noqa: E402
from surogate.gateway.models import ServedModel  # noqa: E402
from surogate.io import open_safetensors  # noqa: E402
from surogate.serve import Embedder  # noqa: E402
from surogate.serve.launch import launch  # noqa: E402

try:
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx

TEXTS = ["Hello world! How is the weather today in the city?", "a b c", "The quick brown fox jumps over the lazy dog."]


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    path = make_embedding_gemma(tmp_path_factory.mktemp("egemma") / "m", seed=4, initializer_range=0.2)
    assert json.loads((path / "config.json").read_text())["architectures"] == ["Gemma3TextModel"]
    return path


def reference(path, ids: list[int]) -> np.ndarray:
    """transformers' Gemma3TextModel, then sentence-transformers' modules written out."""
    model = transformers.AutoModel.from_pretrained(str(path), dtype=torch.float32).eval()
    assert model.config.use_bidirectional_attention
    with torch.no_grad():
        h = model(torch.tensor([ids])).last_hidden_state[0]
    v = h.mean(dim=0)
    for d in sorted(p for p in path.iterdir() if p.name.endswith("_Dense")):
        v = torch.from_numpy(np.array(open_safetensors(d / "model.safetensors").get("linear.weight"))) @ v
    return torch.nn.functional.normalize(v, dim=0).numpy()


def sdk(app) -> openai.AsyncOpenAI:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")
    return openai.AsyncOpenAI(api_key="none", base_url="http://gw/v1", http_client=http, max_retries=0)


def test_embedding_gemma_equals_transformers_bidirectional_encoder(gemma):
    m = launch(str(gemma), name="egemma")
    assert m.client is None and not m.model.spec.causal  # an encoder: no engine
    embedder = m.embedder("last")  # the folder's own pipeline wins: mean pooling, dense, normalize
    assert embedder.pooling == "mean" and len(embedder.dense) == 2 and embedder.normalize
    app = GatewayApp([ServedModel("egemma", m.llm(), embedder=embedder, generates=False)])
    tok = m.model.tokenizer
    ids = [tok.encode(t) for t in TEXTS]
    assert max(len(x) for x in ids) > 8  # longer than the window on either side

    async def calls():
        client = sdk(app)
        floats = await client.embeddings.create(model="egemma", input=TEXTS, encoding_format="float")
        b64 = await client.embeddings.create(model="egemma", input=TEXTS)  # the SDK's base64, decoded
        small = await client.embeddings.create(model="egemma", input=TEXTS[0], dimensions=16)
        models = await client.models.list()
        try:
            await client.chat.completions.create(model="egemma", messages=[{"role": "user", "content": "hi"}])
        except openai.BadRequestError as e:
            chat = e
        return floats, b64, small, models, chat

    floats, b64, small, models, chat = asyncio.run(calls())
    for r in (floats, b64):
        for d, x in zip(r.data, ids):
            np.testing.assert_allclose(d.embedding, reference(gemma, x), atol=1e-5)
    want = reference(gemma, ids[0])[:16]
    np.testing.assert_allclose(small.data[0].embedding, want / np.linalg.norm(want), atol=1e-5)
    assert [x.id for x in models.data] == ["egemma"]
    assert chat.status_code == 400 and "embedding model" in chat.body["message"]
    async def health():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c:
            return (await c.get("/health")).json()
    assert asyncio.run(health()) == {"status": "ok", "models": {"egemma": "loaded"}}


def test_bidirectional_hidden_states_see_both_sides(gemma):
    """Changing the last token changes the first row (a causal model's would not)."""
    model = surogate.load_model(gemma)
    a = model.hidden_states([[5, 6, 7, 8]])
    b = model.hidden_states([[5, 6, 7, 9]])
    assert np.abs(a[0] - b[0]).max() > 1e-4


@pytest.mark.cuda
@pytest.mark.skipif(not (_native.build_info()["cuda"] and _native.cuda_devices()), reason="no CUDA build or no GPU")
def test_embedding_gemma_on_cuda_equals_the_cpu(gemma):
    ids = [[2, 5, 6, 7, 8, 9, 10, 11, 12, 1], list(range(3, 60)), [2, 17, 1]]
    cpu = Embedder.for_model(surogate.load_model(gemma)).embed(ids)
    gpu = Embedder.for_model(surogate.load_model(gemma, device="cuda")).embed(ids)
    np.testing.assert_allclose(gpu, cpu, atol=1e-4)


def test_surogate_serve_an_embedding_model(gemma):
    pytest.importorskip("granian")
    from sgtest.server import surogate_serve

    tok = surogate.load_model(gemma).tokenizer
    with surogate_serve(f"egemma={gemma}") as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
        r = client.embeddings.create(model="egemma", input=TEXTS[2], dimensions=32)
        want = reference(gemma, tok.encode(TEXTS[2]))[:32]
        np.testing.assert_allclose(r.data[0].embedding, want / np.linalg.norm(want), atol=1e-5)
        assert r.usage.prompt_tokens == len(tok.encode(TEXTS[2]))
        with pytest.raises(openai.BadRequestError, match="embedding model"):
            client.completions.create(model="egemma", prompt="hi", max_tokens=2)
