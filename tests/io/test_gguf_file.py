"""Reading GGUF files: metadata, tensor table and dequantized values against gguf-py (the
reference reader and decoder), the HF config built from the hyper-parameters, and damaged or
unsupported files, which must fail with an error naming the file (and the tensor), never a crash."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sgtest.smollm2 import smollm2_path
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader, GGUFWriter
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

import surogate
from surogate.errors import (
    FileFormatError,
    NotFoundError,
    SurogateError,
    UnsupportedError,
)
from surogate.io import GGUFFile, Tokenizer, is_gguf
from surogate.io.gguf_config import llama3_rope_factors
from surogate.models import REGISTRY, config_from_gguf, family_for




def write_tiny_gguf(path: Path, *, arch: str = "llama", kv: dict | None = None, tensors: dict | None = None,
                    raw: dict | None = None) -> Path:
    """A small GGUF written by gguf-py: a 2-layer llama-style header and the given tensors
    (``raw``: name -> (uint8 blocks, ggml type))."""
    rng = np.random.default_rng(0)
    w = GGUFWriter(path, arch)
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_context_length(256)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "ab", "<s>"])
    w.add_array("tokenizer.ggml.merges", ["a b"])
    w.add_uint32("tokenizer.ggml.bos_token_id", 3)
    for key, value in (kv or {}).items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, list):
            w.add_array(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        else:
            w.add_key_value(key, value, *value) if isinstance(value, tuple) else w.add_string(key, value)
    for name, arr in (tensors if tensors is not None else {
            "token_embd.weight": rng.standard_normal((4, 64), dtype=np.float32),
            "output_norm.weight": np.ones(64, np.float32)}).items():
        w.add_tensor(name, arr)
    for name, (blocks, ggml_type) in (raw or {}).items():
        w.add_tensor(name, blocks, raw_dtype=ggml_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ---- a real file ---------------------------------------------------------------------------

def test_smollm2_config_and_tensors():
    gf = GGUFFile(smollm2_path())
    assert gf.architecture == "llama" and gf.version == 3
    config = config_from_gguf(gf)
    expected = {"architectures": ["LlamaForCausalLM"], "hidden_size": 576, "intermediate_size": 1536,
                "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
                "rope_theta": 100000.0, "vocab_size": 49152, "tie_word_embeddings": True, "bos_token_id": 1,
                "eos_token_id": 2, "max_position_embeddings": 8192}
    assert {k: config[k] for k in expected} == expected
    assert config["rms_norm_eps"] == pytest.approx(1e-5)
    assert "rope_scaling" not in config
    assert len(gf.tensors) == 272
    embd = gf.tensor("token_embd.weight")
    assert (embd.type_name, embd.shape, embd.raw.shape) == ("Q8_0", (49152, 576), (49152, 612))
    q = gf.tensor("blk.0.attn_k.weight")
    assert (q.type_name, q.shape) == ("Q4_1", (192, 576))
    assert gf.tensor("blk.0.attn_norm.weight").shape == (576,)
    # The family builds its spec from it as from a config.json.
    spec = family_for(config).spec_from_config(config)
    assert (spec.num_layers, spec.head_dim, spec.tie_word_embeddings) == (30, 64, True)


@pytest.mark.parametrize("name", ["token_embd.weight", "blk.3.ffn_down.weight", "blk.3.attn_q.weight",
                                  "output_norm.weight"])
def test_smollm2_dequantize_matches_gguf_py(name):
    gf = GGUFFile(smollm2_path())
    t = gf.tensor(name)
    ref = gguf_dequantize(t.raw if t.type_name != "F32" else t.raw.view(np.float32), T(t.type)).reshape(t.shape)
    np.testing.assert_array_equal(t.dequantize(), ref)
    bf16 = t.dequantize("bfloat16")
    np.testing.assert_allclose(bf16.astype(np.float32), ref, rtol=1 / 128, atol=1e-30)


def test_metadata_and_tensor_table_match_gguf_py(tmp_path):
    rng = np.random.default_rng(1)
    q8 = gguf_quantize(rng.standard_normal((8, 64), dtype=np.float32), T.Q8_0)
    path = write_tiny_gguf(tmp_path / "m.gguf", kv={"general.name": "tiny"}, raw={"blk.0.attn_q.weight": (q8, T.Q8_0)})
    ours, ref = GGUFFile(path), GGUFReader(path)
    for key, field in ref.fields.items():
        if not key.startswith("GGUF."):
            assert ours.get(key) == pytest.approx(field.contents()), key
    assert [t.name for t in ref.tensors] == list(ours.tensors)
    for t in ref.tensors:
        mine = ours.tensor(t.name)
        assert mine.type == t.tensor_type and mine.shape == tuple(reversed(t.shape.tolist()))
        assert mine.raw.tobytes() == t.data.tobytes()
    np.testing.assert_array_equal(ours.tensor("blk.0.attn_q.weight").dequantize(), gguf_dequantize(q8, T.Q8_0))


# What an architecture needs beyond the common header: (keys, tensors). Gemma 4's per-kind
# geometry (the *_swa keys, one bool per layer) and the full layers' rope_freqs.
ARCH_KEYS = {"gemma4": ({"gemma4.attention.key_length_swa": 32, "gemma4.attention.value_length_swa": 32,
                         "gemma4.attention.sliding_window_pattern": [True, False], "gemma4.attention.sliding_window": 8,
                         "gemma4.embedding_length_per_layer_input": 0},
                        {"rope_freqs.weight": np.ones(16, np.float32)})}


@pytest.mark.parametrize("family", [
    pytest.param(f, marks=pytest.mark.skip(reason=f.gguf.unsupported)) if f.gguf.unsupported else f
    for f in REGISTRY], ids=[f.name for f in REGISTRY])
def test_each_family_reads_its_gguf_architecture(tmp_path, family):
    a = family.gguf.name
    kv, tensors = ARCH_KEYS.get(a, ({}, {}))
    path = write_tiny_gguf(tmp_path / "q.gguf", arch=a, kv={f"{a}.attention.key_length": 32,
                                                            f"{a}.rope.dimension_count": 32, **kv},
                           tensors={"token_embd.weight": np.random.default_rng(0).standard_normal((4, 64), np.float32),
                                    "output_norm.weight": np.ones(64, np.float32), **tensors})
    config = config_from_gguf(GGUFFile(path))
    owner = next(f for f in REGISTRY if f.gguf.name == a)  # the first family of a shared architecture
    assert config["architectures"] == [owner.hf_architecture] and config["head_dim"] == 32
    assert config["model_type"] in owner.model_types and family_for(config) is owner
    assert config["tie_word_embeddings"] is True and "partial_rotary_factor" not in config


def test_llama3_rope_scaling_is_recovered_from_rope_freqs(tmp_path):
    factors = llama3_rope_factors(500000.0, 16, 32.0, 1.0, 4.0, 8192)
    path = write_tiny_gguf(tmp_path / "r.gguf", tensors={"token_embd.weight": np.ones((4, 64), np.float32),
                                                         "rope_freqs.weight": factors})
    assert config_from_gguf(GGUFFile(path))["rope_scaling"] == {
        "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}
    path = write_tiny_gguf(tmp_path / "r2.gguf", tensors={"token_embd.weight": np.ones((4, 64), np.float32),
                                                          "rope_freqs.weight": factors[::-1].copy()})
    with pytest.raises(UnsupportedError, match="rope_freqs.weight"):
        _ = config_from_gguf(GGUFFile(path))


def test_linear_rope_scaling(tmp_path):
    path = write_tiny_gguf(tmp_path / "l.gguf", kv={"llama.rope.scaling.type": "linear",
                                                    "llama.rope.scaling.factor": 4.0})
    assert config_from_gguf(GGUFFile(path))["rope_scaling"] == {"rope_type": "linear", "factor": 4.0}


# ---- errors --------------------------------------------------------------------------------

def test_unsupported_tensor_type_names_file_tensor_and_type(tmp_path):
    blocks = np.zeros((8, 66 * 1), np.uint8)  # IQ2_XXS: 66 bytes per 256 values
    path = write_tiny_gguf(tmp_path / "iq.gguf", raw={"blk.0.attn_q.weight": (blocks, T.IQ2_XXS)})
    gf = GGUFFile(path)  # reading the header works: the type is only a problem when decoding
    with pytest.raises(UnsupportedError) as e:
        gf.tensor("blk.0.attn_q.weight").dequantize()
    assert str(path) in e.value.message
    assert "unsupported GGUF type IQ2_XXS in tensor blk.0.attn_q.weight" in e.value.message
    with pytest.raises(UnsupportedError, match="IQ2_XXS in tensor blk.0.attn_q.weight"):
        gf.check_supported()


def test_unknown_type_id_names_the_tensor(tmp_path):
    path = write_tiny_gguf(tmp_path / "u.gguf")
    data = bytearray(path.read_bytes())
    # The type field of the first tensor info follows its name, n_dims and dims.
    at = data.index(b"token_embd.weight") + len(b"token_embd.weight") + 4 + 2 * 8
    assert int.from_bytes(data[at:at + 4], "little") == int(T.F32)
    data[at:at + 4] = (99).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(UnsupportedError, match="unknown GGML type id 99 in tensor token_embd.weight"):
        GGUFFile(path)


@pytest.mark.parametrize("content, error, text", [
    (b"", FileFormatError, "truncated GGUF file"),
    (b"GGUF\x03\x00\x00\x00", FileFormatError, "truncated GGUF file"),
    (b"PK\x03\x04" + bytes(40), FileFormatError, "is not a GGUF file"),
    (b"GGUF" + (1).to_bytes(4, "little") + bytes(32), UnsupportedError, "GGUF version 1 is not supported"),
    (b"GGUF" + (4).to_bytes(4, "little") + bytes(32), UnsupportedError, "GGUF version 4 is not supported"),
    (b"GGUF" + (3).to_bytes(4, "big") + bytes(32), UnsupportedError, "big-endian"),
    (b"GGUF" + (3).to_bytes(4, "little") + (2**60).to_bytes(8, "little") + bytes(16), FileFormatError,
     "truncated or damaged GGUF file"),
])
def test_bad_headers(tmp_path, content, error, text):
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(error, match=text) as e:
        GGUFFile(path)
    assert str(path) in e.value.message


def test_every_truncation_is_a_file_format_error(tmp_path):
    path = write_tiny_gguf(tmp_path / "t.gguf")
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    for n in sorted({*range(0, 200, 7), *range(200, len(data), 97), len(data) - 1}):
        cut.write_bytes(data[:n])
        with pytest.raises(FileFormatError, match="truncated") as e:
            GGUFFile(cut)
        assert str(cut) in e.value.message


def test_random_damage_never_crashes(tmp_path):
    path = write_tiny_gguf(tmp_path / "d.gguf")
    data = path.read_bytes()
    header_end = data.index(b"output_norm.weight") + 64
    rng = np.random.default_rng(0)
    damaged = tmp_path / "damaged.gguf"
    for _ in range(300):
        buf = bytearray(data)
        for at in rng.integers(8, header_end, size=rng.integers(1, 4)):
            buf[at] = int(rng.integers(0, 256))
        damaged.write_bytes(bytes(buf))
        try:
            gf = GGUFFile(damaged)
            config_from_gguf(gf)
            Tokenizer.from_gguf(gf)
            for t in gf.tensors.values():
                t.dequantize()
        except SurogateError:
            pass  # FileFormatError / UnsupportedError / NotFoundError: all say what and where


def test_missing_and_folder_paths(tmp_path):
    with pytest.raises(NotFoundError):
        GGUFFile(tmp_path / "nope.gguf")
    with pytest.raises(FileFormatError, match="folder"):
        GGUFFile(tmp_path)
    with pytest.raises(NotFoundError, match="no such file or folder: missing.gguf"):
        surogate.load_model("missing.gguf")


@pytest.mark.parametrize("kv", [{"llama.attention.head_count": "four"}, {"llama.attention.head_count": 0},
                                {"llama.block_count": 0}, {"llama.attention.head_count_kv": 3},
                                {"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": "x"}],
                         ids=["string", "zero-heads", "zero-layers", "kv-heads-not-dividing", "bad-rope-factor"])
def test_damaged_hyper_parameters(tmp_path, kv):
    path = write_tiny_gguf(tmp_path / "h.gguf", kv=kv)
    with pytest.raises(FileFormatError, match="damaged") as e:
        surogate.load_model(path)
    assert str(path) in e.value.message


def test_unsupported_architecture(tmp_path):
    path = write_tiny_gguf(tmp_path / "p.gguf", arch="phi3")
    with pytest.raises(UnsupportedError, match="GGUF architecture 'phi3' is not supported"):
        surogate.load_model(path)


def test_is_gguf(tmp_path):
    path = write_tiny_gguf(tmp_path / "x.bin")
    assert is_gguf(path) and not is_gguf(tmp_path) and not is_gguf(tmp_path / "none.gguf")
    (tmp_path / "y.txt").write_text("hello")
    assert not is_gguf(tmp_path / "y.txt")
