"""Gemma 3 images served on the GPU (launch(device="cuda"), f32): LLM.chat with one and two images,
a repeated image (the encoder's cache, the prefix cache) and a text-only chat give
transformers' greedy answer on Gemma3Processor's inputs, as test_vision_serving.py checks on the
CPU. Skipped without a CUDA build and a GPU."""

from __future__ import annotations

import pytest

from surogate import _native

pytestmark = pytest.mark.cuda
if not (_native.build_info()["cuda"] and _native.cuda_devices()):
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from sgtest.vision import hf_generate, image, make_gemma3_vision_chat, template_messages  # noqa: E402
from surogate.serve import SamplingParams  # noqa: E402
from surogate.serve.launch import launch  # noqa: E402

N = 8


def test_chat_with_images_on_cuda_equals_transformers(tmp_path):
    folder = make_gemma3_vision_chat(tmp_path / "g3v", seed=3)
    ref = transformers.Gemma3ForConditionalGeneration.from_pretrained(str(folder), dtype=torch.float32).eval()
    processor = transformers.AutoProcessor.from_pretrained(str(folder))
    m = launch(str(folder), device="cuda", dtype="float32", kv_cache_tokens=2048)
    try:
        llm = m.llm()
        pic = image(10)
        cases = [[{"type": "text", "text": "Describe"}, {"type": "image", "image": pic}],
                 [{"type": "text", "text": "Compare"}, {"type": "image", "image": image(11, (24, 64))},
                  {"type": "text", "text": "with"}, {"type": "image", "image": pic}],
                 [{"type": "text", "text": "Hello there"}]]
        for content in cases:
            messages = [{"role": "user", "content": content}]
            want, _ = hf_generate(ref, processor, messages, N)
            chat, images = template_messages(messages)
            out = llm.chat(chat, SamplingParams(temperature=0.0, max_tokens=N, ignore_eos=True),
                           images=images).result(timeout=120)[0]
            assert out.new_token_ids == want
        assert m.images.encodes == 2 and m.images.hits == 1
    finally:
        m.client.close()
