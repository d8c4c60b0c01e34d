"""Trained-projector LoRA adapters served on the GPU (launch(device="cuda"), f32), as
test_projector_lora_serving.py checks on the CPU: an image request of the adapter (the projector's
device twins bound into the tower's Programs) and a base request in one batch give transformers +
peft's and transformers' greedy answers, also after a sleep. Skipped without a CUDA build and a GPU."""

from __future__ import annotations

import pytest

from surogate import _native

pytestmark = pytest.mark.cuda
if not (_native.build_info()["cuda"] and _native.cuda_devices()):
    pytest.skip("no CUDA build or no GPU", allow_module_level=True)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from sgtest.projector_lora import peft_reference, write_projector_adapter  # noqa: E402
from sgtest.vision import (hf_generate, image, make_gemma3_vision_chat, make_qwen3_vl_chat,  # noqa: E402
                           qwen3_vl_reference, template_messages, user)
from surogate.serve import SamplingParams  # noqa: E402
from surogate.serve.launch import launch  # noqa: E402

N = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=N, ignore_eos=True)


@pytest.mark.parametrize("family", ["gemma3", "qwen3_vl"])
def test_adapter_and_base_image_requests_on_cuda_equal_peft_and_transformers(family, tmp_path):
    if family == "gemma3":
        folder = make_gemma3_vision_chat(tmp_path / "base", seed=3)
    else:
        folder = make_qwen3_vl_chat(tmp_path / "base", seed=4)
    adapter = write_projector_adapter(folder, tmp_path / "proj", seed=1, targets=("q_proj", "v_proj"))
    messages = user("Describe the picture", image(10, (32, 48)))
    if family == "gemma3":
        processor = transformers.AutoProcessor.from_pretrained(str(folder))
        base = transformers.Gemma3ForConditionalGeneration.from_pretrained(str(folder), dtype=torch.float32).eval()
        want = {None: hf_generate(base, processor, messages, N)[0],
                "proj": hf_generate(peft_reference(folder, adapter), processor, messages, N)[0]}
    else:
        want = {None: qwen3_vl_reference(folder)[1](messages, N)[0],
                "proj": qwen3_vl_reference(folder, adapter)[1](messages, N)[0]}
    assert want[None] != want["proj"]
    m = launch(str(folder), device="cuda", dtype="float32", kv_cache_tokens=2048, loras={"proj": str(adapter)})
    try:
        llm = m.llm()
        chat, images = template_messages(messages)
        prompt = llm.render(chat, images=images)
        for _ in range(2):  # the second time after a sleep: the projector's device twins made again
            with m.client.held():
                gens = {name: llm.submit(prompt, GREEDY, adapter=name) for name in want}
            assert {name: g.result(timeout=120)[0].new_token_ids for name, g in gens.items()} == want
            m.client.release()
            m.client.restore()
            m.images._cache.clear()  # encode again, through the woken tower
    finally:
        m.client.close()
