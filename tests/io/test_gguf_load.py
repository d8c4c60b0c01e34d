"""`surogate.load_model("x.gguf")` against transformers loading the same GGUF (it dequantizes the
blocks itself and undoes llama.cpp's q/k row order): SmolLM2-135M-Instruct Q4_1 (30 layers,
9 query / 3 kv heads, tied embeddings, Q8_0 embedding, GPT-2-style BPE).

Measured on this file: logits max |ours - transformers| ~1e-4 (logits reach ~28), the tolerance
is 2e-3; greedy decoding agrees for all 16 tokens (the smallest top-1 margin on the way is 0.08).
Also the quantized-matmul path (blocks kept, `gguf_matmul`), which the runtime will use later."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sgtest.smollm2 import smollm2_path

import surogate
from surogate.io import GGUFFile
from surogate.models import config_from_gguf, family_for
from surogate.models.gguf_names import GGUFWeights, gguf_blocks_for, load_gguf_params, rope_rows

PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ", "1, 1, 2, 3, 5, 8, 13,"]
STEPS = 16




@pytest.fixture(scope="module")
def ours():
    return surogate.load_model(smollm2_path())


@pytest.fixture(scope="module")
def reference():
    """transformers' model from the same GGUF: (logits of a sequence, its greedy continuation)."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()
    path = smollm2_path()
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    torch.set_num_threads(1)  # its idle threads would spin on the cores our kernels run on

    @torch.no_grad()
    def logits(ids: list[int]) -> np.ndarray:
        return model(torch.tensor([ids])).logits[0].numpy()

    @torch.no_grad()
    def greedy(ids: list[int], steps: int) -> list[int]:
        out = model(torch.tensor([ids]), use_cache=True)
        new = []
        for _ in range(steps):  # no stop on eos: compare every step
            new.append(int(out.logits[0, -1].argmax()))
            # transformers 5 calls the KV cache `cache`, 4.x `past_key_values`.
            kv = {"cache": out["cache"]} if "cache" in out else {"past_key_values": out.past_key_values}
            out = model(torch.tensor([new[-1:]]), use_cache=True, **kv)
        return new

    return logits, greedy


def test_logits_match_transformers(ours, reference):
    logits, _ = reference
    docs = [ours.tokenizer.encode(prompt) for prompt in PROMPTS]
    packed = ours.forward(docs)  # the prompts as separate documents of one batch: one compile
    for got, ids in zip(np.split(packed, np.cumsum([len(d) for d in docs])[:-1]), docs, strict=True):
        want = logits(ids)
        assert np.abs(got - want).max() < 2e-3, ours.tokenizer.decode(ids)
        assert (got.argmax(-1) == want.argmax(-1)).all()


def test_greedy_decoding_matches_transformers(ours, reference):
    """transformers decodes 16 tokens greedily (KV cache, no stop on eos); our model, run once
    on prompt + those tokens, picks the same token at each of the 16 positions, which is what
    greedy decoding with our model would produce."""
    _, greedy = reference
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = ours.tokenizer.apply_chat_template(chat, add_generation_prompt=True)
    want = greedy(prompt, STEPS)
    got = ours.forward(prompt + want)[len(prompt) - 1:-1].argmax(-1).tolist()
    assert got == want, (ours.tokenizer.decode(got), ours.tokenizer.decode(want))
    assert "Paris" in ours.tokenizer.decode(want)


def test_bfloat16_load(ours):
    """Weights are dequantized straight to bf16: the f32 values rounded once. Logits then differ
    by bf16 compute (not the loader's doing), so only a loose bound and the top token are checked."""
    import ml_dtypes

    model = surogate.load_model(smollm2_path(), dtype="bfloat16")
    for name in ("layers.0.self_attn.q_proj.weight", "layers.7.mlp.gate_up_proj.weight", "embed_tokens.weight"):
        assert model.params[name].dtype == np.dtype(ml_dtypes.bfloat16)
        np.testing.assert_array_equal(model.params[name], ours.params[name].astype(ml_dtypes.bfloat16))
    ids = ours.tokenizer.encode(PROMPTS[0])
    got, want = model.forward(ids), ours.forward(ids)
    assert np.abs(got - want).max() < 1.0 and got[-1].argmax() == want[-1].argmax()


def test_q_and_k_rows_are_put_back_in_hf_order(ours):
    gf = GGUFFile(smollm2_path())
    raw = gf.tensor("blk.2.attn_k.weight").dequantize()
    ours_k = ours.params["layers.2.self_attn.k_proj.weight"]
    # GGUF row 2j + t of a head holds HF row t * D/2 + j (D = 64, 3 kv heads).
    np.testing.assert_array_equal(ours_k[rope_rows(192, 3, to_gguf=True)], raw)
    assert ours_k[32].tolist() == raw[1].tolist() and ours_k[1].tolist() == raw[2].tolist()


def test_quantized_matmul_path_equals_dequantized_weights():
    """Blocks kept as stored (rows reordered, gate/up stacked) through gguf_matmul give x @ W.T
    of the dequantized weight: within the int8-activation path's error for N <= 32 tokens, to
    float rounding on the float path above that."""
    gf = GGUFFile(smollm2_path())
    config = config_from_gguf(gf)
    family = family_for(config)
    names = [p.name for p in family.architecture(family.spec_from_config(config)).build(mode="logits",
                                                                                         dtype="float32").params()
             if p.name.startswith("layers.4.") and "proj" in p.name]
    assert len(names) == 6
    blocks = gguf_blocks_for(GGUFWeights(gf, family.gguf.tensors(), config), family.name_table(), names)
    values = load_gguf_params(gf, family, config, names)
    rng = np.random.default_rng(0)
    for name in names:
        w = blocks[name]
        assert w.shape == values[name].shape, name
        for n_tokens, tol in ((1, 2e-2), (9, 2e-2), (64, 1e-5)):
            x = rng.standard_normal((n_tokens, w.cols), dtype=np.float32)
            want = x.astype(np.float64) @ values[name].astype(np.float64).T
            assert np.abs(w.matmul(x) - want).max() <= tol * np.abs(want).max(), (name, n_tokens)


def test_model_path_and_config(ours):
    assert ours.path == str(smollm2_path()) and ours.config["tie_word_embeddings"] is True
    assert ours.tokenizer is not None and ours.tokenizer.eos_token == "<|im_end|>"
    assert "lm_head.weight" not in ours.params
