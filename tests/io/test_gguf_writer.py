"""Writing GGUF (`surogate quantize`): each registered family's tiny HF model (rows of 256 and
512 values, so every K type applies) written in each type and read back by gguf-py (metadata,
tensor types, values) and by transformers (an independent reader of llama.cpp's layout); our
loader on our files; the tokenizer round trip; SmolLM2 through GGUF -> HF folder -> Q8_0 ->
GGUF; and what Q4_K_M costs a trained model (see test_q4_k_m_cost_on_a_trained_model)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sgtest.smollm2 import smollm2_path
from gguf import GGUFReader
from gguf.quants import dequantize as gguf_dequantize
from sgtest import tiny_models

import surogate
from surogate.errors import FileFormatError, NotFoundError, UnsupportedError
from surogate.dsl.nn import SandwichBlock
from surogate.io import GGUFFile, Tokenizer, save_hf_tokenizer, save_safetensors
from surogate.io.gguf_writer import QUANT_TYPES, tensor_type, use_more_bits
from surogate.models import REGISTRY, config_from_gguf, family_named
from surogate.models.gguf_names import quantize_to_gguf, rope_rows, stack_expert_tensors
from surogate.train.export import save_hf_folder

# Relative RMS error of the stored weights against the source, per GGML type: measured on
# these Gaussian weights F16 2e-4, BF16 1.7e-3, Q8_0 5.4e-3, Q6_K 1.8e-2, Q5_K 3.6e-2,
# Q5_1 3.8e-2, Q5_0 4.3e-2, Q4_K 7.1e-2; bounds about 1.4x that.
REL_RMS = {"F32": 0.0, "F16": 5e-4, "BF16": 3e-3, "Q8_0": 8e-3, "Q6_K": 2.5e-2, "Q5_K": 5e-2, "Q5_1": 5.5e-2,
           "Q5_0": 6e-2, "Q4_K": 0.1}
FILE_TYPES = {"F32": 0, "F16": 1, "BF16": 32, "Q8_0": 7, "Q6_K": 18, "Q5_K_M": 17, "Q4_K_M": 15}
TEXT = "Hello world! The quick brown fox jumps over the lazy dog, again and again."
# A family whose GGUF this tree does not write yet (Family.gguf.unsupported) is skipped with that reason.
FAMILIES = [pytest.param(f.name, marks=pytest.mark.skip(reason=f.gguf.unsupported)) if f.gguf.unsupported else f.name
            for f in REGISTRY]
GGUF_REGISTRY = [f for f in REGISTRY if not f.gguf.unsupported]
# What llama.cpp's converter writes for the tokenizer styles of the tiny models: (pre-tokenizer, add BOS).
TOKENIZER = {"llama3": ("llama-bpe", True), "chatml": ("qwen2", False), "mistral": ("llama-bpe", True),
             "gemma": ("qwen2", True)}
# Families whose GGUF files transformers' GGUF loader cannot read, and why; our reader is checked
# against gguf-py and against the HF folder for them all the same.
TRANSFORMERS_CANNOT_READ = {
    "gpt_oss": "transformers' GGUF reader fails on a gpt-oss file (a TypeError in its tensor processing of the "
               "3-D expert tensors); tests/models/test_gpt_oss.py checks our gpt-oss GGUF against gguf-py and "
               "the dequantized HF weights instead",
    "gemma4": "transformers' gemma4 GGUF reader takes feed_forward_length as one int (llama.cpp's per-layer array "
              "for double-wide MLPs fails its config validation) and keeps Gemma4TextConfig's defaults for what it "
              "does not map (every 6th layer full, no KV sharing, per-layer inputs of 256 over 262144 tokens, no "
              "swa head dim): test_gguf_gemma4.py checks ours against transformers on the file's dequantized "
              "weights instead",
    "mistral": "transformers renames a 'llama' GGUF whose general.name says Mistral to an architecture 'mistral' "
               "that its gguf-py lacks (NotImplementedError), llama.cpp's own Mistral files included",
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """family -> (HF folder, {type: GGUF path}), for every registered family: its tiny model
    with the family's GGUF overrides (``Family.tiny.gguf``: rows of 256 values; Qwen3's
    head_dim of 128, which transformers' GGUF reader assumes)."""
    root = tmp_path_factory.mktemp("tiny")
    folders = {f.name: tiny_models.make_model(f.name, root / f.name, **f.tiny.gguf) for f in GGUF_REGISTRY}
    return {family: (folder, {t: quantize_to_gguf(folder, root / f"{family}-{t}.gguf", t) for t in QUANT_TYPES})
            for family, folder in folders.items()}


