"""Images in serving, Qwen3-VL (Qwen3VLForConditionalGeneration), against transformers on a tiny
random checkpoint (sgtest/vision.py make_qwen3_vl_chat: a ChatML tokenizer with Qwen's vision
tokens, a Qwen3-VL-style template, preprocessor_config.json at the tower's 8-pixel patches):

- the rendered prompt's ids (each <|image_pad|> repeated grid_t grid_h grid_w / merge^2 times)
  equal the processor rule's input_ids, for one image and for two of different grids;
- LLM.chat's greedy answer equals Qwen3VLForConditionalGeneration.generate: the merged rows at the
  pad tokens, the DeepStack rows after the first decoder layers, MRoPE's 3-D positions in the
  prompt and rope_deltas in decoding (each span's position_shift);
- chunked prefill (a token budget that splits the image spans) gives the same; a repeated image
  hits the prefix cache and gives the same; a text-only chat equals HF too;
- video frames (token-id prompts, `serve_spans(videos=...)`, one span per frame) and images fed to
  the engine directly equal HF generate, with and without chunks;
- in bf16 the served prompt's logprobs equal Model.forward(ids, images=)'s (the same math);
- the spans: causal, keyed by the image, rows [merged | DeepStack | cos | sin], the shift
  max(h, w) / merge - tokens.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from sgtest.vision import (image, make_qwen3_vl_chat, qwen3_vl_reference, served_chat,  # noqa: E402
                           template_messages, user)
from surogate.serve import SamplingParams  # noqa: E402
from surogate.serve.launch import launch  # noqa: E402

N = 8  # greedy tokens compared
GREEDY = SamplingParams(temperature=0.0, max_tokens=N, ignore_eos=True)


@pytest.fixture(scope="module", params=[False, True], ids=["dense", "moe"])
def folder(request, tmp_path_factory):
    """The dense family, and Qwen3-VL-MoE (the same tower over Qwen3-MoE's experts)."""
    return make_qwen3_vl_chat(tmp_path_factory.mktemp("q3vl"), seed=4, moe=request.param)


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


def test_the_family_is_the_checkpoints(served, folder):
    moe = "moe" in served.model.config.get("model_type", "")
    assert served.model.family.name == ("qwen3_vl_moe" if moe else "qwen3_vl")
    assert (served.model.spec.moe is not None) == moe


def ours(llm, messages):
    return served_chat(llm, messages, GREEDY)


# 40 x 30 -> 32 x 32 pixels: a 4 x 4 patch grid (4 tokens); 24 x 64 -> 32 x 64: 8 x 4 (8 tokens).
PICS = [image(10), image(11, (24, 64))]


@pytest.mark.parametrize("n_images", [1, 2])
def test_chat_with_images_equals_transformers_generate(served, llm, reference, n_images):
    messages = user("Describe the picture", *[x for p in PICS[:n_images] for x in (p, "and")])
    want, want_prompt = reference(messages, N)
    chat, images = template_messages(messages)
    prompt = llm.render(chat, images=images)
    assert prompt.token_ids == want_prompt  # the processor's expansion, token for token
    got, out = ours(llm, messages)
    assert got == want
    assert out.num_prompt_tokens == len(want_prompt)


def test_spans_carry_deepstack_positions_and_the_shift(served, llm):
    messages = user("Compare", PICS[0], "with", PICS[1], "now")
    chat, images = template_messages(messages)
    embedded = llm.embed(llm.render(chat, images=images))
    spec = served.model.spec
    C, D, k = spec.hidden_size, spec.head_dim, len(spec.vision.tower.deepstack_visual_indexes)
    proc = served.images.prompt.processor
    assert [proc.grid_thw(p.height, p.width) for p in PICS] == [(1, 4, 4), (1, 8, 4)]
    assert [s.rows.shape for s in embedded.embeds] == [(4, C * (1 + k) + D), (8, C * (1 + k) + D)]
    assert not any(s.bidirectional for s in embedded.embeds)
    # merged grids 2 x 2 and 4 x 2: the positions advance by max(h, w) = 2 and 4, not by 4 and 8 tokens
    assert [s.position_shift for s in embedded.embeds] == [2 - 4, 4 - 8]
    merged, deep = served.model.encode_images(*served.images.prompt.processor([PICS[1]]))
    np.testing.assert_array_equal(embedded.embeds[1].rows[:, :C], merged)
    np.testing.assert_array_equal(embedded.embeds[1].rows[:, C:2 * C], deep[0])


def test_chunked_prefill_and_prefix_cache_give_the_same(folder, reference):
    messages = user("Compare", PICS[1], "with", PICS[0], "please")
    want, prompt = reference(messages, N)
    # a 16-token budget splits the prompt (and the 12-token image span) across steps
    m = launch(str(folder), kv_cache_tokens=1024, max_num_batched_tokens=16, block_size=8)
    try:
        llm = m.llm()
        chat, images = template_messages(messages)
        spans = llm.embed(llm.render(chat, images=images)).embeds
        assert any(s.start // 16 != (s.start + len(s.rows) - 1) // 16 for s in spans)  # a span split by a chunk
        first, _ = ours(llm, messages)
        again, out = ours(llm, messages)
        assert first == again == want
        assert out.num_cached_tokens >= 8 * ((len(prompt) - 1) // 8)  # every full prompt block from the cache
    finally:
        m.client.close()


def test_text_only_chat_equals_transformers(llm, reference):
    messages = [{"role": "user", "content": "Hello there, how are you?"}]
    want, want_prompt = reference(messages, N)
    out = llm.chat(messages, GREEDY).result(timeout=120)[0]
    assert out.new_token_ids == want and out.num_prompt_tokens == len(want_prompt)


def test_a_batch_of_image_and_text_requests_each_equals_transformers(llm, reference):
    # Submitted together: prefill and decode steps mix sequences of other shifts (and none).
    cases = [user("Describe the picture", PICS[1]), [{"role": "user", "content": "Just text here"}],
             user("One", PICS[0], "two", PICS[1], "three")]
    wants = [reference(m, N)[0] for m in cases]
    futures = []
    for messages in cases:
        chat, images = template_messages(messages)
        futures.append(llm.chat(chat, GREEDY, images=images))
    assert [f.result(timeout=120)[0].new_token_ids for f in futures] == wants


@pytest.mark.parametrize("chunk", [None, 8])
def test_video_and_image_token_prompts_with_spans_equal_transformers_generate(tmp_path, chunk):
    # serve_spans on token ids (tiny_models.qwen3_vl_prompts): two images of grids 4 x 6 and 6 x 4;
    # a 3-frame video, one span per frame (its timestamp tokens between); the engine fed directly.
    from sgtest.vision import qwen3_vl_token_prompts

    for what, n_spans, got, want in qwen3_vl_token_prompts(tmp_path, "cpu", chunk, N):
        assert n_spans == (2 if what == "image" else 3)  # a video: one span per frame
        assert got == want, what


def test_bf16_served_prompt_equals_the_models_own_forward(folder):
    # In bf16 the served prefill (serving rows, rope_table by the rows' angles) computes what
    # Model.forward(ids, images=) does (whose f32 logits equal transformers': tests/models/test_qwen3_vl.py).
    m = launch(str(folder), kv_cache_tokens=1024, dtype="bfloat16")
    try:
        llm = m.llm()
        chat, images = template_messages(user("Compare", PICS[0], "with", PICS[1], "now"))
        prompt = llm.render(chat, images=images)
        out = llm.chat(chat, SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0),
                       images=images).result(timeout=120)[0]
        px, grid = m.images.prompt.processor(images)
        logits = torch.tensor(np.asarray(m.model.forward(np.array(prompt.token_ids, np.int32), images=(px, grid)),
                                         np.float32))
        ids = prompt.token_ids
        want = torch.log_softmax(logits, -1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].numpy()
        got = np.array([p.logprob for p in out.prompt_logprobs[1:]])
        np.testing.assert_allclose(got, want, atol=1e-5)
    finally:
        m.client.close()
