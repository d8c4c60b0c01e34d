"""A trained-projector LoRA adapter (train_projector; sgtest/projector_lora.py) through the gateway,
in process (the app over a launched tiny Gemma 3 / Qwen3-VL), with the openai SDK: loaded at run
time by ``POST /v1/load_lora_adapter``, an image chat naming it answers as transformers + peft
does while the base model's answers as transformers alone; ``POST /v1/unload_lora_adapter``
drops it (its projector and its encoder rows; the name is then a 404); an adapter whose projector
does not fit the model is a 400 naming the tensor."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from sgtest.projector_lora import peft_reference, write_projector_adapter  # noqa: E402
from sgtest.vision import (hf_generate, image, image_url_part, make_gemma3_vision_chat,  # noqa: E402
                           make_qwen3_vl_chat, qwen3_vl_reference, user)

N = 6
MODEL = "vlm"


@pytest.mark.parametrize("family", ["gemma3", "qwen3_vl"])
def test_load_chat_unload_a_trained_projector_adapter(family, tmp_path):
    from safetensors.numpy import load_file, save_file

    from surogate.gateway.app import GatewayApp
    from surogate.gateway.models import GatewayConfig, ServedModel
    from surogate.serve.launch import launch

    folder = (make_gemma3_vision_chat(tmp_path / "base", seed=3) if family == "gemma3" else
              make_qwen3_vl_chat(tmp_path / "base", seed=4))
    adapter = write_projector_adapter(folder, tmp_path / "proj", seed=2, targets=("q_proj", "v_proj"))
    pic = image(70, (32, 48))
    messages = user("What is this?", pic)
    if family == "gemma3":
        processor = transformers.AutoProcessor.from_pretrained(str(folder))
        base_ref = transformers.Gemma3ForConditionalGeneration.from_pretrained(str(folder), dtype=torch.float32).eval()
        want_base = hf_generate(base_ref, processor, messages, N)[0]
        want_tuned = hf_generate(peft_reference(folder, adapter), processor, messages, N)[0]
    else:
        want_base = qwen3_vl_reference(folder)[1](messages, N)[0]
        want_tuned = qwen3_vl_reference(folder, adapter)[1](messages, N)[0]
    assert want_tuned != want_base  # the adapter matters
    tensors = load_file(adapter / "adapter_model.safetensors")
    name = next(k for k in tensors if k.endswith(("mm_input_projection_weight", "visual.merger.linear_fc1.weight")))
    misfit = tmp_path / "misfit"
    misfit.mkdir()
    (misfit / "adapter_config.json").write_text((adapter / "adapter_config.json").read_text())
    save_file({**tensors, name: np.zeros((tensors[name].shape[0] + 2, tensors[name].shape[1]), np.float32)},
              misfit / "adapter_model.safetensors", metadata={"format": "pt"})

    m = launch(str(folder), kv_cache_tokens=2048)
    app = GatewayApp([ServedModel(MODEL, m.llm())], GatewayConfig())
    tok = m.model.tokenizer

    async def check():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw", timeout=60) as http:
            client = openai.AsyncOpenAI(base_url="http://gw/v1", api_key="none", max_retries=0, http_client=http)

            async def chat(model):
                r = await client.chat.completions.create(
                    model=model, max_tokens=N, temperature=0, extra_body={"ignore_eos": True},
                    messages=[{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                                           image_url_part(pic)]}])
                return r.choices[0].message.content

            r = await http.post("/v1/load_lora_adapter", json={"lora_name": "tuned", "lora_path": str(adapter)})
            assert (r.status_code, r.text) == (200, "Success: LoRA adapter 'tuned' added successfully.")
            slot = m.client.adapters["tuned"]
            got = {"tuned": await chat("tuned"), MODEL: await chat(MODEL)}
            assert got == {"tuned": tok.decode(want_tuned), MODEL: tok.decode(want_base)}
            assert slot in m.model.projectors and any(k[0] == slot for k in m.images._cache)

            r = await http.post("/v1/load_lora_adapter", json={"lora_name": "misfit", "lora_path": str(misfit)})
            err = r.json()["error"]
            assert r.status_code == 400 and err["param"] == "lora_path", r.text
            assert name[len("base_model.model."):] in err["message"] and "has shape" in err["message"]

            r = await http.post("/v1/unload_lora_adapter", json={"lora_name": "tuned"})
            assert (r.status_code, r.text) == (200, "Success: LoRA adapter 'tuned' removed successfully.")
            assert len(m.model.projectors) == 0 and not any(k[0] == slot for k in m.images._cache)
            with pytest.raises(openai.NotFoundError):
                await chat("tuned")
            assert await chat(MODEL) == tok.decode(want_base)

    try:
        asyncio.run(check())
    finally:
        m.client.close()