def hf_tensors(folder: Path) -> dict[str, np.ndarray]:
    from surogate.io import ModelFolder

    weights = ModelFolder(folder).open_weights()
    return {name: np.array(weights.get(name), np.float32) for name in weights.keys()}  # noqa: SIM118


# ---- metadata and tensor types, read back by gguf-py ---------------------------------------

# Families whose llama.cpp metadata is per layer beyond what the generic check below knows; their
# own test file reads every key back.
OWN_METADATA_TEST = {"gemma4": "per-kind head dims, kv heads, widths and ropes: test_gguf_gemma4.py reads every key"}


@pytest.mark.parametrize("family", [
    pytest.param(f, marks=pytest.mark.skip(reason=OWN_METADATA_TEST[f])) if f in OWN_METADATA_TEST else f
    for f in FAMILIES if isinstance(f, str)] + [f for f in FAMILIES if not isinstance(f, str)])
def test_metadata_read_back_by_gguf_py(tiny, family):
    folder, files = tiny[family]
    config = json.loads((folder / "config.json").read_text())
    spec = json.loads((folder / "tokenizer.json").read_text())
    reader = GGUFReader(files["Q4_K_M"])
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    a = family_named(family).gguf.name
    pre, add_bos = TOKENIZER[family_named(family).tiny.tokenizer]
    assert meta["general.architecture"] == a and meta["general.file_type"] == 15
    assert meta["general.quantization_version"] == 2
    assert (meta[f"{a}.block_count"], meta[f"{a}.embedding_length"], meta[f"{a}.feed_forward_length"]) == (2, 256, 512)
    model = family_named(family).spec_from_config(config)
    kv = config["num_key_value_heads"]
    if model.layer_kinds:  # a hybrid: llama.cpp's per-layer count, 0 for a layer without attention
        kv = [kv if k == "attention" else 0 for k in model.layer_kinds]
    assert (meta[f"{a}.attention.head_count"], meta[f"{a}.attention.head_count_kv"]) == (
        config["num_attention_heads"], kv)
    head_dim = config.get("head_dim") or 256 // config["num_attention_heads"]
    assert meta[f"{a}.attention.key_length"] == meta[f"{a}.rope.dimension_count"] == head_dim
    rope = config.get("rope_parameters") or {}
    rope = rope.get("full_attention", rope)  # v5 per-kind (Gemma 3: the global layers' base is the file's)
    theta = rope.get("rope_theta", config.get("rope_theta"))  # v5 / v4 config
    assert meta[f"{a}.rope.freq_base"] == theta
    assert meta[f"{a}.attention.layer_norm_rms_epsilon"] == pytest.approx(model.rms_norm_eps)
    assert meta[f"{a}.context_length"] == config["max_position_embeddings"]
    assert meta["tokenizer.ggml.model"] == "gpt2"
    assert meta["tokenizer.ggml.pre"] == pre
    assert len(meta["tokenizer.ggml.tokens"]) == len(meta["tokenizer.ggml.token_type"]) == config["vocab_size"]
    assert len(meta["tokenizer.ggml.merges"]) == len(spec["model"]["merges"])
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    for added in spec["added_tokens"]:
        assert tokens[added["id"]] == added["content"] and types[added["id"]] == (3 if added["special"] else 4)
    assert meta["tokenizer.ggml.eos_token_id"] == config["eos_token_id"]
    assert meta["tokenizer.chat_template"] == json.loads((folder / "tokenizer_config.json").read_text())[
        "chat_template"]
    assert meta["tokenizer.ggml.add_bos_token"] is add_bos
    names = {t.name for t in reader.tensors}
    attn = [i for i in range(2) if not model.layer_kinds or model.layer_kinds[i] == "attention"]
    mixer = {i: ("attn_q", "attn_k", "attn_v", "attn_output") if i in attn else
             ("shortconv.conv", "shortconv.in_proj", "shortconv.out_proj") for i in range(2)}
    final_norm = "token_embd_norm" if family == "lfm2" else "output_norm"  # llama.cpp's name for LFM2's embedding_norm
    expected = {"token_embd.weight", f"{final_norm}.weight", *(
        f"blk.{i}.{n}.weight" for i in range(2) for n in ("attn_norm", *mixer[i], "ffn_norm", "ffn_gate", "ffn_up",
                                                          "ffn_down"))}
    if not model.tie_word_embeddings:
        expected.add("output.weight")
    if model.qk_norm:
        expected |= {f"blk.{i}.attn_{n}_norm.weight" for i in attn for n in ("q", "k")}
    if model.attention_bias:
        expected |= {f"blk.{i}.attn_{n}.bias" for i in range(2) for n in ("q", "k", "v")}
    if isinstance(family_named(family).architecture(model).blocks[0], SandwichBlock):  # Gemma's post-norms
        expected |= {f"blk.{i}.{n}.weight" for i in range(2) for n in ("post_attention_norm", "post_ffw_norm")}
    for i in model.moe.layers if model.moe else ():  # experts stacked per projection, the router
        expected -= {f"blk.{i}.{n}.weight" for n in ("ffn_gate", "ffn_up", "ffn_down")}
        expected |= {f"blk.{i}.{n}.weight" for n in ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")}
    if model.attention_sinks:  # GPT-OSS: sinks, o / router / expert biases, post_attention_norm for ffn_norm
        for i in range(2):
            expected = (expected - {f"blk.{i}.ffn_norm.weight"}) | {
                f"blk.{i}.{n}" for n in ("attn_sinks.weight", "post_attention_norm.weight", "attn_output.bias",
                                         "ffn_gate_inp.bias", "ffn_gate_exps.bias", "ffn_up_exps.bias",
                                         "ffn_down_exps.bias")}
    assert names == expected
    # Every name is one gguf-py (llama.cpp's table) knows for the architecture.
    import gguf

    arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == a)
    known = {gguf.TENSOR_NAMES[t].format(bid=i) + suffix for t in gguf.MODEL_TENSORS[arch] for i in range(2)
             for suffix in (".weight", ".bias")}
    assert names <= known, sorted(names - known)


