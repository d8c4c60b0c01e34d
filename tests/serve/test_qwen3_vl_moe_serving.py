"""Images in serving, Qwen3-VL-MoE (Qwen3VLMoeForConditionalGeneration), against transformers on a
tiny random checkpoint (sgtest/vision.py make_qwen3_vl_chat(moe=True): Qwen3-VL's served folder
over the MoE tiny model, three text layers with experts on the first and last): LLM.chat's greedy
answer with one and two images equals generate (the merged rows, DeepStack, MRoPE and rope_deltas
as for the dense model, the experts routed per token in prefill and decode), a text-only chat too,
and image and text requests submitted together."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.models.qwen3_vl_moe")

from sgtest.vision import image, make_qwen3_vl_chat, qwen3_vl_reference, served_chat, template_messages, user  # noqa: E402
from surogate.serve import SamplingParams  # noqa: E402
from surogate.serve.launch import launch  # noqa: E402

N = 8  # greedy tokens compared
GREEDY = SamplingParams(temperature=0.0, max_tokens=N, ignore_eos=True)
# 40 x 30 -> a 4 x 4 patch grid (4 tokens); 24 x 64 -> 8 x 4 (8 tokens).
PICS = [image(10), image(11, (24, 64))]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_qwen3_vl_chat(tmp_path_factory.mktemp("q3vlmoe"), seed=4, moe=True)


@pytest.fixture(scope="module")
def reference(folder):
    return qwen3_vl_reference(folder)[1]


@pytest.fixture(scope="module")
def served(folder):
    m = launch(str(folder), kv_cache_tokens=2048)
    yield m
    m.client.close()


@pytest.fixture(scope="module")
def llm(served):
    return served.llm()


def test_served_model_is_the_moe_family(served):
    assert served.model.family.name == "qwen3_vl_moe" and served.model.spec.moe.layers == (0, 2)


@pytest.mark.parametrize("n_images", [1, 2])
def test_chat_with_images_equals_transformers_generate(llm, reference, n_images):
    messages = user("Describe the picture", *[x for p in PICS[:n_images] for x in (p, "and")])
    want, want_prompt = reference(messages, N)
    chat, images = template_messages(messages)
    assert llm.render(chat, images=images).token_ids == want_prompt
    got, out = served_chat(llm, messages, GREEDY)
    assert got == want and out.num_prompt_tokens == len(want_prompt)


def test_text_and_image_requests_together_each_equal_transformers(llm, reference):
    cases = [user("Describe the picture", PICS[1]), [{"role": "user", "content": "Hello there, how are you?"}],
             user("One", PICS[0], "two", PICS[1], "three")]
    wants = [reference(m, N)[0] for m in cases]
    futures = []
    for messages in cases:
        chat, images = template_messages(messages)
        futures.append(llm.chat(chat, GREEDY, images=images))
    assert [f.result(timeout=120)[0].new_token_ids for f in futures] == wants
