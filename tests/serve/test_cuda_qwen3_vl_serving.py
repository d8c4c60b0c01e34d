"""Qwen3-VL images served on the GPU (launch(device="cuda"), f32): LLM.chat with one and two images
of different grids, chunked prefill, a text-only chat, and video frames / images of token-id
prompts as spans (serve_spans) give transformers' greedy answer, as
test_qwen3_vl_serving.py checks on the CPU (the serving rows through row-strided embed_rows, the
MRoPE angles by rope_table, kv_cache_write, position_shift in the engine's positions). Skipped
without a CUDA build and a GPU."""

from __future__ import annotations

import pytest

from surogate import _native

pytestmark = pytest.mark.cuda
if not (_native.build_info()["cuda"] and _native.cuda_devices()):
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from sgtest.vision import image, make_qwen3_vl_chat, qwen3_vl_reference, template_messages  # noqa: E402
from surogate.serve import SamplingParams  # noqa: E402
from surogate.serve.launch import launch  # noqa: E402

N = 8


@pytest.mark.parametrize("budget", [2048, 16])  # one prefill step; chunks that split the image spans
def test_qwen3_vl_chat_with_images_on_cuda_equals_transformers(tmp_path, budget):
    folder = make_qwen3_vl_chat(tmp_path / "q3vl", seed=4)
    _, reference = qwen3_vl_reference(folder)
    m = launch(str(folder), device="cuda", dtype="float32", kv_cache_tokens=2048, max_num_batched_tokens=budget,
               block_size=8)
    try:
        llm = m.llm()
        pic = image(10)
        cases = [[{"type": "text", "text": "Describe"}, {"type": "image", "image": pic}],
                 [{"type": "text", "text": "Compare"}, {"type": "image", "image": image(11, (24, 64))},
                  {"type": "text", "text": "with"}, {"type": "image", "image": pic}],
                 [{"type": "text", "text": "Hello there"}]]
        for content in cases:
            messages = [{"role": "user", "content": content}]
            want, _ = reference(messages, N)
            chat, images = template_messages(messages)
            out = llm.chat(chat, SamplingParams(temperature=0.0, max_tokens=N, ignore_eos=True),
                           images=images).result(timeout=120)[0]
            assert out.new_token_ids == want
    finally:
        m.client.close()


def test_qwen3_vl_video_frames_and_images_as_spans_on_cuda_equal_transformers(tmp_path):
    from sgtest.vision import qwen3_vl_token_prompts

    for what, _, got, want in qwen3_vl_token_prompts(tmp_path, "cuda", 8, N):
        assert got == want, what
