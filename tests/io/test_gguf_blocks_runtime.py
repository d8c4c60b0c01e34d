"""GGUF weights kept as blocks at run time (`load_model(x.gguf, quantized=True)`): the projections
are uint8 GGML rows multiplied by gguf_matmul, never dequantized. Against the same file loaded
dequantized: logits close, greedy output through the serving engine equal (Q8_0), the weights a
fraction of the memory; training through blocks is refused with a clear error. On a GPU (when
there is one) the device path gives the CPU's tokens."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")

import surogate  # noqa: E402
from sgtest.engine import engine, generate  # noqa: E402
from sgtest.tiny_models import make_model  # noqa: E402
from surogate import _native  # noqa: E402
from surogate.errors import UnsupportedError  # noqa: E402
from surogate.models import REGISTRY, family_named  # noqa: E402
from surogate.models.gguf_names import quantize_to_gguf  # noqa: E402

# K-quants need rows of 256 values: a hidden size and MLP width that are multiples of 256. A
# family's own GGUF overrides (Family.tiny.gguf) win: what its llama.cpp architecture fixes (Gemma 3's
# query scalar = head_dim) and transformers' GGUF reader assumes.
SHAPE = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 64, "num_hidden_layers": 2}


# Relative bound on |blocks - dequantized| per family where 5% is too tight: Gemma 4 at random
# init amplifies rounding (unscaled attention over RMS-normed q / k / v; see test_gguf_writer.py's
# LOADER_BOUNDS), measured 5.6% for Q4_K_M here.
BLOCK_PATH_BOUND = {"gemma4": 0.1}


@pytest.fixture(scope="module", params=[
    pytest.param(f.name, marks=pytest.mark.skip(reason=f.gguf.unsupported)) if f.gguf.unsupported else f.name
    for f in REGISTRY])
def folder(request, tmp_path_factory):
    return make_model(request.param, tmp_path_factory.mktemp(request.param), seed=4, initializer_range=0.05,
                      **{**SHAPE, **family_named(request.param).tiny.gguf})


def gguf(folder, qtype: str):
    out = folder.parent / f"{folder.name}.{qtype}.gguf"
    if not out.exists():
        quantize_to_gguf(folder, out, qtype)
    return out


def greedy(model, prompts: list[list[int]], n: int) -> list[list[int]]:
    """Each prompt alone. On the CPU a step of at most 32 tokens rounds x to 8 bits in gguf_matmul and
    a larger one does not, so with the prompts batched together a row's numbers would depend on
    what the scheduler happened to put beside it (seen: one token flipping under a loaded machine)."""
    with engine(model) as client:
        return [generate(client, [p], n)[0] for p in prompts]


def prompts(vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(0)
    return [rng.integers(3, vocab, n).tolist() for n in (5, 23, 40)]


def weight_bytes(model) -> int:
    return sum(a.nbytes for a in model.params.values())


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K_M"])
def test_blocks_give_the_dequantized_models_answers(folder, qtype):
    path = gguf(folder, qtype)
    deq = surogate.load_model(path)
    blk = surogate.load_model(path, quantized=True)
    # Every projection the file holds as blocks (LFM2's conv and w1/w3/w2 too), not the embedding,
    # the head or a MoE router.
    assert blk.quant and all(n.startswith("layers.") and not n.endswith("mlp.gate.weight") for n in blk.quant)
    assert all(blk.params[n].dtype == np.uint8 for n in blk.quant)
    exe = blk.executable("logits", 8, 1)
    assert "gguf_matmul" in exe.listing() and not any(
        "matmul(" in line and "_proj.weight" in line and "gguf" not in line for line in exe.listing().splitlines())
    ids = prompts(deq.spec.vocab_size)
    a, b = deq.forward(ids[1]), blk.forward(ids[1])
    # The CPU's block path rounds activations to 8 bits per block, as llama.cpp does.
    assert np.abs(a - b).max() < BLOCK_PATH_BOUND.get(deq.spec.family, 0.05) * np.abs(a).max()
    assert (a.argmax(-1) == b.argmax(-1)).mean() >= 0.9
    if qtype == "Q8_0":
        assert greedy(blk, ids, 8) == greedy(deq, ids, 8)
    projections = sum(deq.params[n].nbytes for n in blk.quant)
    kept = sum(blk.params[n].nbytes for n in blk.quant)
    assert kept < 0.3 * projections  # f32 -> ~8.5 (Q8_0) or ~4.5-6.5 (Q4_K_M) bits per weight
    assert weight_bytes(blk) < weight_bytes(deq)


def test_full_finetune_through_blocks_is_refused(folder):
    """Blocks have no gradient: a LoRA trains over them (tests/train/test_qlora.py), a full fine-tune
    is refused with what to do."""
    blk = surogate.load_model(gguf(folder, "Q8_0"), quantized=True)
    with pytest.raises(UnsupportedError, match="(?s)kept as GGUF blocks, which have no gradient.*QLoRA"):
        blk.loss_and_grads(prompts(blk.spec.vocab_size)[0])


def test_an_hf_folder_has_no_blocks_to_keep(folder):
    from surogate.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="not a GGUF file"):
        surogate.load_model(folder, quantized=True)


@pytest.mark.cuda
@pytest.mark.skipif(not (_native.build_info()["cuda"] and _native.cuda_devices()), reason="no CUDA build or no GPU")
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K_M"])
def test_blocks_on_cuda_match_the_dequantized_model(folder, qtype):
    path = gguf(folder, qtype)
    deq = surogate.load_model(path)
    gpu = surogate.load_model(path, device="cuda", quantized=True)
    ids = prompts(deq.spec.vocab_size)
    a, b = deq.forward(ids[2]), gpu.forward(ids[2])
    assert np.abs(a - b).max() < 1e-3 * np.abs(a).max()  # the GPU decodes blocks exactly, x stays f32
    assert greedy(gpu, ids, 8) == greedy(deq, ids, 8)
