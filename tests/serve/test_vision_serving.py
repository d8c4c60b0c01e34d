"""Images in serving, Gemma 3 (Gemma3ForConditionalGeneration), against transformers on a tiny
random checkpoint (sgtest/vision.py: tiny_models.make_gemma3_vision with Gemma 3's image tokens in
its tokenizer, a Gemma-3-style chat template and processor_config.json, so that transformers'
Gemma3Processor loads from the folder):

- the rendered prompt's ids (each <start_of_image> expanded, re-tokenized) equal the processor's
  input_ids, for one and two images and with pan-and-scan crops;
- LLM.chat's greedy answer with one and with two images, and with crops, equals
  Gemma3ForConditionalGeneration.generate on the processor's input_ids / pixel_values;
- a repeated image is encoded once (the encoder's cache) and its prompt served from the prefix
  cache; a text-only chat still equals HF; image tokens without an image are refused;
- the family's processor: preprocessor_config.json's, else the defaults at the tower's size; a
  processor_config.json whose image_seq_length disagrees with the model is refused; a tokenizer
  without the image tokens serves text only, with a warning.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from sgtest.vision import (hf_generate, image, make_gemma3_vision_chat, served_chat,  # noqa: E402
                           template_messages, user)
from surogate.errors import ConfigError, InvalidArgumentError  # noqa: E402
from surogate.serve import SamplingParams  # noqa: E402
from surogate.serve.launch import launch  # noqa: E402

N = 8  # greedy tokens compared
GREEDY = SamplingParams(temperature=0.0, max_tokens=N, ignore_eos=True)


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
def served(folder):
    m = launch(str(folder), kv_cache_tokens=2048)
    yield m
    m.client.close()


@pytest.fixture(scope="module")
def llm(served):
    return served.llm()


def ours(llm, messages):
    return served_chat(llm, messages, GREEDY)


@pytest.mark.parametrize("n_images", [1, 2])
def test_chat_with_images_equals_transformers_generate(served, llm, ref, processor, n_images):
    pics = [image(10), image(11, (24, 64))][:n_images]
    messages = user("Describe the picture", *[x for p in pics for x in (p, "and")])
    want, want_prompt = hf_generate(ref, processor, messages, N)
    chat, images = template_messages(messages)
    prompt = llm.render(chat, images=images)
    assert prompt.token_ids == want_prompt  # the processor's expansion, token for token
    v = served.model.spec.vision
    assert prompt.token_ids.count(v.image_token_index) == v.mm_tokens_per_image * n_images
    got, out = ours(llm, messages)
    assert got == want
    assert out.num_prompt_tokens == len(want_prompt)


def test_repeated_image_is_encoded_once_and_hits_the_prefix_cache(served, llm, ref, processor):
    enc = served.images
    pic = image(20, (33, 47))
    messages = user("What is this?", pic)
    want, _ = hf_generate(ref, processor, messages, N)
    before = enc.encodes
    first, _ = ours(llm, messages)
    assert enc.encodes == before + 1
    hits = enc.hits
    again, out = ours(llm, messages)
    assert first == again == want
    assert enc.encodes == before + 1 and enc.hits == hits + 1  # not encoded again
    assert out.num_cached_tokens >= 16  # the prompt's full blocks, image span included, from the prefix cache
    # the same image twice in one prompt: one encode (here a cache hit), two spans with the same rows
    twice = user("Compare", pic, "with", pic)
    want2, _ = hf_generate(ref, processor, twice, N)
    chat, images = template_messages(twice)
    embedded = llm.embed(llm.render(chat, images=images))
    assert len(embedded.embeds) == 2 and embedded.embeds[0].key == embedded.embeds[1].key
    assert all(s.bidirectional for s in embedded.embeds)
    image_id = served.model.spec.vision.image_token_index
    assert [embedded.token_ids[s.start - 1:s.start + 1] for s in embedded.embeds] == [[image_id - 2, image_id]] * 2
    assert enc.encodes == before + 1
    assert ours(llm, twice)[0] == want2


def test_the_encoder_cache_keeps_the_last_images(served, ref):
    from surogate.serve.multimodal import ImageEncoder

    enc = ImageEncoder(served.images.prompt, served.model.encode_images, cache_images=2)
    a, b, c = image(60), image(61), image(62)
    rows = enc.rows([a, b, a, c])  # a once (twice in one call), b, c; a is the oldest then: dropped
    assert enc.encodes == 3 and enc.hits == 0
    np.testing.assert_array_equal(rows[0], rows[2])
    with torch.no_grad():  # the rows are HF's projected image features for the processor's pixels
        want = ref.model.get_image_features(pixel_values=torch.from_numpy(enc.prompt.processor([c]).pixel_values))
    want = getattr(want, "pooler_output", want)
    np.testing.assert_allclose(rows[3], want.reshape(rows[3].shape).numpy(), atol=1e-4, rtol=0)
    enc.rows([c, b])
    assert enc.encodes == 3 and enc.hits == 2
    enc.rows([a])
    assert enc.encodes == 4


def test_text_only_chat_on_the_vision_model_equals_transformers(llm, ref, processor):
    messages = [{"role": "user", "content": "Hello there, how are you?"}]
    want, want_prompt = hf_generate(ref, processor, messages, N)
    assert llm.render(messages).token_ids == want_prompt
    assert ours(llm, messages)[0] == want


def test_image_tokens_without_an_image_are_refused(served, llm):
    from surogate.serve.frontend import Prompt

    v = served.model.spec.vision
    with pytest.raises(InvalidArgumentError, match="image token"):
        llm.generate([[2, 5, *[v.image_token_index] * 4, 9]], GREEDY)
    with pytest.raises(InvalidArgumentError, match="runs of"):  # a Prompt whose placeholder was never expanded
        llm.generate(Prompt([2, 5, v.boi_token_index, 9], None, [image(1)]), GREEDY)


def test_pan_and_scan_crops_equal_transformers(tmp_path, ref):
    # crops of at least 8 pixels from an image twice as wide as high: the original and 2 crops.
    # transformers' Gemma3Processor puts its own pan-and-scan defaults over preprocessor_config.json's
    # (off, 256-pixel crops): the reference gets the file's keys at the call.
    pan = {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 8, "pan_and_scan_max_num_crops": 3,
           "pan_and_scan_min_ratio_to_activate": 1.2}
    path = make_gemma3_vision_chat(tmp_path / "pas", seed=3, preprocessor=pan)
    proc = transformers.AutoProcessor.from_pretrained(str(path))
    messages = user("Look", image(30, (64, 30)), "closely")
    inputs = proc.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True,
                                      processor_kwargs={**pan, "return_tensors": "pt"})
    assert inputs["pixel_values"].shape[0] == 3  # the image and its two crops
    with torch.no_grad():
        want = ref.generate(**inputs, do_sample=False, max_new_tokens=N, min_new_tokens=N, eos_token_id=None,
                            pad_token_id=0)[0, inputs["input_ids"].shape[1]:].tolist()
    m = launch(str(path), kv_cache_tokens=2048)
    try:
        llm = m.llm()
        chat, images = template_messages(messages)
        prompt = llm.embed(llm.render(chat, images=images))
        assert prompt.token_ids == inputs["input_ids"][0].tolist()
        assert len(prompt.embeds) == 3 and len({s.key for s in prompt.embeds}) == 3
        assert ours(llm, messages)[0] == want
        assert m.images.encodes == 1  # the image's three views in one encode
    finally:
        m.client.close()


def test_processor_from_the_folder_or_the_towers_defaults(folder, tmp_path, served):
    from surogate.models.gemma3 import image_prompt

    spec, tok = served.model.spec, served.model.tokenizer
    with_file = image_prompt(spec, tok, str(folder)).processor
    assert (with_file.height, with_file.width) == (56, 56)
    bare = tmp_path / "bare"
    shutil.copytree(folder, bare)
    (bare / "preprocessor_config.json").unlink()
    defaults = image_prompt(spec, tok, str(bare)).processor
    assert (defaults.height, defaults.width) == (spec.vision.image_size,) * 2
    pic = image(3)
    np.testing.assert_array_equal(defaults([pic]).pixel_values, with_file([pic]).pixel_values)  # hub values = defaults
    (bare / "processor_config.json").write_text(json.dumps({"image_seq_length": 256}))
    with pytest.raises(ConfigError, match="image_seq_length 256"):
        image_prompt(spec, tok, str(bare))


def test_a_tokenizer_without_the_image_tokens_serves_text_only(tmp_path, caplog):
    from sgtest.tiny_models import make_gemma3_vision

    m = launch(str(make_gemma3_vision(tmp_path / "plain", seed=3)), kv_cache_tokens=256)
    try:
        with caplog.at_level("WARNING", logger="surogate.serve.launch"):
            llm = m.llm()
        assert not llm.accepts_images and m.images is None
        assert "served for text only" in caplog.text and "not in the tokenizer's vocabulary" in caplog.text
        assert len(llm.generate("hello", GREEDY)[0].new_token_ids) == N
    finally:
        m.client.close()