@pytest.mark.parametrize("qtype", QUANT_TYPES)
def test_tensor_types_follow_the_recipe(tiny, qtype):
    base = {"Q4_K_M": "Q4_K", "Q5_K_M": "Q5_K"}.get(qtype, qtype)
    more = {"Q4_K_M": "Q6_K", "Q5_K_M": "Q6_K"}.get(qtype, base)
    head = {"Q4_K_M": "Q6_K", "Q5_K_M": "Q6_K"}.get(qtype, base)
    for family, (folder, files) in tiny.items():
        config = json.loads((folder / "config.json").read_text())
        tied, n = config["tie_word_embeddings"], config["num_hidden_layers"]
        reader = GGUFReader(files[qtype])
        types = {t.name: t.tensor_type.name for t in reader.tensors}
        dims = {t.name: len(t.shape) for t in reader.tensors}
        table = family_named(family).gguf.tensors()
        kept_f32 = {g.gguf.replace("{i}", str(i)) for g in table.entries.values() if g.f32 for i in range(n)}
        # llama-quantize counts attn_v tensors (layers without one: conv, KV-shared), ffn_down by layer.
        attn_v = sorted((n_ for n_ in types if n_.endswith(".attn_v.weight")), key=lambda n_: int(n_.split(".")[1]))
        for name, got in types.items():
            if dims[name] == 1 or name in kept_f32:
                want = "F32"  # 1-D tensors (norms, biases, scalars, rope_freqs) stay F32, as llama.cpp keeps them
            elif name == ("token_embd.weight" if tied else "output.weight"):
                want = head  # the head: output, or the tied embedding
            elif name.split(".")[-2] == "attn_v" and use_more_bits(attn_v.index(name), len(attn_v)):
                want = more  # e.g. 2 of them: the second (>= 7n/8) is a "more bits" one
            elif name.split(".")[-2] == "ffn_down" and use_more_bits(int(name.split(".")[1]), n):
                want = more
            else:
                want = base
            assert got == want, (family, qtype, name)


def test_recipe_choices_and_fallbacks():
    assert [use_more_bits(i, 32) for i in range(8)] == [True, True, True, True, False, False, True, False]
    assert tensor_type("Q4_K_M", "blk.6.ffn_down.weight", (4096, 14336), 32, True) == "Q6_K"
    assert tensor_type("Q4_K_M", "blk.7.ffn_down.weight", (4096, 14336), 32, True) == "Q4_K"
    assert tensor_type("Q4_K_M", "blk.7.attn_output.weight", (4096, 4096), 32, True) == "Q4_K"
    # attn_v by its index among the attn_v tensors: E2B's 15 own-KV layers of 35 (layer 14 is the last one).
    assert tensor_type("Q4_K_M", "blk.14.attn_v.weight", (512, 1536), 35, True, attn_v=(14, 15)) == "Q6_K"
    assert tensor_type("Q4_K_M", "blk.14.attn_v.weight", (512, 1536), 35, True) == "Q4_K"
    assert tensor_type("Q4_K_M", "token_embd.weight", (32000, 4096), 32, True) == "Q4_K"
    # Rows of 576 values (SmolLM2) are no whole K block: llama.cpp's fallbacks.
    assert tensor_type("Q4_K_M", "blk.0.attn_q.weight", (576, 576), 30, False) == "Q5_0"
    assert tensor_type("Q5_K_M", "blk.0.attn_q.weight", (576, 576), 30, False) == "Q5_1"
    assert tensor_type("Q6_K", "blk.0.attn_q.weight", (576, 576), 30, False) == "Q8_0"
    assert tensor_type("Q4_K_M", "token_embd.weight", (49152, 576), 30, False) == "Q8_0"
    assert tensor_type("Q4_K_M", "blk.0.ffn_down.weight", (576, 1536), 30, False) == "Q6_K"
    assert tensor_type("Q8_0", "blk.0.attn_q.weight", (8, 48), 2, True) == "F16"
    assert tensor_type("Q4_K_M", "blk.0.attn_q.weight", (8, 48), 2, True) == "F16"
    assert tensor_type("BF16", "blk.0.attn_norm.weight", (48,), 2, True) == "F32"
    with pytest.raises(UnsupportedError, match="Q3_K_S"):
        tensor_type("Q3_K_S", "x", (1, 256), 1, True)


@pytest.mark.parametrize("qtype", QUANT_TYPES)
def test_stored_weights_close_to_the_source(tiny, qtype):
    """gguf-py decodes our blocks; llama.cpp's q/k row order undone; relative RMS error per type."""
    for family, (folder, files) in tiny.items():
        config = json.loads((folder / "config.json").read_text())
        table = family_named(family).gguf.tensors()
        # A MoE layer's per-expert tensors as the stacked ones the GGUF names (split in parts).
        source = {n: read() for n, read in stack_expert_tensors(
            family_named(family), config, {n: (lambda a=a: a) for n, a in hf_tensors(folder).items()}).items()}
        extra = family_named(family).gguf.extra_tensors
        made = extra(config) if extra else {}
        for t in GGUFReader(files[qtype]).tensors:
            if t.name in made:  # made from the config, not a checkpoint tensor: written exactly
                np.testing.assert_array_equal(t.data.reshape(made[t.name].shape), made[t.name])
                continue
            hf_name = table.to_hf(t.name)
            want = source[hf_name]
            g = table.to_gguf(hf_name)
            if g.transposed:  # GPT-OSS: HF's [E, in, out] experts are llama.cpp's [E, out, in]
                want = np.swapaxes(want, -1, -2)
            if g.parts:
                k, n = g.names().index(t.name), len(g.names())
                want = np.take(want, np.arange(k, want.shape[g.axis], n), axis=g.axis) if g.interleaved else \
                    np.split(want, n, axis=g.axis)[k]
            got = gguf_dequantize(t.data, t.tensor_type).reshape(want.shape) - table.to_gguf(hf_name).shift
            kind = table.to_gguf(hf_name).rope_rows
            if kind:
                heads = config["num_key_value_heads" if kind == "k" else "num_attention_heads"]
                got = got[rope_rows(len(got), heads, to_gguf=False)]
            # (transformers starts biases at zero: a zero tensor must come back zero)
            err = np.sqrt(np.mean((got - want) ** 2) / max(np.mean(want ** 2), 1e-30))
            assert err <= REL_RMS[t.tensor_type.name], (family, t.name, t.tensor_type.name, err)


# ---- loading our files -----------------------------------------------------------------------

LOADER_BOUNDS = {
    "default": (("F32", 1e-5), ("F16", 5e-3), ("BF16", 2e-2), ("Q8_0", 0.04), ("Q6_K", 0.12), ("Q4_K_M", 0.4)),
    # Gemma 4 at random init is an order of magnitude more sensitive to rounding its weights, in
    # transformers as here (unscaled attention over RMS-normed q / k / v; rounding all its tensors
    # to bf16 moves transformers' logits by 0.05, one k_proj alone to f16 by 0.03): measured F16
    # 0.0067, BF16 0.053, Q8_0 0.21, Q6_K 0.55, Q4_K_M 0.76. test_gguf_gemma4.py checks the same
    # files against transformers on their dequantized weights to 1e-4.
    "gemma4": (("F32", 1e-5), ("F16", 0.012), ("BF16", 0.08), ("Q8_0", 0.3), ("Q6_K", 0.8), ("Q4_K_M", 1.1)),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_our_loader_on_our_gguf(tiny, family):
    """F32 gives the f32 model's logits; quantized types stay within bounds measured on these
    random models (logits within ~1.4 in magnitude): Q8_0 0.016, Q6_K 0.06, Q4_K_M 0.20."""
    folder, files = tiny[family]
    reference = surogate.load_model(folder)
    ids = reference.tokenizer.encode(TEXT)
    want = reference.forward(ids)
    for qtype, bound in LOADER_BOUNDS.get(family, LOADER_BOUNDS["default"]):
        model = surogate.load_model(files[qtype])
        assert np.abs(model.forward(ids) - want).max() < bound, (family, qtype)
    assert model.config["tie_word_embeddings"] is reference.spec.tie_word_embeddings


@pytest.mark.parametrize("family", [
    pytest.param(f, marks=pytest.mark.skip(reason=TRANSFORMERS_CANNOT_READ[f])) if f in TRANSFORMERS_CANNOT_READ else f
    for f in FAMILIES if isinstance(f, str)] + [f for f in FAMILIES if not isinstance(f, str)])
def test_transformers_reads_our_gguf_as_we_do(tiny, family):
    """transformers' GGUF loader (its own reader of llama.cpp's names, row order and metadata)
    gives the logits our loader gives from the same file."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()
    _, files = tiny[family]
    path = files["Q8_0"]
    ours = surogate.load_model(path)
    ids = ours.tokenizer.encode(TEXT)
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(ours.forward(ids) - want).max() < 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_tokenizer_round_trip(tiny, family):
    folder, files = tiny[family]
    ours, source = Tokenizer.from_gguf(files["Q8_0"]), Tokenizer.from_folder(folder)
    texts = [*tiny_models.CORPUS, "  spaces  and\n\nnew lines ", "<|im_start|>user\nhi<|im_end|>", "12345 67"]
    for text in texts:
        for special in (True, False):
            assert ours.encode(text, add_special_tokens=special) == source.encode(text, add_special_tokens=special)
        ids = source.encode(text)
        assert ours.decode(ids, skip_special_tokens=True) == source.decode(ids, skip_special_tokens=True)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the weather like?"}]
    assert ours.apply_chat_template(chat, add_generation_prompt=True) == source.apply_chat_template(
        chat, add_generation_prompt=True)
    assert (ours.bos_token, ours.eos_token, ours.add_bos_token) == (source.bos_token, source.eos_token,
                                                                     source.add_bos_token)
    assert set(ours.eos_token_ids) == set(source.eos_token_ids)


@pytest.mark.parametrize("family", [f.name for f in REGISTRY if f.gguf.rope_freqs])
def test_llama3_rope_scaling_round_trip(tmp_path, family):
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64}
    folder = tiny_models.make_model(family, tmp_path / "l3", **family_named(family).tiny.gguf,
                                    rope_scaling=dict(rope), max_position_embeddings=512)
    path = quantize_to_gguf(folder, tmp_path / "l3.gguf", "F32")
    gf = GGUFFile(path)
    assert "rope_freqs.weight" in gf.tensors and config_from_gguf(gf)["rope_scaling"] == rope
    reference, ours = surogate.load_model(folder), surogate.load_model(path)
    ids = list(range(1, 200))  # past the original context, where the scaling matters
    assert np.abs(ours.forward(ids) - reference.forward(ids)).max() < 1e-4


# ---- the command and its failures -----------------------------------------------------------

def test_cli_quantize(tiny, tmp_path):
    folder, _ = tiny["llama"]
    out = tmp_path / "out" / "model.gguf"
    proc = subprocess.run([sys.executable, "-P", "-m", "surogate.cli.main", "quantize", str(folder), "--type",
                           "q4_k_m", "--output", str(out)], check=False, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"wrote {out} (Q4_K_M, ") and out.is_file()
    progress = [line for line in proc.stderr.splitlines() if line.startswith("[")]
    assert len(progress) == len(GGUFFile(out).tensors) and progress[0].startswith("[ 1/21] Q4_K  token_embd.weight")
    assert [p.name for p in out.parent.iterdir()] == ["model.gguf"]  # no temp file left


def test_failed_write_leaves_nothing_behind(tiny, tmp_path):
    folder, _ = tiny["llama"]
    broken = tmp_path / "broken"
    tensors = hf_tensors(folder)
    tensors["model.layers.1.mlp.down_proj.weight"][3, 5] = np.nan
    save_hf_folder(broken, tensors, json.loads((folder / "config.json").read_text()))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (broken / name).write_bytes((folder / name).read_bytes())
    out = tmp_path / "out.gguf"
    out.write_bytes(b"previous file")
    with pytest.raises(FileFormatError, match="blk.1.ffn_down.weight holds NaN"):
        quantize_to_gguf(broken, out, "Q8_0")
    assert out.read_bytes() == b"previous file" and sorted(p.name for p in tmp_path.iterdir()) == [
        "broken", "out.gguf"]


def test_inputs_quantize_refuses(tiny, tmp_path):
    folder, files = tiny["llama"]
    with pytest.raises(UnsupportedError, match="quantize reads a Hugging Face model folder"):
        quantize_to_gguf(files["Q8_0"], tmp_path / "x.gguf", "Q8_0")
    with pytest.raises(UnsupportedError, match="unknown GGUF type 'Q2_K'"):
        quantize_to_gguf(folder, tmp_path / "x.gguf", "Q2_K")
    weights_only = tmp_path / "weights_only"
    weights_only.mkdir()
    (weights_only / "config.json").write_bytes((folder / "config.json").read_bytes())
    save_safetensors(weights_only / "model.safetensors", hf_tensors(folder))
    with pytest.raises(NotFoundError, match="no tokenizer.json"):
        quantize_to_gguf(weights_only, tmp_path / "x.gguf", "Q8_0")
    assert not (tmp_path / "x.gguf").exists()


# ---- SmolLM2: the round trip, and what Q4_K_M costs a trained model ---------------------------

@pytest.fixture(scope="module")
def smollm2():
    return surogate.load_model(smollm2_path())


def greedy(model, prompt_ids: list[int], steps: int) -> list[int]:
    total = len(prompt_ids) + steps + 1  # a filler document keeps the shape (one compile)
    seq = list(prompt_ids)
    for _ in range(steps):
        seq.append(int(model.forward([seq, [0] * (total - len(seq))])[len(seq) - 1].argmax()))
    return seq[len(prompt_ids):]


def test_smollm2_round_trip_through_hf_folder_and_q8_0(smollm2, tmp_path):
    folder = save_hf_folder(tmp_path / "hf", smollm2.to_hf(smollm2.params), smollm2.config)
    save_hf_tokenizer(smollm2_path(), folder)
    path = quantize_to_gguf(folder, tmp_path / "smollm2-q8_0.gguf", "Q8_0")
    again = surogate.load_model(path)
    assert GGUFFile(path).tensor("token_embd.weight").type_name == "Q8_0"
    prompt = smollm2.tokenizer.apply_chat_template([{"role": "user", "content": "Name a primary color."}],
                                                   add_generation_prompt=True)
    assert again.tokenizer.apply_chat_template([{"role": "user", "content": "Name a primary color."}],
                                               add_generation_prompt=True) == prompt
    new = greedy(again, prompt, 8)
    # The original's choice at each step, on the same tokens: equal means the same greedy output.
    assert smollm2.forward(prompt + new)[len(prompt) - 1:-1].argmax(-1).tolist() == new


HELD_OUT = (
    "The history of the bicycle began in the early nineteenth century, when inventors in Europe experimented with "
    "two-wheeled machines pushed along by the rider's feet. Pedals attached to the front wheel came later, and the "
    "modern design, with a chain driving the rear wheel and two wheels of equal size, appeared in the 1880s. Cheap, "
    "reliable bicycles changed daily life: workers could live farther from factories, and women gained a new freedom "
    "of movement that supporters of women's rights celebrated at the time.\n\n"
    "To make bread, mix flour, water, salt and a little yeast into a soft dough. Knead it for ten minutes until it is "
    "smooth and elastic, then cover the bowl and leave it in a warm place for about an hour, until the dough has "
    "doubled in size. Shape it into a loaf, let it rise again, and bake it in a hot oven until the crust is brown.\n\n"
    "Computers store numbers in binary, using only the digits zero and one. A group of eight bits is called a byte, "
    "and it can represent any whole number from 0 to 255. Larger numbers use several bytes."
)


def test_q4_k_m_cost_on_a_trained_model(smollm2, tmp_path):
    """What quantizing costs a trained model, in next-token terms on a held-out text: the mean KL
    divergence of the quantized model's next-token distribution from the float model's, and the
    perplexity increase. (A random model's outputs are near uniform: nothing to lose.)

    The only trained weights at hand are SmolLM2's, already Q4_1 / Q8_0. Requantizing those
    values measures how one block grid lands on another (Q4_K nearly recovers a Q4_1 grid, Q5_1
    does not), not quantization. So the float model is SmolLM2 with every weight jittered
    uniformly within half its block's step: a float checkpoint that rounds back to (nearly) the
    same Q4_1 / Q8_0 blocks, an ancestor as far as the file can tell (perplexity on this text
    11.6 -> 17.0: a worse model, still a trained one).

    Measured (this text, 237 tokens): Q8_0 KL 0.0018, perplexity -0.1%; Q4_K_M KL 0.062,
    perplexity +10.6% (SmolLM2's rows of 576 are no whole K block, so most of its Q4_K_M
    tensors fall back to Q5_0; only ffn_down, rows of 1536, is Q4_K / Q6_K). Bounds: Q8_0 KL
    0.006, perplexity +1.5%; Q4_K_M KL 0.1, perplexity +16%."""
    rng = np.random.default_rng(0)

    def jitter(w: np.ndarray, q8: bool) -> np.ndarray:
        blocks = w.reshape(-1, 32)
        step = (np.abs(blocks).max(1, keepdims=True) / 127 if q8 else
                (blocks.max(1, keepdims=True) - blocks.min(1, keepdims=True)) / 15)
        return (blocks + rng.uniform(-0.5, 0.5, blocks.shape).astype(np.float32) * step).reshape(w.shape)

    params = {k: v if v.ndim == 1 else jitter(v, k == "embed_tokens.weight") for k, v in smollm2.params.items()}
    folder = save_hf_folder(tmp_path / "float", smollm2.to_hf(params), smollm2.config)
    save_hf_tokenizer(smollm2_path(), folder)
    ids = smollm2.tokenizer.encode(HELD_OUT)

    def log_probs(model) -> np.ndarray:
        x = model.forward(ids).astype(np.float64)
        x -= x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    def perplexity(lp: np.ndarray) -> float:
        return float(np.exp(-lp[np.arange(len(ids) - 1), ids[1:]].mean()))

    base = log_probs(surogate.load_model(folder))
    for qtype, max_kl, max_ppl in (("Q8_0", 0.006, 1.015), ("Q4_K_M", 0.1, 1.16)):
        lp = log_probs(surogate.load_model(quantize_to_gguf(folder, tmp_path / f"{qtype}.gguf", qtype)))
        kl = float((np.exp(base) * (base - lp)).sum(-1).mean())
        ratio = perplexity(lp) / perplexity(base)
        print(f"{qtype}: KL {kl:.4f}, perplexity {perplexity(base):.2f} -> {perplexity(lp):.2f} ({ratio - 1:+.1%})")
        assert kl < max_kl and ratio < max_ppl, (qtype, kl, ratio)
